// Claims, completes and replays against a real ledgerd over Connect (its
// HTTP listener) and over gRPC (its gRPC listener), and decodes
// KEY_REUSED and IN_PROGRESS with their details, unary and on
// createLedger's stream. The Go test
// TestTypeScriptClient (cmd/ledgerd) starts ledgerd and runs this with
// LEDGER_HTTP, LEDGER_GRPC, LEDGER_ADMIN and LEDGER_TOKEN set, and
// LEDGER_HTTPS and LEDGER_GRPCS, a second ledgerd's listeners over TLS.
import { strict as assert } from "node:assert";
import { spawn } from "node:child_process";
import { randomUUID } from "node:crypto";
import http from "node:http";
import net, { type AddressInfo } from "node:net";
import { test } from "node:test";

import { create } from "@bufbuild/protobuf";
import { anyPack, anyUnpack, StringValueSchema } from "@bufbuild/protobuf/wkt";
import { Code, ConnectError, createClient, type Interceptor, type Transport } from "@connectrpc/connect";
import { createConnectTransport, createGrpcTransport } from "@connectrpc/connect-node";

import { createLedger, ErrorCode, Guard, type Ledger, LedgerConfigError, LedgerError, LedgerService, ledgerError } from "../src/index.js";

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

// createLedger's calls go over one LedgerService.Stream: answered as the
// unary calls are, typed errors and their details included.
for (const [protocol, baseUrl] of [["connect", () => process.env.LEDGER_HTTP!], ["grpc", () => process.env.LEDGER_GRPC!]] as const) {
  test(`createLedger over ${protocol}: calls on one stream, answered as unary calls`, async () => {
    const ledger = createLedger({ baseUrl: baseUrl(), protocol, token });
    try {
      const key = `ts-${randomUUID()}`;
      const begin = { tenant: "acme", key, fingerprint: "v1:" + "ab".repeat(32), method: "http:POST /v1/invoices" };
      const [claimed, busy] = await Promise.allSettled([ledger.begin(begin), ledger.begin(begin)]);
      const won = claimed.status === "fulfilled" ? claimed : busy;
      const lost = claimed.status === "fulfilled" ? busy : claimed;
      assert.equal(won.status, "fulfilled");
      assert.equal(lost.status, "rejected", "two Begins of one key in flight on one stream: one claims");
      assert.equal(ledgerError((lost as PromiseRejectedResult).reason)?.code, ErrorCode.IN_PROGRESS);
      const claim = (won as PromiseFulfilledResult<Awaited<ReturnType<typeof ledger.begin>>>).value.result;
      assert.equal(claim.case, "claim");
      const answer = anyPack(StringValueSchema, create(StringValueSchema, { value: "inv_0042" }));
      await ledger.complete({ tenant: "acme", key, token: claim.case === "claim" ? claim.value.token : 0n, outcome: { result: { case: "response", value: answer } } });
      const replayed = await ledger.begin(begin);
      assert.equal(replayed.result.case, "replay");
      const reused = await ledger.begin({ ...begin, fingerprint: "v1:" + "cd".repeat(32) }).then(() => assert.fail("reused"), (e: unknown) => ledgerError(e));
      assert.equal(reused?.code, ErrorCode.KEY_REUSED);
      assert.equal(reused?.metadata.method, "http:POST /v1/invoices", "the detail's metadata travels on the stream");
      const missing = await ledger.lookup({ tenant: "acme", key: `${key}-absent` }).then(() => assert.fail("found"), (e: unknown) => ledgerError(e));
      assert.equal(missing?.code, ErrorCode.NOT_FOUND);

      // A Lookup that waits, given up by its signal: canceled at once, and the stream goes on.
      await ledger.begin({ ...begin, key: `${key}-held` });
      const ctl = new AbortController();
      const waiting = ledger.lookup({ tenant: "acme", key: `${key}-held`, wait: { seconds: 5n } }, { signal: ctl.signal, timeoutMs: 10_000 });
      ctl.abort();
      const canceled = await waiting.then(() => assert.fail("answered"), (e: unknown) => ConnectError.from(e));
      assert.equal(canceled.code, Code.Canceled);
      assert.equal((await ledger.lookup({ tenant: "acme", key })).record?.method, "http:POST /v1/invoices", "the stream goes on");
    } finally {
      ledger.close();
    }
  });
}

