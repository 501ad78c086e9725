// The HTTP guard in front of a node:http handler, an Express route and a
// Fastify route, driven by fetch, by node:http requests with two key
// lines, and by curl, against a real ledgerd (TestTypeScriptClient,
// cmd/ledgerd).
import { strict as assert } from "node:assert";
import { execFile } from "node:child_process";
import { randomUUID } from "node:crypto";
import http from "node:http";
import type { AddressInfo } from "node:net";
import { test } from "node:test";
import { promisify } from "node:util";

import { createLedger, Guard, httpGuard, type Policy } from "../src/index.js";

const ledger = createLedger({ baseUrl: process.env.LEDGER_HTTP!, token: process.env.LEDGER_TOKEN });

async function serve(policy: Policy, gate?: Promise<void>, stripe = false) {
  let runs = 0;
  const guarded = httpGuard(new Guard(ledger), { route: "/v1/invoices", tenant: "acme", policy, maxBodyBytes: 1024, stripe })(async (req, res) => {
    runs++;
    await gate;
    const body = JSON.parse(req.rawBody!.toString() || "{}") as { customer?: string; status?: number };
    if (body.status) {
      res.writeHead(body.status, { "Content-Type": "application/json" }).end(JSON.stringify({ busy: true }));
      return;
    }
    res.setHeader("Location", `/v1/invoices/${runs}`);
    res.setHeader("X-Run", String(runs)); // not on the allow-list: never replayed
    res.setHeader("Request-Id", `req_${runs}`); // replayed on a Stripe route only
    res.writeHead(201, { "Content-Type": "application/json" });
    res.end(JSON.stringify({ id: `inv_${randomUUID()}`, customer: body.customer }));
  });
  const server = http.createServer((req, res) => void guarded(req, res));
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}/v1/invoices`;
  const post = (body: unknown, key?: string) => fetch(url, { method: "POST", body: JSON.stringify(body),
    headers: { "Content-Type": "application/json", ...(key ? { "Idempotency-Key": key } : {}) } });
  return { url, post, runs: () => runs, close: () => server.close() };
}

test("a bare UUID and stripe-go's own keys; the replay; KEY_REUSED 422; KEY_MISSING 400", async () => {
  const s = await serve({});
  try {
    for (const key of [randomUUID().replace(/^./, "7"), `${Date.now()}${Math.floor(Math.random() * 1e6)}_B8TIFA`]) {
      const first = await s.post({ customer: "c1" }, key);
      assert.equal(first.status, 201);
      const body = await first.text();
      const again = await s.post({ customer: "c1" }, key);
      assert.equal(again.status, 201);
      assert.equal(again.headers.get("Idempotency-Replayed"), "true");
      assert.equal(again.headers.get("Location"), first.headers.get("Location"));
      assert.equal(again.headers.get("X-Run"), null, "a header off the allow-list is not replayed");
      assert.equal(await again.text(), body);
      const reused = await s.post({ customer: "c2" }, key);
      assert.equal(reused.status, 422);
      assert.equal(reused.headers.get("Content-Type"), "application/problem+json");
      assert.equal(((await reused.json()) as { code: string }).code, "KEY_REUSED");
    }
    const missing = await s.post({ customer: "c1" });
    assert.equal(missing.status, 400);
    assert.equal(((await missing.json()) as { code: string }).code, "KEY_MISSING");
    assert.equal(s.runs(), 2);
  } finally {
    s.close();
  }
});

test("two key lines are KEY_INVALID; a body over the limit is 413", async () => {
  const s = await serve({});
  try {
    const [status, body] = await new Promise<[number, string]>((resolve, reject) => {
      // A raw list of headers gets no Host of its own.
      const req = http.request(s.url, { method: "POST", headers: ["Host", new URL(s.url).host, "Content-Type", "application/json", "Idempotency-Key", "a", "Idempotency-Key", "b"] }, (res) => {
        let b = "";
        res.on("data", (c) => { b += c; });
        res.on("end", () => resolve([res.statusCode!, b]));
      });
      req.on("error", reject);
      req.end("{}");
    });
    assert.equal(status, 400);
    assert.equal((JSON.parse(body) as { code: string }).code, "KEY_INVALID");
    const big = await s.post({ customer: "x".repeat(2048) }, randomUUID());
    assert.equal(big.status, 413);
    assert.equal(s.runs(), 0);
  } finally {
    s.close();
  }
});

test("a 503 of the handler releases the key; IN_PROGRESS is 409 with Retry-After", async () => {
  let open!: () => void;
  const gate = new Promise<void>((r) => { open = r; });
  const s = await serve({ onInProgress: "reject", leaseMs: 30_000 }, gate);
  try {
    const key = randomUUID();
    const first = s.post({ customer: "c" }, key);
    while (s.runs() === 0) await new Promise((r) => setImmediate(r));
    const dup = await s.post({ customer: "c" }, key);
    assert.equal(dup.status, 409);
    assert.ok(Number(dup.headers.get("Retry-After")) >= 1);
    open();
    assert.equal((await first).status, 201);
    const released = randomUUID();
    assert.equal((await s.post({ status: 503 }, released)).status, 503);
    assert.equal((await s.post({ status: 503 }, released)).headers.get("Idempotency-Replayed"), null, "released: it ran again");
    assert.equal(s.runs(), 3);
  } finally {
    s.close();
  }
});

test("curl drives it", async () => {
  const s = await serve({});
  try {
    const key = randomUUID();
    const curl = (args: string[]) => promisify(execFile)("curl", ["-s", "-i", "-X", "POST", "-H", "Content-Type: application/json", ...args, s.url]);
    const first = await curl(["-H", `Idempotency-Key: ${key}`, "-d", '{"customer":"c"}']);
    const again = await curl(["-H", `Idempotency-Key: "${key}"`, "-d", '{ "customer" : "c" }']);
    assert.match(first.stdout, /^HTTP\/1.1 201/);
    assert.match(again.stdout, /^HTTP\/1.1 201[\s\S]*idempotency-replayed: true/i);
    assert.equal(first.stdout.split("\r\n\r\n")[1], again.stdout.split("\r\n\r\n")[1]);
  } finally {
    s.close();
  }
});

test("Express: the guard in front of a route whose handler answers with res.json", async () => {
  const express = (await import("express")).default;
  let runs = 0;
  const guarded = httpGuard(new Guard(ledger), { route: "/v1/invoices", tenant: "acme" });
  const app = express();
  app.post("/v1/invoices", guarded((req, res) => {
    runs++;
    const body = JSON.parse((req as { rawBody?: Buffer }).rawBody!.toString()) as { customer: string };
    (res as import("express").Response).status(201).location(`/v1/invoices/${runs}`).json({ id: `inv_${randomUUID()}`, customer: body.customer });
  }));
  const server = app.listen(0, "127.0.0.1");
  await new Promise<void>((r) => server.once("listening", () => r()));
  try {
    const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}/v1/invoices`;
    const key = randomUUID();
    const post = () => fetch(url, { method: "POST", body: JSON.stringify({ customer: "c" }), headers: { "Content-Type": "application/json", "Idempotency-Key": key } });
    const first = await post();
    const again = await post();
    assert.equal(first.status, 201);
    assert.equal(again.status, 201);
    assert.equal(again.headers.get("Idempotency-Replayed"), "true");
    assert.equal(again.headers.get("Location"), "/v1/invoices/1");
    assert.equal(await again.text(), await first.text());
    assert.equal(runs, 1);
  } finally {
    server.close();
  }
});

