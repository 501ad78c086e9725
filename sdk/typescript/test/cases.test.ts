// The guard's behaviour cases (testdata/guard-cases.json) against the
// TypeScript guard, in a TypeScript SDK server driven by the SDK's client,
// at a real ledgerd (TestTypeScriptClient, cmd/ledgerd, sets LEDGER_HTTP
// and LEDGER_TOKEN). examples/guardcases runs the same table against
// mcpguard in Go.
import { strict as assert } from "node:assert";
import { readFileSync } from "node:fs";
import http from "node:http";
import type { AddressInfo } from "node:net";
import { test } from "node:test";

import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { McpServer } from "@modelcontextprotocol/sdk/server/mcp.js";
import { StreamableHTTPServerTransport } from "@modelcontextprotocol/sdk/server/streamableHttp.js";
import { CallToolResultSchema, type CallToolResult } from "@modelcontextprotocol/sdk/types.js";

import { ClaimMeta, createLedger, DefaultKeyArgument, errorFromResult, Guard, KeyMeta, McpGuard, OutcomeUnknownError, ReplayedMeta, type Policy } from "../src/index.js";

interface Step {
  key?: string;
  via?: "meta";
  args: string;
  after_ms?: number;
  tool: { text?: string; text_bytes?: number; error_text?: string; hold?: boolean; unknown?: boolean; token_text?: boolean };
  expect: Answer;
}
interface Answer {
  text?: string;
  text_bytes?: number;
  is_error?: boolean;
  replayed?: boolean;
  error?: string;
  retryable?: boolean;
}
interface Case {
  name: string;
  policy?: { key_optional?: boolean; on_in_progress?: "wait" | "reject"; max_wait_ms?: number; lease_ms?: number; transient_text?: string; on_lease_expiry?: "hold" | "takeover" };
  max_outcome_bytes?: number;
  ledger_down?: boolean;
  steps: Step[];
  runs: number;
}

const table = JSON.parse(readFileSync(new URL("../../../testdata/guard-cases.json", import.meta.url), "utf8")) as { cases: Case[] };

// normal is an answer as the table writes it (the fields it leaves out are
// false).
const normal = (a: Answer): Answer => ({ text: a.text, text_bytes: a.text_bytes, is_error: a.is_error ?? false,
  replayed: a.replayed ?? false, error: a.error, retryable: a.retryable ?? false });

function answerOf(r: CallToolResult): Answer {
  const info = errorFromResult(r);
  if (info) {
    return normal({ error: info.code, retryable: info.retryable });
  }
  const text = r.content.length === 1 && r.content[0].type === "text" ? r.content[0].text : undefined;
  const big = text !== undefined && text.length > 1024;
  return normal({ text: big ? undefined : text, text_bytes: big ? text.length : undefined, is_error: r.isError === true, replayed: r._meta?.[ReplayedMeta] === true });
}

test("the guard's behaviour cases", async (t) => {
  assert.ok(table.cases.length >= 16);
  for (const [i, c] of table.cases.entries()) {
    await t.test(c.name, async () => {
      const ledger = createLedger({ baseUrl: c.ledger_down ? "http://127.0.0.1:1" : process.env.LEDGER_HTTP!, token: process.env.LEDGER_TOKEN });
      const p = c.policy ?? {};
      const policy: Policy = { keyOptional: p.key_optional, onInProgress: p.on_in_progress, maxWaitMs: p.max_wait_ms, leaseMs: p.lease_ms, onLeaseExpiry: p.on_lease_expiry };
      const guard = new McpGuard(new Guard(ledger, { maxOutcomeBytes: c.max_outcome_bytes }), "acme");
      let step = 0, runs = 0;
      let entered!: () => void, release!: () => void;
      let enteredP = new Promise<void>((r) => { entered = r; });
      const released = new Promise<void>((r) => { release = r; });
      const handler = guard.tool("create_invoice", async (_args, extra): Promise<CallToolResult> => {
        runs++;
        const st = c.steps[step];
        if (st.tool.hold) {
          entered();
          await released;
        }
        if (st.tool.unknown) throw new OutcomeUnknownError("the invoice service hung up");
        if (st.tool.token_text) {
          const claim = extra._meta?.[ClaimMeta] as { token: number; attempt: number };
          return { content: [{ type: "text", text: `token ${claim.token}, attempt ${claim.attempt}` }] };
        }
        if (st.tool.error_text) return { isError: true, content: [{ type: "text", text: st.tool.error_text }] };
        if (st.tool.text_bytes) return { content: [{ type: "text", text: "x".repeat(st.tool.text_bytes) }] };
        return { content: [{ type: "text", text: st.tool.text! }] };
      }, { policy, transient: p.transient_text ? (r) => r.content[0]?.type === "text" && r.content[0].text === p.transient_text : undefined });
      const httpServer = http.createServer(async (req, res) => {
        const s = new McpServer({ name: "cases", version: "1.0.0" });
        // Arguments as they are: the table's tool takes any object.
        s.server.registerCapabilities({ tools: {} });
        s.server.setRequestHandler((await import("@modelcontextprotocol/sdk/types.js")).CallToolRequestSchema, async (r, extra) =>
          handler(r.params.arguments ?? {}, { ...extra, _meta: r.params._meta } as never));
        const tr = new StreamableHTTPServerTransport({ sessionIdGenerator: undefined, enableJsonResponse: true });
        res.on("close", () => { void tr.close(); void s.close(); });
        await s.connect(tr);
        await tr.handleRequest(req, res);
      });
      await new Promise<void>((r) => httpServer.listen(0, "127.0.0.1", r));
      const client = new Client({ name: "agent", version: "1.0.0" });
      await client.connect(new StreamableHTTPClientTransport(new URL(`http://127.0.0.1:${(httpServer.address() as AddressInfo).port}/mcp`)));
      const prefix = `ts-${i}-${Date.now()}-`;
      const call = async (st: Step): Promise<Answer> => {
        let args = JSON.parse(st.args) as Record<string, unknown>;
        let meta: Record<string, unknown> | undefined;
        if (st.key && st.via !== "meta") args = { [DefaultKeyArgument]: prefix + st.key, ...args };
        if (st.key && st.via === "meta") meta = { [KeyMeta]: /[^\x20-\x7e]/.test(st.key) ? st.key : prefix + st.key };
        const r = await client.request({ method: "tools/call", params: { name: "create_invoice", arguments: args, _meta: meta } }, CallToolResultSchema, { timeout: 30_000 });
        return answerOf(r as CallToolResult);
      };
      try {
        let held: Promise<Answer> | undefined;
        for (const [j, st] of c.steps.entries()) {
          if (st.after_ms) {
            // The subject is the lease running out on the ledger's clock:
            // the step waits longer than the case's lease.
            await new Promise((r) => setTimeout(r, st.after_ms));
          }
          step = j;
          if (st.tool.hold) {
            held = call(st);
            await enteredP;
            enteredP = new Promise<void>((r) => { entered = r; });
            continue;
          }
          const got = await call(st);
          if (held) {
            release();
            assert.deepEqual(await held, normal(c.steps[j - 1].expect), `step ${j} (held)`);
            held = undefined;
          }
          assert.deepEqual(got, normal(st.expect), `step ${j + 1}`);
        }
        if (held) {
          release();
          await held;
        }
        assert.equal(runs, c.runs, "runs");
      } finally {
        await client.close();
        httpServer.close();
      }
    });
  }
});
