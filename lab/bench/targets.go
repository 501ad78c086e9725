package bench

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/protobuf/types/known/anypb"

	invoicev1 "github.com/idemledger/idemledger/examples/gen/invoice/v1"
	ledgerv1 "github.com/idemledger/idemledger/gen/idemledger/v1"
	"github.com/idemledger/idemledger/internal/backoff"
	"github.com/idemledger/idemledger/ledger"
	"github.com/idemledger/idemledger/ledger/crdb"
	"github.com/idemledger/idemledger/ledger/errcode"
	"github.com/idemledger/idemledger/ledger/ledgerstatus"
	"github.com/idemledger/idemledger/ledger/ledgertest"
)

// The work every target does: a fixed method and fingerprint.
var (
	method      = "/idemledger.examples.invoice.v1.InvoiceService/CreateInvoice"
	fingerprint = ledgertest.Fingerprint("create invoice 42 EUR")
)

// DefaultOutcomeSize is the size of the response a pair stores unless
// told otherwise: an invoice's.
const DefaultOutcomeSize = 80

// Outcome is what a fresh pair stores: a response of a given size, as a
// ledger call carries it and as the store keeps it.
type Outcome struct {
	size   int
	msg    *ledgerv1.Outcome
	stored []byte // ledger.Outcome.MarshalBinary
}

// Size is the bytes of the outcome's response.
func (o *Outcome) Size() int { return o.or().size }

// NewOutcome is an outcome whose response is size bytes.
func NewOutcome(size int) (*Outcome, error) {
	resp := &anypb.Any{TypeUrl: "type.googleapis.com/idemledger.examples.invoice.v1.CreateInvoiceResponse", Value: bytes.Repeat([]byte{0x2a}, size)}
	b, err := (&ledger.Outcome{Response: resp}).MarshalBinary()
	if err != nil {
		return nil, err
	}
	return &Outcome{size: size, msg: &ledgerv1.Outcome{Result: &ledgerv1.Outcome_Response{Response: resp}}, stored: b}, nil
}

var defaultOutcome = func() *Outcome {
	o, err := NewOutcome(DefaultOutcomeSize)
	if err != nil {
		panic(err)
	}
	return o
}()

// or is o, or the default outcome when o is nil.
func (o *Outcome) or() *Outcome {
	if o == nil {
		return defaultOutcome
	}
	return o
}

// ReplayKeys is how many completed keys the replay workload cycles over.
const ReplayKeys = 1000

// HotKeys is how many keys the hot workload contends on.
const HotKeys = 4

// Ledger is the work against a LedgerService.
type Ledger struct {
	Client ledgerv1.LedgerServiceClient
	Tenant string
	Prefix string // keeps keys of different measurements apart
	// Outcome is what Fresh completes with; nil: DefaultOutcomeSize.
	Outcome *Outcome
}

// Fresh claims a key nobody used and completes it.
func (l *Ledger) Fresh() Op {
	out := l.Outcome.or().msg
	return func(ctx context.Context, c int, n int64) error {
		key := fmt.Sprintf("%s-f-%d-%d", l.Prefix, c, n)
		res, err := l.Client.Begin(ctx, &ledgerv1.BeginRequest{Tenant: l.Tenant, Key: key, Fingerprint: fingerprint, Method: method})
		if err != nil {
			return err
		}
		_, err = l.Client.Complete(ctx, &ledgerv1.CompleteRequest{Tenant: l.Tenant, Key: key, Token: res.GetClaim().GetToken(), Outcome: out})
		return err
	}
}

// PrepareReplays completes the keys Replay cycles over.
func (l *Ledger) PrepareReplays(ctx context.Context) error { return prepareReplays(ctx, l.Fresh()) }

// prepareReplays runs fresh on the ReplayKeys keys that Replay reads
// (client -1, n from 0).
func prepareReplays(ctx context.Context, fresh Op) error {
	for i := range ReplayKeys {
		if err := fresh(ctx, -1, int64(i)); err != nil {
			return err
		}
	}
	return nil
}

// Replay begins a completed key: the ledger answers its outcome.
func (l *Ledger) Replay() Op {
	return func(ctx context.Context, c int, n int64) error {
		key := fmt.Sprintf("%s-f--1-%d", l.Prefix, (int64(c)*7919+n)%ReplayKeys)
		res, err := l.Client.Begin(ctx, &ledgerv1.BeginRequest{Tenant: l.Tenant, Key: key, Fingerprint: fingerprint, Method: method})
		if err == nil && res.GetReplay() == nil {
			return errors.New("bench: no replay")
		}
		return err
	}
}

// Hot begins one of HotKeys keys: the winner releases it at once, the
// others are told IN_PROGRESS (which counts as done).
func (l *Ledger) Hot() Op {
	return func(ctx context.Context, c int, n int64) error {
		key := fmt.Sprintf("%s-h-%d", l.Prefix, (int64(c)+n)%HotKeys)
		res, err := l.Client.Begin(ctx, &ledgerv1.BeginRequest{Tenant: l.Tenant, Key: key, Fingerprint: fingerprint, Method: method})
		if err != nil {
			if le := ledgerstatus.FromError(err); le.Code == errcode.InProgress {
				return nil
			}
			return err
		}
		_, err = l.Client.Release(ctx, &ledgerv1.ReleaseRequest{Tenant: l.Tenant, Key: key, Token: res.GetClaim().GetToken()})
		return err
	}
}