// Many calls at once on one stream, their answers interleaved and some
// split across frames: each call gets its own answer, and each replay its
// own outcome's bytes.
test("createLedger: 300 calls at once on one stream, each answered with its own", async () => {
  const ledger = createLedger({ baseUrl: process.env.LEDGER_HTTP!, token });
  try {
    const run = `ts-${randomUUID()}`;
    const value = (i: number) => Uint8Array.from({ length: 1 + ((i * 7919) % (40 << 10)) }, (_, j) => (i + j) % 256);
    const outcome = (i: number) => ({ result: { case: "response" as const, value: { typeUrl: "type.googleapis.com/x.Y", value: value(i) } } });
    const begin = (i: number) => ledger.begin({ tenant: "acme", key: `${run}-${i}`, fingerprint: "v1:" + "ab".repeat(32), method: "http:POST /v1/invoices" });
    const ids = Array.from({ length: 300 }, (_, i) => i);
    await Promise.all(ids.map(async (i) => {
      const claimed = await begin(i);
      assert.equal(claimed.result.case, "claim");
      await ledger.complete({ tenant: "acme", key: `${run}-${i}`, token: claimed.result.case === "claim" ? claimed.result.value.token : 0n, outcome: outcome(i) });
    }));
    await Promise.all(ids.map(async (i) => {
      const replayed = await begin(i);
      assert.equal(replayed.result.case, "replay");
      assert.deepEqual(replayed.result.case === "replay" ? replayed.result.value.outcome?.result.value?.value : undefined, value(i), `key ${i}`);
    }));
  } finally {
    ledger.close();
  }
});

// Over TLS (an https baseUrl; the Go test's CA comes through
// NODE_EXTRA_CA_CERTS): the stream on HTTP/2 by ALPN, and a large
// Complete as a unary call.
for (const [protocol, baseUrl] of [["connect", () => process.env.LEDGER_HTTPS!], ["grpc", () => process.env.LEDGER_GRPCS!]] as const) {
  test(`createLedger over ${protocol} with TLS: the stream and a unary call`, async () => {
    assert.match(baseUrl(), /^https:/);
    const ledger = createLedger({ baseUrl: baseUrl(), protocol, token });
    try {
      const key = `ts-${randomUUID()}`;
      const begin = { tenant: "acme", key, fingerprint: "v1:" + "ab".repeat(32), method: "http:POST /v1/invoices" };
      const claimed = await ledger.begin(begin);
      assert.equal(claimed.result.case, "claim");
      const value = Uint8Array.from({ length: 100 << 10 }, (_, i) => i % 253); // over 64 KiB: a unary call
      await ledger.complete({ tenant: "acme", key, token: claimed.result.case === "claim" ? claimed.result.value.token : 0n,
        outcome: { result: { case: "response", value: { typeUrl: "type.googleapis.com/x.Y", value } } } });
      const replayed = await ledger.begin(begin);
      assert.equal(replayed.result.case, "replay");
      assert.deepEqual(replayed.result.case === "replay" ? replayed.result.value.outcome?.result.value?.value : undefined, value);
    } finally {
      ledger.close();
    }
  });
}

