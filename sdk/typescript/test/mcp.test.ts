// The MCP guard inside a TypeScript SDK server, driven by the TypeScript
// SDK's client, against a real ledgerd: the Go test TestTypeScriptClient
// (cmd/ledgerd) starts ledgerd and runs this with LEDGER_HTTP and
// LEDGER_TOKEN set.
import { strict as assert } from "node:assert";
import { randomUUID } from "node:crypto";
import http from "node:http";
import type { AddressInfo } from "node:net";
import { test } from "node:test";

import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { McpServer } from "@modelcontextprotocol/sdk/server/mcp.js";
import { StreamableHTTPServerTransport } from "@modelcontextprotocol/sdk/server/streamableHttp.js";
import { CallToolResultSchema, type CallToolResult } from "@modelcontextprotocol/sdk/types.js";
import { z } from "zod";

import { callTool, createLedger, errorFromResult, Guard, IdempotencyCapability, KeyMeta, keyShape, McpGuard, ReplayedMeta, sep3182, type Policy } from "../src/index.js";

const ledger = createLedger({ baseUrl: process.env.LEDGER_HTTP!, token: process.env.LEDGER_TOKEN });

// serve starts a server whose create_invoice is guarded with policy, and
// returns a connected client and the count of runs.
async function serve(policy: Policy, gate?: Promise<void>, onPost?: (n: number, req: http.IncomingMessage, res: http.ServerResponse) => void) {
  let runs = 0, posts = 0;
  const guard = new McpGuard(new Guard(ledger), "acme");
  const server = () => {
    const s = new McpServer({ name: "ts-guarded", version: "1.0.0" }, { capabilities: { experimental: { [IdempotencyCapability]: {} } } });
    s.registerTool("create_invoice", {
      description: "Create an invoice.",
      inputSchema: { customer: z.string(), amount_cents: z.number().int(), fail: z.string().optional(), ...keyShape(z) },
    }, guard.tool("create_invoice", async (args: { customer: string; amount_cents: number; fail?: string }) => {
      runs++;
      await gate;
      if (args.fail === "throw") throw new Error("the invoice service refused");
      if (args.fail === "error") return { isError: true, content: [{ type: "text", text: "no such customer" }] };
      if (args.fail === "input") return { content: [], resultType: "input_required", inputRequests: { confirm: { method: "elicitation/create", params: { message: "sure?" } } } } as CallToolResult;
      return { content: [{ type: "text", text: JSON.stringify({ id: `inv_${randomUUID()}`, customer: args.customer }) }] };
    }, { policy, transient: (r) => (r.content[0] as { text: string }).text === "busy" }));
    return s;
  };
  const httpServer = http.createServer(async (req, res) => {
    const chunks: Buffer[] = [];
    for await (const c of req) chunks.push(c as Buffer);
    const body = chunks.length ? sep3182(JSON.parse(Buffer.concat(chunks).toString())) : undefined;
    if (body?.method === "tools/call") onPost?.(++posts, req, res);
    const s = server();
    const t = new StreamableHTTPServerTransport({ sessionIdGenerator: undefined, enableJsonResponse: true });
    res.on("close", () => { void t.close(); void s.close(); });
    await s.connect(t);
    await t.handleRequest(req, res, body);
  });
  await new Promise<void>((r) => httpServer.listen(0, "127.0.0.1", r));
  const client = new Client({ name: "agent", version: "1.0.0" });
  await client.connect(new StreamableHTTPClientTransport(new URL(`http://127.0.0.1:${(httpServer.address() as AddressInfo).port}/mcp`)));
  const call = async (args: Record<string, unknown>, meta?: Record<string, unknown>) =>
    (await client.callTool({ name: "create_invoice", arguments: args, _meta: meta })) as CallToolResult;
  const callWithParam = async (args: Record<string, unknown>, idempotencyKey: unknown) =>
    (await client.request({ method: "tools/call", params: { name: "create_invoice", arguments: args, idempotencyKey } }, CallToolResultSchema)) as CallToolResult;
  return { call, callWithParam, client, runs: () => runs, close: async () => { await client.close(); httpServer.close(); } };
}

const text = (r: CallToolResult) => (r.content[0] as { text: string }).text;

