// The fence with node-postgres, against a real ledgerd and a real
// PostgreSQL: the Go test TestTypeScriptClient (cmd/ledgerd) starts both
// and runs this with LEDGER_HTTP, LEDGER_TOKEN and FENCE_DATABASE_URL set.
// Guard.do, the MCP guard in a v2 server driven by the v2 client, and the
// HTTP guard, each writing its invoice and its fence in one transaction.
import { strict as assert } from "node:assert";
import { randomUUID } from "node:crypto";
import { readFile } from "node:fs/promises";
import http from "node:http";
import type { AddressInfo } from "node:net";
import { after, before, test } from "node:test";

import { Client, StreamableHTTPClientTransport } from "@modelcontextprotocol/client";
import { toNodeHandler } from "@modelcontextprotocol/node";
import { createMcpHandler, McpServer } from "@modelcontextprotocol/server";
import pg from "pg";
import * as z from "zod/v4";

import {
  ClaimMeta, codeName, createLedger, ErrorCode, FenceTable, Guard, httpGuard, KeyMeta, keyShape, LedgerError, McpGuard, OutcomeUnknownError, ReplayedMeta,
  writeFence, type CallToolResult, type Outcome, type Policy,
} from "../src/index.js";

const url = process.env.FENCE_DATABASE_URL;
const ledger = createLedger({ baseUrl: process.env.LEDGER_HTTP!, token: process.env.LEDGER_TOKEN });
let pool: pg.Pool;
let fences: FenceTable;

before(async () => {
  if (!url) {
    return;
  }
  pool = new pg.Pool({ connectionString: url });
  // The fence table's migration as the package ships it, and the tests'
  // invoices (no unique key: a second effect shows as a second row).
  await pool.query(await readFile(new URL("../migrations/postgres/0001_idemledger_fences.up.sql", import.meta.url), "utf8"));
  await pool.query("CREATE TABLE IF NOT EXISTS ts_invoices (idem_key TEXT NOT NULL, token BIGINT NOT NULL, amount BIGINT NOT NULL)");
  fences = new FenceTable(pool);
});

after(async () => {
  await pool?.end();
});

const fenced = url ? test : test.skip;

const outcome = (amount: number): Outcome => ({ response: { $typeName: "google.protobuf.Any", typeUrl: "type.googleapis.com/billing.v1.Invoice", value: new TextEncoder().encode(`invoice of ${amount}`) } });
const text = (o: Outcome) => new TextDecoder().decode(o.response?.value);

// write runs one transaction: the invoice of key, its fence with result,
// then end (COMMIT, or ROLLBACK for a commit that does not land).
async function write(key: string, token: bigint, amount: number, result: unknown, end = "COMMIT"): Promise<void> {
  const client = await pool.connect();
  try {
    await client.query("BEGIN");
    await client.query("INSERT INTO ts_invoices (idem_key, token, amount) VALUES ($1, $2, $3)", [key, token.toString(), amount]);
    await writeFence(client, result);
    await client.query(end);
  } catch (err) {
    await client.query("ROLLBACK");
    throw err;
  } finally {
    client.release();
  }
}

async function invoices(key: string): Promise<number> {
  return Number((await pool.query("SELECT count(*) AS n FROM ts_invoices WHERE idem_key = $1", [key])).rows[0].n);
}

function call(key: string, policy: Policy = {}) {
  return { tenant: "acme", key, fingerprint: "j1:" + "0".repeat(64), method: "fence:test", policy: { leaseMs: 30_000, fence: fences, ...policy } };
}

fenced("Guard.do: a fenced run is completed with its fence, and replayed", async () => {
  const key = `fence-${randomUUID()}`;
  let runs = 0;
  const run = async (claim: { token: bigint } | undefined) => { runs++; await write(key, claim!.token, 100, outcome(100)); return outcome(100); };
  const first = await new Guard(ledger).do(call(key), run);
  assert.equal(first.fenced, true);
  assert.equal(text(first.outcome), "invoice of 100");
  const again = await new Guard(ledger).do(call(key), run);
  assert.equal(again.replayed, true);
  assert.equal(text(again.outcome), "invoice of 100");
  assert.equal(runs, 1);
  assert.equal(await invoices(key), 1);
});

fenced("Guard.do: a run that fails after its commit is answered from its fence", async () => {
  const key = `fence-${randomUUID()}`;
  const res = await new Guard(ledger).do(call(key), async (claim) => {
    await write(key, claim!.token, 100, outcome(100));
    throw new OutcomeUnknownError("the reply was lost after the commit");
  });
  assert.equal(res.fenced, true);
  assert.equal(text(res.outcome), "invoice of 100");
  assert.equal(await invoices(key), 1);
});

