// The caller's side: one key per intent.
import { randomUUID } from "node:crypto";

/** mintKey is a new idempotency key for one intent: reuse it on every retry of that intent. */
export function mintKey(): string {
  return randomUUID();
}
