// Package httpinvoice is the example HTTP invoice API: POST /v1/invoices
// and GET /v1/invoices/{id} over an invoice table of its own
// (invoicedb.DB), with POST made idempotent by the ledger's HTTP
// middleware (package httpguard) as draft-ietf-httpapi-idempotency-key-header
// describes. A takeover is reconciled by looking for the earlier attempt's
// row by key.
package httpinvoice

import (
	"encoding/json"
	"fmt"
	"net/http"
	"time"

	"github.com/idemledger/idemledger/examples/invoicedb"
	"github.com/idemledger/idemledger/interceptors/guard"
	"github.com/idemledger/idemledger/interceptors/httpguard"
)

// CreateRoute is the protected route.
const CreateRoute = "POST /v1/invoices"

// CreateRequest is POST /v1/invoices's body.
type CreateRequest struct {
	Customer    string `json:"customer"`
	Currency    string `json:"currency"`
	AmountCents int64  `json:"amount_cents"`
}

// API is the invoice API.
type API struct {
	Store  invoicedb.DB
	Tenant httpguard.TenantFunc
	// Lease is POST's lease; 0 means 10 s.
	Lease time.Duration
	// BeforeWrite, when set, runs before the write and may answer a
	// status instead (0: go on); AfterWrite runs after it. Tests fail and
	// crash the handler there.
	BeforeWrite func(r *http.Request) int
	AfterWrite  func(r *http.Request)
}

// Guard returns the middleware that protects POST /v1/invoices under g.
func (a *API) Guard(g *guard.Guard, opts ...httpguard.Option) (*httpguard.Guard, error) {
	lease := a.Lease
	if lease <= 0 {
		lease = 10 * time.Second
	}
	// On Postgres the invoice is fenced, and a takeover finds an earlier
	// attempt's commit in the fence; on a File, it is reconciled by key.
	route := httpguard.Route{Policy: guard.Policy{Lease: lease}}
	if f := a.Store.Fence(); f != nil {
		route.Policy.Fence = f
	} else {
		route.Reconcile = a.reconcile
	}
	return httpguard.New(g, append([]httpguard.Option{
		httpguard.WithTenant(a.Tenant),
		httpguard.WithRoute(CreateRoute, route),
	}, opts...)...)
}

// Handler serves the API, POST guarded by g.
func (a *API) Handler(g *httpguard.Guard) http.Handler {
	mux := http.NewServeMux()
	mux.Handle(CreateRoute, g.Middleware(http.HandlerFunc(a.create)))
	mux.HandleFunc("GET /v1/invoices/{id}", a.get)
	return mux
}

func (a *API) create(w http.ResponseWriter, r *http.Request) {
	c, ok := guard.ClaimFromContext(r.Context())
	if !ok {
		writeJSON(w, http.StatusPreconditionRequired, map[string]string{"error": "POST /v1/invoices needs an Idempotency-Key"})
		return
	}
	var req CreateRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil || req.Customer == "" || len(req.Currency) != 3 || req.AmountCents <= 0 {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": "an invoice needs a customer, a 3-letter currency and a positive amount_cents"})
		return
	}
	if a.BeforeWrite != nil {
		if status := a.BeforeWrite(r); status != 0 {
			writeJSON(w, status, map[string]string{"error": http.StatusText(status)})
			return
		}
	}
	inv, err := a.Store.Insert(r.Context(), c.Tenant, c.Key, c.Token, func(n int64) invoicedb.Invoice {
		return invoicedb.Invoice{
			ID: fmt.Sprintf("inv_%s_%06d", c.Tenant, n), Number: n, Customer: req.Customer,
			Currency: req.Currency, AmountCents: req.AmountCents, CreatedAt: time.Now().UTC(),
		}
	}, func(inv invoicedb.Invoice) any { return Created(inv) })
	if err != nil {
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"error": "the invoice table is unavailable"})
		return
	}
	if a.AfterWrite != nil {
		a.AfterWrite(r)
	}
	res := Created(inv)
	for k, v := range res.Header {
		w.Header()[k] = v
	}
	w.WriteHeader(res.Status)
	_, _ = w.Write(res.Body)
}

// Created is the response to a created invoice.
func Created(inv invoicedb.Invoice) *httpguard.Response {
	body, _ := json.Marshal(map[string]any{"invoice": inv})
	return &httpguard.Response{
		Status: http.StatusCreated,
		Header: http.Header{"Content-Type": {"application/json"}, "Location": {"/v1/invoices/" + inv.ID}},
		Body:   append(body, '\n'),
	}
}

// reconcile answers a takeover with the earlier attempt's invoice, found
// by the claim's key.
func (a *API) reconcile(r *http.Request) (*httpguard.Response, error) {
	c, ok := guard.ClaimFromContext(r.Context())
	if !ok {
		return nil, fmt.Errorf("reconcile runs behind the guard")
	}
	inv, ok, err := a.Store.FindByKey(r.Context(), c.Tenant, c.Key)
	if !ok || err != nil {
		return nil, err
	}
	return Created(inv), nil
}

func (a *API) get(w http.ResponseWriter, r *http.Request) {
	tenant, err := a.Tenant(r)
	if err != nil {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": err.Error()})
		return
	}
	inv, ok, err := a.Store.Get(r.Context(), tenant, r.PathValue("id"))
	if err != nil {
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"error": "the invoice table is unavailable"})
		return
	}
	if !ok {
		writeJSON(w, http.StatusNotFound, map[string]string{"error": "no such invoice"})
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"invoice": inv})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
