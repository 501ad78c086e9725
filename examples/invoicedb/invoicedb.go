// Package invoicedb is the examples' own invoice database: an append-only
// table of invoice rows with no unique constraint on the idempotency key,
// so that a write the guard failed to deduplicate shows as a second row.
// Postgres is the database a service runs on: each invoice is written in
// one transaction with its key's fence (module interceptors/fence), and
// a crash at any moment leaves neither a second invoice nor an unknown
// outcome. File keeps the rows in a file or in memory, for the tests and
// demos that have no database; a method on it reconciles a takeover by
// the key instead (FindByKey).
package invoicedb

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"github.com/idemledger/idemledger/interceptors/fence/fencepgx"
)

// DB is an invoice database: Postgres or File.
type DB interface {
	// Insert writes a new invoice of the tenant's key, numbered after the
	// tenant's last, and returns it once it is durable. On Postgres the
	// same transaction writes the fence of the guarded run ctx belongs
	// to, holding answer(invoice): what the handler returns for it.
	Insert(ctx context.Context, tenant, key string, token uint64, build func(number int64) Invoice, answer func(Invoice) any) (Invoice, error)
	// FindByKey returns the first invoice a tenant's key wrote.
	FindByKey(ctx context.Context, tenant, key string) (Invoice, bool, error)
	// Get returns a tenant's invoice by id.
	Get(ctx context.Context, tenant, id string) (Invoice, bool, error)
	// List returns a tenant's invoices in the order they were written.
	List(ctx context.Context, tenant string) ([]Invoice, error)
	// Rows returns every row.
	Rows(ctx context.Context) ([]Row, error)
	// Fence is the fence table for guard.Policy.Fence; nil for File,
	// which has none.
	Fence() *fencepgx.Table
	Close() error
}

// Invoice is an invoice as the tools show it.
type Invoice struct {
	ID          string    `json:"id"`
	Number      int64     `json:"number"`
	Customer    string    `json:"customer"`
	Currency    string    `json:"currency"`
	AmountCents int64     `json:"amount_cents"`
	CreatedAt   time.Time `json:"created_at"`
}

// Row is an invoice row of the store, with the tenant, the idempotency
// key and the token of the attempt that wrote it.
type Row struct {
	Tenant  string  `json:"tenant"`
	Key     string  `json:"key"`
	Token   uint64  `json:"token"`
	Invoice Invoice `json:"invoice"`
}

// File is an invoice database in a file (one JSON row a line, fsynced)
// or in memory. It is safe for concurrent use.
type File struct {
	mu   sync.Mutex
	f    *os.File // nil in memory
	rows []Row
}

var _ DB = (*File)(nil)

// OpenFile opens the database in the file at path, creating it, or an
// empty one in memory when path is "".
func OpenFile(path string) (*File, error) {
	s := &File{}
	if path == "" {
		return s, nil
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	data, err := io.ReadAll(f)
	if err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	// Every acknowledged row is a whole line; a torn last line (a crash
	// mid-write) was never acknowledged, and is cut so that the next row
	// starts on a line of its own.
	good := 0
	for {
		i := bytes.IndexByte(data[good:], '\n')
		var r Row
		if i < 0 || json.Unmarshal(data[good:good+i], &r) != nil {
			break
		}
		s.rows = append(s.rows, r)
		good += i + 1
	}
	if good < len(data) {
		if err := f.Truncate(int64(good)); err != nil {
			_ = f.Close()
			return nil, fmt.Errorf("cut the torn end of %s: %w", path, err)
		}
	}
	s.f = f
	return s, nil
}

// Close closes the file.
func (s *File) Close() error {
	if s.f == nil {
		return nil
	}
	return s.f.Close()
}

// Insert implements DB; File has no fence, and ignores answer.
func (s *File) Insert(_ context.Context, tenant, key string, token uint64, build func(number int64) Invoice, _ func(Invoice) any) (Invoice, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var n int64
	for _, r := range s.rows {
		if r.Tenant == tenant {
			n = max(n, r.Invoice.Number)
		}
	}
	row := Row{Tenant: tenant, Key: key, Token: token, Invoice: build(n + 1)}
	if s.f != nil {
		b, err := json.Marshal(row)
		if err != nil {
			return Invoice{}, err
		}
		if _, err := s.f.Write(append(b, '\n')); err != nil {
			return Invoice{}, fmt.Errorf("write invoice: %w", err)
		}
		if err := s.f.Sync(); err != nil {
			return Invoice{}, fmt.Errorf("sync invoice: %w", err)
		}
	}
	s.rows = append(s.rows, row)
	return row.Invoice, nil
}

// FindByKey implements DB.
func (s *File) FindByKey(_ context.Context, tenant, key string) (Invoice, bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, r := range s.rows {
		if r.Tenant == tenant && r.Key == key {
			return r.Invoice, true, nil
		}
	}
	return Invoice{}, false, nil
}

// Get implements DB.
func (s *File) Get(_ context.Context, tenant, id string) (Invoice, bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, r := range s.rows {
		if r.Tenant == tenant && r.Invoice.ID == id {
			return r.Invoice, true, nil
		}
	}
	return Invoice{}, false, nil
}

// List implements DB.
func (s *File) List(_ context.Context, tenant string) ([]Invoice, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []Invoice
	for _, r := range s.rows {
		if r.Tenant == tenant {
			out = append(out, r.Invoice)
		}
	}
	return out, nil
}

// Rows implements DB.
func (s *File) Rows(context.Context) ([]Row, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Row(nil), s.rows...), nil
}

// Fence implements DB: File has none.
func (s *File) Fence() *fencepgx.Table { return nil }