test("first call, replay, reordered JSON, KEY_REUSED", async () => {
  const s = await serve({});
  try {
    const key = `ts-${randomUUID()}`;
    const first = await s.call({ customer: "cus_1", amount_cents: 4200, idempotency_key: key });
    assert.equal(first.isError, undefined);
    const again = await s.call({ amount_cents: 4200, idempotency_key: key, customer: "cus_1" });
    assert.equal(again._meta?.[ReplayedMeta], true);
    assert.equal(text(again), text(first));
    const meta = await s.call({ customer: "cus_1", amount_cents: 4200 }, { [KeyMeta]: key });
    assert.equal(text(meta), text(first), "the key in _meta is the same key");
    const reused = await s.call({ customer: "cus_2", amount_cents: 4200, idempotency_key: key });
    assert.equal(errorFromResult(reused)?.code, "KEY_REUSED");
    assert.equal(errorFromResult(reused)?.retryable, false);
    assert.equal(s.runs(), 1);
  } finally {
    await s.close();
  }
});

test("KEY_MISSING and KEY_INVALID", async () => {
  const s = await serve({});
  try {
    assert.equal(errorFromResult(await s.call({ customer: "c", amount_cents: 1 }))?.code, "KEY_MISSING");
    assert.equal(errorFromResult(await s.call({ customer: "c", amount_cents: 1 }, { [KeyMeta]: "ключ" }))?.code, "KEY_INVALID");
    assert.equal(s.runs(), 0);
  } finally {
    await s.close();
  }
});

test("an error result is stored; a thrown error is stored; a request for input releases the key", async () => {
  const s = await serve({});
  try {
    const key = `ts-${randomUUID()}`;
    const first = await s.call({ customer: "c", amount_cents: 1, fail: "error", idempotency_key: key });
    const again = await s.call({ customer: "c", amount_cents: 1, fail: "error", idempotency_key: key });
    assert.equal(first.isError, true);
    assert.equal(again._meta?.[ReplayedMeta], true);
    const thrown = `ts-${randomUUID()}`;
    assert.equal(text(await s.call({ customer: "c", amount_cents: 1, fail: "throw", idempotency_key: thrown })), "the invoice service refused");
    assert.equal((await s.call({ customer: "c", amount_cents: 1, fail: "throw", idempotency_key: thrown }))._meta?.[ReplayedMeta], true);
    const input = `ts-${randomUUID()}`;
    await s.call({ customer: "c", amount_cents: 1, fail: "input", idempotency_key: input });
    const after = await s.call({ customer: "c", amount_cents: 1, fail: "input", idempotency_key: input });
    assert.equal(after._meta?.[ReplayedMeta], undefined, "a request for input releases the key: the call runs again");
    assert.equal(s.runs(), 4);
  } finally {
    await s.close();
  }
});

test("IN_PROGRESS under reject; the duplicate waits for the answer under wait", async () => {
  for (const onInProgress of ["reject", "wait"] as const) {
    let open!: () => void;
    const gate = new Promise<void>((r) => { open = r; });
    const s = await serve({ onInProgress, leaseMs: 30_000 }, gate);
    try {
      const key = `ts-${randomUUID()}`;
      const first = s.call({ customer: "c", amount_cents: 1, idempotency_key: key });
      while (s.runs() === 0) await new Promise((r) => setImmediate(r)); // the first attempt holds the key
      const dup = s.call({ customer: "c", amount_cents: 1, idempotency_key: key });
      if (onInProgress === "reject") {
        const d = await dup;
        assert.equal(errorFromResult(d)?.code, "IN_PROGRESS");
        assert.equal(errorFromResult(d)?.retryable, true);
        open();
        await first;
      } else {
        // The first attempt finishes 50 ms on, most likely while the
        // duplicate waits on Lookup; one that Begins after it gets the same
        // replay. Either way the duplicate must not get IN_PROGRESS.
        setTimeout(open, 50);
        const [f, d] = await Promise.all([first, dup]);
        assert.equal(d._meta?.[ReplayedMeta], true);
        assert.equal(text(d), text(f));
      }
      assert.equal(s.runs(), 1);
    } finally {
      await s.close();
    }
  }
});

test("SEP-3182: the idempotencyKey parameter, after the key argument and before _meta", async () => {
  const s = await serve({});
  try {
    assert.ok(s.client.getServerCapabilities()?.experimental?.[IdempotencyCapability]);
    const key = `ts-${randomUUID()}`;
    const first = await s.callWithParam({ customer: "c", amount_cents: 1 }, key);
    const again = await s.call({ customer: "c", amount_cents: 1 }, { [KeyMeta]: key });
    assert.equal(again._meta?.[ReplayedMeta], true, "the parameter's key is the _meta key");
    assert.equal(text(again), text(first));
    const argWins = await s.callWithParam({ customer: "c", amount_cents: 1, idempotency_key: `ts-${randomUUID()}` }, key);
    assert.equal(argWins._meta?.[ReplayedMeta], undefined, "the key argument wins over the parameter");
    assert.equal(errorFromResult(await s.callWithParam({ customer: "c", amount_cents: 1 }, 42))?.code, "KEY_INVALID");
    assert.equal(s.runs(), 2);
  } finally {
    await s.close();
  }
});

