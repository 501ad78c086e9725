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
//
// With -fence it runs the fence's chaos instead (package chaos, RunFence):
// the invoice service on a throwaway PostgreSQL, as processes killed with
// SIGKILL at random moments, killing themselves between their commit and
// Complete, and frozen past a lease so that zombies run on; -fence=false
// is the same run without the fence (-hold: its method holds a key whose
// lease ran out instead of taking it over). Its last line counts what
// happened; with the fence it exits 1 on a double effect or an unknown
// outcome.
//
//	go run ./lab/cmd/ledgerchaos -fence -store postgres -intents 1000
//	go run ./lab/cmd/ledgerchaos -fence=false -store postgres -intents 1000
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
	"syscall"
	"time"

	"github.com/idemledger/idemledger/internal/pgtest"
	"github.com/idemledger/idemledger/lab/chaos"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "serve" {
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		err := chaos.Serve(ctx, os.Args[2:])
		stop()
		if err != nil {
			fmt.Fprintln(os.Stderr, "ledgerchaos serve:", err)
			os.Exit(1)
		}
		return
	}
	var cfg chaos.Config
	var fc chaos.FenceConfig
	var storeName, ledgerd string
	flag.IntVar(&cfg.Intents, "intents", 10000, "intents to run")
	flag.IntVar(&cfg.Agents, "agents", 32, "intents in flight at once")
	flag.Uint64Var(&cfg.Seed, "seed", 0, "seed of the agents' and faults' choices; 0 picks one")
	flag.DurationVar(&cfg.FaultEvery, "fault-every", time.Second, "mean pause between faults of each kind")
	flag.StringVar(&storeName, "store", "embedded", "ledgerd's store: embedded, or postgres (a throwaway cluster, restarted as a fault)")
	flag.StringVar(&cfg.DatabaseURL, "database-url", "", "use this database instead of a throwaway one (not restarted)")
	flag.StringVar(&ledgerd, "ledgerd", "", "ledgerd binary; empty builds ./cmd/ledgerd")
	flag.BoolVar(&cfg.LedgerStream, "ledger-stream", false, "the write service calls the ledger over a Stream (ledger/ledgerclient)")
	flag.BoolVar(&fc.Fence, "fence", false, "run the fence's chaos, fenced; -fence=false runs it unfenced")
	flag.BoolVar(&fc.Hold, "hold", false, "the unfenced fence run holds a key whose lease ran out instead of taking it over")
	flag.IntVar(&fc.Services, "services", 2, "the fence run's service processes")
	flag.DurationVar(&fc.KillEvery, "kill-every", 300*time.Millisecond, "the fence run's mean pause between SIGKILLs of a service")
	flag.DurationVar(&fc.PauseEvery, "pause-every", time.Second, "the fence run's mean pause between SIGSTOPs of a service (thawed after one and a half leases)")
	flag.Float64Var(&fc.CrashAfterCommit, "crash-after-commit", 0.02, "the fence run's chance that a service kills itself between its commit and Complete")
	flag.DurationVar(&fc.Lease, "lease", 500*time.Millisecond, "the fence run's lease")
	flag.Parse()
	fenceRun := false
	flag.Visit(func(f *flag.Flag) { fenceRun = fenceRun || f.Name == "fence" })
	var err error
	if fenceRun {
		fc.Intents, fc.Agents, fc.Seed, fc.DatabaseURL = cfg.Intents, min(cfg.Agents, 16), cfg.Seed, cfg.DatabaseURL
		err = runFence(fc, storeName, ledgerd)
	} else {
		err = run(cfg, storeName, ledgerd)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "ledgerchaos:", err)
		os.Exit(1)
	}
}

// build builds ./cmd/ledgerd (unless ledgerd names a binary) and returns
// its path and a function that removes it.
func build(ledgerd string) (string, func(), error) {
	if ledgerd != "" {
		return ledgerd, func() {}, nil
	}
	dir, err := os.MkdirTemp("", "ledgerchaos-")
	if err != nil {
		return "", nil, err
	}
	ledgerd = filepath.Join(dir, "ledgerd")
	if out, err := exec.Command("go", "build", "-o", ledgerd, "./cmd/ledgerd").CombinedOutput(); err != nil {
		_ = os.RemoveAll(dir)
		return "", nil, fmt.Errorf("build ledgerd (run from the repository's root, or pass -ledgerd): %w\n%s", err, out)
	}
	return ledgerd, func() { _ = os.RemoveAll(dir) }, nil
}

func run(cfg chaos.Config, storeName, ledgerd string) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	ledgerd, remove, err := build(ledgerd)
	if err != nil {
		return err
	}
	defer remove()
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

// runFence runs the fence's chaos: the invoices on PostgreSQL (a
// throwaway cluster unless -database-url names one), ledgerd on -store.
func runFence(cfg chaos.FenceConfig, storeName, ledgerd string) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	ledgerd, remove, err := build(ledgerd)
	if err != nil {
		return err
	}
	defer remove()
	self, err := os.Executable()
	if err != nil {
		return err
	}
	cfg.Ledgerd, cfg.Service = ledgerd, self
	if cfg.Seed == 0 {
		cfg.Seed = rand.Uint64()
	}
	switch storeName {
	case "postgres":
		cfg.LedgerOnPostgres = true
	case "embedded":
	default:
		return fmt.Errorf("-store is embedded or postgres, not %q", storeName)
	}
	if cfg.DatabaseURL == "" {
		pg, err := pgtest.StartCluster()
		if err != nil {
			return err
		}
		defer pg.Stop()
		cfg.DatabaseURL = pg.URL
	}
	cfg.Progress = os.Stderr
	rep, err := chaos.RunFence(ctx, cfg)
	if err != nil {
		return err
	}
	fmt.Printf("ledgerd's store: %s, intents: %d, agents: %d, services: %d, seed: %d\n\n", storeName, cfg.Intents, cfg.Agents, cfg.Services, cfg.Seed)
	rep.Table(os.Stdout)
	fmt.Println(rep.Line())
	if cfg.Fence && !rep.OK() {
		return fmt.Errorf("the fence's promise broke")
	}
	return nil
}
