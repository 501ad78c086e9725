package crdb

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemledger/idemledger/internal/pgtest"
	"github.com/idemledger/idemledger/ledger"
	"github.com/idemledger/idemledger/ledger/ledgertest"
)

func mustHomes(t *testing.T, text string) *Homes {
	t.Helper()
	h, err := ParseHomes(strings.NewReader(text))
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// twoRegions homes the tenants near-* in "near" (the default) and far-* in
// "far".
const twoRegions = `
region near primary
region far
default near
tenant far-1 far
tenant far-2 far
`

func regionClaim(tenant, key string) ledger.ClaimParams {
	return ledger.ClaimParams{Scope: ledger.Scope{Namespace: "billing", Tenant: tenant, Key: key},
		Fingerprint: ledgertest.Fingerprint("p"), Method: ledgertest.Method, Lease: time.Minute, Retention: time.Hour}
}

// TestRegionBatches: with homes, a mixed load of two regions' tenants makes
// batches of one region each, and while the far region's batch is stuck
// (a row it claims is locked) the near region's calls run to the end.
// Region-blind batching, with one batch in flight, would queue them
// behind it.
func TestRegionBatches(t *testing.T) {
	ctx := t.Context()
	url := pgtest.NewDatabase(t)
	h := mustHomes(t, twoRegions)
	s, err := Open(ctx, url, Config{Batching: true, BatchInFlight: 1, Homes: h})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	if _, err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	sizes := map[string][]int{}
	s.batchRan = func(region string, scopes []ledger.Scope) {
		for _, sc := range scopes {
			if got := h.Home(sc.Tenant); got != region {
				t.Errorf("a batch of region %s holds tenant %s of region %s", region, sc.Tenant, got)
			}
		}
		mu.Lock()
		sizes[region] = append(sizes[region], len(scopes))
		mu.Unlock()
	}

	// A mixed load: 32 callers, each claiming keys of both regions' tenants.
	var wg sync.WaitGroup
	tenants := []string{"near-1", "far-1", "near-2", "far-2"}
	for c := range 32 {
		wg.Go(func() {
			for i := range 16 {
				if _, err := s.Claim(ctx, regionClaim(tenants[(c+i)%4], fmt.Sprint("mixed-", c, "-", i))); err != nil {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	mu.Lock()
	for _, region := range []string{"near", "far"} {
		if largest := maxOf(sizes[region]); largest < 2 {
			t.Errorf("region %s ran %d batches, none of more than one call: the load did not batch", region, len(sizes[region]))
		}
	}
	mu.Unlock()
	stats := s.BatchStatsByRegion()
	if stats["near"].Calls+stats["far"].Calls != 32*16 || len(stats) != 2 {
		t.Errorf("BatchStatsByRegion = %+v, want the 512 calls split over near and far", stats)
	}

	// The far region's batch is stuck on a locked row.
	if _, err := s.Claim(ctx, regionClaim("far-1", "held")); err != nil {
		t.Fatal(err)
	}
	hold := lockRows(t, url, "tenant = 'far-1' AND idem_key = 'held'")
	far := s.ops["far"]
	wg.Go(func() {
		if _, err := s.Claim(ctx, regionClaim("far-1", "held")); err != nil {
			t.Error(err)
		}
	})
	// Poll the batcher until PostgreSQL holds its batch on the lock.
	ledgertest.Eventually(t, 5*time.Second, func() bool {
		far.mu.Lock()
		defer far.mu.Unlock()
		return far.inFlight == 1
	}, "the far claim of the held row runs")
	for i := range 4 {
		wg.Go(func() {
			if _, err := s.Claim(ctx, regionClaim("far-2", fmt.Sprint("behind-", i))); err != nil {
				t.Error(err)
			}
		})
	}
	var near sync.WaitGroup
	for i := range 8 {
		near.Go(func() {
			if _, err := s.Claim(ctx, regionClaim("near-1", fmt.Sprint("local-", i))); err != nil {
				t.Error(err)
			}
		})
	}
	near.Wait()
	far.mu.Lock()
	stuck := far.inFlight == 1
	far.mu.Unlock()
	if !stuck {
		t.Error("the far batch ended before the near calls: the test proves nothing")
	}
	if err := hold.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
}

func maxOf(xs []int) int {
	m := 0
	for _, x := range xs {
		m = max(m, x)
	}
	return m
}