// A request over 64 KiB goes as a unary call (sizeBound spares the others
// an encoding): one over ledgerd's limit fails alone, where on the stream
// it would end the stream and every call on it.
test("createLedger: a large Complete goes alone, and one over the limit fails without the stream's calls", async () => {
  const ledger = createLedger({ baseUrl: process.env.LEDGER_HTTP!, token });
  try {
    const key = `ts-${randomUUID()}`;
    const begin = (k: string) => ledger.begin({ tenant: "acme", key: k, fingerprint: "v1:" + "ab".repeat(32), method: "http:POST /v1/invoices" });
    const tokenOf = (r: Awaited<ReturnType<typeof begin>>) => (r.result.case === "claim" ? r.result.value.token : 0n);
    const [big, huge, held] = await Promise.all([begin(`${key}-big`), begin(`${key}-huge`), begin(`${key}-held`)]);
    const waiting = ledger.lookup({ tenant: "acme", key: `${key}-held`, wait: { seconds: 10n } }, { timeoutMs: 20_000 });

    const tooLarge = await ledger.complete({ tenant: "acme", key: `${key}-huge`, token: tokenOf(huge),
      outcome: { result: { case: "response", value: { typeUrl: "type.googleapis.com/x.Y", value: new Uint8Array(5 << 20) } } } })
      .then(() => assert.fail("a 5 MiB outcome was kept"), (e: unknown) => ConnectError.from(e));
    assert.notEqual(tooLarge.code, Code.Unavailable, "the stream did not carry it");

    const value = Uint8Array.from({ length: 100 << 10 }, (_, i) => i % 251);
    await ledger.complete({ tenant: "acme", key: `${key}-big`, token: tokenOf(big), outcome: { result: { case: "response", value: { typeUrl: "type.googleapis.com/x.Y", value } } } });
    const replay = await begin(`${key}-big`);
    assert.equal(replay.result.case, "replay");
    assert.deepEqual(replay.result.case === "replay" ? replay.result.value.outcome?.result.value : undefined, { $typeName: "google.protobuf.Any", typeUrl: "type.googleapis.com/x.Y", value });

    await ledger.complete({ tenant: "acme", key: `${key}-held`, token: tokenOf(held), outcome: { result: { case: "response", value: { typeUrl: "type.googleapis.com/x.Y", value: new Uint8Array(1) } } } });
    assert.ok((await waiting).record?.completedAt, "the Lookup waiting on the stream got its answer: the record completed");
  } finally {
    ledger.close();
  }
});

test("a proxy of HTTP/1.1 only in front of ledgerd: every call goes as a unary call", async () => {
  // A forwarding proxy that speaks HTTP/1.1 alone, as some ingresses do.
  const upstream = new URL(process.env.LEDGER_HTTP!);
  const proxy = http.createServer((req, res) => {
    const out = http.request({ host: upstream.hostname, port: upstream.port, path: req.url, method: req.method, headers: req.headers }, (r) => {
      res.writeHead(r.statusCode ?? 502, r.headers);
      r.pipe(res);
    });
    req.pipe(out);
  });
  await new Promise<void>((r) => proxy.listen(0, "127.0.0.1", r));
  const ledger = createLedger({ baseUrl: `http://127.0.0.1:${(proxy.address() as AddressInfo).port}`, token, log: (m) => assert.fail(m) });
  try {
    const result = await new Guard(ledger).do({ tenant: "acme", key: `ts-${randomUUID()}`, fingerprint: "v1:" + "ab".repeat(32), method: "http:POST /v1/invoices", policy: {} },
      async () => ({ response: anyPack(StringValueSchema, create(StringValueSchema, { value: "inv_7" })) }));
    assert.equal(result.protected, true);
    assert.equal(result.replayed, false);
  } finally {
    ledger.close();
    proxy.closeAllConnections();
    proxy.close();
  }
});

