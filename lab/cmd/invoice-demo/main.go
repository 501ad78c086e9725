// Command invoice-demo plays an agent against the example invoice service,
// protected by the idempotency interceptor against a real ledger, through
// lost responses, 429s, 504s after the write committed, parallel
// duplicates and crashes mid-handler, and prints how many intents,
// invoices and duplicates there were. It exits 1 if there was a duplicate,
// a mismatched answer or an intent left without an invoice.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"

	"github.com/idemledger/idemledger/lab/chaos"
)

func main() {
	var cfg chaos.DemoConfig
	flag.IntVar(&cfg.Intents, "intents", 200, "invoices the agent means to create")
	flag.IntVar(&cfg.Agents, "agents", 8, "intents in flight at once")
	flag.Uint64Var(&cfg.Seed, "seed", 0, "seed of the faults; 0 picks one")
	flag.StringVar(&cfg.LedgerAddr, "ledger", "", "address of a ledgerd in dev mode; empty starts one in process")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	rep, err := chaos.Demo(ctx, cfg)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "invoice-demo:", err)
		os.Exit(1)
	}
	rep.Print(os.Stdout)
	if rep.Duplicates != 0 || rep.Mismatched != 0 || rep.Answered != rep.Intents {
		os.Exit(1)
	}
}
