// Package invoice is the example write service: an InvoiceService whose
// CreateInvoice writes an invoice row to the service's own store, made
// idempotent by the ledger's interceptor (package grpcguard). It imports
// only what a write service imports: the generated code, the interceptor
// and the ledger's types.
package invoice

import (
	"context"
	"fmt"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	invoicev1 "github.com/idemledger/idemledger/examples/gen/invoice/v1"
	"github.com/idemledger/idemledger/interceptors/guard"
)

// CreateInvoiceMethod is the protected method.
const CreateInvoiceMethod = "/idemledger.examples.invoice.v1.InvoiceService/CreateInvoice"

// Row is an invoice row of the store, with the idempotency key and the
// fencing token of the attempt that wrote it.
type Row struct {
	Invoice *invoicev1.Invoice
	Key     string
	Token   uint64
}

// DB is the service's own database: Postgres, where each invoice is
// written with its key's fence, or the in-memory Store.
type DB interface {
	// Write writes the invoice of one attempt, numbered after the
	// tenant's last, and returns it.
	Write(ctx context.Context, c guard.Claim, build func(number int64) *invoicev1.Invoice) (*invoicev1.Invoice, error)
	// Find returns the invoice a tenant's key wrote, if any.
	Find(ctx context.Context, tenant, key string) (*invoicev1.Invoice, bool, error)
	// Rows returns every row.
	Rows(ctx context.Context) ([]Row, error)
}

// Store is the service's database in memory: a table of invoice rows and a
// counter of invoice numbers per tenant. It has no unique constraint on the
// idempotency key, so a write the ledger failed to deduplicate would show
// as a second row for one key. It is safe for concurrent use.
type Store struct {
	// Unfenced turns the fence off: every attempt inserts a row. The demo
	// uses it to show what the fence is for.
	Unfenced bool

	mu    sync.Mutex
	rows  []Row
	next  map[string]int64
	byKey map[string]int // tenant + "/" + key -> index of the first row
}

// NewStore returns an empty Store.
func NewStore() *Store { return &Store{next: map[string]int64{}, byKey: map[string]int{}} }

// Write writes the invoice of one attempt, in one transaction, fenced by
// the attempt's token: when an earlier attempt of the same key already
// wrote its row (it crashed before the ledger heard of it), that row is the
// answer; when a later attempt (a higher token) wrote it, this attempt has
// lost its claim and fails. This check is what the ledger's token is for:
// it closes the window between a handler's commit and its Complete.
func (s *Store) Write(_ context.Context, c guard.Claim, build func(number int64) *invoicev1.Invoice) (*invoicev1.Invoice, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	id := c.Tenant + "/" + c.Key
	if i, ok := s.byKey[id]; ok && !s.Unfenced {
		if s.rows[i].Token > c.Token {
			return nil, status.Error(codes.Aborted, "a later attempt owns this invoice")
		}
		return s.rows[i].Invoice, nil
	}
	s.next[c.Tenant]++
	inv := build(s.next[c.Tenant])
	if _, ok := s.byKey[id]; !ok {
		s.byKey[id] = len(s.rows)
	}
	s.rows = append(s.rows, Row{Invoice: inv, Key: c.Key, Token: c.Token})
	return inv, nil
}

// Find returns the invoice a tenant's key wrote, if any: the lookup that
// reconciles an earlier attempt (Service.Reconcile).
func (s *Store) Find(_ context.Context, tenant, key string) (*invoicev1.Invoice, bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	i, ok := s.byKey[tenant+"/"+key]
	if !ok {
		return nil, false, nil
	}
	return s.rows[i].Invoice, true, nil
}

// Rows returns a copy of every row.
func (s *Store) Rows(context.Context) ([]Row, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Row(nil), s.rows...), nil
}

// Service is the InvoiceService.
type Service struct {
	invoicev1.UnimplementedInvoiceServiceServer
	Store DB
	// BeforeWrite and AfterWrite, when set, run around the write; the demo
	// crashes the handler there.
	BeforeWrite, AfterWrite func(ctx context.Context)
}

// Reconcile is CreateInvoice's reconcile function (grpcguard.Method's
// Reconcile): on a takeover, the interceptor asks it whether the earlier
// attempt's invoice was written, and the service looks for its own row by
// the key. Found, it is the answer, and CreateInvoice does not run again;
// not found, CreateInvoice runs. A store that cannot answer would return
// an error: the call then fails UNAVAILABLE and is retried later.
func (s *Service) Reconcile(ctx context.Context, _ proto.Message) (proto.Message, error) {
	c, ok := guard.ClaimFromContext(ctx)
	if !ok {
		return nil, status.Error(codes.FailedPrecondition, "Reconcile runs behind the idempotency interceptor")
	}
	inv, ok, err := s.Store.Find(ctx, c.Tenant, c.Key)
	if !ok || err != nil {
		return nil, err
	}
	return &invoicev1.CreateInvoiceResponse{Invoice: inv}, nil
}

// CreateInvoice writes an invoice. It must run behind the idempotency
// interceptor: it fences its write with the claim's token.
func (s *Service) CreateInvoice(ctx context.Context, req *invoicev1.CreateInvoiceRequest) (*invoicev1.CreateInvoiceResponse, error) {
	c, ok := guard.ClaimFromContext(ctx)
	if !ok {
		return nil, status.Error(codes.FailedPrecondition, "CreateInvoice runs behind the idempotency interceptor")
	}
	if req.GetCustomerId() == "" || len(req.GetCurrency()) != 3 || len(req.GetLineItems()) == 0 {
		return nil, status.Error(codes.InvalidArgument, "an invoice needs a customer, a currency and at least one line")
	}
	var total int64
	for _, li := range req.GetLineItems() {
		total += li.GetQuantity() * li.GetUnitAmountMicros()
	}
	if s.BeforeWrite != nil {
		s.BeforeWrite(ctx)
	}
	inv, err := s.Store.Write(ctx, c, func(n int64) *invoicev1.Invoice {
		return &invoicev1.Invoice{
			Id: fmt.Sprintf("inv_%s_%06d", req.GetTenant(), n), Tenant: req.GetTenant(), Number: n,
			CustomerId: req.GetCustomerId(), Currency: req.GetCurrency(), TotalMicros: total,
			CreatedAt: timestamppb.New(time.Now()),
		}
	})
	if err != nil {
		return nil, err
	}
	if s.AfterWrite != nil {
		s.AfterWrite(ctx)
	}
	return &invoicev1.CreateInvoiceResponse{Invoice: inv}, nil
}