test("Fastify: the guarded route in a scope of its own that leaves the body unread, its reply hijacked", async () => {
  const Fastify = (await import("fastify")).default;
  let runs = 0;
  const guarded = httpGuard(new Guard(ledger), { route: "/v1/invoices", tenant: "acme" })((req, res) => {
    runs++;
    const body = JSON.parse(req.rawBody!.toString()) as { customer: string };
    res.writeHead(201, { "Content-Type": "application/json", Location: `/v1/invoices/${runs}` }).end(JSON.stringify({ id: `inv_${randomUUID()}`, customer: body.customer }));
  });
  const app = Fastify();
  await app.register(async (scope) => {
    // The guard reads the body itself, as it came: this scope's parser
    // leaves it unread, and the reply is the guard's.
    scope.removeAllContentTypeParsers();
    scope.addContentTypeParser("*", (_req, _payload, done) => done(null));
    scope.post("/v1/invoices", async (request, reply) => {
      reply.hijack();
      await guarded(request.raw, reply.raw);
    });
  });
  app.get("/v1/health", async () => ({ ok: true })); // the rest of the app as it was
  await app.listen({ port: 0, host: "127.0.0.1" });
  try {
    const url = `http://127.0.0.1:${(app.server.address() as AddressInfo).port}`;
    const key = randomUUID();
    const post = (customer: string) => fetch(`${url}/v1/invoices`, { method: "POST", body: JSON.stringify({ customer }), headers: { "Content-Type": "application/json", "Idempotency-Key": key } });
    const first = await post("c");
    const again = await post("c");
    assert.equal(first.status, 201);
    assert.equal(again.status, 201);
    assert.equal(again.headers.get("Idempotency-Replayed"), "true");
    assert.equal(again.headers.get("Location"), "/v1/invoices/1");
    assert.equal(await again.text(), await first.text());
    const reused = await post("d");
    assert.equal(reused.status, 422);
    assert.equal(((await reused.json()) as { code: string }).code, "KEY_REUSED");
    assert.equal(runs, 1);
    assert.deepEqual(await (await fetch(`${url}/v1/health`)).json(), { ok: true });
  } finally {
    await app.close();
  }
});

test("Stripe's conventions: Idempotent-Replayed, Request-Id, Stripe-Should-Retry, Stripe error objects", async () => {
  let open!: () => void;
  const gate = new Promise<void>((r) => { open = r; });
  const s = await serve({ onInProgress: "reject", leaseMs: 30_000 }, gate, true);
  try {
    const key = `${Date.now()}_B8TIFA`;
    const first = s.post({ customer: "c1" }, key);
    while (s.runs() === 0) await new Promise((r) => setImmediate(r));
    const busy = await s.post({ customer: "c1" }, key);
    assert.equal(busy.status, 409);
    assert.equal(busy.headers.get("Stripe-Should-Retry"), "true");
    assert.equal(busy.headers.get("Content-Type"), "application/problem+json", "a retryable error keeps its problem: a Stripe SDK retries it");
    open();
    assert.equal((await first).status, 201);
    const again = await s.post({ customer: "c1" }, key);
    assert.equal(again.headers.get("Idempotent-Replayed"), "true");
    assert.equal(again.headers.get("Idempotency-Replayed"), "true");
    assert.equal(again.headers.get("Stripe-Should-Retry"), "false");
    assert.equal(again.headers.get("Request-Id"), "req_1");
    const reused = await s.post({ customer: "c2" }, key);
    assert.equal(reused.status, 400);
    assert.equal(reused.headers.get("Stripe-Should-Retry"), "false");
    const e = (await reused.json()) as { error: { type: string; code: string } };
    assert.deepEqual([e.error.type, e.error.code], ["idempotency_error", "key_reused"]);
    assert.equal(s.runs(), 1);
  } finally {
    s.close();
  }
});
