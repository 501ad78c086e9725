// Package guardcases_test runs the guard's behaviour cases
// (testdata/guard-cases.json) against mcpguard, in a Go SDK server driven
// by the Go SDK's client, on the 2025 revisions (a session, initialize)
// and on 2026-07-28 (the server stateless, the client's requests carrying
// their _meta envelope), at a real ledgerd and at a LedgerService on the
// memory store, both on loopback gRPC. The same
// table runs against the TypeScript guard in sdk/typescript's
// test/cases.test.ts (TestTypeScriptClient, cmd/ledgerd): a case that
// passes in one language and fails in the other fails the build.
package guardcases_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	ledgerv1 "github.com/idemledger/idemledger/gen/idemledger/v1"
	"github.com/idemledger/idemledger/interceptors/guard"
	"github.com/idemledger/idemledger/interceptors/mcpguard"
	"github.com/idemledger/idemledger/internal/ledgerdtest"
	"github.com/idemledger/idemledger/ledger/ledgerclient"
	"github.com/idemledger/idemledger/ledger/ledgertest"
	"github.com/idemledger/idemledger/server/servertest"
)

// table is testdata/guard-cases.json.
type table struct {
	Cases []tcase `json:"cases"`
}

type tcase struct {
	Name   string `json:"name"`
	Policy struct {
		KeyOptional   bool     `json:"key_optional"`
		OnInProgress  string   `json:"on_in_progress"`
		MaxWaitMS     int      `json:"max_wait_ms"`
		LeaseMS       int      `json:"lease_ms"`
		TransientText string   `json:"transient_text"`
		OnLeaseExpiry string   `json:"on_lease_expiry"`
		ReconcileText string   `json:"reconcile_text"`
		RetentionMS   int      `json:"retention_ms"`
		HostCallIDs   []string `json:"host_call_ids"`
	} `json:"policy"`
	Only            string `json:"only"`
	Needs           string `json:"needs"`
	MaxOutcomeBytes int    `json:"max_outcome_bytes"`
	MaxBodyBytes    int64  `json:"max_body_bytes"`
	LedgerDown      bool   `json:"ledger_down"`
	Steps           []step `json:"steps"`
	Runs            int64  `json:"runs"`
}

type step struct {
	Key      string         `json:"key"`
	Via      string         `json:"via"`
	Meta     map[string]any `json:"meta"`
	Args     string         `json:"args"`
	AfterMS  int            `json:"after_ms"`
	HangUpMS int            `json:"hang_up_ms"`
	// ReleaseMS lets the held run go that long after this step is sent.
	ReleaseMS int `json:"release_ms"`
	Tool      struct {
		Text      string `json:"text"`
		TextBytes int    `json:"text_bytes"`
		ErrorText string `json:"error_text"`
		Hold      bool   `json:"hold"`
		Unknown   bool   `json:"unknown"`
		TokenText bool   `json:"token_text"`
		Confirm   bool   `json:"confirm"`
	} `json:"tool"`
	Expect answer `json:"expect"`
}

// answer is what a step's result says, as the table writes it.
type answer struct {
	Text      string `json:"text,omitempty"`
	TextBytes int    `json:"text_bytes,omitempty"`
	IsError   bool   `json:"is_error,omitempty"`
	Replayed  bool   `json:"replayed"`
	Error     string `json:"error,omitempty"`
	Retryable bool   `json:"retryable"`
	Status    int    `json:"status,omitempty"` // over HTTP
}

// matches says whether got is the answer the table wants: the status only
// where the table names one.
func (got answer) matches(want answer) bool {
	if want.Status == 0 {
		got.Status = 0
	}
	return got == want
}

func load(t *testing.T) table {
	t.Helper()
	b, err := os.ReadFile("../../testdata/guard-cases.json")
	if err != nil {
		t.Fatal(err)
	}
	var tb table
	if err := json.Unmarshal(b, &tb); err != nil {
		t.Fatal(err)
	}
	return tb
}

func TestMain(m *testing.M) { os.Exit(ledgerdtest.Main(m)) }

