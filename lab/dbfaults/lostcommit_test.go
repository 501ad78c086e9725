package dbfaults

import (
	"context"
	"errors"
	"net/url"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemledger/idemledger/internal/ledgerdtest"
	"github.com/idemledger/idemledger/internal/pgtest"
	"github.com/idemledger/idemledger/lab/faultproxy"
	"github.com/idemledger/idemledger/ledger"
	"github.com/idemledger/idemledger/ledger/crdb"
	"github.com/idemledger/idemledger/ledger/errcode"
	"github.com/idemledger/idemledger/ledger/ledgertest"
)

func TestMain(m *testing.M) { os.Exit(ledgerdtest.Run(func() int { return pgtest.Run(m) })) }

// proxied is a fresh database's URL, and the same through a fault proxy.
func proxied(t *testing.T) (direct, viaProxy string, p *faultproxy.Proxy) {
	t.Helper()
	direct = pgtest.NewDatabase(t)
	u, err := url.Parse(direct)
	if err != nil {
		t.Fatal(err)
	}
	p, err = faultproxy.New(u.Host)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	u.Host = p.Addr()
	return direct, u.String(), p
}

// TestLostCommitIsNeverNotDone cuts the database's answer to a claim or a
// completion after the database got it: the answer to the statement
// itself (one statement, its own transaction), to the COMMIT of a batch,
// and to a batch's statement before its COMMIT (nothing committed). In no
// case is the call's write taken as not done when it was done, or done
// when it was not: a claim the caller hears of holds token 1; an error is
// UNAVAILABLE, retryable; the row holds at most one claim; the next
// attempt finds the claim (IN_PROGRESS), and after the lease takes it over
// with token 2, fenced; a lost completion is replayed.
func TestLostCommitIsNeverNotDone(t *testing.T) {
	for _, c := range []struct {
		name     string
		batching bool
		cut      string // what the request the lost answer answers holds: the key, or "commit"
		complete bool   // the completion's answer is lost, not the claim's
	}{
		{"ClaimStatement", false, "key", false},
		{"ClaimBatchCommit", true, "commit", false},
		{"ClaimBatchBeforeCommit", true, "key", false},
		{"CompleteStatement", false, "key", true},
		{"CompleteBatchCommit", true, "commit", true},
	} {
		t.Run(c.name, func(t *testing.T) {
			direct, viaProxy, p := proxied(t)
			clock := ledgertest.NewClock(ledgertest.Start)
			cfg := crdb.Config{Now: clock.Now, Batching: c.batching, RetryBase: time.Millisecond}
			s, err := crdb.Open(t.Context(), viaProxy, cfg)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(s.Close)
			if _, err := s.Migrate(t.Context()); err != nil {
				t.Fatal(err)
			}
			l := ledger.New(s, ledger.Config{})
			key := "lost-" + c.name
			sc := ledger.Scope{Namespace: "billing", Tenant: "acme", Key: key}
			req := ledger.BeginRequest{Scope: sc, Fingerprint: ledgertest.Fingerprint("p"), Method: ledgertest.Method, Lease: time.Minute}
			cut := key
			if c.cut == "commit" {
				cut = "commit"
			}
			if !c.complete {
				p.CutAfter(cut)
				res, err := l.Begin(t.Context(), req)
				switch {
				case err == nil && (res.Claim == nil || res.Claim.Token != 1):
					t.Fatalf("the claim whose answer was lost: %+v", res)
				case err != nil && (errcode.As(err).Code != errcode.Unavailable || !errcode.As(err).Retryable()):
					t.Fatalf("the claim whose answer was lost: %v, want UNAVAILABLE, retryable", err)
				}
				if p.Cuts.Load() != 1 {
					t.Fatalf("the proxy cut %d answers, want 1", p.Cuts.Load())
				}
				t.Logf("the claim whose answer was lost answered %+v, %v", res.Claim, err)
				token, attempt, found := row(t, direct, key)
				if found && (token != 1 || attempt != 1) {
					t.Fatalf("the row: token %d, attempt %d", token, attempt)
				}
				if !found {
					if c.cut != "key" || !c.batching || err == nil {
						t.Fatalf("no row after the claim (answered %+v, %v)", res, err)
					}
					return // a batch cut before its COMMIT: nothing was done, nor said done
				}
				if err == nil {
					return // the claim was resolved and is the caller's
				}
				_, err = l.Begin(t.Context(), req)
				ledgertest.WantCode(t, err, errcode.InProgress)
				clock.Advance(2 * time.Minute)
				next, err := l.Begin(t.Context(), req)
				if err != nil || next.Claim == nil || next.Claim.Token != 2 {
					t.Fatalf("after the lease: %+v, %v; want a takeover with token 2", next, err)
				}
				return
			}
			res, err := l.Begin(t.Context(), req)
			if err != nil || res.Claim == nil {
				t.Fatal(res, err)
			}
			p.CutAfter(cut)
			_, err = l.Complete(t.Context(), sc, res.Claim.Token, ledgertest.Response("inv_7"))
			if err != nil && (errcode.As(err).Code != errcode.Unavailable || !errcode.As(err).Retryable()) {
				t.Fatalf("the completion whose answer was lost: %v, want UNAVAILABLE, retryable", err)
			}
			if p.Cuts.Load() != 1 {
				t.Fatalf("the proxy cut %d answers, want 1", p.Cuts.Load())
			}
			t.Logf("the completion whose answer was lost answered %v", err)
			replay, err := l.Begin(t.Context(), req)
			if err != nil || replay.Replay == nil || !replay.Replay.Outcome.Equal(ledgertest.Response("inv_7")) {
				t.Fatalf("the retry after a lost completion: %+v, %v; want the replay", replay, err)
			}
		})
	}
}

// row reads the key's claim straight from the database.
func row(t *testing.T, direct, key string) (token int64, attempt int32, found bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, direct)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	err = conn.QueryRow(ctx, `SELECT token, attempt FROM idempotency_records WHERE idem_key = $1`, key).Scan(&token, &attempt)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, 0, false
	}
	if err != nil {
		t.Fatal(err)
	}
	return token, attempt, true
}
