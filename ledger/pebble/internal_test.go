package pebble

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	pebbledb "github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"

	"github.com/idemledger/idemledger/ledger"
	"github.com/idemledger/idemledger/ledger/errcode"
	"github.com/idemledger/idemledger/ledger/ledgertest"
	"github.com/idemledger/idemledger/ledger/pebble/internal/recordkv"
)

// TestConformance runs the conformance suite, its sweep rules included.
func TestConformance(t *testing.T) {
	ledgertest.Suite{
		NewStore: func(t *testing.T, now func() time.Time) ledger.Store {
			s, err := Open(t.TempDir(), Config{Now: now, SweepInterval: 10 * time.Millisecond, SweepBatch: 2})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = s.Close() })
			return s
		},
		Count: func(t *testing.T, s ledger.Store, ns string) int { return s.(*Store).count(t, ns) },
	}.Run(t)
}

// count counts the records of namespace, expired or not, and checks that
// the expiry index holds exactly one entry for each record, at the
// record's IndexAt, all from one snapshot (a sweep may run meanwhile).
func (s *Store) count(t *testing.T, namespace string) int {
	t.Helper()
	snap := s.db.NewSnapshot()
	defer snap.Close()
	keys := func(pre []byte, each func(k, v []byte)) (n int) {
		it, err := snap.NewIter(&pebbledb.IterOptions{LowerBound: pre, UpperBound: upperBound(pre)})
		if err != nil {
			t.Fatal(err)
		}
		defer it.Close()
		for valid := it.First(); valid; valid = it.Next() {
			each(it.Key(), it.Value())
			n++
		}
		return n
	}
	index := map[string]bool{}
	keys(expiryPrefix, func(k, _ []byte) { index[string(k)] = true })
	records := keys(recordPrefix, func(k, v []byte) {
		scope, err := recordkv.DecodeScopeKey(k[len(recordPrefix):])
		if err != nil {
			t.Fatal(err)
		}
		rec, err := recordkv.Decode(scope, v)
		if err != nil {
			t.Fatal(err)
		}
		if want := indexKey(&rec, k); !index[string(want)] {
			t.Fatalf("the record of %v (%v) has no expiry index entry at %s", scope, rec.State, recordkv.IndexAt(&rec))
		}
	})
	if records != len(index) {
		t.Fatalf("%d records but %d expiry index entries", records, len(index))
	}
	return keys(prefix(namespace, ""), func(_, _ []byte) {})
}

