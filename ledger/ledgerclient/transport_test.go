package ledgerclient_test

import (
	"bytes"
	"fmt"
	"sync"
	"testing"

	"google.golang.org/protobuf/types/known/anypb"

	ledgerv1 "github.com/idemledger/idemledger/gen/idemledger/v1"
	"github.com/idemledger/idemledger/ledger/ledgerclient"
	"github.com/idemledger/idemledger/server"
)

// TestOutcomesByteForByte: over ledgerd's transport settings on both ends
// (server.TransportOptions, DialOptions), whose codecs encode into
// buffers that are not cleared, outcomes of many sizes, on the stream and
// as unary calls, are stored and replayed byte for byte, many at once:
// no buffer lends one message's bytes to another.
func TestOutcomesByteForByte(t *testing.T) {
	t.Parallel()
	_, addr, _ := start(t, "", server.TransportOptions()...)
	c := dial(t, addr, ledgerclient.DialOptions()...)

	// Longer outcomes first, so that shorter ones get buffers used before.
	sizes := []int{1000 << 10, 700 << 10, 300 << 10, 200 << 10, 129 << 10, 70 << 10, 60 << 10, 2 << 10, 900, 1}
	outcome := func(i int) *ledgerv1.Outcome {
		return &ledgerv1.Outcome{Result: &ledgerv1.Outcome_Response{Response: &anypb.Any{
			TypeUrl: "type.googleapis.com/x.Y", Value: bytes.Repeat([]byte{byte('a' + i)}, sizes[i]),
		}}}
	}
	key := func(w, i int) string { return fmt.Sprintf("k-%d-%d", w, i) }
	const workers = 4
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := range sizes {
				res, err := c.Begin(t.Context(), begin(key(w, i)))
				if err != nil {
					t.Error(err)
					return
				}
				if _, err := c.Complete(t.Context(), &ledgerv1.CompleteRequest{Tenant: "acme", Key: key(w, i), Token: res.GetClaim().GetToken(), Outcome: outcome(i)}); err != nil {
					t.Errorf("%s: Complete of %d bytes: %v", key(w, i), sizes[i], err)
					return
				}
			}
			for i := range sizes {
				res, err := c.Begin(t.Context(), begin(key(w, i)))
				want := outcome(i).GetResponse().GetValue()
				if got := res.GetReplay().GetOutcome().GetResponse().GetValue(); err != nil || !bytes.Equal(got, want) {
					t.Errorf("%s: replay of %d bytes: %d bytes, equal %t (%v)", key(w, i), sizes[i], len(got), bytes.Equal(got, want), err)
				}
			}
		})
	}
	wg.Wait()
}