// A connection to ledgerd that goes silent without closing (its far end
// lost without a reset, as when a node dies) is found by the client's
// pings: the call in flight fails UNAVAILABLE about 15 s on, long before
// its deadline, and its retry goes on a new connection, which the ledger
// answers with the claim, since it never heard the first. A connection
// that is only quiet answers the pings and is kept: a Lookup that waits
// 17 s is answered. A guard whose connection goes silent while its run
// goes on stores the outcome on a new one (its tries for 20 s outlast
// the 15 s), and the retry replays it. Both protocols, all at once.
test("createLedger: a connection gone silent is dropped and the retry goes on a new one, a guard's outcome too; a quiet one is kept", async () => {
  const protocols = [["connect", process.env.LEDGER_HTTP!], ["grpc", process.env.LEDGER_GRPC!]] as const;
  const begin = (key: string) => ({ tenant: "acme", key, fingerprint: "v1:" + "ab".repeat(32), method: "http:POST /v1/invoices" });
  const quiet = protocols.map(async ([protocol, url]) => {
    const ledger = createLedger({ baseUrl: url, protocol, token });
    try {
      const key = `ts-${randomUUID()}`;
      await ledger.begin(begin(key));
      const sent = Date.now();
      const waited = await ledger.lookup({ tenant: "acme", key, wait: { seconds: 17n } }, { timeoutMs: 30_000 });
      assert.equal(waited.record?.method, "http:POST /v1/invoices", protocol);
      assert.ok(Date.now() - sent >= 17_000, `${protocol}: the Lookup was answered after ${Date.now() - sent} ms, before its wait`);
    } finally {
      ledger.close();
    }
  });
  const silent = protocols.map(async ([protocol, url]) => {
    const relay = await silencing(new URL(url));
    const ledger = createLedger({ baseUrl: relay.url, protocol, token });
    try {
      const key = `ts-${randomUUID()}`;
      await ledger.begin(begin(`${key}-before`));
      relay.silence();
      const sent = Date.now();
      const lost = await ledger.begin(begin(key), { timeoutMs: 45_000 }).then(() => assert.fail("answered"), (e: unknown) => ConnectError.from(e));
      assert.equal(lost.code, Code.Unavailable, `${protocol}: ${lost.message}`);
      assert.ok(Date.now() - sent < 30_000, `${protocol}: the call on the silent connection failed after ${Date.now() - sent} ms, want about 15 s`);
      const retried = await ledger.begin(begin(key));
      assert.equal(retried.result.case, "claim", protocol);
      assert.equal(relay.accepted(), 2, `${protocol}: connections`);
    } finally {
      ledger.close();
      relay.close();
    }
  });
  const guarded = protocols.map(([protocol, url]) => outlasted(protocol, url, (relay) => relay.silence()));
  // A gRPC unary call (an outcome over 64 KiB) shares the stream's
  // connection, and after a run longer than the stream's second of idle no
  // stream is open to find it silent: the call's missed deadline has the
  // connection pinged.
  const unary = outlasted("grpc", process.env.LEDGER_GRPC!, async (relay) => {
    await new Promise((r) => setTimeout(r, 1500)); // past the stream's idle close
    relay.silence();
  }, 100 << 10);
  await Promise.all([...quiet, ...silent, ...guarded, unary]);
});

// A connection that closes under a call (a ledgerd killed or restarted)
// fails the call UNAVAILABLE, retryable, where it failed INTERNAL ("ended
// without its end message", "missing status"), and the next call connects
// again. The ledger goes down under a guarded run (its connections
// closed, new ones closed at once) and is back 3 s later: each try of the
// Complete fails at once meanwhile, and the guard goes on trying for its
// 20 s, so the outcome is stored when the ledger is back and the retry
// replays it, an outcome over 64 KiB (a unary call) too. With four tries
// whatever their pace, they were spent in under a second and the key
// stayed in progress. Both protocols, at once.
test("a ledger restart: a call cut off fails UNAVAILABLE, and a guard's outcome outlasts it", async () => {
  const protocols = [["connect", process.env.LEDGER_HTTP!], ["grpc", process.env.LEDGER_GRPC!]] as const;
  const cutOff = protocols.map(async ([protocol, url]) => {
    const relay = await silencing(new URL(url));
    const ledger = createLedger({ baseUrl: relay.url, protocol, token });
    try {
      const key = `ts-${randomUUID()}`;
      await ledger.begin({ tenant: "acme", key, fingerprint: "v1:" + "ab".repeat(32), method: "http:POST /v1/invoices" });
      const waiting = ledger.lookup({ tenant: "acme", key, wait: { seconds: 10n } }, { timeoutMs: 20_000 });
      relay.cut();
      const err = await waiting.then(() => assert.fail("answered"), (e: unknown) => ConnectError.from(e));
      assert.equal(err.code, Code.Unavailable, `${protocol}: ${err.message}`);
      const again = await ledger.lookup({ tenant: "acme", key });
      assert.equal(again.record?.method, "http:POST /v1/invoices", protocol);
      assert.equal(relay.accepted(), 2, `${protocol}: connections`);
    } finally {
      ledger.close();
      relay.close();
    }
  });
  const restart = (relay: Relay) => {
    relay.admit("close");
    relay.cut();
    setTimeout(() => relay.admit("forward"), 3000);
  };
  // An outcome over 64 KiB goes as a unary call: over HTTP/1.1 (Connect),
  // or on the stream's HTTP/2 connection (gRPC).
  const guarded = protocols.flatMap(([protocol, url]) => [outlasted(protocol, url, restart), outlasted(protocol, url, restart, 100 << 10)]);
  // A ledger down past the guard's time to try leaves the key in progress,
  // never a stored error in place of the run's answer (the guard took the
  // failed tries for the ledger's refusal and stored OUTCOME "not kept"
  // once the ledger was back).
  const outlived = protocols.map(async ([protocol, url]) => {
    const relay = await silencing(new URL(url));
    const ledger = createLedger({ baseUrl: relay.url, protocol, token });
    try {
      const call = { tenant: "acme", key: `ts-${randomUUID()}`, fingerprint: "v1:" + "ab".repeat(32), method: "http:POST /v1/invoices", policy: { onInProgress: "reject" as const } };
      const guard = new Guard(ledger, { completeWithinMs: 1000 });
      let back: Promise<void> | undefined;
      await guard.do(call, async () => {
        relay.admit("close");
        relay.cut();
        back = new Promise((r) => setTimeout(() => r(relay.admit("forward")), 1500));
        return { response: anyPack(StringValueSchema, create(StringValueSchema, { value: "inv_1" })) };
      });
      await back;
      const retried = await guard.do(call, async () => assert.fail("ran again")).then(() => assert.fail("answered"), (e: unknown) => e);
      assert.ok(retried instanceof LedgerError && retried.code === ErrorCode.IN_PROGRESS, `${protocol}: ${String(retried)}`);
    } finally {
      ledger.close();
      relay.close();
    }
  });
  await Promise.all([...cutOff, ...guarded, ...outlived]);
});

