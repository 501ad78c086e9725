// Command mcp-demo drives the example MCP invoice tool server through the
// faults agents meet (lost responses, 429s, dropped streams re-issued with
// a new JSON-RPC id, parallel duplicates, crashes of the tool server
// before and after its write) and prints intents, invoices and
// duplicates. It exits 1 if any intent wrote more or less than one
// invoice, or was answered with another.
//
//	go run ./lab/cmd/mcp-demo [-intents 60] [-json]
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"time"

	"github.com/idemledger/idemledger/lab/mcpdemo"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "serve" {
		if err := mcpdemo.Serve(os.Args[2:]); err != nil {
			fmt.Fprintln(os.Stderr, "mcp-demo serve:", err)
			os.Exit(1)
		}
		return
	}
	intents := flag.Int("intents", 60, "intents the agent carries out")
	lease := flag.Duration("lease", time.Second, "create_invoice's lease")
	asJSON := flag.Bool("json", false, "print the report as JSON")
	flag.Parse()
	rep, err := run(*intents, *lease)
	if err != nil {
		fmt.Fprintln(os.Stderr, "mcp-demo:", err)
		os.Exit(1)
	}
	if *asJSON {
		_ = json.NewEncoder(os.Stdout).Encode(rep)
	} else {
		fmt.Printf("intents %d, answered %d, invoices %d, duplicates %d, mismatched %d, tool server restarts %d, %.1f s\n",
			rep.Intents, rep.Answered, rep.Invoices, rep.Duplicates, rep.Mismatched, rep.Restarts, rep.Seconds)
		for _, kind := range mcpdemo.FaultKinds {
			fmt.Printf("  %-20s %d\n", kind, rep.Faults[kind])
		}
	}
	if !rep.OK() {
		os.Exit(1)
	}
}

// run runs the demo with its tool server this binary's serve subcommand.
func run(intents int, lease time.Duration) (mcpdemo.Report, error) {
	dir, err := os.MkdirTemp("", "mcp-demo-")
	if err != nil {
		return mcpdemo.Report{}, err
	}
	defer os.RemoveAll(dir)
	self, err := os.Executable()
	if err != nil {
		return mcpdemo.Report{}, err
	}
	return mcpdemo.Run(context.Background(), mcpdemo.Config{
		Intents: intents, Lease: lease, Dir: dir, Log: os.Stderr,
		Server: func(args ...string) *exec.Cmd { return exec.Command(self, append([]string{"serve"}, args...)...) },
	})
}