// A run that commits and then fails, whose fence cannot be read at first
// (its database failing over, the likely cause of the failure), is
// answered from its fence once it can be read: the guard reads it again
// for completeWithinMs, where it tried once and answered UNAVAILABLE.
fenced("Guard.do: a fence unreadable a while is read again", async () => {
  class FailingOver extends FenceTable {
    failures = 3;
    override async reserve(s: Parameters<FenceTable["reserve"]>[0], token: bigint) {
      if (this.failures-- > 0) {
        throw new Error("the database is failing over");
      }
      return super.reserve(s, token);
    }
  }
  const key = `fence-${randomUUID()}`;
  const failing = new FailingOver(pool);
  const res = await new Guard(ledger).do(call(key, { fence: failing }), async (claim) => {
    await write(key, claim!.token, 100, outcome(100));
    throw new OutcomeUnknownError("the reply was lost after the commit");
  });
  assert.equal(res.fenced, true);
  assert.equal(text(res.outcome), "invoice of 100");
  assert.ok(failing.failures < 0, "the fence was read without its failures");
});

fenced("Guard.do: a commit that did not land is known, and the retry runs once", async () => {
  const key = `fence-${randomUUID()}`;
  await assert.rejects(new Guard(ledger).do(call(key), async (claim) => {
    await write(key, claim!.token, 100, outcome(100), "ROLLBACK");
    throw new OutcomeUnknownError("the connection broke during COMMIT");
  }), (err: LedgerError) => err.code === ErrorCode.UNAVAILABLE && err.retryable && /did not commit/.test(err.message));
  const retry = await new Guard(ledger).do(call(key), async (claim) => { await write(key, claim!.token, 200, outcome(200)); return outcome(200); });
  assert.equal(retry.fenced, true);
  assert.equal(text(retry.outcome), "invoice of 200");
  assert.equal(await invoices(key), 1);
});

fenced("Guard.do: a fence a later record holds refuses the write, rolled back", async () => {
  const key = `fence-${randomUUID()}`;
  let writeErr: unknown;
  await assert.rejects(new Guard(ledger).do(call(key), async (claim) => {
    // A later record of the key holds the fence: this attempt is stale.
    const { rows } = await pool.query("SELECT namespace FROM idemledger_fences LIMIT 1");
    await pool.query(`INSERT INTO idemledger_fences (namespace, tenant, idem_key, record_created_us, token, method, expires_at)
      VALUES ($1, 'acme', $2, $3, 1, 'fence:test', now() + interval '1 hour')`, [rows[0].namespace, key, (BigInt(Date.now()) * 2000n).toString()]);
    try {
      await write(key, claim!.token, 100, outcome(100));
    } catch (err) {
      writeErr = err;
      throw err;
    }
    return outcome(100);
  }), (err: LedgerError) => err.code === ErrorCode.IN_PROGRESS);
  assert.equal(codeName((writeErr as LedgerError).code), "LEASE_LOST");
  assert.equal(await invoices(key), 0);
});

fenced("Guard.do: a fence that cannot be written fails the write, and nothing is stored", async () => {
  const key = `fence-${randomUUID()}`;
  await pool.query("ALTER TABLE idemledger_fences RENAME TO idemledger_fences_away");
  let writeErr: unknown;
  try {
    const res = await new Guard(ledger).do(call(key), async (claim) => {
      try {
        await write(key, claim!.token, 100, outcome(100));
      } catch (err) {
        writeErr = err;
      }
      return { status: { code: 14, message: "the fence could not be written", details: [] }, transient: true };
    });
    assert.equal(res.outcome.transient, true);
  } finally {
    await pool.query("ALTER TABLE idemledger_fences_away RENAME TO idemledger_fences");
  }
  assert.equal((writeErr as LedgerError).code, ErrorCode.UNAVAILABLE);
  assert.equal((writeErr as LedgerError).retryable, true);
  assert.equal(await invoices(key), 0);
  const retry = await new Guard(ledger).do(call(key), async (claim) => { await write(key, claim!.token, 200, outcome(200)); return outcome(200); });
  assert.equal(retry.fenced, true);
  assert.equal(await invoices(key), 1);
});

fenced("Guard.do: a fenced policy takes no hold and no reconcile", async () => {
  for (const c of [call("k-hold", { onLeaseExpiry: "hold" }), { ...call("k-rec"), reconcile: async () => undefined }]) {
    await assert.rejects(new Guard(ledger).do(c, async () => outcome(1)), (err: LedgerError) => err.code === ErrorCode.INTERNAL);
  }
});

