package server

import "testing"

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
