// Command ledgerchaos runs many intents through agents, the example invoice
// service, ledgerd and (optionally) PostgreSQL, with a fault proxy on every
// hop, while it cuts responses, adds latency, resets connections, answers
// 429 storms, kills ledgerd with SIGKILL and restarts the database. It
// prints a table of the faults and the outcomes, and exits 1 if any intent
// ended with no effect or two, went unanswered, or got two different
// answers.
//
//	go run ./lab/cmd/ledgerchaos -intents 10000                  # ledgerd on its embedded store
//	go run ./lab/cmd/ledgerchaos -intents 10000 -store postgres  # on a throwaway PostgreSQL it restarts
package main

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"time"

	"github.com/idemledger/idemledger/internal/pgtest"
	"github.com/idemledger/idemledger/lab/chaos"
)

func main() {
	var cfg chaos.Config
	var storeName, ledgerd string
	flag.IntVar(&cfg.Intents, "intents", 10000, "intents to run")
	flag.IntVar(&cfg.Agents, "agents", 32, "intents in flight at once")
	flag.Uint64Var(&cfg.Seed, "seed", 0, "seed of the agents' and faults' choices; 0 picks one")
	flag.DurationVar(&cfg.FaultEvery, "fault-every", time.Second, "mean pause between faults of each kind")
	flag.StringVar(&storeName, "store", "embedded", "embedded, or postgres (a throwaway cluster, restarted as a fault)")
	flag.StringVar(&cfg.DatabaseURL, "database-url", "", "use this database instead of a throwaway one (not restarted)")
	flag.StringVar(&ledgerd, "ledgerd", "", "ledgerd binary; empty builds ./cmd/ledgerd")
	flag.BoolVar(&cfg.LedgerStream, "ledger-stream", false, "the write service calls the ledger over a Stream (ledger/ledgerclient)")
	flag.Parse()
	if err := run(cfg, storeName, ledgerd); err != nil {
		fmt.Fprintln(os.Stderr, "ledgerchaos:", err)
		os.Exit(1)
	}
}

func run(cfg chaos.Config, storeName, ledgerd string) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if ledgerd == "" {
		dir, err := os.MkdirTemp("", "ledgerchaos-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		ledgerd = filepath.Join(dir, "ledgerd")
		if out, err := exec.Command("go", "build", "-o", ledgerd, "./cmd/ledgerd").CombinedOutput(); err != nil {
			return fmt.Errorf("build ledgerd (run from the repository's root, or pass -ledgerd): %w\n%s", err, out)
		}
	}
	cfg.Ledgerd = ledgerd
	if cfg.Seed == 0 {
		cfg.Seed = rand.Uint64()
	}
	switch {
	case storeName == "postgres" && cfg.DatabaseURL == "":
		pg, err := pgtest.StartCluster()
		if err != nil {
			return err
		}
		defer pg.Stop()
		cfg.DatabaseURL, cfg.RestartDatabase = pg.URL, pg.Restart
	case storeName != "postgres" && storeName != "embedded":
		return fmt.Errorf("-store is embedded or postgres, not %q", storeName)
	case storeName == "embedded":
		cfg.DatabaseURL = ""
	}
	cfg.Progress = os.Stderr
	rep, err := chaos.Run(ctx, cfg)
	if err != nil {
		return err
	}
	fmt.Printf("store: %s, intents: %d, agents: %d, seed: %d\n\n", storeName, cfg.Intents, cfg.Agents, cfg.Seed)
	rep.Table(os.Stdout)
	if !rep.OK() {
		return fmt.Errorf("a guarantee broke")
	}
	return nil
}
