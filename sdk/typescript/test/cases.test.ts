// The guard's behaviour cases (testdata/guard-cases.json) against the
// TypeScript guard, in a server on the TypeScript SDK driven by its client,
// each of v1 (@modelcontextprotocol/sdk, the 2025 revisions) and v2
// (@modelcontextprotocol/server and /client, on 2026-07-28), at a real ledgerd (TestTypeScriptClient, cmd/ledgerd, sets LEDGER_HTTP
// and LEDGER_TOKEN). examples/guardcases runs the same table against
// mcpguard in Go.
import { strict as assert } from "node:assert";
import { readFileSync } from "node:fs";
import http from "node:http";
import type { AddressInfo } from "node:net";
import { test } from "node:test";

import { Client as ClientV2, StreamableHTTPClientTransport as TransportV2 } from "@modelcontextprotocol/client";
import { toNodeHandler } from "@modelcontextprotocol/node";
import { createMcpHandler, McpServer as McpServerV2 } from "@modelcontextprotocol/server";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { McpServer } from "@modelcontextprotocol/sdk/server/mcp.js";
import { StreamableHTTPServerTransport } from "@modelcontextprotocol/sdk/server/streamableHttp.js";
import { CallToolRequestSchema, CallToolResultSchema } from "@modelcontextprotocol/sdk/types.js";

import { callInfo, ClaimMeta, createLedger, DefaultKeyArgument, errorFromResult, Guard, httpGuard, KeyMeta, markOutcomeUnknown, McpGuard, OutcomeUnknownError, ReplayedMeta, type CallToolResult, type GuardedRequest, type Policy, type ToolExtra } from "../src/index.js";

interface Step {
  key?: string;
  via?: "meta";
  meta?: Record<string, unknown>;
  args: string;
  after_ms?: number;
  hang_up_ms?: number;
  release_ms?: number;
  tool: { text?: string; text_bytes?: number; error_text?: string; hold?: boolean; unknown?: boolean; token_text?: boolean; confirm?: boolean };
  expect: Answer;
}
interface Answer {
  text?: string;
  text_bytes?: number;
  is_error?: boolean;
  replayed?: boolean;
  error?: string;
  retryable?: boolean;
  /** The HTTP status, checked over HTTP where the table names one. */
  status?: number;
}
interface Case {
  name: string;
  policy?: { key_optional?: boolean; on_in_progress?: "wait" | "reject"; max_wait_ms?: number; lease_ms?: number; transient_text?: string; on_lease_expiry?: "hold" | "takeover"; reconcile_text?: string; retention_ms?: number; host_call_ids?: string[] };
  only?: "mcp" | "http";
  needs?: "mrtr";
  max_outcome_bytes?: number;
  max_body_bytes?: number;
  ledger_down?: boolean;
  steps: Step[];
  runs: number;
}

const table = JSON.parse(readFileSync(new URL("../../../testdata/guard-cases.json", import.meta.url), "utf8")) as { cases: Case[] };

// normal is an answer as the table writes it (the fields it leaves out are
// false).
const normal = (a: Answer): Answer => ({ text: a.text, text_bytes: a.text_bytes, is_error: a.is_error ?? false,
  replayed: a.replayed ?? false, error: a.error, retryable: a.retryable ?? false, status: a.status });

// same checks got against the table's want: the status only where the
// table names one.
function same(got: Answer, want: Answer, what: string) {
  assert.deepEqual(want.status === undefined ? { ...got, status: undefined } : got, normal(want), what);
}

function answerOf(r: CallToolResult): Answer {
  const info = errorFromResult(r);
  if (info) {
    return normal({ error: info.code, retryable: info.retryable });
  }
  const content = r.content ?? [];
  const text = content.length === 1 && content[0].type === "text" ? content[0].text : undefined;
  const big = text !== undefined && text.length > 1024;
  return normal({ text: big ? undefined : text, text_bytes: big ? text.length : undefined, is_error: r.isError === true, replayed: r._meta?.[ReplayedMeta] === true });
}


// A gate holds a run of the tool until the next step has its answer.
function gate() {
  let entered!: () => void, release!: () => void;
  let enteredP = new Promise<void>((r) => { entered = r; });
  const released = new Promise<void>((r) => { release = r; });
  return {
    /** hold is what a held run does. */
    hold: async () => { entered(); await released; },
    /** started waits until a held run has started. */
    started: async () => { await enteredP; enteredP = new Promise<void>((r) => { entered = r; }); },
    open: () => release(),
  };
}
type Gate = ReturnType<typeof gate>;

