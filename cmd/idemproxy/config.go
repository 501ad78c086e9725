package main

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/idemledger/idemledger/interceptors/guard"
	"github.com/idemledger/idemledger/interceptors/httpguard"
	"github.com/idemledger/idemledger/interceptors/mcpguard"
	"github.com/idemledger/idemledger/ledger"
)

// fileConfig is the configuration file. Unknown fields are an error.
//
//	ledger:
//	  address: 127.0.0.1:7070
//	  token_file: /run/secrets/ledger-token
//	  tls:                                    # ledgerd over TLS; mutual with cert_file and key_file
//	    ca_file: /etc/idemproxy/ca.crt
//	    cert_file: /etc/idemproxy/tls.crt
//	    key_file: /etc/idemproxy/tls.key
//	    server_name: ledgerd.idemledger.svc
//	mcp:
//	  upstream:
//	    url: http://127.0.0.1:8090/mcp        # Streamable HTTP, or:
//	    command: [node, server.mjs, --stdio]  # a stdio child process
//	  tenant: {header: X-Tenant}              # or {static: acme}, or {argument: tenant}
//	  run_timeout: 1m                         # the default of every tool
//	  tools:
//	    create_invoice:
//	      key_argument: idempotency_key
//	      lease: 30s
//	      run_timeout: 2m
//	      on_in_progress: wait                # or reject
//	      on_lease_expiry: takeover           # or hold
//	      host_call_ids: [claudecode/toolUseId] # a host's call id as the key; off when absent
//
// or, in HTTP mode, instead of mcp:
//
//	http:
//	  upstream: http://127.0.0.1:8080
//	  tenant: {header: X-Tenant}              # or {static: acme}
//	  run_timeout: 1m                         # the default of every route
//	  routes:
//	    "POST /v1/invoices": {lease: 30s, release: [408, 429, 503]}
type fileConfig struct {
	Ledger struct {
		Address   string    `yaml:"address"`
		TokenFile string    `yaml:"token_file"`
		TLS       ledgerTLS `yaml:"tls"`
	} `yaml:"ledger"`
	MCP  *mcpConfig  `yaml:"mcp"`
	HTTP *httpConfig `yaml:"http"`
}

// ledgerTLS is how the proxy reaches a ledgerd that serves TLS (as
// deploy/kubernetes does): on when enabled or when any file is named.
type ledgerTLS struct {
	Enabled    bool   `yaml:"enabled"`
	CAFile     string `yaml:"ca_file"`
	CertFile   string `yaml:"cert_file"`
	KeyFile    string `yaml:"key_file"`
	ServerName string `yaml:"server_name"`
}

func (t ledgerTLS) on() bool {
	return t.Enabled || t.CAFile != "" || t.CertFile != "" || t.KeyFile != "" || t.ServerName != ""
}

// httpConfig is the HTTP mode: a reverse proxy in front of an HTTP API.
type httpConfig struct {
	// Upstream is the API's base URL.
	Upstream     string       `yaml:"upstream"`
	Tenant       tenantConfig `yaml:"tenant"`
	MaxBodyBytes int64        `yaml:"max_body_bytes"`
	// MaxResponseBytes bounds a protected route's response the proxy
	// relays (16 MiB when absent): past it, 409 OUTCOME_TOO_LARGE.
	MaxResponseBytes int64 `yaml:"max_response_bytes"`
	// RunTimeout is the run timeout of a route that sets none:
	// defaultRunTimeout when absent.
	RunTimeout duration `yaml:"run_timeout"`
	// Stripe answers every route by Stripe's conventions as well
	// (httpguard.Route.Stripe), for clients written for a Stripe-shaped API.
	Stripe bool                   `yaml:"stripe"`
	Routes map[string]routeConfig `yaml:"routes"`
}

// defaultRunTimeout bounds an upstream call whose tool or route, and
// section, set no run_timeout: the call outlives the client that made it,
// up to this long.
const defaultRunTimeout = time.Minute

// routeConfig is an httpguard.Route in the file, keyed by its ServeMux
// pattern ("POST /v1/invoices").
type routeConfig struct {
	policyConfig `yaml:",inline"`
	Methods      []string `yaml:"methods"`
	Release      []int    `yaml:"release"`
	StoreHeaders []string `yaml:"store_headers"`
	// Stripe answers the route by Stripe's conventions as well
	// (httpguard.Route.Stripe).
	Stripe bool `yaml:"stripe"`
	// KeyPointer and FingerprintPointers are httpguard.Route's: the key,
	// and the parts that make the fingerprint, by JSON Pointer into the body.
	KeyPointer          string   `yaml:"key_pointer"`
	FingerprintPointers []string `yaml:"fingerprint_pointers"`
}

