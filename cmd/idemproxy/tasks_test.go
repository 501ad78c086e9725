package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/idemledger/idemledger/interceptors/mcpguard"
	"github.com/idemledger/idemledger/internal/nodetest"
)

// TestProxyTasks2025: a tool that runs as a task (the 2025-11-25
// revision's tasks, on the TypeScript SDK's v1, over Streamable HTTP and
// stdio), called task-augmented twice with one key through the proxy:
// the answer that created the task is stored, so the retry gets the same
// task, marked replayed, and the tool starts one export; polling the task
// (tasks/get) and its result (tasks/result) pass through.
func TestProxyTasks2025(t *testing.T) {
	node, dir := nodetest.Node(t, "../../examples/mcp-ts", "@modelcontextprotocol/sdk")
	for _, stdio := range []bool{false, true} {
		t.Run(map[bool]string{false: "StreamableHTTP", true: "Stdio"}[stdio], func(t *testing.T) {
			up := byCommand(node, filepath.Join(dir, "server.mjs"), "--stdio")
			if !stdio {
				up = byURL(nodetest.Listen(t, exec.Command(node, filepath.Join(dir, "server.mjs"))) + "/mcp")
			}
			cfg := config(ledgerAddr(t), up, policyConfig{})
			cfg.MCP.Tools["start_export"] = toolConfig{}
			endpoint, _ := proxy(t, cfg)
			out, err := exec.CommandContext(t.Context(), node, filepath.Join(dir, "tasks.mjs"), endpoint, "export-1").Output()
			if err != nil {
				t.Fatalf("tasks.mjs: %v", err)
			}
			var run struct {
				First, Retry, Status string
				RetryMeta            map[string]any
				Result               struct {
					Content []struct{ Text string }
				}
				Count struct{ Exports int }
			}
			if err := json.Unmarshal(out, &run); err != nil {
				t.Fatalf("tasks.mjs printed %s: %v", out, err)
			}
			if run.First == "" || run.Retry != run.First || run.RetryMeta[mcpguard.ReplayedMeta] != true {
				t.Fatalf("the task %q, then with the same key %q (%v); want the same task, replayed", run.First, run.Retry, run.RetryMeta)
			}
			if run.Status != "completed" || len(run.Result.Content) != 1 || run.Result.Content[0].Text != "exported as csv" || run.Count.Exports != 1 {
				t.Fatalf("the task %s, its result %+v, %d exports; want completed, exported, one export", run.Status, run.Result, run.Count.Exports)
			}
		})
	}
}

// tasksUpstream is an MCP server of 2026-07-28 with the tasks extension,
// as the wire has it (no SDK has it yet): start_export answers a task
// (resultType "task") to a client that declares the extension, and
// tasks/get and tasks/cancel answer for its tasks.
type tasksUpstream struct {
	mu      sync.Mutex
	created int
	gets    []string // the Mcp-Name of each tasks/get
}

func (u *tasksUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var msg struct {
		ID     json.RawMessage `json:"id"`
		Method string          `json:"method"`
		Params struct {
			TaskID string         `json:"taskId"`
			Meta   map[string]any `json:"_meta"`
		} `json:"params"`
	}
	_ = json.NewDecoder(r.Body).Decode(&msg)
	u.mu.Lock()
	defer u.mu.Unlock()
	var result any
	switch msg.Method {
	case "tools/call":
		caps, _ := msg.Params.Meta["io.modelcontextprotocol/clientCapabilities"].(map[string]any)
		ext, _ := caps["extensions"].(map[string]any)
		if _, ok := ext["io.modelcontextprotocol/tasks"]; !ok {
			result = map[string]any{"resultType": "complete", "content": []any{map[string]any{"type": "text", "text": "exported at once"}}}
			break
		}
		u.created++
		result = map[string]any{"resultType": "task", "taskId": fmt.Sprintf("task-%d", u.created), "status": "working",
			"createdAt": "2026-12-05T00:00:00Z", "lastUpdatedAt": "2026-12-05T00:00:00Z", "ttlMs": 60000, "pollIntervalMs": 10}
	case "tasks/get":
		u.gets = append(u.gets, r.Header.Get("Mcp-Name"))
		result = map[string]any{"resultType": "complete", "taskId": msg.Params.TaskID, "status": "completed",
			"result": map[string]any{"resultType": "complete", "content": []any{map[string]any{"type": "text", "text": "exported"}}}}
	case "tasks/cancel":
		result = map[string]any{"resultType": "complete"}
	default:
		w.WriteHeader(http.StatusNotFound)
		_ = json.NewEncoder(w).Encode(map[string]any{"jsonrpc": "2.0", "id": msg.ID, "error": map[string]any{"code": -32601, "message": "Method not found"}})
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{"jsonrpc": "2.0", "id": msg.ID, "result": result})
}

