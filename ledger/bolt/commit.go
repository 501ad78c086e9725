package bolt

import (
	"errors"
	"sync"

	bbolt "go.etcd.io/bbolt"
)

// committer commits transitions in groups, without a timer: a transition
// that arrives while no commit runs starts one at once; those that arrive
// while a commit runs wait for it and share the next one, up to maxSize a
// transaction. So a lone caller pays one transaction and one fsync, and
// many callers share them, as the SQL store's batcher does. (bbolt's own
// DB.Batch waits MaxBatchDelay for company first: a whole millisecond of
// timer, even alone.)
type committer struct {
	db      *bbolt.DB
	maxSize int

	mu      sync.Mutex
	pending []*job
	running bool
}

// job is one transition: fn may run more than once (when another job of
// its group fails, the others run again), so it must only read the
// transaction and assign to its caller's variables.
type job struct {
	fn   func(*bbolt.Tx) error
	done chan error
}

// do runs fn in a read-write transaction shared with the transitions that
// arrive with it, and returns once that transaction is committed (or
// failed).
func (c *committer) do(fn func(*bbolt.Tx) error) error {
	j := &job{fn: fn, done: make(chan error, 1)}
	c.mu.Lock()
	c.pending = append(c.pending, j)
	if !c.running {
		c.running = true
		go c.loop()
	}
	c.mu.Unlock()
	return <-j.done
}

// loop commits the pending jobs, a group at a time, until none is left.
func (c *committer) loop() {
	for {
		c.mu.Lock()
		if len(c.pending) == 0 {
			c.running = false
			c.mu.Unlock()
			return
		}
		n := min(len(c.pending), c.maxSize)
		group := c.pending[:n:n]
		c.pending = append([]*job(nil), c.pending[n:]...)
		c.mu.Unlock()
		c.commit(group)
	}
}

// errJobFailed marks the job whose function failed a group's transaction.
type errJobFailed struct {
	index int
	err   error
}

func (e *errJobFailed) Error() string { return e.err.Error() }

// commit runs a group in one transaction. When one job's function fails,
// that job runs again alone (its own error is its answer) and the others
// run again together without it.
func (c *committer) commit(group []*job) {
	err := c.db.Update(func(tx *bbolt.Tx) error {
		for i, j := range group {
			if err := j.fn(tx); err != nil {
				return &errJobFailed{index: i, err: err}
			}
		}
		return nil
	})
	var failed *errJobFailed
	if !errors.As(err, &failed) {
		for _, j := range group {
			j.done <- err
		}
		return
	}
	bad := group[failed.index]
	bad.done <- c.db.Update(bad.fn)
	rest := append(append([]*job(nil), group[:failed.index]...), group[failed.index+1:]...)
	if len(rest) > 0 {
		c.commit(rest)
	}
}