type mcpConfig struct {
	Upstream struct {
		URL     string   `yaml:"url"`
		Command []string `yaml:"command"`
		// MaxSessions bounds the children of a stdio upstream, one per
		// client session (defaultMaxSessions when absent); SessionIdle
		// closes a session, and its child, idle this long
		// (defaultSessionIdle when absent).
		MaxSessions int      `yaml:"max_sessions"`
		SessionIdle duration `yaml:"session_idle"`
		// HeaderFiles are headers the proxy sends an upstream over
		// Streamable HTTP with every request, each value read from its
		// file at start (an Authorization the proxy holds, where its
		// client has none to send: a host over stdio).
		HeaderFiles map[string]string `yaml:"header_files"`
	} `yaml:"upstream"`
	Tenant tenantConfig `yaml:"tenant"`
	// MaxResultBytes bounds one message of the upstream the proxy relays
	// (16 MiB when absent): a tool result past it is answered
	// OUTCOME_TOO_LARGE, not retryable.
	MaxResultBytes int64 `yaml:"max_result_bytes"`
	// RunTimeout is the run timeout of a tool that sets none:
	// defaultRunTimeout when absent.
	RunTimeout duration              `yaml:"run_timeout"`
	Tools      map[string]toolConfig `yaml:"tools"`
}

type tenantConfig struct {
	Static   string `yaml:"static"`
	Header   string `yaml:"header"`
	Argument string `yaml:"argument"`
}

// policyConfig is a guard.Policy in the file.
type policyConfig struct {
	Lease              duration `yaml:"lease"`
	Retention          duration `yaml:"retention"`
	TombstoneRetention duration `yaml:"tombstone_retention"`
	NoTombstones       bool     `yaml:"no_tombstones"`
	KeyOptional        bool     `yaml:"key_optional"`
	OnInProgress       string   `yaml:"on_in_progress"`
	MaxWait            duration `yaml:"max_wait"`
	OnLeaseExpiry      string   `yaml:"on_lease_expiry"`
	// RunTimeout bounds the upstream call, which outlives its client;
	// past it the call is ended and its outcome is unknown.
	RunTimeout duration `yaml:"run_timeout"`
}

type toolConfig struct {
	policyConfig `yaml:",inline"`
	// KeyArgument names the argument that carries the key; absent takes
	// mcpguard.DefaultKeyArgument, "" takes the key from _meta only.
	KeyArgument *string `yaml:"key_argument"`
	// UpstreamDeclaresKey says the upstream tool declares the key argument
	// itself: the proxy then forwards it, and leaves the tool's schema as
	// the upstream wrote it. Otherwise the proxy adds the argument to the
	// tool's input schema in tools/list, described for a model, and removes
	// it from the arguments before the upstream.
	UpstreamDeclaresKey bool `yaml:"upstream_declares_key"`
	// KeyPointer and FingerprintPointers are mcpguard.Tool's: the key, and
	// the parts that make the fingerprint, by JSON Pointer into the arguments.
	KeyPointer          string   `yaml:"key_pointer"`
	FingerprintPointers []string `yaml:"fingerprint_pointers"`
	// HostCallIDs are mcpguard.Tool's: the _meta keys of a host's own
	// per-call id ("claudecode/toolUseId"), taken as the key of a call
	// that carries none of its own; off when absent.
	HostCallIDs []string `yaml:"host_call_ids"`
}

// keyArgument is the argument the proxy advertises and strips for the
// tool: "" when it neither advertises nor strips one.
func (t toolConfig) keyArgument() string {
	if t.UpstreamDeclaresKey {
		return ""
	}
	if t.KeyArgument != nil {
		return *t.KeyArgument
	}
	return mcpguard.DefaultKeyArgument
}

// duration is a time.Duration written as "30s" in the file.
type duration time.Duration

func (d *duration) UnmarshalYAML(n *yaml.Node) error {
	v, err := time.ParseDuration(n.Value)
	if err != nil {
		return fmt.Errorf("line %d: %q is not a duration such as 30s: %w", n.Line, n.Value, err)
	}
	*d = duration(v)
	return nil
}

