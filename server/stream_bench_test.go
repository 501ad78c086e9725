package server_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/protobuf/types/known/anypb"

	ledgerv1 "github.com/idemledger/idemledger/gen/idemledger/v1"
	"github.com/idemledger/idemledger/ledger"
	"github.com/idemledger/idemledger/ledger/ledgerclient"
	"github.com/idemledger/idemledger/ledger/ledgertest"
	"github.com/idemledger/idemledger/ledger/memory"
	"github.com/idemledger/idemledger/server"
	"github.com/idemledger/idemledger/server/servertest"
)

// BenchmarkStreamPairs measures Begin+Complete pairs on fresh keys over
// one Stream (ledger/ledgerclient) over gRPC in memory (bufconn), to a
// LedgerService on the memory store with bearer tokens, at 1, 32 and 128
// concurrent callers, with ledgerd's transport settings: the server's and
// the client's own cost per pair, allocations included, without a disk.
func BenchmarkStreamPairs(b *testing.B) {
	// As ledgerd runs without OTEL_* settings: no span is recorded.
	prev := otel.GetTracerProvider()
	otel.SetTracerProvider(trace.NewNoopTracerProvider()) //nolint:staticcheck // trace/noop is newer than this module's otel floor (v1.3.0)
	b.Cleanup(func() { otel.SetTracerProvider(prev) })
	tokens, err := server.ParseTokens(strings.NewReader(server.HashToken("billing-token") + " billing acme\n"))
	if err != nil {
		b.Fatal(err)
	}
	l := ledger.New(memory.New(memory.Config{}), ledger.Config{})
	srv := servertest.NewServer(b, servertest.Ledger(server.New(l, server.Config{Auth: tokens})), server.TransportOptions()...)
	client := streamClient(b, srv.Dial(b, ledgerclient.DialOptions()...), "billing-token")
	out := &ledgerv1.Outcome{Result: &ledgerv1.Outcome_Response{Response: &anypb.Any{TypeUrl: "type.googleapis.com/billing.v1.Invoice", Value: []byte("\x0a\x08inv_0001")}}}
	for _, clients := range []int{1, 32, 128} {
		b.Run(fmt.Sprintf("clients=%d", clients), func(b *testing.B) {
			ledgertest.Pairs(b, clients, func(ctx context.Context, key string) error {
				res, err := client.Begin(ctx, beginReq(key))
				if err != nil {
					return err
				}
				_, err = client.Complete(ctx, &ledgerv1.CompleteRequest{Tenant: "acme", Key: key, Token: res.GetClaim().GetToken(), Outcome: out})
				return err
			})
		})
	}
}
