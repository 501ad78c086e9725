// Package lincheck checks that a ledger.Store is linearizable: it records
// histories of concurrent Begin, Complete, Release, Extend and Lookup calls
// through a ledger.Ledger over the store, and checks them with porcupine
// against a sequential model of the contract written apart from the
// ledger's code. Every store's tests run it.
//
// It is a module of its own, so that porcupine stays out of the module
// graph of write services.
package lincheck

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/idemledger/idemledger/ledger"
	"github.com/idemledger/idemledger/ledger/errcode"
	"github.com/idemledger/idemledger/ledger/ledgertest"
)

// Config shapes a linearizability run. The zero value works.
type Config struct {
	Keys    int // keys the workers share: 3
	Workers int // concurrent callers: 6
	Phases  int // rounds between clock moves: 30
	Ops     int // operations per worker per phase: 4
	Seed    uint64
	// Fault, when set, runs concurrently with each phase's operations
	// until its context ends (for instance killing database connections).
	Fault func(ctx context.Context, phase int)
	// Timeout bounds the checker: 60 s.
	Timeout time.Duration
}

// Every is a Config.Fault that calls fault at random intervals between
// lo and hi, in real time, until its phase ends. A wait ends with the
// phase: no fault lands after the phase's operations, and the next phase
// does not wait for one.
func Every(lo, hi time.Duration, fault func()) func(ctx context.Context, phase int) {
	return func(ctx context.Context, _ int) {
		for {
			t := time.NewTimer(lo + rand.N(hi-lo))
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-t.C:
			}
			fault()
		}
	}
}

func (c Config) withDefaults() Config {
	def := func(v *int, d int) {
		if *v <= 0 {
			*v = d
		}
	}
	def(&c.Keys, 3)
	def(&c.Workers, 6)
	def(&c.Phases, 30)
	def(&c.Ops, 4)
	if c.Seed == 0 {
		c.Seed = rand.Uint64()
	}
	if c.Timeout <= 0 {
		c.Timeout = time.Minute
	}
	return c
}

// The durations of the run. The clock moves between phases by one of
// linSteps, so leases, retentions and tombstone windows run out during the
// run.
const (
	linLease     = 10 * time.Second
	linExtend    = 15 * time.Second
	linRetention = 60 * time.Second
	linTombstone = 60 * time.Second
)

var linSteps = []time.Duration{0, time.Second, linLease + time.Second, linRetention}

type opKind uint8

const (
	opBegin opKind = iota
	opComplete
	opRelease
	opExtend
	opLookup
	opResolve
	opKinds
)

func (k opKind) String() string {
	return [...]string{"Begin", "Complete", "Release", "Extend", "Lookup", "Resolve"}[k]
}

// linInput is one operation: its kind, key, the phase's clock, and its
// arguments.
type linInput struct {
	Kind    opKind
	Key     int
	Now     int64 // unix µs of the frozen clock
	Fp      int   // payload 0 or 1
	TooLate bool  // Begin: first_attempt_at older than the retention and tombstone windows
	Hold    bool  // Begin: the HOLD policy
	Token   uint64
	Outcome int // Complete: 1 or 2; Resolve: 0 (not applied), 1 or 2
}

// linOutput is what the operation answered.
type linOutput struct {
	Unknown bool         // failed without a rule's answer: it may or may not have happened
	Code    errcode.Code // a rule's error, or 0
	Token   uint64       // Begin: the claim's token
	Attempt uint32       // Begin claim or replay, Lookup
	Claimed bool         // Begin: a claim (else a replay, when Code is 0)
	Outcome int          // Begin replay, Lookup: the stored outcome
	State   ledger.State
	Fp      int
}

// linState is the contract's record of one key, as the model keeps it.
type linState struct {
	Exists   bool
	State    ledger.State // IN_PROGRESS, COMPLETED or RELEASED, as stored
	Hold     bool
	Fp       int
	Token    uint64
	Attempt  uint32
	LeaseEnd int64
	Expires  int64
	Forget   int64
	Outcome  int
}

