package bench

import (
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"golang.org/x/sys/unix"

	"github.com/idemledger/idemledger/internal/pgtest"
)

func TestParseCPUs(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want string // as cpuList writes it; empty: an error
	}{
		{"1", "1"},
		{"0,2", "0,2"},
		{"2-3", "2,3"},
		{" 0 , 3-4", "0,3,4"},
		{"", ""},
		{"a", ""},
		{"3-1", ""},
		{"-1", ""},
		{"1-", ""},
		{"5000", ""},
	} {
		t.Run(tc.in, func(t *testing.T) {
			set, err := parseCPUs(tc.in)
			if tc.want == "" {
				if err == nil {
					t.Fatalf("parseCPUs(%q) = %s, want an error", tc.in, cpuList(set))
				}
				return
			}
			if err != nil || cpuList(set) != tc.want {
				t.Fatalf("parseCPUs(%q) = %s, %v; want %s", tc.in, cpuList(set), err, tc.want)
			}
		})
	}
}

// TestPlace pins a real PostgreSQL cluster to the first CPU this process
// may use and this process to the others: the postmaster, its processes,
// a backend forked afterwards and every thread of this process end up
// where they belong.
func TestPlace(t *testing.T) {
	var all unix.CPUSet
	if err := unix.SchedGetaffinity(0, &all); err != nil {
		t.Fatal(err)
	}
	if all.Count() < 2 {
		t.Skip("needs two CPUs")
	}
	procs := runtime.GOMAXPROCS(0)
	t.Cleanup(func() {
		if err := pinProcess(os.Getpid(), all); err != nil {
			t.Error(err)
		}
		runtime.GOMAXPROCS(procs)
	})
	pg, err := pgtest.StartCluster()
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal(err)
		}
		t.Skip(err)
	}
	t.Cleanup(pg.Stop)
	pid, err := pg.PID()
	if err != nil {
		t.Fatal(err)
	}
	first := strings.Split(cpuList(all), ",")[0]
	db, rest, err := Place(pid, first)
	if err != nil {
		t.Fatal(err)
	}
	wantRest := all
	n, _ := strconv.Atoi(first)
	wantRest.Clear(n)
	if db != first || rest != cpuList(wantRest) {
		t.Fatalf("Place = %s, %s; want %s, %s", db, rest, first, cpuList(wantRest))
	}

	conn, err := pgx.Connect(t.Context(), pg.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(t.Context())
	var backend int
	if err := conn.QueryRow(t.Context(), "SELECT pg_backend_pid()").Scan(&backend); err != nil {
		t.Fatal(err)
	}
	children, err := childrenOf(pid)
	if err != nil {
		t.Fatal(err)
	}
	if len(children) < 2 {
		t.Fatalf("the postmaster has %d processes, want its background processes and the backend", len(children))
	}
	for _, p := range append([]int{pid, backend}, children...) {
		if got := allowedCPUs(t, p, 0); got != first {
			t.Errorf("PostgreSQL process %d may run on CPUs %s, want %s", p, got, first)
		}
	}
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		t.Fatal(err)
	}
	for _, task := range tasks {
		tid, _ := strconv.Atoi(task.Name())
		if got := allowedCPUs(t, os.Getpid(), tid); got != rest {
			t.Errorf("thread %d of this process may run on CPUs %s, want %s", tid, got, rest)
		}
	}
	if got := runtime.GOMAXPROCS(0); got != wantRest.Count() {
		t.Errorf("GOMAXPROCS = %d, want %d", got, wantRest.Count())
	}

	if _, _, err := Place(pid, cpuList(all)); err == nil {
		t.Error("Place left this process no CPU and did not fail")
	}
	if _, _, err := Place(pid, "x"); err == nil {
		t.Error("Place took a bad CPU list")
	}
}

// allowedCPUs is the Cpus_allowed_list of process pid, or of its thread
// tid when tid is not 0, as cpuList writes it.
func allowedCPUs(t *testing.T, pid, tid int) string {
	t.Helper()
	path := filepath.Join("/proc", strconv.Itoa(pid), "status")
	if tid != 0 {
		path = filepath.Join("/proc", strconv.Itoa(pid), "task", strconv.Itoa(tid), "status")
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "Cpus_allowed_list:"); ok {
			set, err := parseCPUs(strings.TrimSpace(v))
			if err != nil {
				t.Fatal(err)
			}
			return cpuList(set)
		}
	}
	t.Fatalf("%s has no Cpus_allowed_list", path)
	return ""
}