// outlasted runs a guarded call over a ledger reached through a relay,
// whose run calls fault with the relay: the run's answer is stored all the
// same, and the retry replays it without running.
async function outlasted(protocol: "connect" | "grpc", url: string, fault: (relay: Relay) => void | Promise<void>, size = 0): Promise<void> {
  const relay = await silencing(new URL(url));
  const ledger = createLedger({ baseUrl: relay.url, protocol, token });
  try {
    const call = { tenant: "acme", key: `ts-${randomUUID()}`, fingerprint: "v1:" + "ab".repeat(32), method: "http:POST /v1/invoices", policy: {} };
    let runs = 0;
    const run = async (id: string) => {
      runs++;
      await fault(relay);
      return { response: anyPack(StringValueSchema, create(StringValueSchema, { value: id + ".".repeat(size) })) };
    };
    const guard = new Guard(ledger);
    const first = await guard.do(call, () => run("inv_1"));
    assert.equal(first.replayed, false, protocol);
    const retried = await guard.do(call, () => run("other"));
    assert.equal(retried.replayed, true, `${protocol}: the retry is replayed`);
    const value = retried.outcome.response && anyUnpack(retried.outcome.response, StringValueSchema)?.value;
    assert.ok(value === "inv_1" + ".".repeat(size), `${protocol}: replayed ${value?.slice(0, 20)} (${value?.length} chars), ${retried.outcome.status?.message ?? ""}`);
    assert.equal(runs, 1, protocol);
  } finally {
    ledger.close();
    relay.close();
  }
}