// view is how the record reads at now (docs/contract.md): absent once
// released or forgotten, or for an attempt of the TAKEOVER policy past its
// retention; OUTCOME_UNKNOWN for an attempt of the HOLD policy whose lease
// ran out; EXPIRED (a tombstone) for a completed record past its
// retention.
func (s linState) view(now int64) ledger.State {
	switch {
	case !s.Exists || s.State == ledger.StateReleased || now >= s.Forget:
		return ledger.StateAbsent
	case s.State == ledger.StateInProgress && s.Hold && now >= s.LeaseEnd:
		return ledger.StateUnknown
	case s.State == ledger.StateInProgress && now >= s.Expires:
		return ledger.StateAbsent
	case s.State == ledger.StateCompleted && now >= s.Expires:
		return ledger.StateExpired
	}
	return s.State
}

// leaseTo gives the record a lease until end and keeps it, and its
// tombstone window, at least as long.
func (s *linState) leaseTo(end int64) {
	s.LeaseEnd = end
	if end > s.Expires {
		s.Forget += end - s.Expires
		s.Expires = end
	}
}

// linApply is the sequential specification: the record after the operation
// and its answer, written from the contract (docs/contract.md),
// independently of the ledger's code.
func linApply(s linState, in linInput) (linState, linOutput) {
	now := in.Now
	v := s.view(now)
	holder := s.Exists && s.Token == in.Token && (v == ledger.StateInProgress || v == ledger.StateUnknown)
	lost := linOutput{Code: errcode.LeaseLost}
	switch in.Kind {
	case opBegin:
		switch {
		case v == ledger.StateAbsent && in.TooLate:
			return s, linOutput{Code: errcode.RetryTooLate}
		case v == ledger.StateAbsent:
			token := uint64(1)
			if s.Exists {
				token = s.Token + 1
			}
			lease := now + linLease.Microseconds()
			expires := max(now+linRetention.Microseconds(), lease)
			n := linState{Exists: true, State: ledger.StateInProgress, Hold: in.Hold, Fp: in.Fp, Token: token, Attempt: 1,
				LeaseEnd: lease, Expires: expires, Forget: expires + linTombstone.Microseconds()}
			return n, linOutput{Claimed: true, Token: token, Attempt: 1}
		case s.Fp != in.Fp:
			return s, linOutput{Code: errcode.KeyReused}
		case v == ledger.StateCompleted:
			return s, linOutput{Outcome: s.Outcome, Attempt: s.Attempt}
		case v == ledger.StateExpired:
			return s, linOutput{Code: errcode.KeyExpired}
		case v == ledger.StateUnknown:
			return s, linOutput{Code: errcode.OutcomeUnknown}
		case now < s.LeaseEnd:
			return s, linOutput{Code: errcode.InProgress}
		}
		n := s
		n.Token++
		n.Attempt++
		n.leaseTo(now + linLease.Microseconds())
		return n, linOutput{Claimed: true, Token: n.Token, Attempt: n.Attempt}
	case opComplete:
		switch {
		case v == ledger.StateCompleted && s.Token == in.Token && s.Outcome == in.Outcome:
			return s, linOutput{}
		case !holder:
			return s, lost
		}
		n := s
		n.State, n.Outcome = ledger.StateCompleted, in.Outcome
		return n, linOutput{}
	case opRelease:
		if s.Exists && s.State == ledger.StateReleased && s.Token == in.Token && now < s.Expires {
			return s, linOutput{}
		}
		if !holder {
			return s, lost
		}
		n := s
		n.State = ledger.StateReleased
		return n, linOutput{}
	case opExtend:
		if !holder {
			return s, lost
		}
		n := s
		n.leaseTo(now + linExtend.Microseconds())
		return n, linOutput{}
	case opResolve:
		switch {
		case v == ledger.StateAbsent:
			return s, linOutput{Code: errcode.NotFound}
		case v == ledger.StateCompleted || v == ledger.StateExpired:
			return s, linOutput{Code: errcode.ValidationFailed}
		case v == ledger.StateInProgress && now < s.LeaseEnd:
			return s, linOutput{Code: errcode.InProgress}
		}
		n := s
		if in.Outcome == 0 {
			n.State = ledger.StateReleased
		} else {
			n.State, n.Outcome = ledger.StateCompleted, in.Outcome
		}
		return n, linOutput{}
	}
	switch v {
	case ledger.StateAbsent:
		return s, linOutput{Code: errcode.NotFound}
	case ledger.StateCompleted:
		return s, linOutput{State: v, Attempt: s.Attempt, Fp: s.Fp, Outcome: s.Outcome}
	}
	return s, linOutput{State: v, Attempt: s.Attempt, Fp: s.Fp}
}

