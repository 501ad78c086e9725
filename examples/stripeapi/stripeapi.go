// Package stripeapi is a Stripe-shaped API behind httpguard with Stripe's
// conventions (httpguard.Route.Stripe): POST /v1/charges, form-encoded as
// the Stripe SDKs send it, answered with a charge object. It is what a
// team that offers a Stripe-compatible API, or that puts one behind
// idemproxy, runs; its tests drive it with stripe-go. On PostgreSQL (DB)
// each charge is written with its key's fence.
package stripeapi

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemledger/idemledger/examples/invoicedb"
	"github.com/idemledger/idemledger/interceptors/fence/fencepgx"
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
// charge is made (a test holds the write there), and AfterWrite after it
// is made, before it is answered (a test crashes there).
type API struct {
	Accounts        map[string]string
	Run, AfterWrite func(r *http.Request)
	// DB, when set, holds the charges (Migrate applies its tables), each
	// written in one transaction with its key's fence; nil keeps them in
	// memory.
	DB *pgxpool.Pool

	mu      sync.Mutex
	charges []Charge
}

// schema is the charges' table; the fence table's migration goes with it.
const schema = `
CREATE TABLE IF NOT EXISTS stripe_charges (
	n        BIGSERIAL PRIMARY KEY,
	account  TEXT   NOT NULL,
	amount   BIGINT NOT NULL,
	currency TEXT   NOT NULL
);`

// Migrate applies the charges' table and the fence table's migration to
// DB, as a service's migration tool would.
func (a *API) Migrate(ctx context.Context) error { return invoicedb.ApplySchema(ctx, a.DB, schema) }

// Charges are the charges made, in order.
func (a *API) Charges(ctx context.Context) ([]Charge, error) {
	if a.DB == nil {
		a.mu.Lock()
		defer a.mu.Unlock()
		return append([]Charge(nil), a.charges...), nil
	}
	rows, err := a.DB.Query(ctx, `SELECT n, account, amount, currency FROM stripe_charges ORDER BY n`)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (Charge, error) {
		var n int64
		c := Charge{Object: "charge"}
		err := r.Scan(&n, &c.Account, &c.Amount, &c.Currency)
		c.ID = fmt.Sprint("ch_", n)
		return c, err
	})
}

// Handler serves the API with POST /v1/charges guarded by g, by Stripe's
// conventions.
func (a *API) Handler(g *guard.Guard, route httpguard.Route) (http.Handler, error) {
	route.Stripe = true
	if a.DB != nil {
		route.Policy.Fence = fencepgx.New(a.DB)
	}
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
	c, err := a.charge(r.Context(), Charge{Object: "charge", Amount: amount, Currency: currency, Account: account})
	if err != nil {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = fmt.Fprint(w, `{"error":{"type":"api_error","message":"the charge could not be made: retry with the same key"}}`)
		return
	}
	if a.AfterWrite != nil {
		a.AfterWrite(r)
	}
	res := answer(c)
	for k, v := range res.Header {
		w.Header()[k] = v
	}
	_, _ = w.Write(res.Body)
}

// charge makes c: in memory, or in DB with its key's fence, the answer
// it is given.
func (a *API) charge(ctx context.Context, c Charge) (Charge, error) {
	if a.DB == nil {
		a.mu.Lock()
		defer a.mu.Unlock()
		c.ID = fmt.Sprintf("ch_%d", len(a.charges)+1)
		a.charges = append(a.charges, c)
		return c, nil
	}
	err := pgx.BeginFunc(ctx, a.DB, func(tx pgx.Tx) error {
		var n int64
		if err := tx.QueryRow(ctx, `INSERT INTO stripe_charges (account, amount, currency) VALUES ($1, $2, $3) RETURNING n`,
			c.Account, c.Amount, c.Currency).Scan(&n); err != nil {
			return err
		}
		c.ID = fmt.Sprint("ch_", n)
		return fencepgx.Write(ctx, tx, answer(c))
	})
	return c, err
}

// answer is the response to a charge made.
func answer(c Charge) *httpguard.Response {
	return &httpguard.Response{Status: http.StatusOK,
		Header: http.Header{"Content-Type": {"application/json"}, "Request-Id": {"req_" + strings.TrimPrefix(c.ID, "ch_")}},
		Body:   fmt.Appendf(nil, `{"id":%q,"object":"charge","amount":%d,"currency":%q}`, c.ID, c.Amount, c.Currency)}
}
