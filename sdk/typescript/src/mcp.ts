// The guard for a tool of the official TypeScript SDK's McpServer, v2
// (@modelcontextprotocol/server) and v1 (@modelcontextprotocol/sdk) alike,
// with mcpguard's semantics: the key from the tool's key argument, else
// SEP-3182's idempotencyKey parameter (moved into _meta by sep3182), else
// _meta["io.idemledger/idempotency-key"], else, where the tool names them,
// a host's own per-call id in _meta; the method "mcp:tools/<name>"; a j1:
// fingerprint of the arguments without the key (never the request's _meta
// envelope, nor a round's inputResponses and requestState); the first
// result stored and every retry answered with its bytes, marked
// _meta["io.idemledger/replayed"]; a result that asks for input
// (input_required) never stored; errors as tool results a model can act
// on, with _meta["io.idemledger/error"]. It imports neither SDK: it reads
// what either gives a tool's handler.
import { ErrorCode } from "./gen/idemledger/v1/errors_pb.js";
import { codeName, LedgerError, ledgerError } from "./errors.js";
import { fingerprintJSON } from "./fingerprint.js";
import { Guard, OutcomeUnknownError, type Outcome, type Policy, statusError } from "./guard.js";

export const KeyMeta = "io.idemledger/idempotency-key";
export const ParamKeyMeta = "io.idemledger/idempotency-key-param";
export const ReplayedMeta = "io.idemledger/replayed";
export const ErrorMeta = "io.idemledger/error";
export const ClaimMeta = "io.idemledger/claim";
export const DefaultKeyArgument = "idempotency_key";
export const MethodPrefix = "mcp:tools/";
export const KeyDescription = "Idempotency key of this call: a new random value (such as a UUID) for each new intent, " +
  "and the same value on every retry of that intent, so that it is done once however often it is sent. " +
  "It is not part of the request itself.";

const resultTypeUrl = "type.idemledger.io/mcp.CallToolResult";
const errorTypeUrl = "type.idemledger.io/jsonrpc.Error";

/** A tool's result, as both SDKs type it (the part the guard reads), with whatever else it carries. */
export interface CallToolResult {
  content?: Array<{ type: string; text?: string; [k: string]: unknown }>;
  structuredContent?: unknown;
  isError?: boolean;
  _meta?: Record<string, unknown>;
  [k: string]: unknown;
}

/**
 * What an SDK gives a tool's handler besides its arguments, the part the
 * guard reads: v2's context (ctx.mcpReq, ctx.http) or v1's extra
 * (extra._meta, extra.requestInfo, extra.authInfo).
 */
export interface ToolExtra {
  mcpReq?: { _meta?: Record<string, unknown>; [k: string]: unknown };
  http?: { authInfo?: unknown; req?: { headers?: { entries(): Iterable<[string, string]> } }; [k: string]: unknown };
  _meta?: Record<string, unknown>;
  requestInfo?: { headers?: Record<string, string | string[] | undefined> };
  authInfo?: unknown;
  [k: string]: unknown;
}

/** A tool's handler, as McpServer.registerTool takes it for a tool with an input schema. */
export type ToolHandler<A, X = ToolExtra, R = CallToolResult> = (args: A, extra: X) => R | Promise<R>;

/** What the guard reads of a call, alike from either SDK. */
export interface CallInfo {
  /** The request's _meta (for 2026-07-28, with its per-request envelope). */
  meta: Record<string, unknown>;
  /** The HTTP request's headers, by lowercase name (Streamable HTTP); empty over stdio. */
  headers: Record<string, string>;
  /** The verified token the transport carries (the SDK's AuthInfo), if any. */
  authInfo?: { clientId?: string; extra?: Record<string, unknown>; [k: string]: unknown };
  /** The SDK's own: v2's ctx, or v1's extra. */
  raw: ToolExtra;
}

/** callInfo reads a call's _meta, headers and token from the second argument of a tool's handler, of either SDK. */
export function callInfo(extra: ToolExtra | undefined): CallInfo {
  const raw = extra ?? {};
  const headers: Record<string, string> = {};
  for (const [k, v] of Object.entries(raw.requestInfo?.headers ?? {})) {
    if (v !== undefined) {
      headers[k.toLowerCase()] = Array.isArray(v) ? v.join(", ") : v;
    }
  }
  const entries = raw.http?.req?.headers?.entries;
  if (typeof entries === "function") {
    for (const [k, v] of entries.call(raw.http!.req!.headers)) {
      headers[k.toLowerCase()] = v;
    }
  }
  return {
    meta: (raw.mcpReq?._meta ?? raw._meta ?? {}) as Record<string, unknown>,
    headers,
    authInfo: (raw.http?.authInfo ?? raw.authInfo) as CallInfo["authInfo"],
    raw,
  };
}

