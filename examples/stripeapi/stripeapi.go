// Package stripeapi is a Stripe-shaped API behind httpguard with Stripe's
// conventions (httpguard.Route.Stripe): POST /v1/charges, form-encoded as
// the Stripe SDKs send it, answered with a charge object. It is what a
// team that offers a Stripe-compatible API, or that puts one behind
// idemproxy, runs; its tests drive it with stripe-go.
package stripeapi

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"

	"github.com/idemledger/idemledger/interceptors/guard"
	"github.com/idemledger/idemledger/interceptors/httpguard"
	"github.com/idemledger/idemledger/ledger/errcode"
)

// Charge is a charge the API made.
type Charge struct {
	ID       string `json:"id"`
	Object   string `json:"object"` // "charge"
	Amount   int64  `json:"amount"`
	Currency string `json:"currency"`
	Account  string `json:"-"`
}

// API makes charges. Accounts maps each secret key to its account, the
// tenant of the ledger; Run, when set, runs in every create before the
// charge is made (a test holds the write there).
type API struct {
	Accounts map[string]string
	Run      func(r *http.Request)

	mu      sync.Mutex
	charges []Charge
}

// Charges are the charges made, in order.
func (a *API) Charges() []Charge {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]Charge(nil), a.charges...)
}

// Handler serves the API with POST /v1/charges guarded by g, by Stripe's
// conventions.
func (a *API) Handler(g *guard.Guard, route httpguard.Route) (http.Handler, error) {
	route.Stripe = true
	hg, err := httpguard.New(g, httpguard.WithRoute("POST /v1/charges", route), httpguard.WithTenant(a.account))
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.Handle("POST /v1/charges", hg.Middleware(http.HandlerFunc(a.create)))
	return mux, nil
}

// account is the tenant of a request: the account of its secret key.
func (a *API) account(r *http.Request) (string, error) {
	key, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if account, known := a.Accounts[key]; ok && known {
		return account, nil
	}
	return "", errcode.Errorf(errcode.ValidationFailed, "the request's API key is not one of an account")
}

func (a *API) create(w http.ResponseWriter, r *http.Request) {
	amount, err := strconv.ParseInt(r.PostFormValue("amount"), 10, 64)
	currency := r.PostFormValue("currency")
	if err != nil || amount <= 0 || currency == "" {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusBadRequest)
		_, _ = fmt.Fprint(w, `{"error":{"type":"invalid_request_error","message":"amount and currency are required"}}`)
		return
	}
	if a.Run != nil {
		a.Run(r)
	}
	account, _ := a.account(r)
	a.mu.Lock()
	c := Charge{ID: fmt.Sprintf("ch_%d", len(a.charges)+1), Object: "charge", Amount: amount, Currency: currency, Account: account}
	a.charges = append(a.charges, c)
	a.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Request-Id", "req_"+strings.TrimPrefix(c.ID, "ch_"))
	_, _ = fmt.Fprintf(w, `{"id":%q,"object":"charge","amount":%d,"currency":%q}`, c.ID, c.Amount, c.Currency)
}