func TestGuardCases(t *testing.T) {
	for _, version := range []string{"2025-11-25", "2026-07-28"} {
		t.Run(version, func(t *testing.T) {
			forEachCase(t, "mcp", func(t *testing.T, c tcase, g *guard.Guard, pass func(time.Duration), keyPrefix string) {
				runCase(t, c, g, pass, keyPrefix+"-"+version, version)
			})
		})
	}
}

// forEachCase runs every case of the table for transport with run, each at a guard of
// its own, at two ledgers: a real ledgerd on its embedded store, and a
// LedgerService on the memory store whose clock the cases move. Either
// way the ledger decides when a lease or a retention has run out; pass is
// how a step's after_ms passes on its clock.
func forEachCase(t *testing.T, transport string, run func(t *testing.T, c tcase, g *guard.Guard, pass func(time.Duration), keyPrefix string)) {
	tb := load(t)
	if len(tb.Cases) < 20 {
		t.Fatalf("the table has %d cases", len(tb.Cases))
	}
	clock := ledgertest.NewClock(time.Now())
	ledgers := []struct {
		name string
		addr func(t *testing.T) string
		pass func(time.Duration)
	}{
		{"ledgerd", func(t *testing.T) string {
			return ledgerdtest.Start(t, "--admin-listen", "", "--http-listen", "", "--data-dir", t.TempDir()).GRPC
		}, time.Sleep}, // a real ledgerd's clock, which a test cannot move: the step waits longer than the case's lease
		{"memory", func(t *testing.T) string { return memoryLedger(t, clock) }, clock.Advance},
	}
	for _, l := range ledgers {
		t.Run(l.name, func(t *testing.T) {
			t.Parallel() // two ledgers of their own
			addr := l.addr(t)
			for i, c := range tb.Cases {
				if c.Only != "" && c.Only != transport {
					continue
				}
				t.Run(c.Name, func(t *testing.T) {
					target := addr
					if c.LedgerDown {
						target = closedPort(t)
					}
					run(t, c, newGuard(t, c, target), l.pass, fmt.Sprintf("go-%s-%d-%d", transport, i, time.Now().UnixNano()))
				})
			}
		})
	}
}

// newGuard is a guard at the ledger at addr, with the case's outcome limit.
func newGuard(t *testing.T, c tcase, addr string) *guard.Guard {
	t.Helper()
	conn, err := grpc.NewClient(addr, append(ledgerclient.DialOptions(), grpc.WithTransportCredentials(insecure.NewCredentials()))...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	lc := ledgerclient.New(ledgerv1.NewLedgerServiceClient(conn))
	t.Cleanup(func() { _ = lc.Close() })
	var opts []guard.Option
	if c.MaxOutcomeBytes > 0 {
		opts = append(opts, guard.WithMaxOutcomeBytes(c.MaxOutcomeBytes))
	}
	gd, err := guard.New(lc, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return gd
}

// memoryLedger serves a LedgerService on the memory store on loopback, at
// clock.
func memoryLedger(t *testing.T, clock *ledgertest.Clock) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	ledgerv1.RegisterLedgerServiceServer(gs, servertest.MemoryLedgerAt("cases", clock.Now))
	go func() { _ = gs.Serve(lis) }()
	t.Cleanup(gs.Stop)
	return lis.Addr().String()
}

// policyOf is the case's policy.
func policyOf(c tcase) guard.Policy {
	p := guard.Policy{KeyOptional: c.Policy.KeyOptional, MaxWait: time.Duration(c.Policy.MaxWaitMS) * time.Millisecond,
		Lease: time.Duration(c.Policy.LeaseMS) * time.Millisecond, Retention: time.Duration(c.Policy.RetentionMS) * time.Millisecond}
	if c.Policy.OnInProgress == "reject" {
		p.OnInProgress = guard.Reject
	}
	if c.Policy.OnLeaseExpiry == "hold" {
		p.OnLeaseExpiry = guard.Hold
	}
	return p
}

// closedPort is a loopback address nothing listens on.
func closedPort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	_ = l.Close()
	return addr
}

// script is what the tool does on each step, in order.
type script struct {
	steps []step
	next  atomic.Int64
	runs  atomic.Int64
	gate  gate
}

