// The j1: fingerprint of JSON arguments, as interceptors/fingerprint
// computes it in Go: "j1:" and the hex SHA-256 of the profile, the method
// and the value's RFC 8785 canonical form, each framed by its length.
import { createHash } from "node:crypto";
import canonicalize from "canonicalize";

/** fingerprintJSON is the j1: fingerprint of value sent to method, without the top-level members in skip. */
export function fingerprintJSON(method: string, value: unknown, skip: string[] = []): string {
  let v = value === undefined ? null : value;
  if (skip.length > 0 && v !== null && typeof v === "object" && !Array.isArray(v)) {
    v = Object.fromEntries(Object.entries(v as Record<string, unknown>).filter(([k]) => !skip.includes(k)));
  }
  const canonical = canonicalize(v);
  if (canonical === undefined) {
    throw new TypeError("the value is not JSON");
  }
  const h = createHash("sha256");
  for (const part of ["j1", method, canonical]) {
    const b = Buffer.from(part, "utf8");
    h.update(`${b.length}:`);
    h.update(b);
  }
  return "j1:" + h.digest("hex");
}
