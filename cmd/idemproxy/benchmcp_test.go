package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/idemledger/idemledger/internal/nodetest"
)

// TestBenchMCPRuns runs make bench-mcp's script (sdk/typescript/bench/
// mcp.mjs) briefly, on ledgerd built from this tree and this test binary
// as idemproxy: every pair it measures answers, and each prints its
// ratios and the machine's and ledgerd's CPU a call, each of the proxy's
// idemproxy's CPU a call (over HTTP and over stdio), as does the guard's
// CPU in process, with ledgerd's. Then the guard's pair again, its ledger
// client on ledgerd's gRPC listener (--guard-protocol grpc). The numbers
// themselves are docs/performance.md's.
func TestBenchMCPRuns(t *testing.T) {
	if testing.Short() {
		t.Skip("builds ledgerd")
	}
	t.Parallel()
	node, guardJS := nodetest.Guard(t)
	bin := t.TempDir()
	build := exec.Command("go", "build", "-o", bin, "github.com/idemledger/idemledger/cmd/ledgerd")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	bench := func(args ...string) (rows, proxyCPU, machineCPU int, inProcess bool, out []byte) {
		args = append([]string{filepath.Join("..", "..", "sdk", "typescript", "bench", "mcp.mjs"),
			"--ledgerd", filepath.Join(bin, "ledgerd"), "--idemproxy", os.Args[0], "--guard", guardJS,
			"--calls", "10", "--block", "5", "--clients", "2", "--seconds", "0.2", "--rounds", "1",
			"--ledgerd-procs", "1", "--proxy-procs", "1"}, args...) // the processes sized to one core, as docs/performance.md measures them too
		cmd := exec.CommandContext(t.Context(), node, args...)     //nolint:gosec // the test's own
		cmd.Env = append(os.Environ(), "IDEMPROXY_TEST_AS_MAIN=1") // the proxy the script starts is this binary's cli
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("bench/mcp.mjs: %v\n%s", err, out)
		}
		for line := range strings.Lines(string(out)) {
			if strings.Contains(line, " p50 ") && strings.Contains(line, "calls/s") {
				rows++
				if strings.HasPrefix(line, "proxy ") && strings.Contains(line, ", idemproxy ") && strings.Contains(line, "µs of CPU a call") {
					proxyCPU++
				}
				if strings.Contains(line, "; the machine's CPU a call ") && strings.Contains(line, " µs, ledgerd's ") {
					machineCPU++
				}
			}
			inProcess = inProcess || strings.HasPrefix(line, "guard in process") && strings.Contains(line, "µs of CPU a call") && strings.Contains(line, "ledgerd's ")
		}
		return rows, proxyCPU, machineCPU, inProcess, out
	}
	if rows, proxyCPU, machineCPU, inProcess, out := bench(); rows != 11 || proxyCPU != 8 || machineCPU != 11 || !inProcess {
		t.Fatalf("%d pairs measured, %d with idemproxy's CPU a call, %d with the machine's and ledgerd's; want 11 (the guard on v2 in both eras and v1, the proxy over HTTP and stdio and its pass-through over each, in both eras), 8 of them the proxy's with its CPU, all 11 with the machine's, and the guard's CPU in process with ledgerd's:\n%s", rows, proxyCPU, machineCPU, out)
	}
	if rows, _, machineCPU, inProcess, out := bench("--guard-protocol", "grpc", "--only", "guard v2 2025,guard-cpu"); rows != 1 || machineCPU != 1 || !inProcess {
		t.Fatalf("%d pairs measured, %d with the machine's and ledgerd's CPU; want the guard's v2 2025 pair, with both, and the guard's CPU in process:\n%s", rows, machineCPU, out)
	}
}
