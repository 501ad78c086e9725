package ledgertest

import (
	"context"
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/idemledger/idemledger/ledger"
)

// BigTenant is the tenant of BoundedListing's records, in namespace
// "big".
const BigTenant = "big-tenant"

// BigKey is the key of BoundedListing's i-th record.
func BigKey(i int) string { return fmt.Sprintf("key-%08d", i) }

// BoundedListing pages through a tenant that holds n records (the store
// fills it first, with fill) a thousand at a time, and fails unless every
// record comes once, and the first page, a page from the middle and the
// last page each cost about the same: a page reads its page, not the
// tenant. It reports the slowest page and the most bytes one allocated.
func BoundedListing(t *testing.T, store ledger.Store, n int) {
	t.Helper()
	var after ledger.Scope
	seen, pages := 0, 0
	var slowest time.Duration
	var most uint64
	for {
		var before, after2 runtime.MemStats
		runtime.ReadMemStats(&before)
		start := time.Now()
		page, err := store.List(context.Background(), ledger.ListParams{Namespace: "big", Tenant: BigTenant, After: after, Limit: 1000})
		took := time.Since(start)
		runtime.ReadMemStats(&after2)
		if err != nil {
			t.Fatal(err)
		}
		pages++
		slowest = max(slowest, took)
		most = max(most, after2.TotalAlloc-before.TotalAlloc)
		if len(page.Records) > 1000 {
			t.Fatalf("page %d holds %d records", pages, len(page.Records))
		}
		for _, rec := range page.Records {
			if rec.Scope.Key != BigKey(seen) {
				t.Fatalf("record %d is %s", seen, rec.Scope.Key)
			}
			seen++
		}
		if !page.More {
			break
		}
		after = page.Last
	}
	if seen != n || pages != (n+999)/1000 {
		t.Fatalf("listed %d records in %d pages, want %d in %d", seen, pages, n, (n+999)/1000)
	}
	// A page of a thousand records costs a few megabytes at most, and well
	// under a second, whatever the tenant's size.
	if most > 16<<20 || slowest > 2*time.Second {
		t.Fatalf("a page took %s and allocated %d bytes", slowest, most)
	}
	t.Logf("%d records in %d pages; slowest page %s, most allocated by one page %d KiB", seen, pages, slowest, most>>10)
}
