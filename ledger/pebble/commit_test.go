package pebble

import (
	"bytes"
	"context"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"

	"github.com/idemledger/idemledger/ledger"
	"github.com/idemledger/idemledger/ledger/errcode"
	"github.com/idemledger/idemledger/ledger/ledgertest"
)

// heldSync is a store whose next sync of the log, once armed, waits until
// it is let go, and which counts the log's syncs from then.
type heldSync struct {
	s       *Store
	armed   atomic.Bool
	syncs   atomic.Int64
	syncing chan struct{} // closed when the held sync has begun
	letGo   chan struct{}
}

func openHeldSync(t *testing.T, dir string) *heldSync {
	h := &heldSync{syncing: make(chan struct{}), letGo: make(chan struct{})}
	fs := errorfs.Wrap(vfs.Default, errorfs.InjectorFunc(func(op errorfs.Op) error {
		isSync := op.Kind == errorfs.OpFileSync || op.Kind == errorfs.OpFileSyncData || op.Kind == errorfs.OpFileSyncTo
		if !isSync || !strings.HasSuffix(op.Path, ".log") || !h.armed.Load() {
			return nil
		}
		if h.syncs.Add(1) == 1 {
			close(h.syncing)
			<-h.letGo
		}
		return nil
	}))
	s, err := Open(dir, Config{fs: fs})
	if err != nil {
		t.Fatal(err)
	}
	h.s = s
	return h
}

// hold arms the hold and starts write, whose sync it holds; it returns
// once that sync has begun, with the channel write's error comes on.
func (h *heldSync) hold(write func() error) <-chan error {
	h.armed.Store(true)
	done := make(chan error, 1)
	go func() { done <- write() }()
	<-h.syncing
	return done
}

// holdClaim claims key with the log's sync held (hold).
func (h *heldSync) holdClaim(t *testing.T, key string) <-chan error {
	return h.hold(func() error {
		_, err := h.s.Claim(t.Context(), claimParams(key))
		return err
	})
}

// claimQueued starts claims of n keys on stripes of their own, none of
// taken's, and returns once all n wait in the commit loop's queue, with
// the keys and the channel their errors come on.
func (h *heldSync) claimQueued(t *testing.T, n int, taken ...string) ([]string, <-chan error) {
	keys := h.keys(n, taken...)
	errs := make(chan error, n)
	for _, k := range keys {
		go func() {
			_, err := h.s.Claim(t.Context(), claimParams(k))
			errs <- err
		}()
	}
	h.queued(n)
	return keys, errs
}

// queued waits until n writes wait in the commit loop's queue.
func (h *heldSync) queued(n int) {
	for {
		h.s.commits.mu.Lock()
		got := len(h.s.commits.queue)
		h.s.commits.mu.Unlock()
		if got >= n {
			return
		}
		runtime.Gosched()
	}
}

// keys returns n keys whose stripes differ from each other and from
// those of taken: a write waits for its stripe's, and these must not.
func (h *heldSync) keys(n int, taken ...string) []string {
	used := map[uint64]bool{}
	for _, k := range taken {
		used[h.s.stripeAt(recordKey(claimParams(k).Scope))] = true
	}
	var keys []string
	for i := 0; len(keys) < n; i++ {
		k := fmt.Sprint("k-", i)
		if at := h.s.stripeAt(recordKey(claimParams(k).Scope)); !used[at] {
			used[at] = true
			keys = append(keys, k)
		}
	}
	return keys
}

func claimParams(key string) ledger.ClaimParams {
	return ledger.ClaimParams{Scope: ledger.Scope{Namespace: "ns", Tenant: "t", Key: key}, Fingerprint: ledgertest.Fingerprint("p"),
		Method: ledgertest.Method, Lease: time.Minute, Retention: time.Hour}
}

// TestWritesDuringASyncShareTheNext: the writes that arrive while the log
// syncs go to the log together, in one batch and one sync, as Redis's
// loop does with what it read during its last fsync; a call that waits
// for its stripe's write still ends at its deadline.
func TestWritesDuringASyncShareTheNext(t *testing.T) {
	t.Parallel()
	h := openHeldSync(t, t.TempDir())
	defer h.s.Close()
	first := h.holdClaim(t, "first")
	const during = 16
	keys, errs := h.claimQueued(t, during, "first")

	// A claim of the syncing key waits for its stripe's lock: no longer
	// than its deadline, with the sync still held.
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	if _, err := h.s.Claim(ctx, claimParams("first")); errcode.Of(err) != errcode.UpstreamTimeout {
		t.Errorf("a claim of the key whose write syncs, past its deadline = %v; want UPSTREAM_TIMEOUT", err)
	}

	close(h.letGo)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	for range during {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if n := h.syncs.Load(); n != 2 {
		t.Errorf("the log synced %d times for a write and the %d that came during its sync; want 2", n, during)
	}
	for _, k := range keys {
		if _, err := h.s.Get(t.Context(), claimParams(k).Scope); err != nil {
			t.Errorf("claim %s of the group: %v", k, err)
		}
	}
}

// TestAGroupIsBounded: writes that together pass maxGroupBytes go to the
// log in more than one batch, so that a group of large outcomes never
// makes a batch Pebble would turn into a memtable of its own; a write
// larger than the bound is a group of its own.
func TestAGroupIsBounded(t *testing.T) {
	t.Parallel()
	s, err := Open(t.TempDir(), Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	batch := func(size int) *write {
		b := s.db.NewBatch()
		if err := b.Set([]byte("k"), bytes.Repeat([]byte("v"), size), nil); err != nil {
			t.Fatal(err)
		}
		return &write{b: b}
	}
	c := newCommits()
	for _, size := range []int{100, maxGroupBytes / 2, maxGroupBytes / 2, 2 * maxGroupBytes, 100, 100} {
		c.add(batch(size))
	}
	var groups []int
	for {
		group := c.take(nil)
		if len(group) == 0 {
			break
		}
		groups = append(groups, len(group))
		for _, w := range group {
			_ = w.b.Close()
		}
	}
	if want := []int{2, 1, 1, 2}; !slices.Equal(groups, want) {
		t.Errorf("writes of 100 B, two of half the bound, twice the bound, 100 B twice went in groups of %v; want %v", groups, want)
	}
}

// TestCloseCommitsWhatIsQueued: Close lets the commit loop commit the
// writes queued before it, and answers them; they are there after the
// store opens again.
func TestCloseCommitsWhatIsQueued(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	h := openHeldSync(t, dir)
	first := h.holdClaim(t, "first")
	const queued = 4
	keys, errs := h.claimQueued(t, queued, "first")
	closed := make(chan error, 1)
	go func() { closed <- h.s.Close() }()
	close(h.letGo)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	for range queued {
		if err := <-errs; err != nil {
			t.Fatalf("a write queued before Close: %v", err)
		}
	}
	if err := <-closed; err != nil {
		t.Fatal(err)
	}
	s, err := Open(dir, Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for _, k := range keys {
		if _, err := s.Get(t.Context(), claimParams(k).Scope); err != nil {
			t.Errorf("write %s queued before Close, after the store opened again: %v", k, err)
		}
	}
}