/** How one tool is guarded. */
export interface ToolOptions {
  policy?: Policy;
  /** The argument that carries the key ("idempotency_key" when absent; "" takes it from the parameter and _meta only). */
  keyArgument?: string;
  /**
   * The _meta keys of a host's own per-call id (such as "claudecode/toolUseId"),
   * read, in order, when the call carries no key of its own: off when
   * absent. A host's call id is stable only across that host's own re-sends
   * of the call, so a record keyed by one says so.
   */
  hostCallIds?: string[];
  /** Says an isError result is transient: the key is released, not the result stored. */
  transient?: (result: CallToolResult) => boolean;
  /**
   * Asked on a takeover (attempt 2 or later) whether the earlier attempt's
   * write landed: its result if it did (stored, and answered as a replay),
   * undefined if it did not (the call runs); a throw when it cannot tell
   * (UNAVAILABLE, the claim left to run out).
   */
  reconcile?: (args: Record<string, unknown>, call: CallInfo) => Promise<CallToolResult | undefined>;
}

/** The tenant of a call: a string, or a function of the call (tenantFromHeader, tenantFromToken). */
export type Tenant = string | ((args: Record<string, unknown>, call: CallInfo) => string | Promise<string>);

/** tenantFromHeader reads the tenant from an HTTP header of the call; a call without it is VALIDATION_FAILED. */
export function tenantFromHeader(name: string): Tenant {
  return (_args, call) => {
    const v = call.headers[name.toLowerCase()]?.trim();
    if (!v) {
      throw new LedgerError(ErrorCode.VALIDATION_FAILED, `the call has no ${name} header`);
    }
    return v;
  };
}

/** tenantFromToken reads the tenant from the call's verified token: the string in its extra[claim], or its clientId when claim is absent. */
export function tenantFromToken(claim?: string): Tenant {
  return (_args, call) => {
    const v = claim === undefined ? call.authInfo?.clientId : call.authInfo?.extra?.[claim];
    if (typeof v !== "string" || v === "") {
      throw new LedgerError(ErrorCode.VALIDATION_FAILED, "the call's token names no tenant");
    }
    return v;
  };
}

/** A model-readable error info, as _meta["io.idemledger/error"] carries it. */
export interface ErrorInfo {
  code: string;
  retryable: boolean;
  retry_after_ms: number;
}

/** McpGuard guards the tools of an MCP server. */
export class McpGuard {
  constructor(readonly guard: Guard, readonly tenant: Tenant) {}

  /**
   * tool returns handler under the guard, for McpServer.registerTool. Its
   * input schema must accept the key argument (keyShape adds it).
   */
  tool<A extends Record<string, unknown>, X extends ToolExtra, R extends CallToolResult>(name: string, handler: ToolHandler<A, X, R>, opts: ToolOptions = {}): ToolHandler<A, X, R> {
    const policy = opts.policy ?? {};
    const keyArg = opts.keyArgument ?? DefaultKeyArgument;
    const method = MethodPrefix + name;
    return async (args, extra) => {
      const call = callInfo(extra);
      let key: string, keySource: string;
      try {
        [key, keySource] = callKey(keyArg, opts.hostCallIds ?? [], args, call.meta);
      } catch (err) {
        return errorResult(err, call.meta) as R;
      }
      let tenant = "", fingerprint = "";
      if (key !== "") {
        try {
          tenant = typeof this.tenant === "string" ? this.tenant : await this.tenant(args, call);
        } catch (err) {
          return errorResult(ledgerError(err) ?? new LedgerError(ErrorCode.VALIDATION_FAILED, "the call names no tenant"), call.meta) as R;
        }
        fingerprint = fingerprintJSON(method, args ?? {}, keyArg ? [keyArg] : []);
      }
      let live: R | undefined;
      try {
        const reconcile = opts.reconcile && (async () => {
          const r = await opts.reconcile!(args, call);
          return r && outcomeOf(r, {});
        });
        const encode = (r: unknown): Outcome => outcomeOf(r as CallToolResult, opts); // what a fenced handler hands writeFence
        const res = await this.guard.do({ tenant, key, fingerprint, method, policy, reconcile, keySource, encode }, async (claim) => {
          const forwarded = claim ? withClaim(extra, { token: Number(claim.token), attempt: claim.attempt }) : extra;
          try {
            live = await handler(args, forwarded);
          } catch (err) {
            if (err instanceof OutcomeUnknownError || (err instanceof Error && err.cause instanceof OutcomeUnknownError)) {
              throw err;
            }
            // What McpServer makes of a handler that throws: an error
            // result, stored like any other.
            live = { isError: true, content: [{ type: "text", text: err instanceof Error ? err.message : String(err) }] } as R;
          }
          return outcomeOf(live!, opts);
        });
        if (!res.protected || (!res.replayed && res.outcome.transient)) {
          return live!;
        }
        return fromOutcome(res.outcome, res.replayed, call.meta) as R;
      } catch (err) {
        return errorResult(err, call.meta) as R;
      }
    };
  }
}