// drive sends the case's steps in order and checks each answer. A held
// step goes in the background and is answered once the next step has its
// answer; one whose caller hangs up goes on once it has. next tells the
// tool which step it runs.
async function drive(c: Case, g: Gate, next: (j: number) => void, send: (st: Step) => Promise<Answer>) {
  let held: Promise<Answer> | undefined;
  try {
    for (const [j, st] of c.steps.entries()) {
      if (st.after_ms) {
        // The subject is the lease running out on the ledger's clock, a
        // real ledgerd's that a test cannot move: the step waits longer
        // than the case's lease.
        await new Promise((r) => setTimeout(r, st.after_ms));
      }
      next(j);
      if (st.tool.hold) {
        held = send(st);
        await g.started();
        if (st.hang_up_ms) {
          // Its caller hangs up while the run is held; then the run goes
          // on, outliving it.
          same(await held, st.expect, `step ${j + 1}`);
          held = undefined;
          g.open();
        }
        continue;
      }
      // The held run ends while this step waits for its answer.
      if (held && st.release_ms) setTimeout(g.open, st.release_ms);
      const got = await send(st);
      if (held) {
        g.open();
        same(await held, c.steps[j - 1].expect, `step ${j} (held)`);
        held = undefined;
      }
      same(got, st.expect, `step ${j + 1}`);
    }
  } finally {
    g.open(); // a failed step leaves no run held
    await held?.catch(() => undefined);
  }
}

// mcpServer serves handler as create_invoice, taking any arguments, on
// the SDK generation sdk; it returns the endpoint.
async function mcpServer(sdk: "v1" | "v2", handler: (args: Record<string, unknown>, extra: ToolExtra) => Promise<CallToolResult>) {
  let serve: (req: http.IncomingMessage, res: http.ServerResponse) => Promise<void>;
  if (sdk === "v1") {
    serve = async (req, res) => {
      const s = new McpServer({ name: "cases", version: "1.0.0" });
      // Arguments as they are: the table's tool takes any object.
      s.server.registerCapabilities({ tools: {} });
      s.server.setRequestHandler(CallToolRequestSchema, async (r, extra) =>
        (await handler(r.params.arguments ?? {}, { ...extra, _meta: r.params._meta })) as never);
      const tr = new StreamableHTTPServerTransport({ sessionIdGenerator: undefined, enableJsonResponse: true });
      res.on("close", () => { void tr.close(); void s.close(); });
      await s.connect(tr);
      await tr.handleRequest(req, res);
    };
  } else {
    serve = toNodeHandler(createMcpHandler(() => {
      const s = new McpServerV2({ name: "cases", version: "1.0.0" }, { capabilities: { tools: {} } });
      s.server.setRequestHandler("tools/call", async (r, ctx) => (await handler(r.params.arguments ?? {}, ctx as ToolExtra)) as never);
      return s;
    }));
  }
  const server = http.createServer((req, res) => void serve(req, res));
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  return { url: new URL(`http://127.0.0.1:${(server.address() as AddressInfo).port}/mcp`), close: () => { server.closeAllConnections(); server.close(); } };
}

// mcpClient is the SDK generation's client of url: v1 on the 2025
// handshake, v2 pinned to 2026-07-28 (answering a confirmation yes); it
// returns a function that sends a tools/call.
async function mcpClient(sdk: "v1" | "v2", url: URL) {
  if (sdk === "v1") {
    const client = new Client({ name: "agent", version: "1.0.0" });
    await client.connect(new StreamableHTTPClientTransport(url));
    return { close: () => client.close(), send: async (params: Record<string, unknown>, timeout: number) =>
      (await client.request({ method: "tools/call", params: params as never }, CallToolResultSchema, { timeout })) as CallToolResult };
  }
  const client = new ClientV2({ name: "agent", version: "1.0.0" }, { capabilities: { elicitation: { form: {} } }, versionNegotiation: { mode: { pin: "2026-07-28" } } });
  client.setRequestHandler("elicitation/create", async () => ({ action: "accept" as const, content: { confirm: true } }));
  await client.connect(new TransportV2(url));
  return { close: () => client.close(), send: async (params: Record<string, unknown>, timeout: number) =>
    (await client.callTool(params as never, { timeout })) as CallToolResult };
}