test("callTool re-sends a lost response with the same key: the replay", async () => {
  const s = await serve({}, undefined, (n, req, res) => {
    if (n === 1) {
      res.end = (() => { req.socket.destroy(); return res; }) as typeof res.end; // the call ran; its answer is lost
    }
  });
  try {
    const r = await callTool(s.client, { name: "create_invoice", arguments: { customer: "c", amount_cents: 1 } }, { baseMs: 10 });
    assert.equal(r.isError, undefined);
    assert.equal(r._meta?.[ReplayedMeta], true);
    assert.equal(s.runs(), 1);
  } finally {
    await s.close();
  }
});

test("callTool waits out IN_PROGRESS, then gets the first attempt's answer", async () => {
  let open!: () => void;
  const gate = new Promise<void>((r) => { open = r; });
  // The second tools/call is callTool's first attempt: once it is answered
  // (IN_PROGRESS), the first attempt finishes.
  const s = await serve({ onInProgress: "reject", leaseMs: 30_000 }, gate, (n, _req, res) => { if (n === 2) res.on("finish", open); });
  try {
    const key = `ts-${randomUUID()}`;
    const first = s.call({ customer: "c", amount_cents: 1, idempotency_key: key });
    while (s.runs() === 0) await new Promise((r) => setImmediate(r));
    const r = await callTool(s.client, { name: "create_invoice", arguments: { customer: "c", amount_cents: 1 } }, { key, baseMs: 10 });
    assert.equal(r._meta?.[ReplayedMeta], true);
    assert.equal(text(r), text(await first));
    assert.equal(s.runs(), 1);
  } finally {
    await s.close();
  }
});

test("a tool that runs as a task (2025-11-25): its createTask under the guard, a retry with the key gets the same task", async () => {
  const { InMemoryTaskStore } = await import("@modelcontextprotocol/sdk/experimental/tasks/stores/in-memory.js");
  const { CreateTaskResultSchema, GetTaskResultSchema } = await import("@modelcontextprotocol/sdk/types.js");
  const taskStore = new InMemoryTaskStore();
  const guard = new McpGuard(new Guard(ledger), "acme");
  let created = 0;
  const server = () => {
    const s = new McpServer({ name: "ts-tasks", version: "1.0.0" }, { capabilities: { tasks: { requests: { tools: { call: {} } } } }, taskStore });
    s.experimental.tasks.registerToolTask("start_export", {
      description: "Export, as a task.", inputSchema: { format: z.string(), ...keyShape(z) }, execution: { taskSupport: "optional" },
    }, {
      createTask: guard.tool("start_export", async (_args: { format: string }, extra) => {
        created++;
        const task = await (extra as unknown as { taskStore: { createTask(o: object): Promise<{ taskId: string }> } }).taskStore.createTask({ ttl: 60_000 });
        return { task } as never;
      }) as never,
      getTask: async (_args, extra) => (await extra.taskStore.getTask(extra.taskId))!,
      getTaskResult: async (_args, extra) => (await extra.taskStore.getTaskResult(extra.taskId)) as never,
    });
    return s;
  };
  const httpServer = http.createServer(async (req, res) => {
    const s = server();
    const t = new StreamableHTTPServerTransport({ sessionIdGenerator: undefined, enableJsonResponse: true });
    res.on("close", () => { void t.close(); void s.close(); });
    await s.connect(t);
    await t.handleRequest(req, res);
  });
  await new Promise<void>((r) => httpServer.listen(0, "127.0.0.1", r));
  const client = new Client({ name: "agent", version: "1.0.0" }, { capabilities: { tasks: {} } });
  await client.connect(new StreamableHTTPClientTransport(new URL(`http://127.0.0.1:${(httpServer.address() as AddressInfo).port}/mcp`)));
  try {
    const key = `ts-${randomUUID()}`;
    const start = () => client.request({ method: "tools/call", params: { name: "start_export", arguments: { format: "csv", idempotency_key: key }, task: { ttl: 60_000 } } }, CreateTaskResultSchema);
    const first = await start();
    const again = await start();
    assert.equal(again.task.taskId, first.task.taskId);
    assert.equal(again._meta?.[ReplayedMeta], true);
    assert.equal(created, 1);
    const polled = await client.request({ method: "tasks/get", params: { taskId: first.task.taskId } }, GetTaskResultSchema);
    assert.equal(polled.taskId, first.task.taskId);
  } finally {
    await client.close();
    httpServer.close();
  }
});