// loadConfig reads and checks the configuration file.
func loadConfig(path string) (fileConfig, error) {
	var c fileConfig
	f, err := os.Open(path)
	if err != nil {
		return c, err
	}
	defer f.Close()
	dec := yaml.NewDecoder(f)
	dec.KnownFields(true)
	if err := dec.Decode(&c); err != nil && !errors.Is(err, io.EOF) {
		return c, fmt.Errorf("%s: %w", path, err)
	}
	if err := c.check(); err != nil {
		return c, fmt.Errorf("%s: %w", path, err)
	}
	return c, nil
}

func (c fileConfig) check() error {
	switch {
	case c.MCP == nil && c.HTTP == nil:
		return errors.New("no mcp or http section: nothing to proxy")
	case c.MCP != nil && c.HTTP != nil:
		return errors.New("one of mcp and http: a proxy serves one mode")
	case c.HTTP != nil:
		return c.HTTP.check()
	}
	m := c.MCP
	if (m.Upstream.URL == "") == (len(m.Upstream.Command) == 0) {
		return errors.New("mcp.upstream needs exactly one of url and command")
	}
	n := 0
	for _, s := range []string{m.Tenant.Static, m.Tenant.Header, m.Tenant.Argument} {
		if s != "" {
			n++
		}
	}
	if n != 1 {
		return errors.New("mcp.tenant needs exactly one of static, header and argument")
	}
	if len(m.Upstream.HeaderFiles) > 0 && m.Upstream.URL == "" {
		return errors.New("mcp.upstream.header_files go with url: a stdio upstream sees no headers")
	}
	for name := range m.Upstream.HeaderFiles {
		if !ownHeader(name) {
			return fmt.Errorf("mcp.upstream.header_files: %q is not a header the file may set (MCP's own headers and the connection's are not)", name)
		}
	}
	if m.Upstream.MaxSessions < 0 || m.Upstream.SessionIdle < 0 {
		return errors.New("mcp.upstream.max_sessions and session_idle must not be negative")
	}
	if m.MaxResultBytes < 0 {
		return errors.New("mcp.max_result_bytes must not be negative")
	}
	if len(m.Tools) == 0 {
		return errors.New("mcp.tools names no tool to guard")
	}
	for name, t := range m.Tools {
		if err := ledger.ValidateMethod(mcpguard.MethodPrefix + name); err != nil {
			return fmt.Errorf("mcp.tools: %q is not a tool name: %w", name, err)
		}
		if _, err := t.tool(time.Duration(m.RunTimeout)); err != nil {
			return fmt.Errorf("mcp.tools.%s: %w", name, err)
		}
	}
	return nil
}

// checkStdio reports what keeps the file from serving over stdio: only
// the MCP mode does, and a message on stdin has no header to name its
// tenant.
func (c fileConfig) checkStdio() error {
	switch {
	case c.MCP == nil:
		return errors.New("--stdio serves the MCP mode: the file has no mcp section")
	case c.MCP.Tenant.Header != "":
		return errors.New("--stdio: a message on stdin has no headers, so mcp.tenant takes static or argument, not header")
	}
	return nil
}

// policy is the guard's policy the file describes; runTimeout is its
// section's default run timeout (0: defaultRunTimeout).
func (p policyConfig) policy(runTimeout time.Duration) (guard.Policy, error) {
	g := guard.Policy{
		Lease: time.Duration(p.Lease), Retention: time.Duration(p.Retention),
		TombstoneRetention: time.Duration(p.TombstoneRetention), NoTombstones: p.NoTombstones,
		KeyOptional: p.KeyOptional, MaxWait: time.Duration(p.MaxWait), RunTimeout: time.Duration(p.RunTimeout),
	}
	if g.RunTimeout == 0 {
		g.RunTimeout = cmp.Or(runTimeout, defaultRunTimeout)
	}
	switch strings.ToLower(p.OnInProgress) {
	case "", "wait":
		g.OnInProgress = guard.Wait
	case "reject":
		g.OnInProgress = guard.Reject
	default:
		return g, fmt.Errorf("on_in_progress is wait or reject, not %q", p.OnInProgress)
	}
	switch strings.ToLower(p.OnLeaseExpiry) {
	case "", "takeover":
		g.OnLeaseExpiry = guard.Takeover
	case "hold":
		g.OnLeaseExpiry = guard.Hold
	default:
		return g, fmt.Errorf("on_lease_expiry is takeover or hold, not %q", p.OnLeaseExpiry)
	}
	return g, g.Check()
}