// confirmed reports whether a round's inputResponses confirm the call.
function confirmed(extra: ToolExtra): boolean {
  const r = (extra.mcpReq as { inputResponses?: Record<string, { action?: string; content?: { confirm?: unknown } }> } | undefined)?.inputResponses?.confirm;
  return r?.action === "accept" && r.content?.confirm === true;
}

for (const sdk of ["v1", "v2"] as const) {
  test(`the guard's behaviour cases, the SDK's ${sdk}`, async (t) => {
    assert.ok(table.cases.length >= 20);
    for (const [i, c] of table.cases.entries()) {
      if (c.only && c.only !== "mcp") continue;
      if (c.needs === "mrtr" && sdk === "v1") continue; // v1 has no multi-round-trip requests
      await t.test(c.name, async () => {
        const ledger = createLedger({ baseUrl: c.ledger_down ? "http://127.0.0.1:1" : process.env.LEDGER_HTTP!, token: process.env.LEDGER_TOKEN });
        const p = c.policy ?? {};
        const policy: Policy = { keyOptional: p.key_optional, onInProgress: p.on_in_progress, maxWaitMs: p.max_wait_ms, leaseMs: p.lease_ms, onLeaseExpiry: p.on_lease_expiry, retentionMs: p.retention_ms };
        const guard = new McpGuard(new Guard(ledger, { maxOutcomeBytes: c.max_outcome_bytes }), "acme");
        let step = 0, runs = 0;
        const g = gate();
        const handler = guard.tool("create_invoice", async (_args: Record<string, unknown>, extra: ToolExtra): Promise<CallToolResult> => {
          runs++;
          const st = c.steps[step];
          if (st.tool.hold) await g.hold();
          if (st.tool.unknown) throw new OutcomeUnknownError("the invoice service hung up");
          if (st.tool.confirm && !confirmed(extra)) {
            return { content: [], resultType: "input_required", inputRequests: { confirm: { method: "elicitation/create", params: { mode: "form", message: "sure?",
              requestedSchema: { type: "object", properties: { confirm: { type: "boolean" } }, required: ["confirm"] } } } } };
          }
          if (st.tool.token_text) {
            const claim = callInfo(extra).meta[ClaimMeta] as { token: number; attempt: number };
            return { content: [{ type: "text", text: `token ${claim.token}, attempt ${claim.attempt}` }] };
          }
          if (st.tool.error_text) return { isError: true, content: [{ type: "text", text: st.tool.error_text }] };
          if (st.tool.text_bytes) return { content: [{ type: "text", text: "x".repeat(st.tool.text_bytes) }] };
          return { content: [{ type: "text", text: st.tool.text! }] };
        }, { policy, hostCallIds: p.host_call_ids, transient: p.transient_text ? (r) => r.content?.[0]?.type === "text" && r.content[0].text === p.transient_text : undefined,
          reconcile: p.reconcile_text ? async () => ({ content: [{ type: "text" as const, text: p.reconcile_text! }] }) : undefined });
        const server = await mcpServer(sdk, handler);
        const client = await mcpClient(sdk, server.url);
        const prefix = `ts-${sdk}-${i}-${Date.now()}-`;
        const call = async (st: Step): Promise<Answer> => {
          let args = JSON.parse(st.args) as Record<string, unknown>;
          let meta: Record<string, unknown> | undefined;
          if (st.key && st.via !== "meta") args = { [DefaultKeyArgument]: prefix + st.key, ...args };
          if (st.key && st.via === "meta") meta = { [KeyMeta]: /[^\x20-\x7e]/.test(st.key) ? st.key : prefix + st.key };
          for (const [k, v] of Object.entries(st.meta ?? {})) {
            // A host's call id is unique to the run, as a key is.
            (meta ??= {})[k] = p.host_call_ids?.includes(k) && typeof v === "string" ? prefix + v : v;
          }
          try {
            return answerOf(await client.send({ name: "create_invoice", arguments: args, ...(meta ? { _meta: meta } : {}) }, st.hang_up_ms ?? 30_000));
          } catch (err) {
            if (st.hang_up_ms) return normal({ error: "HUNG_UP" });
            throw err;
          }
        };
        try {
          await drive(c, g, (j) => { step = j; }, call);
          assert.equal(runs, c.runs, "runs");
        } finally {
          await client.close();
          server.close();
        }
      });
    }
  });
}