func (s *script) handler(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
	s.runs.Add(1)
	st := s.steps[s.next.Load()]
	if st.Tool.Hold {
		s.gate.hold()
	}
	switch {
	case st.Tool.Confirm && !confirmed(req):
		return &mcp.CallToolResult{InputRequests: mcp.InputRequestMap{"confirm": &mcp.ElicitParams{Message: "sure?",
			RequestedSchema: map[string]any{"type": "object", "properties": map[string]any{"confirm": map[string]any{"type": "boolean"}}}}}}, nil
	case st.Tool.Unknown:
		return nil, fmt.Errorf("the invoice service hung up: %w", guard.ErrOutcomeUnknown)
	case st.Tool.ErrorText != "":
		return &mcp.CallToolResult{IsError: true, Content: []mcp.Content{&mcp.TextContent{Text: st.Tool.ErrorText}}}, nil
	case st.Tool.TokenText:
		c, _ := guard.ClaimFromContext(ctx)
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: fmt.Sprintf("token %d, attempt %d", c.Token, c.Attempt)}}}, nil
	case st.Tool.TextBytes > 0:
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: strings.Repeat("x", st.Tool.TextBytes)}}}, nil
	}
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: st.Tool.Text}}}, ctx.Err()
}

// confirmed reports whether a round's inputResponses confirm the call.
func confirmed(req *mcp.CallToolRequest) bool {
	r, ok := req.Params.InputResponses["confirm"]
	if !ok {
		return false
	}
	res, ok := r.(*mcp.ElicitResult)
	return ok && res.Action == "accept" && res.Content["confirm"] == true
}

// runCase runs one case on the protocol version: a stateless server for
// 2026-07-28, a session's for the 2025 revisions.
func runCase(t *testing.T, c tcase, gd *guard.Guard, pass func(time.Duration), keyPrefix, version string) {
	tool := mcpguard.NewTool(policyOf(c))
	tool.HostCallIDs = c.Policy.HostCallIDs
	if text := c.Policy.ReconcileText; text != "" {
		tool.Reconcile = func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: text}}}, nil
		}
	}
	if text := c.Policy.TransientText; text != "" {
		tool.Transient = func(r *mcp.CallToolResult) bool {
			tc, ok := r.Content[0].(*mcp.TextContent)
			return ok && tc.Text == text
		}
	}
	g, err := mcpguard.New(gd, mcpguard.WithTenant(mcpguard.Tenant("acme")), mcpguard.WithTool("create_invoice", tool))
	if err != nil {
		t.Fatal(err)
	}
	s := &script{steps: c.Steps, gate: newGate()}
	srv := mcp.NewServer(&mcp.Implementation{Name: "cases", Version: "v1"}, nil)
	srv.AddTool(&mcp.Tool{Name: "create_invoice", InputSchema: map[string]any{"type": "object"}}, s.handler)
	srv.AddReceivingMiddleware(g.Middleware())
	hs := httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv },
		&mcp.StreamableHTTPOptions{Stateless: version >= "2026-07-28"}))
	t.Cleanup(hs.Close)
	cl := mcp.NewClient(&mcp.Implementation{Name: "agent", Version: "v1"}, &mcp.ClientOptions{
		ElicitationHandler: func(context.Context, *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
			return &mcp.ElicitResult{Action: "accept", Content: map[string]any{"confirm": true}}, nil
		},
	})
	cs, err := cl.Connect(t.Context(), &mcp.StreamableClientTransport{Endpoint: hs.URL}, &mcp.ClientSessionOptions{ProtocolVersion: version})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cs.Close() })

	drive(t, c, &s.gate, pass, func(i int) { s.next.Store(int64(i)) }, func(st step) answer { return call(t, cs, keyPrefix, c.Policy.HostCallIDs, st) })
	if s.runs.Load() != c.Runs {
		t.Errorf("the tool ran %d times, want %d", s.runs.Load(), c.Runs)
	}
}

// gate holds a run of the tool until the next step has its answer.
type gate struct {
	entered chan struct{} // a held run has started
	release chan struct{} // the held run may answer
	once    sync.Once
}

func newGate() gate { return gate{entered: make(chan struct{}, 1), release: make(chan struct{})} }

// hold is what a held run does.
func (g *gate) hold() {
	g.entered <- struct{}{}
	<-g.release
}

func (g *gate) open() { g.once.Do(func() { close(g.release) }) }

