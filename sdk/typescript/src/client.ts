// The caller's side: one key per intent, re-sent after a dropped stream, a
// lost response or a retryable error, as idemclient and
// mcpguard.ClientMiddleware do in Go: it waits at least the server's hint,
// with full jitter, at most maxAttempts attempts, and stops at the
// deadline.
import { mintKey } from "./keys.js";
import { errorFromResult, IdempotencyCapability, KeyMeta, type CallToolResult } from "./mcp.js";

/**
 * The part of the official SDK's Client that callTool uses: v2's
 * (@modelcontextprotocol/client, which has getProtocolEra) or v1's
 * (@modelcontextprotocol/sdk).
 */
export interface ToolClient {
  getServerCapabilities(): { experimental?: Record<string, unknown> } | undefined;
  // v2: callTool(params, options); v1: callTool(params, resultSchema, options).
  callTool(params: any, ...rest: any[]): Promise<unknown>;
  getProtocolEra?: () => string | undefined;
}

export interface CallToolOptions {
  /** The intent's key: minted when absent. Reuse it to re-send the same intent later. */
  key?: string;
  /** The most attempts (5 when absent). */
  maxAttempts?: number;
  /** When to stop, in milliseconds from now (60 s when absent); each attempt gets what is left. */
  deadlineMs?: number;
  /** The backoff's base and cap in milliseconds (100 and 5,000 when absent). */
  baseMs?: number;
  capMs?: number;
}

/** The JSON-RPC errors that say the call itself is wrong: sending it again changes nothing. */
const permanent = new Set([-32700, -32600, -32601, -32602]);

/**
 * callTool calls a tool under one key, re-sending it with the same key
 * until it has an answer that is not a retryable error. The key goes as
 * SEP-3182's idempotencyKey parameter to a server that advertises
 * tools.idempotency, else in _meta["io.idemledger/idempotency-key"].
 */
export async function callTool(client: ToolClient, params: { name: string; arguments?: Record<string, unknown>; _meta?: Record<string, unknown> },
  opts: CallToolOptions = {}): Promise<CallToolResult> {
  const key = opts.key ?? mintKey();
  const maxAttempts = opts.maxAttempts ?? 5;
  const deadline = Date.now() + (opts.deadlineMs ?? 60_000);
  const sep = client.getServerCapabilities()?.experimental?.[IdempotencyCapability] !== undefined;
  const sent = sep ? { ...params, idempotencyKey: key } : { ...params, _meta: { ...(params._meta ?? {}), [KeyMeta]: key } };
  const send = (timeout: number) => typeof client.getProtocolEra === "function"
    ? client.callTool(sent, { timeout })
    : client.callTool(sent, undefined, { timeout });
  for (let attempt = 1; ; attempt++) {
    const left = deadline - Date.now();
    let hint = 0;
    let last: CallToolResult | undefined;
    let failure: unknown;
    try {
      last = (await send(Math.max(1, left))) as CallToolResult;
      const info = errorFromResult(last);
      if (!info?.retryable) {
        return last;
      }
      hint = info.retry_after_ms;
    } catch (err) {
      const code = (err as { code?: unknown } | null)?.code;
      if (typeof code === "number" && permanent.has(code)) {
        throw err;
      }
      failure = err; // a dropped stream, a lost response: the call may have run; the key makes the retry safe
    }
    const wait = Math.max(hint, Math.random() * Math.min(opts.capMs ?? 5_000, (opts.baseMs ?? 100) * 2 ** (attempt - 1)));
    if (attempt >= maxAttempts || Date.now() + wait >= deadline) {
      if (last) {
        return last;
      }
      throw failure;
    }
    await new Promise((r) => setTimeout(r, wait));
  }
}