// tool is the MCP adapter's Tool the file describes, under its section's
// default run timeout.
func (t toolConfig) tool(runTimeout time.Duration) (mcpguard.Tool, error) {
	p, err := t.policy(runTimeout)
	if err != nil {
		return mcpguard.Tool{}, err
	}
	tool := mcpguard.NewTool(p)
	if t.KeyArgument != nil {
		tool.KeyArgument = *t.KeyArgument
	}
	tool.KeyPointer, tool.FingerprintPointers, tool.HostCallIDs = t.KeyPointer, t.FingerprintPointers, t.HostCallIDs
	for _, k := range t.HostCallIDs {
		if k == "" || k == mcpguard.KeyMeta {
			return tool, fmt.Errorf("host_call_ids: %q is not a host's _meta key", k)
		}
	}
	return tool, nil
}

// tenant is the MCP adapter's TenantFunc the file describes.
func (t tenantConfig) tenant() mcpguard.TenantFunc {
	switch {
	case t.Header != "":
		return mcpguard.TenantFromHeader(t.Header)
	case t.Argument != "":
		return mcpguard.TenantFromArgument(t.Argument)
	}
	return mcpguard.Tenant(t.Static)
}

func (h *httpConfig) check() error {
	u, err := url.Parse(h.Upstream)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("http.upstream %q is not an http(s) URL", h.Upstream)
	}
	if h.Tenant.Argument != "" || (h.Tenant.Static == "") == (h.Tenant.Header == "") {
		return errors.New("http.tenant needs exactly one of static and header")
	}
	if h.MaxBodyBytes < 0 || h.MaxResponseBytes < 0 {
		return errors.New("http.max_body_bytes and http.max_response_bytes must not be negative")
	}
	if len(h.Routes) == 0 {
		return errors.New("http.routes names no route to protect")
	}
	for pattern, r := range h.Routes {
		if _, err := r.route(time.Duration(h.RunTimeout), h.Stripe); err != nil {
			return fmt.Errorf("http.routes.%q: %w", pattern, err)
		}
		for _, s := range r.Release {
			if s < 100 || s > 599 {
				return fmt.Errorf("http.routes.%q: %d is not an HTTP status", pattern, s)
			}
		}
	}
	return nil
}

// route is the httpguard.Route the file describes, under its section's
// default run timeout.
func (r routeConfig) route(runTimeout time.Duration, stripe bool) (httpguard.Route, error) {
	p, err := r.policy(runTimeout)
	if err != nil {
		return httpguard.Route{}, err
	}
	route := httpguard.Route{Policy: p, Methods: r.Methods, StoreHeaders: r.StoreHeaders, Stripe: r.Stripe || stripe,
		KeyPointer: r.KeyPointer, FingerprintPointers: r.FingerprintPointers}
	if len(r.Release) > 0 {
		release := slices.Clone(r.Release)
		route.Release = func(status int) bool { return slices.Contains(release, status) }
	}
	return route, nil
}

// ownHeader reports whether a header of mcp.upstream.header_files is one
// the proxy may set upstream: a valid name, and neither the connection's
// (notForwarded) nor one MCP binds to a message or a session.
func ownHeader(name string) bool {
	canon := http.CanonicalHeaderKey(name)
	if name == "" || strings.ContainsAny(name, " :\r\n\t") || notForwarded[canon] {
		return false
	}
	switch canon {
	case "Mcp-Session-Id", "Mcp-Protocol-Version", "Mcp-Method", "Mcp-Name":
		return false
	}
	return !strings.HasPrefix(canon, "Mcp-Param-")
}

// upstreamHeaders reads the values of mcp.upstream.header_files, each its
// file's content without its trailing blanks.
func (m *mcpConfig) upstreamHeaders() (http.Header, error) {
	h := http.Header{}
	for name, path := range m.Upstream.HeaderFiles {
		b, err := os.ReadFile(path)
		if err != nil {
			return nil, fmt.Errorf("mcp.upstream.header_files.%s: %w", name, err)
		}
		v := strings.TrimSpace(string(b))
		if v == "" || strings.ContainsAny(v, "\r\n") {
			return nil, fmt.Errorf("mcp.upstream.header_files.%s: %s holds no one-line value", name, path)
		}
		h.Set(name, v)
	}
	return h, nil
}
