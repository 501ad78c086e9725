package invoicedb_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/idemledger/idemledger/examples/invoicedb"
)

// TestStoreSurvivesATornWrite: rows written before a crash are there
// after it, and a torn last line is cut, not joined to the next row.
func TestStoreSurvivesATornWrite(t *testing.T) {
	path := filepath.Join(t.TempDir(), "invoices.jsonl")
	s, err := invoicedb.OpenFile(path)
	if err != nil {
		t.Fatal(err)
	}
	build := func(n int64) invoicedb.Invoice { return invoicedb.Invoice{ID: "inv", Number: n} }
	if _, err := s.Insert(t.Context(), "acme", "k1", 1, build, nil); err != nil {
		t.Fatal(err)
	}
	_ = s.Close()
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = f.WriteString(`{"tenant":"acme","key":"k2","tok`)
	_ = f.Close()
	s, err = invoicedb.OpenFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Insert(t.Context(), "acme", "k3", 1, build, nil); err != nil {
		t.Fatal(err)
	}
	_ = s.Close()
	s, err = invoicedb.OpenFile(path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	rows, _ := s.Rows(t.Context())
	if len(rows) != 2 || rows[0].Key != "k1" || rows[1].Key != "k3" || rows[1].Invoice.Number != 2 {
		t.Fatalf("rows after a torn write: %+v", rows)
	}
}
