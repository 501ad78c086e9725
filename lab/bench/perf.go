package bench

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
)

// An FdatasyncCount starts counting the fdatasync system calls of a
// process and returns the stop that turns the count off and gives it
// (CountFdatasyncs of the process).
type FdatasyncCount func() (stop func() (uint64, error), err error)

// fdatasyncEvent is the kernel's tracepoint on entering fdatasync(2).
const fdatasyncEvent = "syscalls:sys_enter_fdatasync"

// CountFdatasyncs starts counting the fdatasync system calls of process
// pid (its threads, and those it starts) with perf, from the kernel's
// tracepoint, so that a store in this process and a server of its own,
// such as Redis, are counted alike. It returns once the count is on, with
// the stop that turns it off and gives the count. It needs perf (Debian's
// linux-perf) and the right to trace pid: as root, or with
// kernel.perf_event_paranoid at most -1.
func CountFdatasyncs(pid int) (stop func() (uint64, error), err error) {
	bin, err := exec.LookPath("perf")
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "ledgerbench-perf-")
	if err != nil {
		return nil, err
	}
	out := filepath.Join(dir, "count")
	// perf starts with the count off and turns it on when told on its
	// control pipe, then says so on its acknowledgement pipe: the count
	// covers what happens between the two, not perf's own start.
	ctlR, ctlW, err := os.Pipe()
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	ackR, ackW, err := os.Pipe()
	if err != nil {
		_ = ctlR.Close()
		_ = ctlW.Close()
		_ = os.RemoveAll(dir)
		return nil, err
	}
	cmd := exec.Command(bin, "stat", "-e", fdatasyncEvent, "-x", ",", "-o", out,
		"-p", strconv.Itoa(pid), "--delay", "-1", "--control", "fd:3,4")
	cmd.ExtraFiles = []*os.File{ctlR, ackW}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	err = cmd.Start()
	_ = ctlR.Close()
	_ = ackW.Close()
	if err != nil {
		_ = ctlW.Close()
		_ = ackR.Close()
		_ = os.RemoveAll(dir)
		return nil, err
	}
	acks := bufio.NewReader(ackR)
	// finish waits for perf to exit; interrupted is whether it was told to
	// by an interrupt, which it passes on as its own end once it has
	// written its count.
	finish := func(interrupted bool) error {
		_ = ctlW.Close()
		_ = ackR.Close()
		err := cmd.Wait()
		var exit *exec.ExitError
		if interrupted && errors.As(err, &exit) && !exit.Exited() {
			err = nil
		}
		if err != nil {
			err = fmt.Errorf("perf stat: %w: %s", err, strings.TrimSpace(stderr.String()))
		}
		return err
	}
	// command tells perf what to do and waits for it to be done; a perf
	// that cannot trace pid has exited, and its acknowledgement pipe ends.
	command := func(what string) error {
		if _, err := io.WriteString(ctlW, what+"\n"); err != nil {
			return err
		}
		ack, err := acks.ReadString('\n')
		if err != nil {
			return fmt.Errorf("perf stat did not acknowledge %q: %w", what, err)
		}
		// The acknowledgement is a C string: "ack\n\x00".
		if _, err := acks.ReadString(0); err != nil || strings.TrimSpace(ack) != "ack" {
			return fmt.Errorf("perf stat acknowledged %q with %q", what, ack)
		}
		return nil
	}
	if err := command("enable"); err != nil {
		_ = cmd.Process.Kill()
		err = errors.Join(err, finish(false))
		_ = os.RemoveAll(dir)
		return nil, err
	}
	return func() (uint64, error) {
		defer func() { _ = os.RemoveAll(dir) }()
		err := command("disable")
		// perf writes its count and exits at an interrupt (not at the end
		// of its control pipe, nor told to stop on it).
		_ = cmd.Process.Signal(os.Interrupt)
		if err := errors.Join(err, finish(true)); err != nil {
			return 0, err
		}
		b, err := os.ReadFile(out)
		if err != nil {
			return 0, err
		}
		return parseCount(b, fdatasyncEvent)
	}, nil
}

// parseCount reads event's count from perf stat's CSV output (-x ,):
// "count,unit,event,...". A count perf could not take ("<not counted>",
// "<not supported>") is an error.
func parseCount(out []byte, event string) (uint64, error) {
	for line := range strings.Lines(string(out)) {
		f := strings.Split(strings.TrimSpace(line), ",")
		if len(f) < 3 || f[2] != event {
			continue
		}
		n, err := strconv.ParseUint(f[0], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("perf stat counted %s as %q", event, f[0])
		}
		return n, nil
	}
	return 0, fmt.Errorf("perf stat gave no count of %s: %q", event, out)
}