// Model is the porcupine model of one key's record: a failed operation
// whose outcome is unknown may or may not have taken effect.
func Model() porcupine.Model {
	m := porcupine.NondeterministicModel{
		Partition: func(history []porcupine.Operation) [][]porcupine.Operation {
			byKey := map[int][]porcupine.Operation{}
			for _, op := range history {
				k := op.Input.(linInput).Key
				byKey[k] = append(byKey[k], op)
			}
			var parts [][]porcupine.Operation
			for _, ops := range byKey {
				parts = append(parts, ops)
			}
			return parts
		},
		Init: func() []any { return []any{linState{}} },
		Step: func(state, input, output any) []any {
			s, in, out := state.(linState), input.(linInput), output.(linOutput)
			next, want := linApply(s, in)
			if out.Unknown {
				if next == s {
					return []any{s}
				}
				return []any{s, next}
			}
			if want != out {
				return nil
			}
			return []any{next}
		},
		DescribeOperation: func(input, output any) string {
			in, out := input.(linInput), output.(linOutput)
			return fmt.Sprintf("%s(k%d tok=%d fp=%d late=%v hold=%v out=%d) -> %+v", in.Kind, in.Key, in.Token, in.Fp, in.TooLate, in.Hold, in.Outcome, out)
		},
		DescribeState: func(state any) string { return fmt.Sprintf("%+v", state.(linState)) },
	}
	return m.ToModel()
}

