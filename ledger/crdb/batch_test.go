package crdb

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestBatcherCoalescesAndRecovers: calls that arrive while a batch runs are
// answered by the next batch, one per scope, at most max at a time; a call
// whose caller is gone before it runs does not wedge the batcher.
func TestBatcherCoalescesAndRecovers(t *testing.T) {
	var batches, largest atomic.Int64
	release := make(chan struct{})
	b := &batcher[int, int]{max: 4, maxInFlight: 1, run: func(_ context.Context, calls []*call[int, int]) {
		if batches.Add(1) == 1 {
			<-release // hold the first batch while the others queue
		}
		seen := map[string]bool{}
		for _, c := range calls {
			if seen[c.key] {
				t.Errorf("scope %s twice in one batch", c.key)
			}
			seen[c.key] = true
			c.done <- result[int]{r: c.p * 10}
		}
		if n := int64(len(calls)); n > largest.Load() {
			largest.Store(n)
		}
	}}
	var wg sync.WaitGroup
	wg.Go(func() {
		if r, err := b.do(context.Background(), "first", 1); err != nil || r != 10 {
			t.Errorf("first call = %d, %v", r, err)
		}
	})
	time.Sleep(20 * time.Millisecond)
	// A caller gone before its call runs.
	gone, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := b.do(gone, "gone", 0); err == nil {
		t.Error("a canceled call succeeded")
	}
	for i := range 9 {
		wg.Go(func() {
			key := fmt.Sprint("k", i%3) // three scopes, three calls each
			if r, err := b.do(context.Background(), key, i); err != nil || r != i*10 {
				t.Errorf("call %d = %d, %v", i, r, err)
			}
		})
	}
	time.Sleep(20 * time.Millisecond)
	close(release)
	wg.Wait()
	if largest.Load() > 4 || largest.Load() < 2 || batches.Load() > 6 {
		t.Fatalf("%d batches, the largest of %d calls: want coalescing, at most 4 a batch", batches.Load(), largest.Load())
	}
	// A canceled call on an idle batcher, then a lone call: it still runs
	// (nothing is wedged).
	if _, err := b.do(gone, "gone-again", 0); err == nil {
		t.Error("a canceled call succeeded")
	}
	ctx, cancelCtx := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancelCtx()
	if r, err := b.do(ctx, "last", 7); err != nil || r != 70 {
		t.Fatalf("a lone call after a canceled one = %d, %v", r, err)
	}
}