// TestProxyTasksExtension: the 2026-07-28 tasks extension through the
// proxy. A guarded call answered with a task stores that answer: its
// retry with the key gets the same task id, replayed, and the upstream
// made one task; tasks/get (routed by its Mcp-Name, the task id) and
// tasks/cancel pass through.
func TestProxyTasksExtension(t *testing.T) {
	up := &tasksUpstream{}
	srv := httptest.NewServer(up)
	t.Cleanup(srv.Close)
	cfg := config(ledgerAddr(t), byURL(srv.URL), policyConfig{})
	cfg.MCP.Tools["start_export"] = toolConfig{}
	endpoint, _ := proxy(t, cfg)
	post := func(method, name string, params map[string]any) map[string]any {
		t.Helper()
		meta, _ := params["_meta"].(map[string]any)
		if meta == nil {
			meta = map[string]any{}
			params["_meta"] = meta
		}
		meta["io.modelcontextprotocol/protocolVersion"] = "2026-07-28"
		meta["io.modelcontextprotocol/clientCapabilities"] = map[string]any{"extensions": map[string]any{"io.modelcontextprotocol/tasks": map[string]any{}}}
		res, err := postModern(t.Context(), endpoint, method, name, params, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		b = firstMessage(b)
		var msg struct {
			Result map[string]any `json:"result"`
		}
		if err := json.Unmarshal(b, &msg); err != nil || msg.Result == nil {
			t.Fatalf("%s: HTTP %d, %s", method, res.StatusCode, b)
		}
		return msg.Result
	}
	start := func() map[string]any {
		return post("tools/call", "start_export", map[string]any{"name": "start_export", "arguments": map[string]any{"format": "csv"},
			"_meta": map[string]any{mcpguard.KeyMeta: "export-2026"}})
	}
	first, again := start(), start()
	meta, _ := again["_meta"].(map[string]any)
	if first["resultType"] != "task" || first["taskId"] != "task-1" || again["taskId"] != "task-1" || meta[mcpguard.ReplayedMeta] != true {
		t.Fatalf("a task, then its retry with the key: %v, %v; want task-1 twice, the retry replayed", first, again)
	}
	got := post("tasks/get", "task-1", map[string]any{"taskId": "task-1"})
	if got["status"] != "completed" || !strings.Contains(fmt.Sprint(got["result"]), "exported") {
		t.Fatalf("tasks/get through the proxy: %v", got)
	}
	if c := post("tasks/cancel", "task-1", map[string]any{"taskId": "task-1"}); c["resultType"] != "complete" {
		t.Fatalf("tasks/cancel through the proxy: %v", c)
	}
	up.mu.Lock()
	defer up.mu.Unlock()
	if up.created != 1 || len(up.gets) != 1 || up.gets[0] != "task-1" {
		t.Fatalf("the upstream made %d tasks and saw tasks/get for %v; want one task, polled by its id", up.created, up.gets)
	}
}
