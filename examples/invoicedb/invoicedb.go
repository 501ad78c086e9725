// Package invoicedb is the examples' own invoice database: an append-only
// table of invoice rows with no unique constraint on the idempotency key,
// so that a write the guard failed to deduplicate shows as a second row.
package invoicedb

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sync"
	"time"
)

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

// Store is the tool server's own database: an append-only table of invoice
// rows, in a file (one JSON row a line, fsynced) or in memory. It has no
// unique constraint on the idempotency key: a write the guard failed to
// deduplicate shows as a second row for one key. It is safe for concurrent
// use.
type Store struct {
	mu   sync.Mutex
	f    *os.File // nil in memory
	rows []Row
}

// OpenStore opens the store in the file at path, creating it, or an
// empty store in memory when path is "".
func OpenStore(path string) (*Store, error) {
	s := &Store{}
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
func (s *Store) Close() error {
	if s.f == nil {
		return nil
	}
	return s.f.Close()
}

// Insert writes a new invoice for the tenant, numbered after the tenant's
// last, and returns it once it is durable.
func (s *Store) Insert(tenant, key string, token uint64, build func(number int64) Invoice) (Invoice, error) {
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

// FindByKey returns the first invoice a tenant's key wrote.
func (s *Store) FindByKey(tenant, key string) (Invoice, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, r := range s.rows {
		if r.Tenant == tenant && r.Key == key {
			return r.Invoice, true
		}
	}
	return Invoice{}, false
}

// Get returns a tenant's invoice by id.
func (s *Store) Get(tenant, id string) (Invoice, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, r := range s.rows {
		if r.Tenant == tenant && r.Invoice.ID == id {
			return r.Invoice, true
		}
	}
	return Invoice{}, false
}

// List returns a tenant's invoices in the order they were written.
func (s *Store) List(tenant string) []Invoice {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []Invoice
	for _, r := range s.rows {
		if r.Tenant == tenant {
			out = append(out, r.Invoice)
		}
	}
	return out
}

// Rows returns a copy of every row.
func (s *Store) Rows() []Row {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Row(nil), s.rows...)
}
