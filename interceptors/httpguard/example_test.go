package httpguard_test

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	ledgerv1 "github.com/idemledger/idemledger/gen/idemledger/v1"
	"github.com/idemledger/idemledger/interceptors/guard"
	"github.com/idemledger/idemledger/interceptors/httpguard"
	"github.com/idemledger/idemledger/server/servertest"
)

// A service protects POST /v1/invoices: the same Idempotency-Key sent
// twice creates one invoice, and the second answer is the first,
// replayed.
func ExampleGuard_Middleware() {
	lis, err := net.Listen("tcp", "127.0.0.1:0") // the ledger, in memory here: ledgerd in production
	if err != nil {
		fmt.Println(err)
		return
	}
	ls := grpc.NewServer()
	ledgerv1.RegisterLedgerServiceServer(ls, servertest.MemoryLedgerAt("billing", nil))
	go func() { _ = ls.Serve(lis) }()
	defer ls.Stop()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer conn.Close()

	g, err := guard.New(ledgerv1.NewLedgerServiceClient(conn))
	if err != nil {
		fmt.Println(err)
		return
	}
	hg, err := httpguard.New(g,
		httpguard.WithRoute("POST /v1/invoices", httpguard.Route{Policy: guard.Policy{Lease: 30 * time.Second}}),
		httpguard.WithTenant(httpguard.TenantFromHeader("X-Tenant")))
	if err != nil {
		fmt.Println(err)
		return
	}
	invoices := 0
	mux := http.NewServeMux()
	mux.Handle("POST /v1/invoices", hg.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		invoices++ // the write
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"id":"inv_%d"}`, invoices)
	})))
	srv := httptest.NewServer(mux)
	defer srv.Close()

	for range 2 {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/invoices", strings.NewReader(`{"amount":1200}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-Tenant", "acme")
		req.Header.Set(httpguard.KeyHeader, `"7f1c9a52"`)
		res, err := srv.Client().Do(req)
		if err != nil {
			fmt.Println(err)
			return
		}
		body, _ := io.ReadAll(res.Body)
		res.Body.Close()
		fmt.Println(res.StatusCode, string(body), "replayed:", res.Header.Get(httpguard.ReplayedHeader) == "true")
	}
	fmt.Println(invoices, "invoice")
	// Output:
	// 201 {"id":"inv_1"} replayed: false
	// 201 {"id":"inv_1"} replayed: true
	// 1 invoice
}
