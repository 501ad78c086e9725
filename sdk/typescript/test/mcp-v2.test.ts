// The MCP guard inside a server on the official TypeScript SDK's v2
// packages, driven by the v2 client on the 2026-07-28 revision (by
// server/discover, and pinned) and on the 2025 handshake, against a real
// ledgerd: the Go test TestTypeScriptClient (cmd/ledgerd) starts ledgerd
// and runs this with LEDGER_HTTP and LEDGER_TOKEN set.
import { strict as assert } from "node:assert";
import { randomUUID } from "node:crypto";
import http from "node:http";
import type { AddressInfo } from "node:net";
import { test } from "node:test";

import { Client, StreamableHTTPClientTransport } from "@modelcontextprotocol/client";
import { toNodeHandler, NodeStreamableHTTPServerTransport } from "@modelcontextprotocol/node";
import { acceptedContent, classifyInboundRequest, createMcpHandler, inputRequired, isInitializeRequest, McpServer } from "@modelcontextprotocol/server";
import * as z from "zod/v4";

import { ClaimMeta, createLedger, errorFromResult, Guard, KeyMeta, keyShape, McpGuard, ReplayedMeta, tenantFromHeader, tenantFromToken, type CallToolResult, type Tenant } from "../src/index.js";

const ledger = createLedger({ baseUrl: process.env.LEDGER_HTTP!, token: process.env.LEDGER_TOKEN });

type Mode = "auto" | "pin" | "legacy";
const modes: Mode[] = ["auto", "pin", "legacy"];

// serve starts a v2 server whose create_invoice and charge are guarded for
// tenant (charge asks for a confirmation first): a 2026-07-28 request
// goes to createMcpHandler, a 2025 client gets a session of its own (so
// that a confirmation can be pushed to it). auth, when given, is the
// verified token every request carries.
async function serve(tenant: Tenant, auth?: unknown) {
  let invoices = 0, charges = 0;
  const claims: unknown[] = [];
  const guard = new McpGuard(new Guard(ledger), tenant);
  const factory = () => {
    const s = new McpServer({ name: "ts-v2-guarded", version: "1.0.0" });
    s.registerTool("create_invoice", {
      description: "Create an invoice.",
      inputSchema: z.object({ customer: z.string(), amount_cents: z.number().int(), ...keyShape(z) }),
    }, guard.tool("create_invoice", async (args: { customer: string }, ctx) => {
      invoices++;
      claims.push(ctx.mcpReq._meta?.[ClaimMeta]);
      return { content: [{ type: "text" as const, text: JSON.stringify({ id: `inv_${randomUUID()}`, customer: args.customer }) }] };
    }));
    s.registerTool("charge", {
      description: "Charge a customer, once they confirm.",
      inputSchema: z.object({ customer: z.string(), amount_cents: z.number().int(), ...keyShape(z) }),
    }, guard.tool("charge", async (args: { customer: string }, ctx) => {
      const answer = acceptedContent(ctx.mcpReq.inputResponses, "confirm", z.object({ confirm: z.boolean() }));
      if (answer?.confirm !== true) {
        return inputRequired({ inputRequests: { confirm: inputRequired.elicit({ message: `Charge ${args.customer}?`,
          requestedSchema: { type: "object", properties: { confirm: { type: "boolean" } }, required: ["confirm"] } }) } });
      }
      charges++;
      return { content: [{ type: "text" as const, text: `ch_${randomUUID()}` }] };
    }));
    return s;
  };
  const modern = toNodeHandler(createMcpHandler(factory));
  const sessions: Record<string, NodeStreamableHTTPServerTransport> = {};
  const httpServer = http.createServer(async (req, res) => {
    if (auth) (req as { auth?: unknown }).auth = auth;
    const chunks: Buffer[] = [];
    for await (const c of req) chunks.push(c as Buffer);
    const body = chunks.length ? JSON.parse(Buffer.concat(chunks).toString()) : undefined;
    const header = (n: string) => req.headers[n] as string | undefined;
    if (classifyInboundRequest({ httpMethod: req.method!, protocolVersionHeader: header("mcp-protocol-version"), mcpMethodHeader: header("mcp-method"), body }).kind !== "legacy") {
      await modern(req, res, body);
      return;
    }
    let t = sessions[header("mcp-session-id") ?? ""];
    if (!t && isInitializeRequest(body)) {
      const created = new NodeStreamableHTTPServerTransport({ sessionIdGenerator: () => randomUUID(), onsessioninitialized: (id) => { sessions[id] = created; } });
      t = created;
      await factory().connect(t);
    }
    await t.handleRequest(req, res, body);
  });
  await new Promise<void>((r) => httpServer.listen(0, "127.0.0.1", r));
  const url = new URL(`http://127.0.0.1:${(httpServer.address() as AddressInfo).port}/mcp`);
  return { url, invoices: () => invoices, charges: () => charges, claims, close: () => { httpServer.closeAllConnections(); httpServer.close(); } };
}

