package workers

import (
	"cmp"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"testing/synctest"
	"time"
)

// TestPool: a function runs on the worker an earlier one ran on once
// that one is idle; one that blocks holds up no other; Close ends the idle
// workers, and a busy one once its function returns, and functions still
// run after it.
func TestPool(t *testing.T) {
	t.Parallel()
	p := &Pool{}
	ran := make(chan uint64)
	on := func() { ran <- goroutineID() }
	p.Go(on)
	first := <-ran
	waitIdle(t, p, 1)
	p.Go(on)
	if again := <-ran; again != first {
		t.Fatalf("with a worker idle, a function ran on goroutine %d, not the worker's %d", again, first)
	}

	waitIdle(t, p, 1)
	release := make(chan struct{})
	p.Go(func() { <-release }) // takes the idle worker
	p.Go(on)
	if other := <-ran; other == first {
		t.Fatalf("a function ran on the busy worker %d", first)
	}
	waitIdle(t, p, 1)
	p.Close()
	close(release)
	p.live.Wait() // the idle worker ended, and the busy one after its function

	p.Go(on)
	<-ran
	p.live.Wait()
	if n := idleWorkers(p); n != 0 {
		t.Fatalf("%d idle workers after Close", n)
	}
}

// TestPoolIdleFor: a worker waits IdleFor for its next function, each
// function restarting the wait, and then ends.
func TestPoolIdleFor(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		p := &Pool{IdleFor: 10 * time.Second}
		defer p.Close()
		ran := make(chan uint64)
		on := func() { ran <- goroutineID() }
		p.Go(on)
		first := <-ran
		synctest.Wait()                          // the worker is idle
		time.Sleep(p.IdleFor - time.Millisecond) // synctest's clock: the idle wait is the subject
		p.Go(on)
		if again := <-ran; again != first {
			t.Fatalf("a function ran on goroutine %d, not on the worker %d that waited", again, first)
		}
		synctest.Wait()
		time.Sleep(p.IdleFor - time.Millisecond) // synctest's clock: just short of the wait the last function restarted
		synctest.Wait()
		if n := idleWorkers(p); n != 1 {
			t.Fatalf("%d idle workers before the worker waited %v, want 1", n, p.IdleFor)
		}
		time.Sleep(time.Millisecond) // synctest's clock: the wait runs out
		synctest.Wait()
		if n := idleWorkers(p); n != 0 {
			t.Fatalf("%d idle workers after %v idle, want none", n, p.IdleFor)
		}
		p.live.Wait()
	})
}

// TestPoolMaxIdle: past MaxIdle idle workers (DefaultMaxIdle when it is
// 0, or more than that), a worker ends as its function returns.
func TestPoolMaxIdle(t *testing.T) {
	t.Parallel()
	for _, bound := range []int{0, 4 * DefaultMaxIdle} {
		t.Run(strconv.Itoa(bound), func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				p := &Pool{MaxIdle: bound}
				defer p.Close()
				want := cmp.Or(bound, DefaultMaxIdle)
				release := make(chan struct{})
				for range want + 1 {
					p.Go(func() { <-release })
				}
				close(release)
				synctest.Wait()
				if n := idleWorkers(p); n != want {
					t.Fatalf("%d idle workers after %d functions at once, want %d", n, want+1, want)
				}
			})
		})
	}
}

// goroutineID is the calling goroutine's id, as its stack trace gives it.
func goroutineID() uint64 {
	buf := make([]byte, 64)
	buf = buf[:runtime.Stack(buf, false)]
	id, _, _ := strings.Cut(strings.TrimPrefix(string(buf), "goroutine "), " ")
	n, err := strconv.ParseUint(id, 10, 64)
	if err != nil {
		panic("a stack trace without its goroutine's id: " + string(buf))
	}
	return n
}

func idleWorkers(p *Pool) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.idle)
}

// waitIdle waits until n of p's workers are idle: a worker goes idle
// right after its function returns.
func waitIdle(t *testing.T, p *Pool, n int) {
	t.Helper()
	for start := time.Now(); idleWorkers(p) != n; runtime.Gosched() {
		if time.Since(start) > 10*time.Second {
			t.Fatalf("%d idle workers after 10 s, want %d", idleWorkers(p), n)
		}
	}
}