// A connection that is not up in 20 s is given up, and the call waiting on
// it fails UNAVAILABLE then, not at its deadline: one to an address that
// drops its SYNs (a listener whose queue is full), which Node leaves to
// the kernel's retries (about 2 min), and one over TLS whose handshake
// gets no answer, which Node would wait on for ever; the retry of the
// latter connects anew and claims. Both protocols, all at once.
test("createLedger: a connection not up in 20 s is given up, and the next call connects anew", async () => {
  const begin = (key: string) => ({ tenant: "acme", key, fingerprint: "v1:" + "ab".repeat(32), method: "http:POST /v1/invoices" });
  const lost = async (ledger: Ledger, protocol: string, key: string) => {
    const sent = Date.now();
    const err = await ledger.begin(begin(key), { timeoutMs: 45_000 }).then(() => assert.fail("answered"), (e: unknown) => ConnectError.from(e));
    const took = Date.now() - sent;
    assert.equal(err.code, Code.Unavailable, `${protocol}: ${err.message}`);
    assert.match(err.message, /ETIMEDOUT/, protocol);
    assert.ok(took >= 19_000 && took < 30_000, `${protocol}: the call failed after ${took} ms, want about 20 s`);
  };
  const dropping = await droppingSyns();
  const syn = (["connect", "grpc"] as const).map(async (protocol) => {
    const ledger = createLedger({ baseUrl: dropping.url, protocol, token });
    try {
      await lost(ledger, protocol, `ts-${randomUUID()}`);
    } finally {
      ledger.close();
    }
  });
  const handshake = ([["connect", process.env.LEDGER_HTTPS!], ["grpc", process.env.LEDGER_GRPCS!]] as const).map(async ([protocol, url]) => {
    const relay = await silencing(new URL(url));
    relay.admit("hang");
    const ledger = createLedger({ baseUrl: relay.url.replace("127.0.0.1", "localhost"), protocol, token });
    try {
      const key = `ts-${randomUUID()}`;
      await lost(ledger, `${protocol} over TLS`, key);
      relay.admit("forward");
      const retried = await ledger.begin(begin(key));
      assert.equal(retried.result.case, "claim", protocol);
      assert.equal(relay.accepted(), 2, `${protocol}: connections`);
    } finally {
      ledger.close();
      relay.close();
    }
  });
  try {
    await Promise.all([...syn, ...handshake]);
  } finally {
    dropping.close();
  }
});

// droppingSyns is an address whose SYNs are dropped: a listener (in a
// process of its own, blocked, so it never accepts) whose queue of one is
// filled first.
async function droppingSyns(): Promise<{ url: string; close(): void }> {
  const child = spawn(process.execPath, ["-e", `
    const s = require("node:net").createServer().listen({ port: 0, host: "127.0.0.1", backlog: 1 }, () => {
      console.log(s.address().port);
      Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0);
    });`], { stdio: ["ignore", "pipe", "inherit"] });
  const port = await new Promise<number>((resolve) => child.stdout.once("data", (d: Buffer) => resolve(Number(String(d).trim()))));
  // A queue of one takes two connections: the third's SYN is dropped.
  const filling = [0, 1].map(() => net.connect(port, "127.0.0.1"));
  await Promise.all(filling.map((s) => new Promise((r) => s.once("connect", r))));
  return {
    url: `http://127.0.0.1:${port}`,
    close: () => {
      filling.forEach((s) => s.destroy());
      child.kill("SIGKILL");
    },
  };
}

// silencing forwards the connections it accepts to target; silence makes
// the ones it holds go silent without closing (what either end sends is
// read and dropped), and cut closes them (a server that went down). What
// it does with the ones it accepts later is admit's: forward them, hang
// (hold them and never answer, reaching no target: a process that accepts
// and hangs) or close them at once (a server that is down).
type Relay = { url: string; silence(): void; cut(): void; admit(mode: "forward" | "hang" | "close"): void; accepted(): number; close(): void };
async function silencing(target: URL): Promise<Relay> {
  let held: { silent: boolean; sockets: net.Socket[] }[] = [];
  let accepted = 0;
  let mode: "forward" | "hang" | "close" = "forward";
  const relay = net.createServer((agent) => {
    accepted++;
    agent.on("error", () => agent.destroy());
    if (mode === "close") {
      agent.destroy();
      return;
    }
    if (mode === "hang") {
      held.push({ silent: true, sockets: [agent] });
      agent.resume();
      return;
    }
    const far = net.connect(Number(target.port), target.hostname);
    const conn = { silent: false, sockets: [agent, far] };
    held.push(conn);
    const pipe = (from: net.Socket, to: net.Socket) => {
      from.on("data", (chunk) => conn.silent || to.write(chunk));
      from.on("close", () => to.destroy());
      from.on("error", () => to.destroy());
    };
    pipe(agent, far);
    pipe(far, agent);
  });
  await new Promise<void>((r) => relay.listen(0, "127.0.0.1", r));
  const cut = () => {
    held.forEach((c) => c.sockets.forEach((s) => s.destroy()));
    held = [];
  };
  return {
    url: `${target.protocol}//127.0.0.1:${(relay.address() as AddressInfo).port}`,
    silence: () => held.forEach((c) => (c.silent = true)),
    cut,
    admit: (m) => (mode = m),
    accepted: () => accepted,
    close: () => {
      relay.close();
      cut();
    },
  };
}