// The same table over HTTP, against httpGuard, mapped as
// examples/guardcases/http_test.go maps it for httpguard: a step is a
// POST of its arguments, its key in Idempotency-Key (a key that is not
// ASCII goes as two header lines); the tool's text a 201, its error text a
// 422, the transient text a 503, an unknown run a 502 marked unknown.
test("the guard's behaviour cases over HTTP", async (t) => {
  for (const [i, c] of table.cases.entries()) {
    if (c.only && c.only !== "http") continue;
    await t.test(c.name, async () => {
      const ledger = createLedger({ baseUrl: c.ledger_down ? "http://127.0.0.1:1" : process.env.LEDGER_HTTP!, token: process.env.LEDGER_TOKEN });
      const p = c.policy ?? {};
      const policy: Policy = { keyOptional: p.key_optional, onInProgress: p.on_in_progress, maxWaitMs: p.max_wait_ms, leaseMs: p.lease_ms, onLeaseExpiry: p.on_lease_expiry, retentionMs: p.retention_ms };
      let step = 0, runs = 0;
      const g = gate();
      const guarded = httpGuard(new Guard(ledger, { maxOutcomeBytes: c.max_outcome_bytes }), { route: "/v1/invoices", tenant: "acme", policy, maxBodyBytes: c.max_body_bytes,
        reconcile: p.reconcile_text ? async () => ({ status: 201, headers: { "content-type": "text/plain" }, body: p.reconcile_text }) : undefined })(async (req: GuardedRequest, res) => {
        runs++;
        const st = c.steps[step];
        if (st.tool.hold) await g.hold();
        let status = 201, text = st.tool.text ?? "";
        if (st.tool.unknown) { markOutcomeUnknown(res); status = 502; }
        else if (st.tool.error_text && st.tool.error_text === p.transient_text) { status = 503; text = st.tool.error_text; }
        else if (st.tool.error_text) { status = 422; text = st.tool.error_text; }
        else if (st.tool.text_bytes) text = "x".repeat(st.tool.text_bytes);
        else if (st.tool.token_text) text = `token ${req.claim!.token}, attempt ${req.claim!.attempt}`;
        res.writeHead(status, { "Content-Type": "text/plain" }).end(text);
      });
      const server = http.createServer((req, res) => void guarded(req, res));
      await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
      const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}/v1/invoices`;
      const prefix = `ts-http-${i}-${Date.now()}-`;
      const post = (st: Step) => new Promise<Answer>((resolve, reject) => {
        const headers: string[] = ["Host", new URL(url).host, "Content-Type", "application/json"]; // a raw list gets no Host of its own
        if (st.key && /[^\x20-\x7e]/.test(st.key)) headers.push("Idempotency-Key", "a", "Idempotency-Key", "b");
        else if (st.key) headers.push("Idempotency-Key", prefix + st.key);
        const req = http.request(url, { method: "POST", headers }, (res) => {
          const chunks: Buffer[] = [];
          res.on("data", (c: Buffer) => chunks.push(c));
          res.on("end", () => {
            const body = Buffer.concat(chunks).toString();
            if (res.headers["content-type"] === "application/problem+json") {
              const pb = JSON.parse(body) as { code: string; retryable: boolean };
              resolve(normal({ error: pb.code, retryable: pb.retryable, status: res.statusCode }));
              return;
            }
            const big = body.length > 1024;
            resolve(normal({ text: big ? undefined : body, text_bytes: big ? body.length : undefined, status: res.statusCode,
              is_error: res.statusCode === 422 || res.statusCode === 503, replayed: res.headers["idempotency-replayed"] === "true" }));
          });
        });
        if (st.hang_up_ms) {
          req.setTimeout(st.hang_up_ms, () => { req.destroy(); resolve(normal({ error: "HUNG_UP" })); });
        }
        req.on("error", (err) => (st.hang_up_ms ? undefined : reject(err)));
        req.end(st.args);
      });
      try {
        await drive(c, g, (j) => { step = j; }, post);
        assert.equal(runs, c.runs, "runs");
      } finally {
        server.closeAllConnections();
        server.close();
      }
    });
  }
});
