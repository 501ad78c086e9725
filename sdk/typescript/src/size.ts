// A bound on a message's encoded size that costs no encoding: the
// guard's and the stream's size checks encode a message only when the
// bound says it may be over their limit (a large outcome), not every
// Complete.

/**
 * sizeBound is at least the protobuf encoding's size of the message (or
 * init shape) v: each string at three bytes a UTF-16 unit, each byte
 * array's bytes, and 16 bytes for every field and element besides (a tag
 * and a length prefix, or a varint, take at most 15).
 */
export function sizeBound(v: unknown): number {
  if (typeof v === "string") {
    return 3 * v.length + 16;
  }
  if (v instanceof Uint8Array) {
    return v.length + 16;
  }
  if (typeof v !== "object" || v === null) {
    return 16;
  }
  let n = 16;
  for (const e of Array.isArray(v) ? v : Object.values(v)) {
    n += sizeBound(e);
  }
  return n;
}
