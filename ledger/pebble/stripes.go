package pebble

// The locks the scopes share, and the records in progress each keeps in
// memory.

import (
	"context"
	"hash/maphash"
	"sync/atomic"

	pebbledb "github.com/cockroachdb/pebble/v2"

	"github.com/idemledger/idemledger/ledger"
)

// lockStripes is how many locks the scopes share: two transitions of
// scopes that hash alike wait for each other, which costs nothing but
// time.
const lockStripes = 1024

// maxHeld is how many records in progress a stripe keeps in memory.
const maxHeld = 64

// stripe is one of the locks the scopes share. Every write of a record
// key takes its stripe's lock (a purge's batch takes several, in the
// stripes' order; every other holder holds one), and after it counts the
// write and keeps held in step. So, under the lock, a record in held is
// the record Pebble holds, and a claim whose lock-free read began after
// the last write counted has read what Pebble holds: a fresh pair reads
// Pebble once, in its claim's first read, not three times.
//
// Pebble shows a batch to readers once it is applied, before the log's
// sync that makes it durable has ended; a write holds its stripe's lock
// until then. A read without the lock is answered from only when no write
// of its stripe was syncing while it read (settled); otherwise it is done
// again under the lock, so that no call is answered with a record the
// store may never acknowledge.
type stripe struct {
	lock    chan struct{} // its one token is the lock (Lock, lockBy)
	writes  atomic.Uint64
	syncing atomic.Int32             // writes from their commit until they are counted
	held    map[string]ledger.Record // by record key: records in progress only
}

// Lock takes the stripe's lock.
func (st *stripe) Lock() { st.lock <- struct{}{} }

// Unlock lets go of the stripe's lock, which any goroutine may do: a
// write's lock is let go by the commit loop once the write is durable.
func (st *stripe) Unlock() { <-st.lock }

// lockBy takes the stripe's lock, or returns ctx's error when ctx ends
// first: a call waits for a write of its stripe no longer than it waits
// for its own (a stalled disk holds both).
func (st *stripe) lockBy(ctx context.Context) error {
	select {
	case st.lock <- struct{}{}:
		return nil
	default:
	}
	select {
	case st.lock <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// begin starts a read of the stripe without its lock, before the read
// can see anything.
func (st *stripe) begin() seen {
	writes := st.writes.Load()
	return seen{writes: writes, quiet: st.syncing.Load() == 0}
}

// settled reports whether the read r may be answered from: no write of the
// stripe was syncing, or failed, while it read.
func (st *stripe) settled(r seen) bool {
	return r.quiet && st.syncing.Load() == 0 && st.writes.Load() == r.writes
}

// stripe is the stripe of a record key.
func (s *Store) stripe(key []byte) *stripe { return &s.locks[s.stripeAt(key)] }

// stripeAt is the index of a record key's stripe in Store.locks.
func (s *Store) stripeAt(key []byte) uint64 { return maphash.Bytes(s.seed, key) % lockStripes }

// wrote counts a write of key, whose record is now rec (nil when erased
// or not known: a commit that failed). Under the lock.
func (st *stripe) wrote(key []byte, rec *ledger.Record) {
	st.writes.Add(1)
	if rec == nil || rec.State != ledger.StateInProgress {
		delete(st.held, string(key))
		return
	}
	if _, ok := st.held[string(key)]; !ok && len(st.held) >= maxHeld {
		return
	}
	if st.held == nil {
		st.held = make(map[string]ledger.Record, maxHeld)
	}
	st.held[string(key)] = *rec
}

// read is key's record as Pebble holds it: the one held in memory, or
// Pebble's. Under the lock.
func (st *stripe) read(db reader, scope ledger.Scope, key []byte) (*ledger.Record, error) {
	if rec, ok := st.held[string(key)]; ok {
		return &rec, nil
	}
	return getRecord(db, scope, key)
}

// readLocked reads key's record under its stripe's lock: the read again
// of one that met a write still syncing. It returns at ctx's end while
// that write's sync stalls.
func (s *Store) readLocked(ctx context.Context, scope ledger.Scope, key []byte) (*ledger.Record, error) {
	st := s.stripe(key)
	if err := st.lockBy(ctx); err != nil {
		return nil, err
	}
	defer st.Unlock()
	var rec *ledger.Record
	err := s.with(func(db *pebbledb.DB) error {
		var err error
		rec, err = st.read(db, scope, key)
		return err
	})
	return rec, err
}

// seen is a record read without the lock, the count of its stripe's
// writes before the read began, and whether none was syncing then.
type seen struct {
	writes uint64
	quiet  bool
	rec    *ledger.Record
}