// withClaim is the handler's second argument with the claim in its
// request's _meta (ClaimMeta): v2's ctx.mcpReq._meta, v1's extra._meta.
function withClaim<X extends ToolExtra>(extra: X, claim: { token: number; attempt: number }): X {
  if (extra.mcpReq) {
    return { ...extra, mcpReq: { ...extra.mcpReq, _meta: { ...(extra.mcpReq._meta ?? {}), [ClaimMeta]: claim } } };
  }
  return { ...extra, _meta: { ...(extra._meta ?? {}), [ClaimMeta]: claim } };
}

/** keyShape is the key argument's entry for a zod input shape: { ...shape, ...keyShape(z) }. */
export function keyShape<Z extends { string: () => { min: (n: number) => { max: (n: number) => { optional: () => { describe: (d: string) => unknown } } } } }>(z: Z, name = DefaultKeyArgument): Record<string, unknown> {
  return { [name]: z.string().min(1).max(255).optional().describe(KeyDescription) };
}

// callKey is the call's key and where it came from, by precedence: the key
// argument, SEP-3182's parameter, _meta's key, then the host call ids the
// tool names.
function callKey(keyArg: string, hostCallIds: string[], args: Record<string, unknown> | undefined, meta: Record<string, unknown>): [string, string] {
  if (keyArg !== "" && args && args[keyArg] !== undefined && args[keyArg] !== null) {
    const v = args[keyArg];
    if (typeof v !== "string") {
      throw new LedgerError(ErrorCode.KEY_INVALID, `the ${keyArg} argument is not a string`);
    }
    if (v !== "") {
      return [checked(v), "argument"];
    }
  }
  const sources: Array<[string, string, string]> = [[ParamKeyMeta, "the idempotencyKey parameter", "parameter"], [KeyMeta, `_meta["${KeyMeta}"]`, "meta"],
    ...hostCallIds.map((k): [string, string, string] => [k, `the host's call id _meta["${k}"]`, `host:${k}`])];
  for (const [k, what, source] of sources) {
    const v = meta[k];
    if (v === undefined || v === null || v === "") {
      continue;
    }
    if (typeof v !== "string") {
      throw new LedgerError(ErrorCode.KEY_INVALID, `${what} is not a string`);
    }
    return [checked(v), source];
  }
  return ["", ""];
}

// checked is key when it is 1 to 255 printable ASCII characters.
function checked(key: string): string {
  if (!/^[\x20-\x7e]{1,255}$/.test(key)) {
    throw new LedgerError(ErrorCode.KEY_INVALID, "the idempotency key must be 1 to 255 printable ASCII characters");
  }
  return key;
}

function outcomeOf(r: CallToolResult, opts: ToolOptions): Outcome {
  const out: Outcome = { response: { $typeName: "google.protobuf.Any", typeUrl: resultTypeUrl, value: new TextEncoder().encode(JSON.stringify(r)) } };
  const input = r as { resultType?: unknown; inputRequests?: unknown };
  if (input.resultType === "input_required" || (typeof input.inputRequests === "object" && input.inputRequests !== null && Object.keys(input.inputRequests).length > 0)) {
    out.transient = true; // a request for input: the call applied nothing yet and will come back
  } else if (r.isError) {
    out.transient = opts.transient?.(r) ?? false;
  }
  return out;
}

function fromOutcome(o: Outcome, replayed: boolean, meta: Record<string, unknown>): CallToolResult {
  if (o.status) {
    return errorResult(statusError(o.status), meta);
  }
  switch (o.response?.typeUrl) {
    case resultTypeUrl: {
      const r = JSON.parse(new TextDecoder().decode(o.response.value)) as CallToolResult;
      if (replayed) {
        r._meta = { ...(r._meta ?? {}), [ReplayedMeta]: true };
      }
      return r;
    }
    case errorTypeUrl: {
      const e = JSON.parse(new TextDecoder().decode(o.response.value)) as { message?: string };
      return errorResult(new LedgerError(ErrorCode.INTERNAL, e.message ?? "the tool failed"), meta);
    }
  }
  return errorResult(new LedgerError(ErrorCode.INTERNAL, `the key holds an outcome of another kind (${o.response?.typeUrl})`), meta);
}

/**
 * errorResult is an error as a tool result a model can act on: isError,
 * one line that says what to do, and ErrorMeta. Given the request's _meta
 * of a 2026-07-28 call, it says resultType "complete", as every result of
 * that revision does.
 */
