package pebble

// The commit loop: the writes that arrive while a sync is in flight, and
// those of the calls ready to run when it ends, are committed together,
// in one batch and one sync, as Redis's event loop does with the commands
// it read during its last fsync.

import (
	"runtime"
	"sync"

	pebbledb "github.com/cockroachdb/pebble/v2"

	"github.com/idemledger/idemledger/ledger"
)

// maxGroupBytes bounds the batch of one group: far below the size at
// which Pebble makes a batch a memtable of its own (half of one), so that
// a group of large outcomes costs no flush. A write larger than it is a
// group of its own.
const maxGroupBytes = 1 << 20

// write is a transition's batch on its way to the log. Its stripe is
// locked until the batch is durable or has failed; the commit loop counts
// the write and unlocks it.
type write struct {
	b    *pebbledb.Batch
	st   *stripe
	key  []byte
	rec  *ledger.Record
	done chan error // buffered: the loop never waits for a caller that left
}

// commits is the queue of the commit loop.
type commits struct {
	mu     sync.Mutex
	queue  []*write
	wake   chan struct{} // a token while the queue has writes
	stop   chan struct{} // closed by Close, once no call can queue more
	exited chan struct{}
}

func newCommits() *commits {
	return &commits{wake: make(chan struct{}, 1), stop: make(chan struct{}), exited: make(chan struct{})}
}

// add queues w for the next group.
func (c *commits) add(w *write) {
	c.mu.Lock()
	c.queue = append(c.queue, w)
	first := len(c.queue) == 1
	c.mu.Unlock()
	if first {
		c.signal()
	}
}

// signal leaves the loop a token, unless one is there.
func (c *commits) signal() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// take moves the next group into group: the writes queued, up to
// maxGroupBytes (at least one). What is left keeps its token.
func (c *commits) take(group []*write) []*write {
	c.mu.Lock()
	defer c.mu.Unlock()
	size := 0
	n := 0
	for ; n < len(c.queue); n++ {
		size += len(c.queue[n].b.Repr())
		if n > 0 && size > maxGroupBytes {
			break
		}
	}
	group = append(group, c.queue[:n]...)
	left := copy(c.queue, c.queue[n:])
	clear(c.queue[left:]) // the queue's array keeps no write it handed on
	c.queue = c.queue[:left]
	if len(c.queue) > 0 {
		c.signal()
	}
	return group
}

// commitLoop commits the queued writes a group at a time until Close,
// then what Close let in before it.
func (s *Store) commitLoop() {
	c := s.commits
	defer close(c.exited)
	var group []*write
	for {
		select {
		case <-c.wake:
			// Every goroutine ready to run goes first, once: the calls
			// among them are about to queue their writes, which join this
			// group instead of waiting for the next sync, as Redis's loop
			// reads every socket that is ready before it syncs. Nothing
			// waits when nothing else is ready (one caller).
			runtime.Gosched()
		case <-c.stop:
		}
		if group = c.take(group[:0]); len(group) > 0 {
			s.commitGroup(group)
			clear(group) // keeps no write it answered
			continue
		}
		select {
		case <-c.stop:
			return // and nothing is left: no call queues after Close
		default:
		}
	}
}

// commitGroup commits the batches of group as one, with one sync, and
// answers each write.
func (s *Store) commitGroup(group []*write) {
	b := group[0].b
	var err error
	if len(group) > 1 {
		b = s.db.NewBatch()
		defer b.Close()
		for _, w := range group {
			if err = b.Apply(w.b, nil); err != nil {
				break
			}
		}
	}
	if err == nil {
		err = s.commit(b, pebbledb.Sync)
	}
	if err == nil {
		s.mark.ack(b)
	}
	for _, w := range group {
		rec := w.rec
		if err != nil {
			rec = nil // it may have landed: read it next time
		}
		w.st.wrote(w.key, rec)
		w.st.syncing.Add(-1) // after wrote, for settled
		w.st.Unlock()
		_ = w.b.Close()
		w.done <- err
	}
}
