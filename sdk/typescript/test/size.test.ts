// sizeBound, which spares the guard and the stream an encoding of every
// Complete, is never under the encoding's size: were it under, an outcome
// over the guard's limit would be sent, and a request over the stream's
// limit would end the stream with every call on it.
import { strict as assert } from "node:assert";
import { test } from "node:test";

import { create, toBinary } from "@bufbuild/protobuf";
import { AnySchema } from "@bufbuild/protobuf/wkt";

import { BeginRequestSchema, OutcomeSchema, StreamRequestSchema } from "../src/gen/idemledger/v1/ledger_pb.js";
import { sizeBound } from "../src/size.js";

// A small PRNG, so that every run checks the same messages.
function rand(seed: number): () => number {
  return () => {
    seed = (seed * 1103515245 + 12345) & 0x7fffffff;
    return seed / 0x7fffffff;
  };
}

const alphabet = ["a", "Z", "é", "€", "漢", "😀", "\u0000", "\uffff"];

function text(r: () => number, max: number): string {
  let s = "";
  for (let n = Math.floor(r() * max); n > 0; n--) {
    s += alphabet[Math.floor(r() * alphabet.length)];
  }
  return s;
}

function outcome(r: () => number) {
  if (r() < 0.5) {
    return create(OutcomeSchema, { result: { case: "response", value: create(AnySchema, { typeUrl: text(r, 40), value: new Uint8Array(Math.floor(r() * 100_000)) }) } });
  }
  const details = Array.from({ length: Math.floor(r() * 5) }, () => create(AnySchema, { typeUrl: text(r, 40), value: new Uint8Array(Math.floor(r() * 300)) }));
  return create(OutcomeSchema, { result: { case: "status", value: { code: Math.floor(r() * 17), message: text(r, 3000), details } } });
}

test("sizeBound is at least the encoded size, for every kind of field", () => {
  const r = rand(7);
  for (let i = 0; i < 300; i++) {
    const o = outcome(r);
    assert.ok(sizeBound(o) >= toBinary(OutcomeSchema, o).length, `outcome ${i}`);
    const complete = create(StreamRequestSchema, {
      id: BigInt(Math.floor(r() * 2 ** 53)),
      timeout: { seconds: BigInt(Math.floor(r() * 1e9)), nanos: Math.floor(r() * 1e9) },
      call: { case: "complete", value: { tenant: text(r, 64), key: text(r, 255), token: BigInt(Math.floor(r() * 2 ** 53)) * 1024n, outcome: o } },
    });
    assert.ok(sizeBound(complete) >= toBinary(StreamRequestSchema, complete).length, `complete ${i}`);
    const begin = create(BeginRequestSchema, {
      tenant: text(r, 64), key: text(r, 255), fingerprint: text(r, 80), method: text(r, 200),
      lease: { seconds: BigInt(Math.floor(r() * 1e6)) }, firstAttemptAt: { seconds: BigInt(Math.floor(r() * 2e9)), nanos: Math.floor(r() * 1e9) },
      onLeaseExpiry: Math.floor(r() * 3), keySource: text(r, 40),
    });
    assert.ok(sizeBound(begin) >= toBinary(BeginRequestSchema, begin).length, `begin ${i}`);
  }
});

test("sizeBound is near the encoded size of a large outcome", () => {
  const o = create(OutcomeSchema, { result: { case: "response", value: create(AnySchema, { typeUrl: "type.idemledger.io/mcp.CallToolResult", value: new Uint8Array(1 << 20) }) } });
  const size = toBinary(OutcomeSchema, o).length;
  assert.ok(sizeBound(o) - size < 512, `bound ${sizeBound(o)} for ${size} bytes: only a large outcome is encoded to check it`);
});
