package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// upstream is the readiness check's view of the MCP server behind the
// proxy: one client session to its Streamable HTTP endpoint (the bridge's,
// for a stdio upstream), dialed when first needed and again after it
// breaks. Calls do not use it: they pass through the front (front.go).
type upstream struct {
	endpoint string
	client   *http.Client

	mu sync.Mutex
	cs *mcp.ClientSession
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
	cs, err := c.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: u.endpoint, HTTPClient: u.client}, nil)
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