func TestUpperBound(t *testing.T) {
	for _, tc := range []struct{ in, want []byte }{
		{[]byte("r"), []byte("s")},
		{[]byte{'r', 0xff}, []byte("s")},
		{[]byte{0xff, 0xff}, nil},
	} {
		if got := upperBound(tc.in); !bytes.Equal(got, tc.want) {
			t.Errorf("upperBound(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

// TestCorruptBlockIsInternal: 16 KiB of random bytes in the middle of a
// table. Either Open refuses the store (it saw the damage), or the process
// stays up: the reads of the keys the damaged block holds fail INTERNAL,
// not retryable, the others are answered, and Ping (readiness) says the
// store is damaged. Pebble's default would end the process at the first
// read of the block.
func TestCorruptBlockIsInternal(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir, Config{})
	if err != nil {
		t.Fatal(err)
	}
	const n = 3000
	outcome := ledgertest.Response(string(bytes.Repeat([]byte("o"), 300)))
	for i := range n {
		sc := ledger.Scope{Namespace: "ns", Tenant: "t", Key: fmt.Sprintf("k-%05d", i)}
		res, err := s.Claim(t.Context(), ledger.ClaimParams{Scope: sc, Fingerprint: ledgertest.Fingerprint("p"), Method: ledgertest.Method, Lease: time.Minute, Retention: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.Complete(t.Context(), ledger.CompleteParams{Scope: sc, Token: res.Record.Token, Outcome: outcome}); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.db.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	tables, err := filepath.Glob(filepath.Join(dir, DirName, "*.sst"))
	if err != nil || len(tables) == 0 {
		t.Fatalf("no table to damage: %v, %v", tables, err)
	}
	var largest string
	var size int64
	for _, f := range tables {
		if st, err := os.Stat(f); err == nil && st.Size() > size {
			largest, size = f, st.Size()
		}
	}
	if size < 64<<10 {
		t.Fatalf("the largest table is %d bytes: too small to damage a block in its middle", size)
	}
	f, err := os.OpenFile(largest, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	junk := make([]byte, 16<<10)
	_, _ = rand.Read(junk)
	if _, err := f.WriteAt(junk, size/2-8<<10); err != nil {
		t.Fatal(err)
	}
	_ = f.Close()

	s, err = Open(dir, Config{})
	if errors.Is(err, ErrRefused) {
		return // refused at start: the check saw the damage
	}
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	damaged, fine := 0, 0
	for i := range n {
		_, err := s.Get(t.Context(), ledger.Scope{Namespace: "ns", Tenant: "t", Key: fmt.Sprintf("k-%05d", i)})
		switch le := errcode.As(err); {
		case err == nil:
			fine++
		case le.Code == errcode.Internal && !le.Retryable():
			damaged++
		default:
			t.Fatalf("key %d: %v; want its record or INTERNAL", i, err)
		}
	}
	if damaged == 0 || fine == 0 {
		t.Fatalf("%d keys damaged, %d fine; want some of each", damaged, fine)
	}
	if err := s.Ping(t.Context()); errcode.Of(err) != errcode.Internal {
		t.Fatalf("Ping of a damaged store = %v; want INTERNAL (not ready)", err)
	}
}

// TestFreshClaimsSkipTablesByFilter: a claim of a key the store does not
// hold, inside the key range of a table, learns that from the table's
// Bloom filter, without reading a data block of it.
func TestFreshClaimsSkipTablesByFilter(t *testing.T) {
	s, err := Open(t.TempDir(), Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	claim := func(key string) ledger.ClaimResult {
		t.Helper()
		sc := ledger.Scope{Namespace: "ns", Tenant: "t", Key: key}
		res, err := s.Claim(t.Context(), ledger.ClaimParams{Scope: sc, Fingerprint: ledgertest.Fingerprint("p"), Method: ledgertest.Method, Lease: time.Minute, Retention: time.Hour})
		if err != nil || !res.Claimed {
			t.Fatalf("claim %s: %+v, %v", key, res, err)
		}
		return res
	}
	const n = 400
	for i := range n {
		claim(fmt.Sprintf("k-%05d", i))
	}
	if err := s.db.Flush(); err != nil {
		t.Fatal(err)
	}
	before := s.db.Metrics().Filter
	for i := range n {
		claim(fmt.Sprintf("k-%05d-fresh", i)) // between two keys of the table
	}
	after := s.db.Metrics().Filter
	if skipped := after.Hits - before.Hits; skipped < n*9/10 {
		t.Fatalf("the filter kept %d of %d fresh claims' first reads out of the table (misses %d); want nearly all", skipped, n, after.Misses-before.Misses)
	}
}

// TestWriteStallsAreCounted: while Pebble cannot flush its memtables (the
// tables' creation blocked, as a slow disk holds them), the writes that
// fill them stall; WriteStalls counts the stall, and the time it lasted
// once the flushes go on.
func TestWriteStallsAreCounted(t *testing.T) {
	fs := &heldTables{FS: vfs.Default, release: make(chan struct{})}
	s, err := Open(t.TempDir(), Config{fs: fs, MemTableSize: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	released := false
	release := func() {
		if !released {
			released = true
			close(fs.release)
		}
	}
	defer release()
	fs.hold.Store(true)
	outcome := ledgertest.Response(string(bytes.Repeat([]byte("o"), 16<<10)))
	pair := func(ctx context.Context, key string) error {
		sc := ledger.Scope{Namespace: "ns", Tenant: "t", Key: key}
		res, err := s.Claim(ctx, ledger.ClaimParams{Scope: sc, Fingerprint: ledgertest.Fingerprint("p"), Method: ledgertest.Method, Lease: time.Minute, Retention: time.Hour})
		if err != nil {
			return err
		}
		_, err = s.Complete(ctx, ledger.CompleteParams{Scope: sc, Token: res.Record.Token, Outcome: outcome})
		return err
	}
	// 2 MiB of queued memtables stop the writes: well within 1,000 pairs.
	for i := 0; s.WriteStalls().Count == 0; i++ {
		if i == 1000 {
			t.Fatal("1,000 pairs of 16 KiB written with every flush held, and no write stalled")
		}
		ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond) // a stalled write's call returns at its end
		err := pair(ctx, fmt.Sprintf("k-%04d", i))
		cancel()
		if err != nil && errcode.Of(err) != errcode.UpstreamTimeout {
			t.Fatalf("pair %d: %v", i, err)
		}
	}
	if n := s.WriteStalls().Count; n != 1 {
		t.Fatalf("%d write stalls while the flushes are held; want 1", n)
	}
	release()
	// This pair's writes queue behind the stalled one: when they are done
	// the stall is over.
	if err := pair(t.Context(), "after"); err != nil {
		t.Fatal(err)
	}
	got := s.WriteStalls()
	if got.Count != 1 || got.Waited <= 0 {
		t.Fatalf("WriteStalls after the flushes went on = %+v; want 1 stall that waited", got)
	}
	if again := s.WriteStalls(); again != got {
		t.Fatalf("WriteStalls moved on from %+v to %+v with no stall under way", got, again)
	}
}

// heldTables is a file system whose tables cannot be created, while hold
// is set, until release is closed.
type heldTables struct {
	vfs.FS
	hold    atomic.Bool
	release chan struct{}
}

func (h *heldTables) Create(name string, category vfs.DiskWriteCategory) (vfs.File, error) {
	if h.hold.Load() && strings.HasSuffix(name, ".sst") {
		<-h.release
	}
	return h.FS.Create(name, category)
}

// TestRefusesALostLog damages the write-ahead log of a running store, as
// a crash leaves it (no clean close), whose identity is in a table and
// whose records are in the log alone: deleted, cut to half, or 8 KiB of
// it zeroed in the middle. Pebble opens each quietly, behind the writes
// it acknowledged; Open refuses it, and opens it once the watermark is
// removed, without the lost records.
func TestRefusesALostLog(t *testing.T) {
	zero := func(f string) error {
		st, err := os.Stat(f)
		if err != nil {
			return err
		}
		h, err := os.OpenFile(f, os.O_WRONLY, 0)
		if err != nil {
			return err
		}
		defer h.Close()
		_, err = h.WriteAt(make([]byte, 8<<10), st.Size()/2)
		return err
	}
	halve := func(f string) error {
		st, err := os.Stat(f)
		if err != nil {
			return err
		}
		return os.Truncate(f, st.Size()/2)
	}
	for _, c := range []struct {
		name   string
		damage func(string) error
	}{
		{"deleted", os.Remove},
		{"halved", halve},
		{"8 KiB zeroed", zero},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			s, err := Open(dir, Config{})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			if err := s.db.Flush(); err != nil {
				t.Fatal(err)
			}
			l := ledger.New(s, ledger.Config{})
			const n = 1566
			for i := range n {
				sc := ledger.Scope{Namespace: "ns", Tenant: "t", Key: fmt.Sprintf("k-%d", i)}
				res, err := l.Begin(t.Context(), ledger.BeginRequest{Scope: sc, Fingerprint: ledgertest.Fingerprint("p"), Method: ledgertest.Method})
				if err != nil {
					t.Fatal(err)
				}
				if _, err := l.Complete(t.Context(), sc, res.Claim.Token, ledgertest.Response("inv")); err != nil {
					t.Fatal(err)
				}
			}
			// What Run does every WatermarkInterval.
			if err := s.mark.save(); err != nil {
				t.Fatal(err)
			}
			// The crash: a copy of the directory as the open store left it.
			crashed := t.TempDir()
			if err := os.CopyFS(crashed, os.DirFS(dir)); err != nil {
				t.Fatal(err)
			}
			store := filepath.Join(crashed, DirName)
			logs, err := filepath.Glob(filepath.Join(store, "*.log"))
			if err != nil || len(logs) == 0 {
				t.Fatalf("no write-ahead log: %v", err)
			}
			// The live log: the newest (names sort by number).
			if err := c.damage(logs[len(logs)-1]); err != nil {
				t.Fatal(err)
			}
			reopened, err := Open(crashed, Config{})
			if err == nil {
				_ = reopened.Close()
			}
			if !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), "write-ahead log") {
				t.Fatalf("Open of a store whose log was %s = %v, want ErrRefused naming the write-ahead log", c.name, err)
			}
			if err := os.Remove(filepath.Join(crashed, WatermarkFileName)); err != nil {
				t.Fatal(err)
			}
			reopened, err = Open(crashed, Config{})
			if err != nil {
				t.Fatalf("Open once the loss is accepted: %v", err)
			}
			defer reopened.Close()
			last := ledger.Scope{Namespace: "ns", Tenant: "t", Key: fmt.Sprintf("k-%d", n-1)}
			if rec, err := reopened.Get(t.Context(), last); errcode.Of(err) != errcode.NotFound {
				t.Fatalf("the last record once the loss is accepted: %+v, %v; want NOT_FOUND (it was in the lost log)", rec, err)
			}
		})
	}
}

// TestRunKeepsTheWatermark: while Run runs, the watermark file catches up
// with the last acknowledged write; Run ends with its context.
func TestRunKeepsTheWatermark(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir, Config{WatermarkInterval: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	sc := ledger.Scope{Namespace: "ns", Tenant: "t", Key: "k"}
	if _, err := s.Claim(t.Context(), ledger.ClaimParams{Scope: sc, Fingerprint: ledgertest.Fingerprint("p"), Method: ledgertest.Method, Lease: time.Minute, Retention: time.Hour}); err != nil {
		t.Fatal(err)
	}
	want := s.mark.acked.Load()
	ctx, cancel := context.WithCancel(t.Context())
	ran := make(chan error, 1)
	go func() { ran <- s.Run(ctx, func(err error) { t.Error(err) }) }()
	// Run writes it on its own ticker.
	ledgertest.Eventually(t, 10*time.Second, func() bool {
		b, err := os.ReadFile(filepath.Join(dir, WatermarkFileName))
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(string(b)) == fmt.Sprint(want)
	}, "the watermark file says %d", want)
	cancel()
	if err := <-ran; err != nil {
		t.Fatal(err)
	}
}

// TestFullDiskRefusesWrites: with less free space than the reserve, every
// write is refused UNAVAILABLE, retryable, saying the disk is full, and
// Pebble is not written; reads are served; writes resume with room.
func TestFullDiskRefusesWrites(t *testing.T) {
	s, err := Open(t.TempDir(), Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	claim := func(k string) (ledger.ClaimResult, error) {
		return s.Claim(t.Context(), ledger.ClaimParams{Scope: ledger.Scope{Namespace: "ns", Tenant: "t", Key: k},
			Fingerprint: ledgertest.Fingerprint("p"), Method: ledgertest.Method, Lease: time.Minute, Retention: time.Hour})
	}
	before, err := claim("before")
	if err != nil {
		t.Fatal(err)
	}
	s.cfg.DiskReserve = 1 << 62 // more than any disk has free
	seq := visibleSeq(s.db)
	_, err = claim("full")
	if le := errcode.As(err); le.Code != errcode.Unavailable || !le.Retryable() || le.RetryAfter <= 0 || !strings.Contains(le.Message, "disk") {
		t.Fatalf("a claim on a full disk = %v; want a retryable UNAVAILABLE with a hint, saying the disk is full", err)
	}
	if after := visibleSeq(s.db); after != seq {
		t.Fatalf("the refused claim wrote to Pebble: sequence %d, then %d", seq, after)
	}
	// A call that would write nothing gets its answer: a Complete by a
	// token that does not hold the key is LEASE_LOST, not a full disk.
	_, err = s.Complete(t.Context(), ledger.CompleteParams{Scope: ledger.Scope{Namespace: "ns", Tenant: "t", Key: "before"},
		Token: before.Record.Token + 1, Outcome: ledgertest.Response("inv_1")})
	if errcode.Of(err) != errcode.LeaseLost {
		t.Fatalf("a Complete by a stale token on a full disk = %v; want LEASE_LOST", err)
	}
	if _, err := s.Get(t.Context(), ledger.Scope{Namespace: "ns", Tenant: "t", Key: "before"}); err != nil {
		t.Fatalf("a read on a full disk: %v", err)
	}
	if err := s.Ping(t.Context()); err != nil {
		t.Fatalf("Ping on a full disk (reads work; the canary's write says not ready): %v", err)
	}
	s.cfg.DiskReserve = 0 // room again
	if _, err := claim("full"); err != nil {
		t.Fatalf("a claim once room returned: %v", err)
	}
}

// TestFailedLogWriteFailsTheStore: the log's writes fail (ENOSPC) under
// concurrent claims, in a child process. Pebble is broken from then on;
// the process goes on, every call is answered UNAVAILABLE with
// ledger.ErrMustRestart, none hangs, and none is told its write is done.
// The child then exits without closing the store, as the restart that
// ErrMustRestart asks for, and the store opens with every record it
// acknowledged.
func TestFailedLogWriteFailsTheStore(t *testing.T) {
	const acked = 50
	scope := func(k string) ledger.Scope { return ledger.Scope{Namespace: "ns", Tenant: "t", Key: k} }
	if dir := os.Getenv("PEBBLE_FAILED_STORE_DIR"); dir != "" {
		failTheStore(t, dir, acked, scope)
		if t.Failed() {
			os.Exit(1)
		}
		os.Exit(0) // the restart: a failed store is not closed
	}
	dir := t.TempDir()
	child := exec.CommandContext(t.Context(), os.Args[0], "-test.run=^TestFailedLogWriteFailsTheStore$", "-test.v")
	child.Env = append(os.Environ(), "PEBBLE_FAILED_STORE_DIR="+dir)
	out, err := child.CombinedOutput()
	if err != nil || !bytes.Contains(out, []byte("the store failed")) {
		t.Fatalf("the child: %v\n%s", err, out)
	}
	s, err := Open(dir, Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for i := range acked {
		if _, err := s.Get(t.Context(), scope(fmt.Sprintf("acked-%d", i))); err != nil {
			t.Fatalf("acknowledged record %d after the restart: %v", i, err)
		}
	}
}

// failTheStore is the child of TestFailedLogWriteFailsTheStore.
func failTheStore(t *testing.T, dir string, acked int, scope func(string) ledger.Scope) {
	var full atomic.Bool
	fs := errorfs.Wrap(vfs.Default, errorfs.InjectorFunc(func(op errorfs.Op) error {
		if full.Load() && op.Kind.ReadOrWrite() == errorfs.OpIsWrite && strings.HasSuffix(op.Path, ".log") {
			return syscall.ENOSPC
		}
		return nil
	}))
	s, err := Open(dir, Config{fs: fs})
	if err != nil {
		t.Fatal(err)
	}
	claim := func(ctx context.Context, k string) (ledger.ClaimResult, error) {
		return s.Claim(ctx, ledger.ClaimParams{Scope: scope(k), Fingerprint: ledgertest.Fingerprint("p"), Method: ledgertest.Method, Lease: time.Minute, Retention: time.Hour})
	}
	for i := range acked {
		if _, err := claim(t.Context(), fmt.Sprintf("acked-%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	full.Store(true)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	errs := make(chan error, 16)
	for i := range cap(errs) {
		go func() {
			_, err := claim(ctx, fmt.Sprintf("lost-%d", i))
			errs <- err
		}()
	}
	for range cap(errs) {
		err := <-errs
		if le := errcode.As(err); le.Code != errcode.Unavailable || !le.Retryable() {
			t.Errorf("a claim as the log fails = %v; want UNAVAILABLE, retryable (and never a done write or a hang)", err)
		}
	}
	if err := s.Ping(t.Context()); !errors.Is(err, ledger.ErrMustRestart) {
		t.Errorf("Ping of a failed store = %v; want ledger.ErrMustRestart", err)
	}
	if _, err := s.Get(t.Context(), scope("acked-1")); errcode.Of(err) != errcode.Unavailable {
		t.Errorf("a read of a failed store = %v; want UNAVAILABLE (its memory may hold writes its log lacks)", err)
	}
	closed := make(chan error, 1)
	go func() { closed <- s.Close() }()
	select {
	case err := <-closed:
		if !errors.Is(err, ledger.ErrMustRestart) {
			t.Errorf("Close of a failed store = %v; want ledger.ErrMustRestart", err)
		}
	case <-time.After(10 * time.Second):
		t.Error("Close of a failed store hangs")
	}
}

// TestNoAnswerFromAnUnsyncedWrite: Pebble shows a batch to readers once
// it is applied, before the log's sync that makes it durable ends. A
// replay (Claim) and a Lookup (Get, GetMany) of a record whose Complete,
// or whose Purge, is still syncing wait for that sync instead of answering
// from it: here the sync fails, in a child process, and none may have
// answered with a write the store never acknowledged.
func TestNoAnswerFromAnUnsyncedWrite(t *testing.T) {
	if dir := os.Getenv("PEBBLE_UNSYNCED_DIR"); dir != "" {
		answerDuringASync(t, dir, os.Getenv("PEBBLE_UNSYNCED_WRITE"))
		if t.Failed() {
			os.Exit(1)
		}
		os.Exit(0) // a failed store is not closed
	}
	for _, write := range []string{"complete", "purge"} {
		t.Run(write, func(t *testing.T) {
			t.Parallel()
			child := exec.CommandContext(t.Context(), os.Args[0], "-test.run=^TestNoAnswerFromAnUnsyncedWrite$", "-test.v")
			child.Env = append(os.Environ(), "PEBBLE_UNSYNCED_DIR="+t.TempDir(), "PEBBLE_UNSYNCED_WRITE="+write)
			if out, err := child.CombinedOutput(); err != nil || !bytes.Contains(out, []byte("the sync failed")) {
				t.Fatalf("the child: %v\n%s", err, out)
			}
		})
	}
}

// answerDuringASync is the child of TestNoAnswerFromAnUnsyncedWrite: it
// holds the sync of write (a "complete" of an attempt, or a "purge" of a
// completed record), reads the record while the write is applied, and
// fails the sync.
func answerDuringASync(t *testing.T, dir, write string) {
	var hold atomic.Bool
	syncing, fail := make(chan struct{}), make(chan struct{})
	fs := errorfs.Wrap(vfs.Default, errorfs.InjectorFunc(func(op errorfs.Op) error {
		isSync := op.Kind == errorfs.OpFileSync || op.Kind == errorfs.OpFileSyncData || op.Kind == errorfs.OpFileSyncTo
		if !isSync || !strings.HasSuffix(op.Path, ".log") || !hold.CompareAndSwap(true, false) {
			return nil
		}
		close(syncing)
		<-fail
		return syscall.EIO
	}))
	s, err := Open(dir, Config{fs: fs})
	if err != nil {
		t.Fatal(err)
	}
	sc := ledger.Scope{Namespace: "ns", Tenant: "t", Key: "k"}
	claim := ledger.ClaimParams{Scope: sc, Fingerprint: ledgertest.Fingerprint("p"), Method: ledgertest.Method, Lease: time.Minute, Retention: time.Hour}
	res, err := s.Claim(t.Context(), claim)
	if err != nil {
		t.Fatal(err)
	}
	complete := func() error {
		_, err := s.Complete(t.Context(), ledger.CompleteParams{Scope: sc, Token: res.Record.Token, Outcome: ledgertest.Response("inv_1")})
		return err
	}
	acked, unsynced := ledger.StateInProgress, complete
	if write == "purge" {
		if err := complete(); err != nil {
			t.Fatal(err)
		}
		acked = ledger.StateCompleted
		unsynced = func() error {
			_, err := s.Purge(t.Context(), ledger.PurgeParams{Scope: sc, Limit: 1})
			return err
		}
	}
	hold.Store(true)
	applied := visibleSeq(s.db) + 1
	written := make(chan error, 1)
	go func() { written <- unsynced() }()
	<-syncing
	for visibleSeq(s.db) < applied {
		runtime.Gosched() // the write is applied, and readers see it, while its sync waits
	}
	type answer struct {
		call  string
		state ledger.State
		err   error
	}
	answers := make(chan answer, 3)
	go func() {
		r, err := s.Claim(t.Context(), claim)
		answers <- answer{"a replay", r.Record.State, err}
	}()
	go func() {
		r, err := s.Get(t.Context(), sc)
		answers <- answer{"a Lookup", r.State, err}
	}()
	go func() {
		recs, err := s.GetMany(t.Context(), []ledger.Scope{sc})
		var st ledger.State
		if err == nil {
			st = recs[0].State
		}
		answers <- answer{"a Lookup of many", st, err}
	}()
	close(fail)
	if err := <-written; errcode.Of(err) != errcode.Unavailable {
		t.Fatalf("the %s whose sync failed = %v; want UNAVAILABLE", write, err)
	}
	for range cap(answers) {
		a := <-answers
		if (a.err == nil && a.state != acked) || errcode.Of(a.err) == errcode.NotFound {
			t.Errorf("%s during the %s's sync answered %v (%v), which the store never acknowledged", a.call, write, a.state, a.err)
		}
	}
	t.Log("the sync failed")
}

// TestPebbleErrorLinesAreRateLimited: a flush failing in a loop (a full
// disk) writes one line per kind per logEvery, which says how many it
// dropped.
func TestPebbleErrorLinesAreRateLimited(t *testing.T) {
	var out bytes.Buffer
	clock := ledgertest.NewClock(ledgertest.Start)
	l := &logger{fail: &failure{}, seen: map[string]*logLimit{}, log: slog.New(slog.NewTextHandler(&out, nil)), now: clock.Now}
	for range 1000 {
		l.Errorf("background error: %v", syscall.ENOSPC)
		clock.Advance(time.Millisecond)
	}
	l.Errorf("another kind: %d", 1)
	clock.Advance(logEvery)
	l.Errorf("background error: %v", syscall.ENOSPC)
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 3 || !strings.Contains(lines[2], "and 999 more like it") {
		t.Fatalf("1,001 lines of one kind and one of another wrote:\n%s\nwant 3, the last counting the 999 dropped", out.String())
	}
}

// TestLogsAreWrittenInPlace: the log a store starts with, and the one
// after its first memtable, are zero-filled spares as large as a log gets,
// so their writes overwrite blocks the file has and never grow it. A spare
// no log took is gone after Close, and a directory in use gets no spares
// from a second Open.
func TestLogsAreWrittenInPlace(t *testing.T) {
	dir := t.TempDir()
	cfg := Config{MemTableSize: 1 << 20}
	s, err := Open(dir, cfg)
	if err != nil {
		t.Fatal(err)
	}
	size := int64(cfg.MemTableSize + cfg.MemTableSize/10)
	store := filepath.Join(dir, DirName)
	// newest is the log Pebble writes now: the highest-numbered one.
	newest := func() (name string, size int64) {
		t.Helper()
		logs, err := filepath.Glob(filepath.Join(store, "*.log"))
		if err != nil || len(logs) == 0 {
			t.Fatalf("the store's logs: %v, %v", logs, err)
		}
		fi, err := os.Stat(logs[len(logs)-1])
		if err != nil {
			t.Fatal(err)
		}
		return fi.Name(), fi.Size()
	}
	spares := func() []string {
		t.Helper()
		names, err := filepath.Glob(filepath.Join(store, sparePrefix+"*"))
		if err != nil {
			t.Fatal(err)
		}
		return names
	}
	if got := spares(); len(got) != spareLogs-1 {
		t.Fatalf("after Open, spares %v; want %d left (the first log took one)", got, spareLogs-1)
	}
	if _, err := Open(dir, cfg); err == nil {
		t.Fatal("a second Open of the directory in use succeeded")
	}
	if got := spares(); len(got) != spareLogs-1 {
		t.Fatalf("after a second Open failed, spares %v; want the first store's %d untouched", got, spareLogs-1)
	}
	claimed := 0
	claim := func(n int) {
		t.Helper()
		for range n {
			claimed++
			if _, err := s.Claim(t.Context(), ledger.ClaimParams{Scope: ledger.Scope{Namespace: "ns", Tenant: "t", Key: fmt.Sprint("k", claimed)},
				Fingerprint: ledgertest.Fingerprint("p"), Method: ledgertest.Method, Lease: time.Minute, Retention: time.Hour}); err != nil {
				t.Fatal(err)
			}
		}
	}
	var logs []string
	for round := range spareLogs {
		claim(100)
		name, got := newest()
		if got != size {
			t.Fatalf("round %d: log %s is %d bytes after 100 claims; want the spare's %d, written in place", round, name, got, size)
		}
		if slices.Contains(logs, name) {
			t.Fatalf("round %d: log %s again; want the next one", round, name)
		}
		logs = append(logs, name)
		if _, err := s.db.AsyncFlush(); err != nil { // the next memtable starts the next log
			t.Fatal(err)
		}
	}
	if got := spares(); len(got) != 0 {
		t.Fatalf("spares %v left after %d logs; want none", got, spareLogs)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s, err = Open(dir, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if got := spares(); len(got) != 0 {
		t.Fatalf("spares %v left after Close; want none", got)
	}
}

// diskFS reports the free space a test sets, on a disk of 1 TiB.
type diskFS struct {
	vfs.FS
	free atomic.Uint64
}

func (d *diskFS) GetDiskUsage(string) (vfs.DiskUsage, error) {
	return vfs.DiskUsage{AvailBytes: d.free.Load(), TotalBytes: 1 << 40}, nil
}

// TestDiskReadingServesAMillisecond: a reading of the disk's free space
// serves the writes of the next diskFresh by the store's clock, either
// way; the first write after that reads the disk again.
func TestDiskReadingServesAMillisecond(t *testing.T) {
	clock := ledgertest.NewClock(ledgertest.Start)
	disk := &diskFS{FS: vfs.Default}
	disk.free.Store(1 << 40)
	s, err := Open(t.TempDir(), Config{Now: clock.Now, fs: disk, DiskReserve: 1 << 30})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	claim := func(k string) error {
		_, err := s.Claim(t.Context(), ledger.ClaimParams{Scope: ledger.Scope{Namespace: "ns", Tenant: "t", Key: k},
			Fingerprint: ledgertest.Fingerprint("p"), Method: ledgertest.Method, Lease: time.Minute, Retention: time.Hour})
		return err
	}
	full := func(err error) bool {
		return errcode.Of(err) == errcode.Unavailable && strings.Contains(err.Error(), "disk")
	}
	if err := claim("a"); err != nil {
		t.Fatal(err)
	}
	disk.free.Store(1 << 20) // below the reserve
	if err := claim("b"); err != nil {
		t.Fatalf("a claim within %s of a reading with room = %v; want it taken", diskFresh, err)
	}
	clock.Advance(diskFresh + time.Microsecond)
	if err := claim("c"); !full(err) {
		t.Fatalf("a claim %s after the reading, the disk below the reserve = %v; want UNAVAILABLE, the disk full", diskFresh, err)
	}
	disk.free.Store(1 << 40)
	if err := claim("c"); !full(err) {
		t.Fatalf("a claim within %s of a reading without room = %v; want it refused", diskFresh, err)
	}
	clock.Advance(diskFresh + time.Microsecond)
	if err := claim("c"); err != nil {
		t.Fatalf("a claim once the disk has room again = %v", err)
	}
}

// TestCompleteWritesTheRecordAlone: a claim writes the record and its
// expiry index entry, at the end of its retention; the Complete of an
// attempt of the TAKEOVER policy writes the record alone, its entry
// already where a completed record's belongs.
func TestCompleteWritesTheRecordAlone(t *testing.T) {
	s, err := Open(t.TempDir(), Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	sc := ledger.Scope{Namespace: "ns", Tenant: "t", Key: "k"}
	before := visibleSeq(s.db)
	res, err := s.Claim(t.Context(), ledger.ClaimParams{Scope: sc, Fingerprint: ledgertest.Fingerprint("p"), Method: ledgertest.Method,
		Lease: time.Minute, Retention: time.Hour, TombstoneRetention: 24 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	claimed := visibleSeq(s.db)
	if _, err := s.Complete(t.Context(), ledger.CompleteParams{Scope: sc, Token: res.Record.Token, Outcome: ledgertest.Response("inv_1")}); err != nil {
		t.Fatal(err)
	}
	if got := [2]uint64{claimed - before, visibleSeq(s.db) - claimed}; got != [2]uint64{2, 1} {
		t.Fatalf("keys written by a claim and its Complete: %v; want [2 1]", got)
	}
	if n := s.count(t, "ns"); n != 1 {
		t.Fatalf("%d records; want 1", n)
	}
}

// TestSweepShareDefaults: a share outside (0, 1], NaN included, is the
// default 0.25; one inside is kept.
func TestSweepShareDefaults(t *testing.T) {
	for _, tc := range []struct{ share, want float64 }{{0, 0.25}, {-1, 0.25}, {1.5, 0.25}, {math.NaN(), 0.25}, {0.05, 0.05}, {1, 1}} {
		if got := (Config{SweepShare: tc.share}).withDefaults().SweepShare; got != tc.want {
			t.Errorf("SweepShare %v: %v, want %v", tc.share, got, tc.want)
		}
	}
}

// TestSweepResumesWhereItStopped: after a full batch the next sweep lists
// from the entry after the last it handled, not from the front of the
// index, and a sweep that ends the backlog sends the next one to the front
// again, where it finds an entry that came due behind the last batch.
func TestSweepResumesWhereItStopped(t *testing.T) {
	clock := ledgertest.NewClock(ledgertest.Start)
	s, err := Open(t.TempDir(), Config{Now: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := t.Context()
	sc := func(k string) ledger.Scope { return ledger.Scope{Namespace: "ns", Tenant: "t", Key: k} }
	for _, k := range []string{"k1", "k2", "k3"} {
		res, err := s.Claim(ctx, ledger.ClaimParams{Scope: sc(k), Fingerprint: ledgertest.Fingerprint("p"), Method: ledgertest.Method,
			Lease: time.Minute, Retention: time.Hour, TombstoneRetention: 24 * time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.Complete(ctx, ledger.CompleteParams{Scope: sc(k), Token: res.Record.Token, Outcome: ledgertest.Response(k)}); err != nil {
			t.Fatal(err)
		}
	}
	clock.Advance(2 * time.Hour)
	sweep := func(want int) {
		t.Helper()
		if n, err := s.Sweep(ctx, 2); err != nil || n != want {
			t.Fatalf("Sweep = %d, %v; want %d handled", n, err, want)
		}
	}
	stored := func(k string) *ledger.Record {
		t.Helper()
		rec, err := getRecord(s.db, sc(k), recordKey(sc(k)))
		if err != nil || rec == nil {
			t.Fatalf("%s: %v, %v", k, rec, err)
		}
		return rec
	}
	shrunk := func(k string, want bool) {
		t.Helper()
		rec := stored(k)
		if got := rec.Outcome == nil; got != want {
			t.Fatalf("%s: shrunk to a tombstone = %v, want %v", k, got, want)
		}
	}
	sweep(2) // k1 and k2: a full batch
	// k0 comes due before k1 did, behind where the batch stopped.
	k0 := stored("k3")
	k0.Scope, k0.ExpiresAt = sc("k0"), ledgertest.Start.Add(30*time.Minute)
	if err := s.with(func(db *pebbledb.DB) error {
		b := db.NewBatch()
		defer b.Close()
		if err := put(b, recordKey(k0.Scope), nil, k0); err != nil {
			return err
		}
		return s.commit(b, pebbledb.Sync)
	}); err != nil {
		t.Fatal(err)
	}
	sweep(1) // k3 alone, from where the batch stopped: the backlog ends
	shrunk("k3", true)
	shrunk("k0", false)
	sweep(1) // from the front: k0
	shrunk("k0", true)
	sweep(0)
	if n := s.count(t, "ns"); n != 4 {
		t.Fatalf("%d records; want 4 tombstones", n)
	}
}

// TestPurgeInBatches: a tenant purge of more records than a batch holds
// erases up to its limit across batches, counts the records it leaves,
// and says there is more.
func TestPurgeInBatches(t *testing.T) {
	s, err := Open(t.TempDir(), Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	const done, held, limit = 2*purgeBatch + 44, 3, purgeBatch + 60
	claim := func(key string) ledger.ClaimResult {
		t.Helper()
		p := ledger.ClaimParams{Scope: ledger.Scope{Namespace: "ns", Tenant: "t", Key: key}, Fingerprint: ledgertest.Fingerprint("p"), Method: ledgertest.Method, Lease: time.Hour, Retention: time.Hour}
		res, err := s.Claim(t.Context(), p)
		if err != nil || !res.Claimed {
			t.Fatalf("claim %s: %+v, %v", key, res, err)
		}
		return res
	}
	for i := range done {
		res := claim(fmt.Sprintf("done-%03d", i))
		if _, err := s.Complete(t.Context(), ledger.CompleteParams{Scope: res.Record.Scope, Token: res.Record.Token, Outcome: ledgertest.Response("x")}); err != nil {
			t.Fatal(err)
		}
	}
	for i := range held {
		claim(fmt.Sprintf("held-%d", i))
	}
	tenant := ledger.PurgeParams{Scope: ledger.Scope{Namespace: "ns", Tenant: "t"}, Limit: limit}
	first, err := s.Purge(t.Context(), tenant)
	if err != nil || first != (ledger.PurgeResult{Purged: limit, Skipped: held, More: true}) {
		t.Fatalf("a purge of %d, limit %d, %d held = %+v, %v; want %d purged, %d skipped, more", done, limit, held, first, err, limit, held)
	}
	second, err := s.Purge(t.Context(), tenant)
	if err != nil || second != (ledger.PurgeResult{Purged: done - limit, Skipped: held}) {
		t.Fatalf("the next purge = %+v, %v; want the %d left, %d skipped", second, err, done-limit, held)
	}
	for i := range done {
		if _, err := s.Get(t.Context(), ledger.Scope{Namespace: "ns", Tenant: "t", Key: fmt.Sprintf("done-%03d", i)}); errcode.Of(err) != errcode.NotFound {
			t.Fatalf("done-%03d after the purges: %v; want NOT_FOUND", i, err)
		}
	}
	for i := range held {
		if rec, err := s.Get(t.Context(), ledger.Scope{Namespace: "ns", Tenant: "t", Key: fmt.Sprintf("held-%d", i)}); err != nil || rec.State != ledger.StateInProgress {
			t.Fatalf("held-%d after the purges: %+v, %v", i, rec, err)
		}
	}
}

// TestOnBackgroundBracketsEachSweep: OnBackground is called as each sweep begins,
// before it handles a record, and its function as the sweep ends, after
// the last; a sweep of nothing is bracketed too, and a sweep whose context
// ended is not.
func TestOnBackgroundBracketsEachSweep(t *testing.T) {
	t.Parallel()
	clock := ledgertest.NewClock(ledgertest.Start)
	sc := ledger.Scope{Namespace: "ns", Tenant: "t", Key: "k"}
	var s *Store
	var log []string
	stored := func() string { // the record's state as stored, not as read
		rec, err := getRecord(s.db, sc, recordKey(sc))
		if err != nil || rec == nil {
			t.Fatalf("%v, %v", rec, err)
		}
		return rec.State.String()
	}
	s, err := Open(t.TempDir(), Config{Now: clock.Now, OnBackground: func() func() {
		log = append(log, "begin "+stored())
		return func() { log = append(log, "end "+stored()) }
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	l := ledger.New(s, ledger.Config{})
	res, err := l.Begin(t.Context(), ledger.BeginRequest{Scope: sc, Fingerprint: ledgertest.Fingerprint("p"), Method: ledgertest.Method, Retention: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Complete(t.Context(), sc, res.Claim.Token, ledgertest.Response("x")); err != nil {
		t.Fatal(err)
	}
	clock.Advance(2 * time.Hour)
	for _, want := range []int{1, 0} {
		if n, err := s.Sweep(t.Context(), 10); err != nil || n != want {
			t.Fatalf("Sweep = %d, %v; want %d", n, err, want)
		}
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if _, err := s.Sweep(ctx, 10); err == nil {
		t.Fatal("a sweep whose context ended swept")
	}
	want := []string{"begin COMPLETED", "end EXPIRED", "begin EXPIRED", "end EXPIRED"}
	if !slices.Equal(log, want) {
		t.Fatalf("OnBackground saw %q, want %q", log, want)
	}
}

// TestOnBackgroundBracketsFlushesAndCompactions: Pebble's flushes and
// compactions are work in the background too, each begun and ended once.
func TestOnBackgroundBracketsFlushesAndCompactions(t *testing.T) {
	t.Parallel()
	var begun, ended atomic.Int64
	s, err := Open(t.TempDir(), Config{OnBackground: func() func() {
		begun.Add(1)
		return func() { ended.Add(1) }
	}})
	if err != nil {
		t.Fatal(err)
	}
	l := ledger.New(s, ledger.Config{})
	for round := range 2 {
		for i := range 50 {
			if _, err := l.Begin(t.Context(), ledger.BeginRequest{Scope: ledger.Scope{Namespace: "ns", Tenant: "t", Key: fmt.Sprint(round, "-", i)},
				Fingerprint: ledgertest.Fingerprint("p"), Method: ledgertest.Method}); err != nil {
				t.Fatal(err)
			}
		}
		if err := s.db.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.db.Compact(t.Context(), []byte{0}, []byte{0xff}, true); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	// Two flushes and at least one compaction, every one ended.
	if b, e := begun.Load(), ended.Load(); b < 3 || e != b {
		t.Fatalf("OnBackground begun %d times and ended %d; want at least 3, each ended", b, e)
	}
}
