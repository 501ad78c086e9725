// Claims, completes and replays against a real ledgerd over Connect (its
// HTTP listener) and over gRPC (its gRPC listener), and decodes
// KEY_REUSED and IN_PROGRESS with their details. The Go test
// TestTypeScriptClient (cmd/ledgerd) starts ledgerd and runs this with
// LEDGER_HTTP, LEDGER_GRPC, LEDGER_ADMIN and LEDGER_TOKEN set.
import { strict as assert } from "node:assert";
import { randomUUID } from "node:crypto";
import { test } from "node:test";

import { create } from "@bufbuild/protobuf";
import { anyPack, anyUnpack, StringValueSchema } from "@bufbuild/protobuf/wkt";
import { createClient, type Interceptor, type Transport } from "@connectrpc/connect";
import { createConnectTransport, createGrpcTransport } from "@connectrpc/connect-node";

import { createLedger, ErrorCode, Guard, LedgerConfigError, LedgerError, LedgerService, ledgerError } from "../src/index.js";

const token = process.env.LEDGER_TOKEN ?? "";
const bearer: Interceptor = (next) => (req) => {
  req.header.set("Authorization", `Bearer ${token}`);
  return next(req);
};

const transports: Record<string, () => Transport> = {
  connect: () => createConnectTransport({ baseUrl: process.env.LEDGER_HTTP!, httpVersion: "1.1", interceptors: [bearer] }),
  grpc: () => createGrpcTransport({ baseUrl: process.env.LEDGER_GRPC!, interceptors: [bearer] }),
};

for (const [protocol, transport] of Object.entries(transports)) {
  test(`claim, complete, replay over ${protocol}`, async () => {
    const ledger = createClient(LedgerService, transport());
    const key = `ts-${randomUUID()}`;
    const begin = { tenant: "acme", key, fingerprint: "v1:" + "ab".repeat(32), method: "http:POST /v1/invoices" };

    const claimed = await ledger.begin(begin);
    assert.equal(claimed.result.case, "claim");
    const token = claimed.result.case === "claim" ? claimed.result.value.token : 0n;
    assert.equal(token, 1n);

    const answer = anyPack(StringValueSchema, create(StringValueSchema, { value: "inv_0042" }));
    await ledger.complete({ tenant: "acme", key, token, outcome: { result: { case: "response", value: answer } } });

    const replayed = await ledger.begin(begin);
    assert.equal(replayed.result.case, "replay");
    const outcome = replayed.result.case === "replay" ? replayed.result.value.outcome : undefined;
    assert.equal(outcome?.result.case, "response");
    const response = outcome?.result.case === "response" ? outcome.result.value : undefined;
    assert.deepEqual(response?.value, answer.value, "the replay is the stored bytes");
    assert.equal(response && anyUnpack(response, StringValueSchema)?.value, "inv_0042");

    // The same key with another fingerprint: KEY_REUSED, permanent.
    const reused = await ledger.begin({ ...begin, fingerprint: "v1:" + "cd".repeat(32) }).then(
      () => assert.fail("another fingerprint was accepted"),
      (err: unknown) => ledgerError(err),
    );
    assert.equal(reused?.code, ErrorCode.KEY_REUSED);
    assert.equal(reused?.codeName, "KEY_REUSED");
    assert.equal(reused?.retryable, false);
    assert.equal(reused?.metadata.method, "http:POST /v1/invoices");

    // A second Begin while the first holds the lease: IN_PROGRESS, retryable after a while.
    const busy = { ...begin, key: `${key}-busy` };
    await ledger.begin(busy);
    const inProgress = await ledger.begin(busy).then(
      () => assert.fail("a held key was claimed twice"),
      (err: unknown) => ledgerError(err),
    );
    assert.equal(inProgress?.code, ErrorCode.IN_PROGRESS);
    assert.equal(inProgress?.retryable, true);
    assert.ok((inProgress?.retryAfterMs ?? 0) > 0, "IN_PROGRESS says when to retry");
  });
}

test("an error without the ledger's detail is not typed", () => {
  assert.equal(ledgerError(new Error("connection refused")), undefined);
});

test("timeoutMs 0 is no deadline, not one already past", async () => {
  const ledger = createLedger({ baseUrl: process.env.LEDGER_HTTP!, token, timeoutMs: 0 });
  const claimed = await ledger.begin({ tenant: "acme", key: `ts-${randomUUID()}`, fingerprint: "v1:" + "ab".repeat(32), method: "http:POST /v1/invoices" });
  assert.equal(claimed.result.case, "claim");
});

test("a baseUrl that is not the ledger is a configuration error, said once, never UNAVAILABLE", async () => {
  // ledgerd's admin listener answers 404 to the LedgerService.
  const logged: string[] = [];
  const ledger = createLedger({ baseUrl: process.env.LEDGER_ADMIN!, token, log: (m) => logged.push(m) });
  const guard = new Guard(ledger);
  const call = { tenant: "acme", key: `ts-${randomUUID()}`, fingerprint: "v1:" + "ab".repeat(32), method: "http:POST /v1/invoices", policy: {} };
  for (let i = 0; i < 2; i++) {
    let ran = false;
    const err = await guard.do({ ...call }, async () => { ran = true; return {}; }).then(
      () => assert.fail("a call through a wrong endpoint succeeded"),
      (e: unknown) => e,
    );
    assert.equal(ran, false, "the write does not run");
    assert.ok(err instanceof LedgerError);
    assert.equal(err.code, ErrorCode.INTERNAL, `got ${err.codeName}: ${err.message}`);
    assert.equal(err.retryable, false);
    assert.equal(err.message, "internal error", "the caller is not told the service's configuration");
    assert.ok(err.cause instanceof LedgerConfigError);
  }
  assert.equal(logged.length, 1, "said once");
  assert.match(logged[0], /is not ledgerd's LedgerService \(HTTP 404 to Begin\).*--http-listen, 7072/);

  // A port where nothing listens is an outage: UNAVAILABLE, retryable, nothing said.
  const closed = createLedger({ baseUrl: "http://127.0.0.1:1", log: (m) => logged.push(m) });
  const down = await new Guard(closed).do({ ...call }, async () => ({})).then(() => assert.fail("succeeded"), (e: unknown) => e);
  assert.ok(down instanceof LedgerError);
  assert.equal(down.code, ErrorCode.UNAVAILABLE);
  assert.equal(logged.length, 1);
});