fenced("FenceTable.sweep deletes expired fences in batches", async () => {
  const key = `fence-${randomUUID()}`;
  await new Guard(ledger).do(call(key, { retentionMs: 60_000 }), async (claim) => { await write(key, claim!.token, 1, outcome(1)); return outcome(1); });
  const later = new Date(Date.now() + 2 * 3600_000);
  let swept = 0;
  for (let n = -1; n !== 0;) {
    n = await fences.sweep(later, 2);
    swept += n;
  }
  assert.ok(swept >= 1);
  const { rows } = await pool.query("SELECT count(*) AS n FROM idemledger_fences WHERE idem_key = $1", [key]);
  assert.equal(Number(rows[0].n), 0);
});

fenced("McpGuard: a v2 tool writes its invoice and its fence, and the retry is the replay", async () => {
  let runs = 0;
  const guard = new McpGuard(new Guard(ledger), "acme");
  const factory = () => {
    const s = new McpServer({ name: "fenced", version: "1.0.0" });
    s.registerTool("create_invoice", { inputSchema: z.object({ amount_cents: z.number().int(), ...keyShape(z) }) },
      guard.tool("create_invoice", async (args: { amount_cents: number; idempotency_key?: string }, ctx) => {
        runs++;
        const result = { content: [{ type: "text" as const, text: `invoice of ${args.amount_cents}` }] };
        const claim = ctx.mcpReq._meta?.[ClaimMeta] as { token: number };
        await write(String(ctx.mcpReq._meta?.[KeyMeta] ?? args.idempotency_key), BigInt(claim.token), args.amount_cents, result);
        return result;
      }, { policy: { leaseMs: 30_000, fence: fences } }));
    return s;
  };
  const handler = toNodeHandler(createMcpHandler(factory));
  const server = http.createServer((req, res) => void handler(req, res));
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  const client = new Client({ name: "agent", version: "1.0.0" }, { versionNegotiation: { mode: "auto" } });
  try {
    await client.connect(new StreamableHTTPClientTransport(new URL(`http://127.0.0.1:${(server.address() as AddressInfo).port}/mcp`)));
    const key = `fence-${randomUUID()}`;
    const first = (await client.callTool({ name: "create_invoice", arguments: { amount_cents: 300, idempotency_key: key } })) as CallToolResult;
    const again = (await client.callTool({ name: "create_invoice", arguments: { amount_cents: 300, idempotency_key: key } })) as CallToolResult;
    assert.equal(first.isError, undefined, JSON.stringify(first));
    assert.equal(first.content?.[0]?.text, "invoice of 300");
    assert.equal(again._meta?.[ReplayedMeta], true);
    assert.equal(again.content?.[0]?.text, "invoice of 300");
    assert.equal(runs, 1);
    assert.equal(await invoices(key), 1);
  } finally {
    await client.close();
    server.closeAllConnections();
    server.close();
  }
});

fenced("httpGuard: a route writes its invoice and its fence; the first answer is the fence's, the retry its replay", async () => {
  let runs = 0;
  const guarded = httpGuard(new Guard(ledger), { route: "/v1/invoices", tenant: "acme", policy: { leaseMs: 30_000, fence: fences } })(async (req, res) => {
    runs++;
    const key = String(req.headers["idempotency-key"]);
    const body = JSON.stringify({ id: `inv_${runs}` });
    const response = { status: 201, headers: { "Content-Type": "application/json" }, body };
    await write(key, req.claim!.token, 1, response);
    res.writeHead(201, { "Content-Type": "application/json" }).end(body);
  });
  const server = http.createServer((req, res) => void guarded(req, res));
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  try {
    const key = `fence-${randomUUID()}`;
    const post = () => fetch(`http://127.0.0.1:${(server.address() as AddressInfo).port}/v1/invoices`, { method: "POST", body: "{}",
      headers: { "Content-Type": "application/json", "Idempotency-Key": key } });
    const first = await post();
    const firstBody = await first.text();
    const again = await post();
    assert.equal(first.status, 201);
    assert.equal(first.headers.get("Idempotency-Replayed"), null);
    assert.equal(again.status, 201);
    assert.equal(again.headers.get("Idempotency-Replayed"), "true");
    assert.equal(await again.text(), firstBody);
    assert.equal(runs, 1);
    assert.equal(await invoices(key), 1);
  } finally {
    server.closeAllConnections();
    server.close();
  }
});
