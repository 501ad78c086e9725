package bench

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// TestCountFdatasyncs: perf counts this process's fdatasync calls between
// the start and the stop, those of a thread it starts meanwhile included,
// and none after the stop (skipped without perf, failed under CI=true:
// .ci/run installs it).
func TestCountFdatasyncs(t *testing.T) {
	if _, err := exec.LookPath("perf"); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("perf is not installed")
		}
		t.Skip("perf is not installed")
	}
	f, err := os.Create(filepath.Join(t.TempDir(), "log"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	syncs := func(n int) {
		for range n {
			if _, err := f.Write([]byte("x")); err != nil {
				t.Error(err)
				return
			}
			if err := fdatasync(f); err != nil {
				t.Error(err)
				return
			}
		}
	}
	syncs(5) // before the count
	stop, err := CountFdatasyncs(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	syncs(30)
	done := make(chan struct{})
	go func() { // likely on another thread, maybe a new one
		defer close(done)
		syncs(20)
	}()
	<-done
	n, err := stop()
	if err != nil {
		t.Fatal(err)
	}
	syncs(5) // after it
	// Nothing else in this process syncs meanwhile (the runtime does not,
	// and no test of this package runs in parallel or leaves a goroutine
	// behind that syncs): exactly 50.
	if n != 50 {
		t.Fatalf("counted %d fdatasyncs, want 50", n)
	}
	// A process that is not there is an error, not a count of 0.
	if _, err := CountFdatasyncs(1 << 30); err == nil {
		t.Fatal("counted the fdatasyncs of a process that is not there")
	}
}

// TestParseCount: perf stat's CSV line gives the count; a count it could
// not take, or none, is an error.
func TestParseCount(t *testing.T) {
	out := "# started on Sun Dec  6 08:59:31 2026\n\n3,,syscalls:sys_enter_fdatasync,421044673,100.00,,\n"
	if n, err := parseCount([]byte(out), fdatasyncEvent); err != nil || n != 3 {
		t.Fatalf("parseCount = %d, %v; want 3", n, err)
	}
	for _, bad := range []string{
		"<not counted>,,syscalls:sys_enter_fdatasync,0,0.00,,\n",
		"<not supported>,,syscalls:sys_enter_fdatasync,0,100.00,,\n",
		"3,,syscalls:sys_enter_fsync,421044673,100.00,,\n",
		"",
	} {
		if n, err := parseCount([]byte(bad), fdatasyncEvent); err == nil {
			t.Errorf("parseCount(%q) = %d, want an error", bad, n)
		}
	}
}