// History runs concurrent Begin, Complete, Release, Extend and Lookup
// calls through a Ledger over a store from newStore and returns the
// history. The clock is frozen while a phase's calls run and moves between
// phases, so every call's time is known to the model.
func History(t testing.TB, newStore func(now func() time.Time) ledger.Store, cfg Config) []porcupine.Operation {
	t.Helper()
	cfg = cfg.withDefaults()
	clock := ledgertest.NewClock(ledgertest.Start)
	l := ledger.New(newStore(clock.Now), ledger.Config{})
	ns := "lin-" + fmt.Sprintf("%x", rand.Uint64())
	var seq atomic.Int64
	var mu sync.Mutex
	var history []porcupine.Operation
	rng := rand.New(rand.NewPCG(cfg.Seed, 1))
	tokens := make([][]uint64, cfg.Workers) // per worker: the last token it saw per key
	for w := range tokens {
		tokens[w] = make([]uint64, cfg.Keys)
	}
	for phase := range cfg.Phases {
		now := clock.Now()
		// Each worker's operations for the phase, drawn up front so the
		// run is reproducible from the seed.
		plans := make([][]linInput, cfg.Workers)
		for w := range plans {
			for range cfg.Ops {
				in := linInput{Kind: opKind(rng.IntN(int(opKinds))), Key: rng.IntN(cfg.Keys), Now: now.UnixMicro(), Outcome: 1 + rng.IntN(2)}
				switch in.Kind {
				case opBegin:
					in.Fp = boolInt(rng.IntN(8) == 0)
					in.TooLate = rng.IntN(10) == 0
					in.Hold = rng.IntN(4) == 0
				case opResolve:
					in.Outcome = rng.IntN(3)
				}
				if rng.IntN(5) == 0 {
					in.Token = uint64(1 + rng.IntN(4)) // a stale or made-up token
				} else {
					in.Token = fromWorker // filled in with the worker's last token when it runs
				}
				plans[w] = append(plans[w], in)
			}
		}
		ctx, stopFault := context.WithCancel(context.Background())
		var faultDone sync.WaitGroup
		if cfg.Fault != nil {
			faultDone.Go(func() { cfg.Fault(ctx, phase) })
		}
		var wg sync.WaitGroup
		for w := range cfg.Workers {
			wg.Go(func() {
				for _, in := range plans[w] {
					if in.Token == fromWorker {
						in.Token = max(tokens[w][in.Key], 1)
					}
					call := seq.Add(1)
					out := linCall(l, ns, in, now)
					ret := seq.Add(1)
					if out.Claimed {
						tokens[w][in.Key] = out.Token
					}
					mu.Lock()
					history = append(history, porcupine.Operation{ClientId: w, Input: in, Call: call, Output: out, Return: ret})
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		stopFault()
		faultDone.Wait()
		clock.Advance(linSteps[rng.IntN(len(linSteps))])
	}
	return history
}

// fromWorker marks a token the worker fills in, when it runs, with the
// last token it was given for the key.
const fromWorker = ^uint64(0)

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

func linCall(l *ledger.Ledger, ns string, in linInput, now time.Time) linOutput {
	ctx := context.Background()
	sc := ledger.Scope{Namespace: ns, Tenant: "t", Key: fmt.Sprint("k", in.Key)}
	outcome := ledgertest.Response(fmt.Sprint(in.Outcome))
	var err error
	switch in.Kind {
	case opBegin:
		tomb := linTombstone
		req := ledger.BeginRequest{Scope: sc, Fingerprint: ledgertest.Fingerprint(fmt.Sprint(in.Fp)), Method: ledgertest.Method,
			Lease: linLease, Retention: linRetention, TombstoneRetention: &tomb}
		if in.TooLate {
			req.FirstAttemptAt = now.Add(-2 * (linRetention + linTombstone))
		}
		if in.Hold {
			req.OnLeaseExpiry = ledger.Hold
		}
		var res ledger.BeginResponse
		if res, err = l.Begin(ctx, req); err == nil {
			if res.Claim != nil {
				return linOutput{Claimed: true, Token: res.Claim.Token, Attempt: res.Claim.Attempt}
			}
			return linOutput{Outcome: outcomeID(res.Replay.Outcome), Attempt: res.Replay.Attempt}
		}
	case opComplete:
		_, err = l.Complete(ctx, sc, in.Token, outcome)
	case opRelease:
		err = l.Release(ctx, sc, in.Token)
	case opExtend:
		_, err = l.Extend(ctx, sc, in.Token, linExtend)
	case opLookup:
		var rec ledger.Record
		if rec, err = l.Lookup(ctx, sc, 0); err == nil {
			fp := 0
			if rec.Fingerprint == ledgertest.Fingerprint("1") {
				fp = 1
			}
			return linOutput{State: rec.State, Attempt: rec.Attempt, Fp: fp, Outcome: outcomeID(rec.Outcome)}
		}
	case opResolve:
		var o *ledger.Outcome
		if in.Outcome != 0 {
			o = outcome
		}
		_, err = l.Resolve(ctx, sc, o)
	}
	if err == nil {
		return linOutput{}
	}
	var le *errcode.Error
	if errors.As(err, &le) {
		switch le.Code {
		case errcode.InProgress, errcode.KeyReused, errcode.RetryTooLate, errcode.LeaseLost, errcode.NotFound,
			errcode.KeyExpired, errcode.OutcomeUnknown, errcode.ValidationFailed:
			return linOutput{Code: le.Code}
		}
	}
	return linOutput{Unknown: true}
}

func outcomeID(o *ledger.Outcome) int {
	if o == nil || o.Response == nil {
		return 0
	}
	for id := 1; id <= 2; id++ {
		if bytes.Equal(o.Response.GetValue(), ledgertest.Response(fmt.Sprint(id)).Response.GetValue()) {
			return id
		}
	}
	return -1
}

// Check runs History and checks it against Model. It
// returns the checker's verdict and what it found, the history's size, and
// how many operations ended with an unknown outcome.
func Check(t testing.TB, newStore func(now func() time.Time) ledger.Store, cfg Config) (res porcupine.CheckResult, info porcupine.LinearizationInfo, ops, unknown int) {
	t.Helper()
	cfg = cfg.withDefaults()
	history := History(t, newStore, cfg)
	for _, op := range history {
		if op.Output.(linOutput).Unknown {
			unknown++
		}
	}
	res, info = porcupine.CheckOperationsVerbose(Model(), history, cfg.Timeout)
	return res, info, len(history), unknown
}

// Run fails the test unless the store's history is linearizable.
func Run(t testing.TB, newStore func(now func() time.Time) ledger.Store, cfg Config) {
	t.Helper()
	cfg = cfg.withDefaults()
	res, info, ops, unknown := Check(t, newStore, cfg)
	t.Logf("%d operations (%d with unknown outcome), seed %d: %s", ops, unknown, cfg.Seed, res)
	if res == porcupine.Illegal {
		// Kept after the test, for a person to open.
		if f, err := os.CreateTemp("", "lin-*.html"); err == nil { //nolint:usetesting // see above
			_ = porcupine.Visualize(Model(), info, f)
			_ = f.Close()
			t.Logf("the violation is drawn in %s", f.Name())
		}
	}
	if res != porcupine.Ok {
		t.Fatalf("history is %s, want ok (seed %d)", res, cfg.Seed)
	}
}