// connect is a v2 client of mode, with headers on every request; asked
// counts the confirmations it was asked for (answered yes).
async function connect(url: URL, mode: Mode, headers: Record<string, string> = {}) {
  const client = new Client({ name: "agent", version: "1.0.0" }, {
    capabilities: { elicitation: { form: {} } },
    ...(mode === "legacy" ? {} : { versionNegotiation: { mode: mode === "auto" ? "auto" as const : { pin: "2026-07-28" as const } } }),
  });
  let asked = 0;
  client.setRequestHandler("elicitation/create", async () => {
    asked++;
    return { action: "accept" as const, content: { confirm: true } };
  });
  await client.connect(new StreamableHTTPClientTransport(url, { requestInit: { headers } }));
  const call = async (name: string, args: Record<string, unknown>, meta?: Record<string, unknown>) =>
    (await client.callTool({ name, arguments: args, ...(meta ? { _meta: meta } : {}) })) as CallToolResult;
  return { client, call, asked: () => asked };
}

const text = (r: CallToolResult) => r.content?.[0]?.text;

for (const mode of modes) {
  test(`v2, ${mode}: a run and its marked replay, a key in _meta, KEY_REUSED, the claim in ctx.mcpReq._meta`, async () => {
    const s = await serve("acme");
    const c = await connect(s.url, mode);
    try {
      assert.equal(c.client.getProtocolEra(), mode === "legacy" ? "legacy" : "modern");
      const key = `ts-v2-${randomUUID()}`;
      const first = await c.call("create_invoice", { customer: "c1", amount_cents: 100, idempotency_key: key });
      assert.equal(first.isError, undefined, JSON.stringify(first));
      const again = await c.call("create_invoice", { amount_cents: 100, customer: "c1", idempotency_key: key });
      assert.equal(again._meta?.[ReplayedMeta], true);
      assert.equal(text(again), text(first));
      const meta = `ts-v2-${randomUUID()}`;
      const byMeta = await c.call("create_invoice", { customer: "c1", amount_cents: 100 }, { [KeyMeta]: meta });
      const byMetaAgain = await c.call("create_invoice", { customer: "c1", amount_cents: 100 }, { [KeyMeta]: meta });
      assert.equal(byMeta.isError, undefined, JSON.stringify(byMeta));
      assert.equal(byMetaAgain._meta?.[ReplayedMeta], true, "a key in _meta (v2 puts it at ctx.mcpReq._meta)");
      assert.equal(text(byMetaAgain), text(byMeta));
      const reused = await c.call("create_invoice", { customer: "c2", amount_cents: 100 }, { [KeyMeta]: meta });
      assert.equal(errorFromResult(reused)?.code, "KEY_REUSED");
      assert.equal(s.invoices(), 2);
      for (const [k, source] of [[key, "argument"], [meta, "meta"]]) {
        const rec = (await ledger.lookup({ tenant: "acme", key: k })).record;
        assert.equal(rec?.keySource, source, `the record says where its key came from (${k})`);
      }
      assert.deepEqual(s.claims.map((cl) => (cl as { attempt: number }).attempt), [1, 1], "the handler reads its claim in ctx.mcpReq._meta");
    } finally {
      await c.client.close();
      s.close();
    }
  });

  test(`v2, ${mode}: a charge gated on a confirmation runs once and replays`, async () => {
    const s = await serve("acme");
    const c = await connect(s.url, mode);
    try {
      const key = `ts-v2-${randomUUID()}`;
      const first = await c.call("charge", { customer: "c1", amount_cents: 990, idempotency_key: key });
      assert.equal(first.isError, undefined, JSON.stringify(first));
      assert.match(text(first) ?? "", /^ch_/);
      const again = await c.call("charge", { customer: "c1", amount_cents: 990, idempotency_key: key });
      assert.equal(again._meta?.[ReplayedMeta], true);
      assert.equal(text(again), text(first));
      assert.equal(c.asked(), 1, "the confirmation is asked once: the retry is the replay");
      assert.equal(s.charges(), 1);
    } finally {
      await c.client.close();
      s.close();
    }
  });

  test(`v2, ${mode}: the tenant from a header and from the verified token`, async () => {
    const byHeader = await serve(tenantFromHeader("X-Tenant"));
    const byToken = await serve(tenantFromToken(), { clientId: "acme", token: "t", scopes: [] });
    const c = await connect(byHeader.url, mode, { "X-Tenant": "acme" });
    const bare = await connect(byHeader.url, mode);
    const t = await connect(byToken.url, mode);
    try {
      const key = `ts-v2-${randomUUID()}`;
      const args = { customer: "c1", amount_cents: 100, idempotency_key: key };
      assert.equal((await c.call("create_invoice", args)).isError, undefined);
      assert.equal((await c.call("create_invoice", args))._meta?.[ReplayedMeta], true);
      const missing = await bare.call("create_invoice", { ...args, idempotency_key: `ts-v2-${randomUUID()}` });
      assert.equal(errorFromResult(missing)?.code, "VALIDATION_FAILED", "a call without the tenant's header names no tenant");
      // The same key for the same tenant, from the token: the replay.
      assert.equal((await t.call("create_invoice", args))._meta?.[ReplayedMeta], true);
    } finally {
      await Promise.all([c.client.close(), bare.client.close(), t.client.close()]);
      byHeader.close();
      byToken.close();
    }
  });
}
