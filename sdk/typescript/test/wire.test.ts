// createLedger's stream against an HTTP/2 server on loopback that answers
// as ledgerd's LedgerService.Stream does, for what ledgerd itself never
// sends on demand: answers split at every byte, a stream ended by an
// error (Connect's end message, gRPC's trailers), a reset. The calls with
// ledgerd itself are in ledger.test.ts.
import { strict as assert } from "node:assert";
import http2 from "node:http2";
import type { AddressInfo } from "node:net";
import { test } from "node:test";

import { create, fromBinary, toBinary, type MessageInitShape } from "@bufbuild/protobuf";
import { Code, ConnectError } from "@connectrpc/connect";

import { createLedger, StreamRequestSchema, StreamResponseSchema, type StreamRequest } from "../src/index.js";

type Answer = (stream: http2.ServerHttp2Stream, req: StreamRequest) => void;

/** The gRPC trailers a stream of fakeLedger ends with (grpc-status 0 when absent). */
const grpcTrailers = new WeakMap<http2.ServerHttp2Stream, http2.OutgoingHttpHeaders>();

// fakeLedger serves LedgerService.Stream over h2c: answer gets each request
// as it is read; opened counts the streams.
async function fakeLedger(protocol: "connect" | "grpc", answer: Answer) {
  const server = http2.createServer();
  let opened = 0;
  server.on("stream", (stream, headers) => {
    assert.equal(headers[":path"], "/idemledger.v1.LedgerService/Stream");
    assert.equal(headers["content-type"], protocol === "connect" ? "application/connect+proto" : "application/grpc+proto");
    opened++;
    stream.respond({ ":status": 200, "content-type": headers["content-type"] }, { waitForTrailers: protocol === "grpc" });
    stream.on("wantTrailers", () => stream.sendTrailers(grpcTrailers.get(stream) ?? { "grpc-status": "0" }));
    let buf = Buffer.alloc(0);
    stream.on("data", (chunk: Buffer) => {
      buf = Buffer.concat([buf, chunk]);
      while (buf.length >= 5 && buf.length >= 5 + buf.readUInt32BE(1)) {
        const len = buf.readUInt32BE(1);
        answer(stream, fromBinary(StreamRequestSchema, buf.subarray(5, 5 + len)));
        buf = buf.subarray(5 + len);
      }
    });
    stream.on("error", () => {});
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  return {
    baseUrl: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
    opened: () => opened,
    close: () => new Promise<void>((r) => server.close(() => r())),
  };
}

function envelope(flags: number, data: Uint8Array): Buffer {
  const env = Buffer.alloc(5 + data.length);
  env[0] = flags;
  env.writeUInt32BE(data.length, 1);
  env.set(data, 5);
  return env;
}

// response is one message of the server's: the first answer, the others
// in its more.
function response(first: MessageInitShape<typeof StreamResponseSchema>, ...more: MessageInitShape<typeof StreamResponseSchema>[]): Buffer {
  return envelope(0, toBinary(StreamResponseSchema, create(StreamResponseSchema, { ...first, more })));
}

function claimAnswer(id: bigint, token: bigint): MessageInitShape<typeof StreamResponseSchema> {
  return { id, result: { case: "begin", value: { result: { case: "claim", value: { token, attempt: 1 } } } } };
}

function claim(id: bigint, token: bigint): Buffer {
  return response(claimAnswer(id, token));
}

const begin = (key: string) => ({ tenant: "acme", key, fingerprint: "v1:" + "ab".repeat(32), method: "http:POST /v1/invoices" });

test("answers split anywhere, two in one message, and one larger than a chunk, are read whole", async () => {
  const outcome = Uint8Array.from({ length: 300 << 10 }, (_, i) => (i * 7) % 256);
  const received: StreamRequest[] = [];
  const ledger = await fakeLedger("connect", (stream, req) => {
    received.push(req);
    if (received.length < 3) {
      return;
    }
    // Three answers at once, two of them in one message, written a few
    // bytes at a time, one write a turn.
    const replay = response({ id: received[2].id, result: { case: "begin", value: { result: { case: "replay", value: {
      outcome: { result: { case: "response", value: { typeUrl: "type.googleapis.com/x.Y", value: outcome } } } } } } } });
    const bytes = Buffer.concat([response(claimAnswer(received[1].id, 12n), claimAnswer(received[0].id, 11n)), replay]);
    const sizes = [1, 2, 3, 4, 5, 6, 7, 11, 13, 64 << 10];
    const writeFrom = (at: number, i: number): void => {
      if (at >= bytes.length) {
        return;
      }
      const end = Math.min(bytes.length, at + sizes[i % sizes.length]);
      stream.write(bytes.subarray(at, end), () => setImmediate(() => writeFrom(end, i + 1)));
    };
    writeFrom(0, 0);
  });
  const client = createLedger({ baseUrl: ledger.baseUrl });
  try {
    const [a, b, c] = await Promise.all([client.begin(begin("a")), client.begin(begin("b")), client.begin(begin("c"))]);
    assert.equal(a.result.case === "claim" && a.result.value.token, 11n);
    assert.equal(b.result.case === "claim" && b.result.value.token, 12n);
    assert.equal(c.result.case, "replay");
    const value = c.result.case === "replay" ? c.result.value.outcome?.result.value?.value : undefined;
    assert.ok(value instanceof Uint8Array && !Buffer.isBuffer(value), "bytes decode as a Uint8Array, not a Node Buffer");
    assert.deepEqual(value, outcome);
    assert.equal(ledger.opened(), 1, "one stream for the three calls");
  } finally {
    client.close();
    await ledger.close();
  }
});

for (const protocol of ["connect", "grpc"] as const) {
  test(`a stream ended with an error over ${protocol} fails its calls with it, and the next call opens a new stream`, async () => {
    let n = 0;
    const ledger = await fakeLedger(protocol, (stream, req) => {
      if (++n > 1) {
        stream.write(claim(req.id, 5n));
        return;
      }
      if (protocol === "connect") {
        stream.end(envelope(0b10, Buffer.from(JSON.stringify({ error: { code: "permission_denied", message: "not this tenant" } }))));
      } else {
        grpcTrailers.set(stream, { "grpc-status": String(Code.PermissionDenied), "grpc-message": "not%20this%20tenant" });
        stream.end();
      }
    });
    const client = createLedger({ baseUrl: ledger.baseUrl, protocol });
    try {
      const err = await client.begin(begin("a")).then(() => assert.fail("answered"), (e: unknown) => ConnectError.from(e));
      assert.equal(err.code, Code.PermissionDenied);
      assert.equal(err.rawMessage, "not this tenant");
      const next = await client.begin(begin("b"));
      assert.equal(next.result.case === "claim" && next.result.value.token, 5n);
      assert.equal(ledger.opened(), 2);
    } finally {
      client.close();
      await ledger.close();
    }
  });
}

test("a stream refused, or ended without its end message, fails the calls in flight, and the next call opens a new stream", async () => {
  let n = 0;
  const ledger = await fakeLedger("connect", (stream, req) => {
    n++;
    if (n === 1) {
      stream.close(http2.constants.NGHTTP2_REFUSED_STREAM);
    } else if (n === 2) {
      stream.end();
    } else {
      stream.write(claim(req.id, 9n));
    }
  });
  const client = createLedger({ baseUrl: ledger.baseUrl });
  try {
    for (const [what, code] of [["refused", Code.Unavailable], ["ended without its end message", Code.Internal]] as const) {
      const err = await client.begin(begin(what)).then(() => assert.fail("answered"), (e: unknown) => ConnectError.from(e));
      assert.equal(err.code, code, `${what}: ${err.message}`);
    }
    const next = await client.begin(begin("c"));
    assert.equal(next.result.case === "claim" && next.result.value.token, 9n);
  } finally {
    client.close();
    await ledger.close();
  }
});

test("a drain: the calls sent are answered, the stream's sending side closes, new calls go on a new stream", async () => {
  const streams: http2.ServerHttp2Stream[] = [];
  let sendingClosed!: () => void;
  const firstClosed = new Promise<void>((r) => (sendingClosed = r));
  const ledger = await fakeLedger("connect", (stream, req) => {
    if (!streams.includes(stream)) {
      streams.push(stream);
      if (streams.length === 1) {
        stream.on("end", () => {
          sendingClosed();
          stream.end(envelope(0b10, Buffer.from("{}")));
        });
      }
    }
    if (streams.length === 1) {
      // As ledgerd shutting down: the drain first, then the call's answer on the same stream.
      stream.write(response({ id: 0n, result: { case: "drain", value: {} } }));
      setImmediate(() => stream.write(claim(req.id, 1n)));
      return;
    }
    stream.write(claim(req.id, 2n));
  });
  const client = createLedger({ baseUrl: ledger.baseUrl });
  try {
    const first = await client.begin(begin("a"));
    assert.equal(first.result.case === "claim" && first.result.value.token, 1n, "answered on the drained stream");
    await firstClosed;
    const second = await client.begin(begin("b"));
    assert.equal(second.result.case === "claim" && second.result.value.token, 2n);
    assert.equal(streams.length, 2, "the call after the drain went on a new stream");
  } finally {
    client.close();
    await ledger.close();
  }
});

test("a request that cannot be encoded fails alone, INVALID_ARGUMENT, and never reaches the stream", async () => {
  const received: StreamRequest[] = [];
  const ledger = await fakeLedger("connect", (stream, req) => {
    received.push(req);
    stream.write(claim(req.id, 3n));
  });
  const client = createLedger({ baseUrl: ledger.baseUrl });
  try {
    const [bad, good] = await Promise.allSettled([
      client.complete({ tenant: "acme", key: "a", token: -1n }),
      client.begin(begin("b")),
    ]);
    assert.equal(bad.status, "rejected");
    const err = ConnectError.from((bad as PromiseRejectedResult).reason);
    assert.equal(err.code, Code.InvalidArgument);
    assert.match(err.rawMessage, /complete request cannot be encoded.*uint64/);
    assert.equal(good.status === "fulfilled" && good.value.result.case, "claim");
    assert.deepEqual(received.map((r) => r.call.case), ["begin"], "only the Begin reached the ledger");
  } finally {
    client.close();
    await ledger.close();
  }
});

test("close: the calls in flight fail UNAVAILABLE at once, later calls too, and the connection closes", async () => {
  let streamClosed!: () => void, arrived!: () => void;
  const closed = new Promise<void>((r) => (streamClosed = r));
  const received = new Promise<void>((r) => (arrived = r));
  const ledger = await fakeLedger("connect", (stream) => {
    stream.on("close", () => streamClosed()); // never answers
    arrived();
  });
  const client = createLedger({ baseUrl: ledger.baseUrl, timeoutMs: 60_000 });
  try {
    const inFlight = client.begin(begin("a")).then(() => assert.fail("answered"), (e: unknown) => ConnectError.from(e));
    await received; // the call is in flight at the ledger
    client.close();
    const err = await inFlight;
    assert.equal(err.code, Code.Unavailable);
    assert.match(err.rawMessage, /closed/);
    const later = await client.begin(begin("b")).then(() => assert.fail("answered"), (e: unknown) => ConnectError.from(e));
    assert.equal(later.code, Code.Unavailable);
    await closed;
  } finally {
    await ledger.close();
  }
});
