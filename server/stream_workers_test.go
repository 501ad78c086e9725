package server

import (
	"testing"
	"testing/synctest"
	"time"
)

// A stream's calls run on its workers, up to maxStreamWorkers of them;
// a call that finds every worker busy runs at once on a goroutine of its
// own.
func TestStreamWorkers(t *testing.T) {
	t.Parallel()
	st := &callStream{work: make(chan func())}
	defer close(st.work) // the workers end with the stream (goleak checks)
	release := make(chan struct{})
	running := make(chan struct{})
	busy := func() {
		running <- struct{}{}
		<-release
	}
	for range maxStreamWorkers + 1 {
		st.run(busy) // the last one runs though every worker is busy
	}
	for range maxStreamWorkers + 1 {
		<-running
	}
	if n := st.workers.Load(); n != maxStreamWorkers {
		t.Fatalf("%d workers started, want %d", n, maxStreamWorkers)
	}
	close(release)
}

// A worker takes the stream's next call while it waits, and ends once it
// has waited streamWorkerIdle.
func TestStreamWorkersEndWhenIdle(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		st := &callStream{work: make(chan func())}
		defer close(st.work)
		call := func() {
			ran := make(chan struct{})
			st.run(func() { close(ran) })
			<-ran
			synctest.Wait() // the worker waits for the next call
		}
		call()
		time.Sleep(streamWorkerIdle - time.Millisecond) // synctest's clock: the idle wait is the subject
		call()                                          // the waiting worker's
		if n := st.workers.Load(); n != 1 {
			t.Fatalf("%d workers, want the one that waited", n)
		}
		time.Sleep(streamWorkerIdle - time.Millisecond) // synctest's clock: just short of the wait the last call restarted
		synctest.Wait()
		if n := st.workers.Load(); n != 1 {
			t.Fatalf("%d workers before the worker was idle for %v, want 1", n, streamWorkerIdle)
		}
		time.Sleep(time.Millisecond) // synctest's clock: the wait runs out
		synctest.Wait()
		if n := st.workers.Load(); n != 0 {
			t.Fatalf("%d workers after %v idle, want none", n, streamWorkerIdle)
		}
	})
}