// drive sends the case's steps in order and checks each answer. A held
// step goes in the background and is answered once the next step has its
// answer; one whose caller hangs up goes on once it has. after_ms passes
// on the ledger's clock. next tells the tool which step it runs.
func drive(t *testing.T, c tcase, g *gate, pass func(time.Duration), next func(int), send func(step) answer) {
	t.Helper()
	var held chan answer // the answer of a held step, once released
	defer g.open()       // a failed step leaves no run held
	for i, st := range c.Steps {
		if st.AfterMS > 0 {
			pass(time.Duration(st.AfterMS) * time.Millisecond)
		}
		next(i)
		if st.Tool.Hold {
			held = make(chan answer, 1)
			go func() { held <- send(st) }()
			<-g.entered
			if st.HangUpMS > 0 {
				// Its caller hangs up while the run is held; then the run
				// goes on, outliving it.
				if h := <-held; !h.matches(st.Expect) {
					t.Errorf("step %d: %+v, want %+v", i+1, h, st.Expect)
				}
				held = nil
				g.open()
			}
			continue
		}
		if held != nil && st.ReleaseMS > 0 {
			// The held run ends while this step waits for its answer.
			time.AfterFunc(time.Duration(st.ReleaseMS)*time.Millisecond, g.open)
		}
		got := send(st)
		if held != nil {
			g.open()
			if h := <-held; !h.matches(c.Steps[i-1].Expect) {
				t.Errorf("step %d (held): %+v, want %+v", i, h, c.Steps[i-1].Expect)
			}
			held = nil
		}
		if !got.matches(st.Expect) {
			t.Errorf("step %d: %+v, want %+v", i+1, got, st.Expect)
		}
	}
	if held != nil {
		g.open()
		<-held
	}
}

// call sends one step and reads its answer as the table writes it.
func call(t *testing.T, cs *mcp.ClientSession, keyPrefix string, hostCallIDs []string, st step) answer {
	args := json.RawMessage(st.Args)
	params := &mcp.CallToolParams{Name: "create_invoice"}
	if st.Key != "" && st.Via != "meta" {
		var m map[string]json.RawMessage
		if err := json.Unmarshal(args, &m); err != nil {
			t.Fatal(err)
		}
		k, _ := json.Marshal(keyPrefix + st.Key)
		// The key argument goes first, the arguments' text after it as
		// written.
		args = json.RawMessage(`{"` + mcpguard.DefaultKeyArgument + `":` + string(k) + `,` + strings.TrimPrefix(st.Args, "{"))
	}
	if st.Key != "" && st.Via == "meta" {
		key := keyPrefix + st.Key
		if strings.ContainsFunc(st.Key, func(r rune) bool { return r > 0x7e }) {
			key = st.Key // an invalid key as it is
		}
		params.Meta = mcp.Meta{mcpguard.KeyMeta: key}
	}
	for k, v := range st.Meta {
		if params.Meta == nil {
			params.Meta = mcp.Meta{}
		}
		if s, ok := v.(string); ok && slices.Contains(hostCallIDs, k) {
			v = keyPrefix + s // a host's call id, unique to the run as a key is
		}
		params.Meta[k] = v
	}
	params.Arguments = args
	ctx := context.Background()
	if st.HangUpMS > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, time.Duration(st.HangUpMS)*time.Millisecond)
		defer cancel()
	}
	res, err := cs.CallTool(ctx, params)
	if err != nil && st.HangUpMS > 0 && ctx.Err() != nil {
		return answer{Error: "HUNG_UP"}
	}
	if err != nil {
		return answer{Error: "JSON-RPC: " + err.Error()}
	}
	var a answer
	if info, ok := mcpguard.ErrorFromResult(res); ok {
		return answer{Error: info.Code, Retryable: info.Retryable}
	}
	a.IsError = res.IsError
	a.Replayed = res.Meta[mcpguard.ReplayedMeta] == true
	if len(res.Content) == 1 {
		if tc, ok := res.Content[0].(*mcp.TextContent); ok {
			a.Text = tc.Text
			if len(tc.Text) > 1024 {
				a.Text, a.TextBytes = "", len(tc.Text)
			}
		}
	}
	return a
}