// SQL is the same work as Ledger, as the store's statements sent straight
// through pgx (crdb.Statements), retried on serialization failures.
type SQL struct {
	Pool    *pgxpool.Pool
	Prefix  string
	Outcome *Outcome // nil: DefaultOutcomeSize
}

// claim runs the claim statement and says whether the claim is ours, with
// its token.
func (s *SQL) claim(ctx context.Context, key string) (token int64, ours bool, err error) {
	nonce := make([]byte, 16)
	_, _ = rand.Read(nonce)
	err = retry(ctx, func() error {
		var (
			ns, tenant, k, m, fp, source string
			state                        int16
			attempt                      int32
			created, lease, expires, now time.Time
			completed, forget            *time.Time
			outcome, claimID             []byte
			policy                       int16
		)
		err := s.Pool.QueryRow(ctx, crdb.Statements.Claim, nil, "bench", "sql", key, method, fingerprint,
			int64(30e6), int64(86400e6), nil, nonce, 0, int64(7*86400e6), "").Scan(&ns, &tenant, &k, &state, &m, &fp, &token, &attempt,
			&created, &lease, &completed, &expires, &outcome, &claimID, &policy, &forget, &source, &now)
		ours = err == nil && state == 1 && bytes.Equal(claimID, nonce)
		return err
	})
	return token, ours, err
}

// cas runs a compare-and-set statement (Complete or Release).
func (s *SQL) cas(ctx context.Context, sql string, args ...any) error {
	return retry(ctx, func() error {
		rows, err := s.Pool.Query(ctx, sql, args...)
		if err != nil {
			return err
		}
		rows.Close()
		return rows.Err()
	})
}

// Fresh claims a fresh key and completes it: two statements.
func (s *SQL) Fresh() Op {
	stored := s.Outcome.or().stored
	return func(ctx context.Context, c int, n int64) error {
		key := fmt.Sprintf("%s-f-%d-%d", s.Prefix, c, n)
		token, ours, err := s.claim(ctx, key)
		if err != nil {
			return err
		}
		if !ours {
			return errors.New("bench: not claimed")
		}
		return s.cas(ctx, crdb.Statements.Complete, nil, "bench", "sql", key, token, stored)
	}
}

// PrepareReplays completes the keys Replay cycles over.
func (s *SQL) PrepareReplays(ctx context.Context) error { return prepareReplays(ctx, s.Fresh()) }

// Replay runs the claim statement on a completed key.
func (s *SQL) Replay() Op {
	return func(ctx context.Context, c int, n int64) error {
		_, ours, err := s.claim(ctx, fmt.Sprintf("%s-f--1-%d", s.Prefix, (int64(c)*7919+n)%ReplayKeys))
		if err == nil && ours {
			return errors.New("bench: a completed key was claimed")
		}
		return err
	}
}

// Hot claims one of HotKeys keys and, when it won, releases it.
func (s *SQL) Hot() Op {
	return func(ctx context.Context, c int, n int64) error {
		key := fmt.Sprintf("%s-h-%d", s.Prefix, (int64(c)+n)%HotKeys)
		token, ours, err := s.claim(ctx, key)
		if err != nil || !ours {
			return err
		}
		return s.cas(ctx, crdb.Statements.Release, nil, "bench", "sql", key, token)
	}
}

// The backoff between direct SQL's retries: ledgerd's PostgreSQL store's
// (crdb.Config's RetryBase and RetryCap defaults).
const (
	retryBase = 2 * time.Millisecond
	retryCap  = 200 * time.Millisecond
)

// retry runs fn again on serialization failures (SQLSTATE 40001) after a
// full-jitter backoff, as ledgerd's store does: direct SQL is the peer a
// careful user would write, not a storm of retries at once, which under
// SERIALIZABLE conflicts again and collapses from 32 clients.
func retry(ctx context.Context, fn func() error) error {
	for attempt := 1; ; attempt++ {
		err := fn()
		var pe *pgconn.PgError
		if !errors.As(err, &pe) || pe.Code != "40001" {
			return err
		}
		if err := backoff.Sleep(ctx, backoff.FullJitter(retryBase, retryCap, attempt+1)+time.Microsecond); err != nil {
			return err
		}
	}
}

// Invoices is a write RPC: CreateInvoice with a fresh key each time.
type Invoices struct {
	Client invoicev1.InvoiceServiceClient
	Prefix string
}

// Write creates an invoice.
func (v *Invoices) Write() Op {
	return func(ctx context.Context, c int, n int64) error {
		_, err := v.Client.CreateInvoice(ctx, &invoicev1.CreateInvoiceRequest{
			RequestId: fmt.Sprintf("%s-%d-%d", v.Prefix, c, n), Tenant: "acme", CustomerId: "cus_1", Currency: "EUR",
			LineItems: []*invoicev1.LineItem{{Description: "seats", Quantity: 3, UnitAmountMicros: 14_000_000}},
		})
		return err
	}
}
