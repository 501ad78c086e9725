package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"os/exec"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/idemledger/idemledger/interceptors/guard"
	"github.com/idemledger/idemledger/interceptors/mcpguard"
)

// upstream is the MCP server behind the proxy: one client session, over
// Streamable HTTP or to a stdio child process, dialed when first needed
// and again after it breaks. Each message it sends is bounded
// (max_result_bytes: relay.go). No timeout of its own bounds a call: the
// tool's run timeout does, and the caller's context for the rest.
type upstream struct {
	transport func() (mcp.Transport, error)
	log       *slog.Logger
	limit     int64 // the relay bound
	// keys is, by guarded tool, the key argument the proxy advertises in
	// tools/list and removes before the upstream (toolConfig.keyArgument).
	keys map[string]string

	mu sync.Mutex
	cs *mcp.ClientSession
}

func newUpstream(c *mcpConfig, log *slog.Logger) *upstream {
	u := &upstream{log: log, limit: c.MaxResultBytes, keys: map[string]string{}}
	if u.limit == 0 {
		u.limit = defaultMaxResultBytes
	}
	for name, t := range c.Tools {
		if arg := t.keyArgument(); arg != "" {
			u.keys[name] = arg
		}
	}
	if c.Upstream.URL != "" {
		url := c.Upstream.URL
		client := &http.Client{Transport: &boundedTransport{base: http.DefaultTransport, limit: u.limit}}
		u.transport = func() (mcp.Transport, error) {
			return &mcp.StreamableClientTransport{Endpoint: url, HTTPClient: client}, nil
		}
	} else {
		argv := c.Upstream.Command
		u.transport = func() (mcp.Transport, error) {
			return startChild(exec.Command(argv[0], argv[1:]...), u.limit) //nolint:gosec // the operator's configured upstream
		}
	}
	return u
}

// startChild starts a stdio upstream, its messages bounded.
func startChild(cmd *exec.Cmd, limit int64) (mcp.Transport, error) {
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start the upstream MCP server: %w", err)
	}
	return &mcp.IOTransport{Reader: &child{Reader: &boundedLines{in: bufio.NewReader(stdout), limit: limit}, cmd: cmd, stdin: stdin}, Writer: stdin}, nil
}

// child is the stdio upstream's output; closing it ends the process: its
// input closed, then, if it has not exited within 5 s, killed.
type child struct {
	io.Reader
	cmd   *exec.Cmd
	stdin io.Closer
	once  sync.Once
}

func (c *child) Close() error {
	c.once.Do(func() {
		_ = c.stdin.Close()
		exited := make(chan struct{})
		go func() { _ = c.cmd.Wait(); close(exited) }()
		select {
		case <-exited:
		case <-time.After(5 * time.Second):
			_ = c.cmd.Process.Kill()
			<-exited
		}
	})
	return nil
}

// session returns the live session, dialing one if there is none.
func (u *upstream) session(ctx context.Context) (*mcp.ClientSession, error) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.cs != nil {
		return u.cs, nil
	}
	c := mcp.NewClient(&mcp.Implementation{Name: "idemproxy", Version: version()}, nil)
	t, err := u.transport()
	if err != nil {
		return nil, err
	}
	cs, err := c.Connect(ctx, t, nil)
	if err != nil {
		return nil, fmt.Errorf("connect to the upstream MCP server: %w", err)
	}
	u.cs = cs
	return cs, nil
}

// broken forgets cs after a transport failure, so that the next call
// dials again.
func (u *upstream) broken(cs *mcp.ClientSession, err error) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.cs == cs {
		u.log.Warn("upstream MCP session broken; dialing again on the next call", "error", err)
		_ = cs.Close()
		u.cs = nil
	}
}

// close ends the session (and a stdio child).
func (u *upstream) close() {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.cs != nil {
		_ = u.cs.Close()
		u.cs = nil
	}
}

// ping reports whether the upstream answers.
func (u *upstream) ping(ctx context.Context) error {
	cs, err := u.session(ctx)
	if err != nil {
		return err
	}
	if err := cs.Ping(ctx, nil); err != nil {
		u.broken(cs, err)
		return err
	}
	return nil
}

// answered reports whether err is the upstream's own JSON-RPC error,
// rather than a failure of the transport to or from it.
func answered(err error) bool {
	var w *jsonrpc.Error
	return errors.As(err, &w) && w.Code != codeRejected
}

// codeRejected is the go-sdk's "rejected by transport": an HTTP failure, a
// lost response.
const codeRejected = -32005

