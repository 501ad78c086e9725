package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os/exec"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/idemledger/idemledger/interceptors/guard"
)

// upstream is the MCP server behind the proxy: one client session, over
// Streamable HTTP or to a stdio child process, dialed when first needed
// and again after it breaks.
type upstream struct {
	transport func() mcp.Transport
	log       *slog.Logger

	mu sync.Mutex
	cs *mcp.ClientSession
}

func newUpstream(c *mcpConfig, log *slog.Logger) *upstream {
	u := &upstream{log: log}
	if c.Upstream.URL != "" {
		url := c.Upstream.URL
		u.transport = func() mcp.Transport {
			return &mcp.StreamableClientTransport{Endpoint: url, HTTPClient: &http.Client{Timeout: 5 * time.Minute}}
		}
	} else {
		argv := c.Upstream.Command
		u.transport = func() mcp.Transport {
			cmd := exec.Command(argv[0], argv[1:]...) //nolint:gosec // the operator's configured upstream
			return &mcp.CommandTransport{Command: cmd}
		}
	}
	return u
}

// session returns the live session, dialing one if there is none.
func (u *upstream) session(ctx context.Context) (*mcp.ClientSession, error) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.cs != nil {
		return u.cs, nil
	}
	c := mcp.NewClient(&mcp.Implementation{Name: "idemproxy", Version: version()}, nil)
	cs, err := c.Connect(ctx, u.transport(), nil)
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
		res, err := call(ctx, cs, method, req.GetParams())
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
