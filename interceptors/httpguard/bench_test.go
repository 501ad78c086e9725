package httpguard_test

import (
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	ledgerv1 "github.com/idemledger/idemledger/gen/idemledger/v1"
	"github.com/idemledger/idemledger/interceptors/guard"
	"github.com/idemledger/idemledger/interceptors/httpguard"
	"github.com/idemledger/idemledger/ledger/ledgerclient"
	"github.com/idemledger/idemledger/server/servertest"
)

// BenchmarkMiddleware measures a POST of a small JSON body to a handler
// that writes nothing, over loopback HTTP, protected against unprotected
// on the same server, in one run: the kinds take turns in blocks of 100
// requests, and the metrics are medians of their latencies. The protected
// route claims a fresh key and completes it at a LedgerService on the
// memory store (over gRPC on a Stream); replayed sends a key again.
func BenchmarkMiddleware(b *testing.B) {
	conn := servertest.NewServer(b, servertest.Ledger(servertest.MemoryLedger("api"))).Dial(b, grpc.WithTransportCredentials(insecure.NewCredentials()))
	ledger := ledgerclient.New(ledgerv1.NewLedgerServiceClient(conn))
	b.Cleanup(func() { _ = ledger.Close() })
	gd, err := guard.New(ledger)
	if err != nil {
		b.Fatal(err)
	}
	g, err := httpguard.New(gd, httpguard.WithTenant(httpguard.Tenant("acme")), httpguard.WithRoute("POST /protected", httpguard.Route{}))
	if err != nil {
		b.Fatal(err)
	}
	handler := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, `{"id":"inv_1"}`)
	})
	mux := http.NewServeMux()
	mux.Handle("POST /protected", g.Middleware(handler))
	mux.Handle("POST /plain", handler)
	url := serve(b, mux)
	client := &http.Client{}
	send := func(path, key string) time.Duration {
		start := time.Now()
		req, _ := http.NewRequest(http.MethodPost, url+path, strings.NewReader(`{"customer":"cus_1","amount_cents":4200}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set(httpguard.KeyHeader, `"`+key+`"`)
		res, err := client.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, res.Body)
		_ = res.Body.Close()
		if res.StatusCode != http.StatusCreated {
			b.Fatalf("%s: %d", path, res.StatusCode)
		}
		return time.Since(start)
	}
	run := time.Now().UnixNano()
	var plain, fresh, replay []time.Duration
	for i := 0; b.Loop(); i++ {
		key := fmt.Sprintf("%d-%d", run, i)
		switch i / 100 % 3 {
		case 0:
			plain = append(plain, send("/plain", key))
		case 1:
			fresh = append(fresh, send("/protected", key))
		default:
			replay = append(replay, send("/protected", fmt.Sprintf("%d-%d", run, i-100)))
		}
	}
	if len(replay) == 0 {
		return
	}
	p, f, r := median(plain), median(fresh), median(replay)
	b.ReportMetric(float64(p.Microseconds()), "µs/unprotected")
	b.ReportMetric(float64(f.Microseconds()), "µs/protected")
	b.ReportMetric(float64(r.Microseconds()), "µs/replayed")
	b.ReportMetric(float64((f - p).Microseconds()), "µs-added")
}

func median(d []time.Duration) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[len(s)/2]
}