export function errorResult(err: unknown, requestMeta?: Record<string, unknown>): CallToolResult {
  const le = ledgerError(err) ?? new LedgerError(ErrorCode.INTERNAL, "internal error", { cause: err });
  const info: ErrorInfo = { code: codeName(le.code), retryable: le.retryable, retry_after_ms: le.retryAfterMs };
  const r: CallToolResult = {
    isError: true,
    content: [{ type: "text", text: advice(le) }],
    _meta: { [ErrorMeta]: info },
    structuredContent: { error: info },
  };
  if (requestMeta?.[ProtocolVersionMeta] !== undefined) {
    r.resultType = "complete";
  }
  return r;
}

/** ProtocolVersionMeta is the _meta key of a request's revision from 2026-07-28 on (the per-request envelope). */
export const ProtocolVersionMeta = "io.modelcontextprotocol/protocolVersion";

/** errorFromResult is the ErrorInfo of an error result, or undefined. */
export function errorFromResult(r: CallToolResult): ErrorInfo | undefined {
  return r._meta?.[ErrorMeta] as ErrorInfo | undefined;
}

/** advice is the one line a model reads for an error: what happened, and whether and when to retry (mcpguard.Advice). */
export function advice(le: LedgerError): string {
  const line = le.message.split(/\s+/).filter(Boolean).join(" ");
  switch (le.code) {
    case ErrorCode.KEY_REUSED:
      return "this idempotency key was used for a different request: do not retry with it; a new intent needs a new key";
    case ErrorCode.KEY_MISSING:
      return `this tool needs an idempotency key: mint one per intent, send it as _meta["${KeyMeta}"] (or the tool's key argument), and reuse it on every retry`;
    case ErrorCode.KEY_INVALID:
      return "the idempotency key is not 1 to 255 printable ASCII characters: mint a valid one for this intent";
    case ErrorCode.OUTCOME_UNKNOWN:
      return "an earlier attempt of this call may have done it, and nobody knows: it will not run again until an operator resolves it; do not retry";
    case ErrorCode.KEY_EXPIRED:
      return "this call already ran, and its answer is no longer kept: do not retry it";
    case ErrorCode.RETRY_TOO_LATE:
      return "this intent is too old to retry safely: do not retry it; check whether it happened";
    case ErrorCode.IN_PROGRESS:
      return "another attempt of this call is still running: retry with the same key after " + delay(le.retryAfterMs);
    case ErrorCode.UNAVAILABLE:
      return (line || "the call cannot be served now") + ": retry with the same key after " + delay(le.retryAfterMs);
    case ErrorCode.RATE_LIMITED:
      return "too many calls: retry with the same key after " + delay(le.retryAfterMs);
    case ErrorCode.VALIDATION_FAILED:
      return "the call cannot be guarded (" + line + "): fix the call, then send it with the same key";
    case ErrorCode.OUTCOME_TOO_LARGE:
    case ErrorCode.INTERNAL:
      if (le.metadata.applied === "true") {
        return line;
      }
  }
  return le.retryable ? line + ": retry with the same key after " + delay(le.retryAfterMs) : line + ": do not retry with this key";
}

// delay is a wait as Go's time.Duration prints it, rounded as mcpguard rounds it.
function delay(ms: number): string {
  ms = Math.max(ms, 100);
  if (ms < 1000) {
    return `${Math.round(ms / 10) * 10}ms`;
  }
  const tenths = Math.round(ms / 100);
  const min = Math.floor(tenths / 600);
  const sec = (tenths % 600) / 10;
  return min > 0 ? `${min}m${sec}s` : `${sec}s`;
}

/** IdempotencyCapability is SEP-3182's capability, under experimental: a server that reads the parameter says so. */
export const IdempotencyCapability = "tools.idempotency";

/**
 * sep3182 moves SEP-3182's idempotencyKey parameter of a tools/call
 * message into _meta, where the guard reads it (the SDK's handlers see
 * _meta, not the request's other parameters). Call it on the parsed body
 * before the transport's handleRequest, and advertise
 * experimental["tools.idempotency"]. It returns the message.
 */
export function sep3182<T>(message: T): T {
  const m = message as { method?: unknown; params?: Record<string, unknown> } | null;
  if (m === null || typeof m !== "object" || m.method !== "tools/call" || !m.params || !("idempotencyKey" in m.params)) {
    return message;
  }
  const { idempotencyKey, ...params } = m.params;
  const meta = typeof params._meta === "object" && params._meta !== null ? { ...(params._meta as Record<string, unknown>) } : {};
  meta[ParamKeyMeta] = idempotencyKey;
  m.params = { ...params, _meta: meta };
  return message;
}
