package bench

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Place pins the database server whose main process is dbPID, and the
// processes it starts, to the CPUs in the list dbCPUs ("1", "2-3", as
// taskset takes them), and this process to the CPUs it may use less
// those, with GOMAXPROCS set to their number. It returns the CPU lists of
// both.
//
// On a small machine the database, the service and the clients otherwise
// compete for the same cores, and a measurement says as much about the
// scheduler as about the service. Cores of its own for the database model a
// deployment, where the database runs on machines of its own and its
// capacity is what a service in front of it spends.
func Place(dbPID int, dbCPUs string) (db, rest string, err error) {
	dbSet, err := parseCPUs(dbCPUs)
	if err != nil {
		return "", "", err
	}
	restSet, err := without(dbSet)
	if err != nil {
		return "", "", err
	}
	if err := pinTree(dbPID, dbSet); err != nil {
		return "", "", fmt.Errorf("pin the database: %w", err)
	}
	if err := pinProcess(os.Getpid(), restSet); err != nil {
		return "", "", fmt.Errorf("pin this process: %w", err)
	}
	runtime.GOMAXPROCS(restSet.Count())
	return cpuList(dbSet), cpuList(restSet), nil
}

// parseCPUs parses a CPU list as taskset takes it: "1", "0,2", "2-3".
func parseCPUs(s string) (unix.CPUSet, error) {
	var set unix.CPUSet
	for _, part := range strings.Split(s, ",") {
		lo, hi, isRange := strings.Cut(strings.TrimSpace(part), "-")
		first, err := strconv.Atoi(lo)
		last := first
		if err == nil && isRange {
			last, err = strconv.Atoi(hi)
		}
		if err != nil || first < 0 || last < first || last >= 1024 {
			return set, fmt.Errorf("bad CPU list %q", s)
		}
		for c := first; c <= last; c++ {
			set.Set(c)
		}
	}
	return set, nil
}

// without is the CPUs this process may run on, less cpus.
func without(cpus unix.CPUSet) (unix.CPUSet, error) {
	var rest unix.CPUSet
	if err := unix.SchedGetaffinity(0, &rest); err != nil {
		return rest, fmt.Errorf("CPU affinity: %w", err)
	}
	for c := range 1024 {
		if cpus.IsSet(c) {
			rest.Clear(c)
		}
	}
	if rest.Count() == 0 {
		return rest, fmt.Errorf("no CPU is left for this process")
	}
	return rest, nil
}

// pinTree restricts the process pid and its descendants to cpus; processes
// they start later inherit it (a PostgreSQL backend is forked by the
// postmaster).
func pinTree(pid int, cpus unix.CPUSet) error {
	if err := pinProcess(pid, cpus); err != nil {
		return err
	}
	children, err := childrenOf(pid)
	if err != nil {
		return err
	}
	for _, c := range children {
		// A child that exited meanwhile has nothing to pin.
		if err := pinTree(c, cpus); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	return nil
}

// pinProcess sets the affinity of each of pid's threads; threads started
// later inherit it.
func pinProcess(pid int, cpus unix.CPUSet) error {
	tasks, err := os.ReadDir(filepath.Join("/proc", strconv.Itoa(pid), "task"))
	if err != nil {
		return err
	}
	for _, t := range tasks {
		tid, err := strconv.Atoi(t.Name())
		if err != nil {
			continue
		}
		if err := unix.SchedSetaffinity(tid, &cpus); err != nil && err != unix.ESRCH {
			return fmt.Errorf("pin thread %d of process %d: %w", tid, pid, err)
		}
	}
	return nil
}

// childrenOf lists the processes whose parent is pid.
func childrenOf(pid int) ([]int, error) {
	procs, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	var children []int
	for _, p := range procs {
		child, err := strconv.Atoi(p.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(filepath.Join("/proc", p.Name(), "stat"))
		if err != nil {
			continue // gone
		}
		// The fields after the command, which may hold spaces and
		// parentheses: state, ppid, ...
		end := strings.LastIndexByte(string(stat), ')')
		fields := strings.Fields(string(stat[end+1:]))
		if end < 0 || len(fields) < 2 {
			continue
		}
		if ppid, _ := strconv.Atoi(fields[1]); ppid == pid {
			children = append(children, child)
		}
	}
	return children, nil
}

// cpuList writes set as a CPU list: "0", "1,3".
func cpuList(set unix.CPUSet) string {
	var cpus []string
	for c := range 1024 {
		if set.IsSet(c) {
			cpus = append(cpus, strconv.Itoa(c))
		}
	}
	return strings.Join(cpus, ",")
}