// forward is the innermost receiving middleware of the proxy's server: it
// sends the methods of tools, resources, prompts and completion to the
// upstream and answers with its answer. Everything else (initialize,
// ping, notifications) the proxy's server answers itself.
func (u *upstream) forward(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		switch method {
		case "tools/list", "tools/call", "resources/list", "resources/templates/list", "resources/read",
			"prompts/list", "prompts/get", "completion/complete":
		default:
			return next(ctx, method, req)
		}
		cs, err := u.session(ctx)
		if err != nil {
			// Nothing was sent: a guarded call is released (UNAVAILABLE is
			// transient), and its retry runs afresh.
			return nil, fmt.Errorf("%w: %w: %w", errUpstreamDown, status.Error(codes.Unavailable, "upstream down"), err)
		}
		res, err := call(ctx, cs, method, u.stripKey(req.GetParams()))
		if list, ok := res.(*mcp.ListToolsResult); ok && err == nil {
			u.advertiseKeys(list)
		}
		if method == "tools/call" && isTooLarge(err) {
			// The tool ran; its answer is not relayed, and says so.
			return tooLargeResult(u.limit), nil
		}
		if err != nil && !answered(err) {
			u.broken(cs, err)
			if method == "tools/call" {
				// The call may have reached the upstream: nobody knows
				// whether it wrote.
				return nil, fmt.Errorf("%w: %w", guard.ErrOutcomeUnknown, err)
			}
		}
		return res, err
	}
}

// advertiseKeys adds each guarded tool's key argument to its input schema,
// an optional string described for a model as mcpguard.KeySchema does, so
// that a model learns to send it.
func (u *upstream) advertiseKeys(list *mcp.ListToolsResult) {
	for _, tool := range list.Tools {
		arg, ok := u.keys[tool.Name]
		if !ok {
			continue
		}
		schema, _ := tool.InputSchema.(map[string]any)
		if schema == nil {
			schema = map[string]any{"type": "object"}
		}
		props, _ := schema["properties"].(map[string]any)
		if _, declared := props[arg]; declared {
			continue // the upstream's own
		}
		withKey := maps.Clone(props)
		if withKey == nil {
			withKey = map[string]any{}
		}
		withKey[arg] = map[string]any{
			"type": "string", "minLength": 1, "maxLength": 255, "description": mcpguard.KeyDescription,
		}
		out := maps.Clone(schema)
		out["properties"] = withKey
		tool.InputSchema = out
	}
}

// stripKey is params with a guarded tool's key argument removed, so that
// an upstream whose schema does not declare it is not sent it.
func (u *upstream) stripKey(params mcp.Params) mcp.Params {
	p, ok := params.(*mcp.CallToolParamsRaw)
	if !ok {
		return params
	}
	arg, ok := u.keys[p.Name]
	if !ok {
		return params
	}
	var args map[string]json.RawMessage
	if json.Unmarshal(p.Arguments, &args) != nil || args == nil {
		return params // not an object: the upstream says what it makes of it
	}
	if _, sent := args[arg]; !sent {
		return params
	}
	delete(args, arg)
	b, err := json.Marshal(args)
	if err != nil {
		return params
	}
	stripped := *p
	stripped.Arguments = b
	return &stripped
}

// errUpstreamDown is the error of a call the proxy could not send.
var errUpstreamDown = &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: "the upstream MCP server cannot be reached"}

// call sends one method to the upstream.
func call(ctx context.Context, cs *mcp.ClientSession, method string, params mcp.Params) (mcp.Result, error) {
	switch p := params.(type) {
	case *mcp.ListToolsParams:
		return cs.ListTools(ctx, p)
	case *mcp.CallToolParamsRaw:
		args := p.Arguments
		if len(args) == 0 {
			args = json.RawMessage("{}")
		}
		return cs.CallTool(ctx, &mcp.CallToolParams{Meta: p.Meta, Name: p.Name, Arguments: args})
	case *mcp.ListResourcesParams:
		return cs.ListResources(ctx, p)
	case *mcp.ListResourceTemplatesParams:
		return cs.ListResourceTemplates(ctx, p)
	case *mcp.ReadResourceParams:
		return cs.ReadResource(ctx, p)
	case *mcp.ListPromptsParams:
		return cs.ListPrompts(ctx, p)
	case *mcp.GetPromptParams:
		return cs.GetPrompt(ctx, p)
	case *mcp.CompleteParams:
		return cs.Complete(ctx, p)
	}
	return nil, &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: fmt.Sprintf("idemproxy cannot forward %s with %T", method, params)}
}
