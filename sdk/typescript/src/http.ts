// The guard for Node's http handlers (and Express's, which run on the same
// response), with httpguard's HTTP mapping: the Idempotency-Key header as
// docs/contract.md reads it; the method "http:<METHOD> <route>"; a j1: fingerprint of
// a JSON body, b1: of any other; the first response buffered, stored
// (status, allow-listed headers, body) and replayed with
// Idempotency-Replayed: true; errors as RFC 9457 problems with 400, 422,
// 409 (Retry-After), 503, 413.
import { createHash } from "node:crypto";
import { create, toBinary } from "@bufbuild/protobuf";
import type { IncomingMessage, ServerResponse } from "node:http";
import { ErrorCode, ErrorDetailSchema } from "./gen/idemledger/v1/errors_pb.js";
import { codeName, LedgerError, ledgerError } from "./errors.js";
import { fingerprintJSON } from "./fingerprint.js";
import { Guard, OutcomeUnknownError, statusError, type Claim, type Outcome, type Policy } from "./guard.js";

export const KeyHeader = "Idempotency-Key";
export const ReplayedHeader = "Idempotency-Replayed";
export const FirstAttemptHeader = "Idempotency-First-Attempt-At";
/** The response headers stored and replayed, besides a route's own. */
export const DefaultStoredHeaders = ["Content-Type", "Location", "ETag", "Cache-Control"];
const responseTypeUrl = "type.idemledger.io/http.Response";

/** A status that means the handler applied nothing: released, not stored (408, 425, 429, 502, 503, 504). */
export function defaultRelease(status: number): boolean {
  return [408, 425, 429, 502, 503, 504].includes(status);
}

export interface HttpRouteOptions {
  /** The route as the ledger names it ("/v1/invoices"): the method is "http:<METHOD> <route>". */
  route: string;
  /** The tenant of a request. */
  tenant: string | ((req: IncomingMessage) => string | Promise<string>);
  policy?: Policy;
  /** Statuses released rather than stored (defaultRelease when absent). */
  release?: (status: number) => boolean;
  /** Response headers stored and replayed besides DefaultStoredHeaders. */
  storeHeaders?: string[];
  /** The largest request body read (1 MiB when absent): past it, 413. */
  maxBodyBytes?: number;
  /** The largest response kept (16 MiB when absent): past it, 409 OUTCOME_TOO_LARGE, applied. */
  maxResponseBytes?: number;
  /**
   * Stripe answers by Stripe's conventions as well, for clients written for
   * a Stripe-shaped API (httpguard's Route.Stripe): a replay carries
   * Idempotent-Replayed and the handler's Request-Id; every answer of the
   * guard says Stripe-Should-Retry; a permanent error is a Stripe error
   * object (a reused key is 400 idempotency_error); a retryable one keeps
   * its problem, which a Stripe SDK retries.
   */
  stripe?: boolean;
  /**
   * Asked on a takeover whether the earlier attempt's write landed: the
   * response it answered if it did (stored, and sent as a replay),
   * undefined if it did not; a throw when it cannot tell.
   */
  reconcile?: (req: GuardedRequest) => Promise<{ status: number; headers?: Record<string, string | string[]>; body?: Buffer | string } | undefined>;
}

/** A request under the guard: its body, read by the guard, and the claim the handler runs under (a fencing token for its writes). */
export type GuardedRequest = IncomingMessage & { rawBody?: Buffer; claim?: Claim };

/**
 * httpGuard returns handler under the guard: a (req, res) handler of
 * node:http, or Express's (it runs on the same response). The handler
 * writes its response as usual; the guard buffers it, stores it, then
 * sends it. The body is read by the guard and left in req.rawBody.
 */
export function httpGuard(guard: Guard, opts: HttpRouteOptions) {
  const stored = [...DefaultStoredHeaders, ...(opts.storeHeaders ?? []), ...(opts.stripe ? ["Request-Id"] : [])].map((h) => h.toLowerCase());
  const fail = opts.stripe ? stripeError : problem;
  const maxBody = opts.maxBodyBytes ?? 1 << 20;
  const maxResp = opts.maxResponseBytes ?? 16 << 20;
  const release = opts.release ?? defaultRelease;
  return (handler: (req: GuardedRequest, res: ServerResponse) => unknown) => async (req: GuardedRequest, res: ServerResponse): Promise<void> => {
    const method = `http:${req.method} ${opts.route}`;
    const policy = opts.policy ?? {};
    try {
      const key = requestKey(req.headersDistinct?.["idempotency-key"] ?? []);
      const body = await readBody(req, maxBody);
      req.rawBody = body;
      let tenant = "", fingerprint = "";
      if (key !== "") {
        tenant = typeof opts.tenant === "string" ? opts.tenant : await opts.tenant(req);
        fingerprint = requestPrint(method, String(req.headers["content-type"] ?? ""), body);
      }
      let live: Recorded | undefined;
      const reconcile = opts.reconcile && (async () => {
        const r = await opts.reconcile!(req);
        return r && { response: encode({ status: r.status, headers: r.headers ?? {}, body: Buffer.from(r.body ?? ""), overflow: false, unknown: false, send: () => {} }, stored) };
      });
      // What a fenced handler hands writeFence: the response it sends.
      const encodeFenced = (r: unknown): Outcome => {
        const f = r as { status?: unknown; headers?: Record<string, string | string[]>; body?: Buffer | string };
        if (typeof f?.status !== "number") {
          throw new LedgerError(ErrorCode.INTERNAL, "a fence of an HTTP route holds a response { status, headers, body }");
        }
        return { response: encode({ status: f.status, headers: f.headers ?? {}, body: Buffer.from(f.body ?? ""), overflow: false, unknown: false, send: () => {} }, stored) };
      };
      const res2 = await guard.do({ tenant, key, fingerprint, method, policy, reconcile, keySource: "header", encode: encodeFenced }, async (claim) => {
        if (!claim) {
          await handler(req, res); // no key, key optional: unprotected, unbuffered
          return {};
        }
        req.claim = claim;
        live = await record(res, maxResp, () => handler(req, res));
        if (live.unknown) {
          throw new OutcomeUnknownError("the handler marked the outcome unknown");
        }
        if (live.overflow) {
          return { status: tooLargeStatus(maxResp) };
        }
        return { response: encode(live, stored), transient: release(live.status) };
      });
      if (!res2.protected) {
        return;
      }
      if (res2.fenced) {
        replay(res, res2.outcome, opts.stripe ?? false, false); // the outcome its fence holds
        return;
      }
      if (!res2.replayed && live && !live.overflow) {
        live.send(); // the first answer, every header of it
        return;
      }
      replay(res, res2.outcome, opts.stripe ?? false);
    } catch (err) {
      fail(res, err);
    }
  };
}

/** markOutcomeUnknown says, from a guarded handler, that nobody knows whether its write happened: nothing is stored or released, the client gets 503. */
export function markOutcomeUnknown(res: ServerResponse): void {
  (res as ServerResponse & { [unknownMark]?: boolean })[unknownMark] = true;
}
const unknownMark = Symbol("idemledger.unknown");

// requestKey reads Idempotency-Key as docs/contract.md says: a structured-field
// string, or the whole trimmed unquoted value; two lines are malformed.
export function requestKey(values: string[]): string {
  if (values.length === 0) {
    return "";
  }
  const invalid = new LedgerError(ErrorCode.KEY_INVALID, `the ${KeyHeader} header must be one key: a structured-field string such as "8e03978e-40d5-43e8-bc93-6894a57f9324", or the key unquoted (1 to 255 bytes of printable ASCII without '"', ',' or ';')`);
  if (values.length > 1) {
    throw invalid;
  }
  const v = values[0].replace(/^[ \t]+|[ \t]+$/g, "");
  if (!v.startsWith('"')) {
    if (!/^[\x21\x23-\x2b\x2d-\x3a\x3c-\x7e]{1,255}$/.test(v)) {
      throw invalid;
    }
    return v;
  }
  const m = /^"((?:[\x20\x21\x23-\x5b\x5d-\x7e]|\\["\\])*)"$/.exec(v); // an sf-string, no parameters
  if (!m || m[1] === "") {
    throw invalid;
  }
  return m[1].replace(/\\(["\\])/g, "$1");
}

async function readBody(req: IncomingMessage, limit: number): Promise<Buffer> {
  const chunks: Buffer[] = [];
  let size = 0;
  for await (const c of req) {
    size += (c as Buffer).length;
    if (size > limit) {
      throw new BodyTooLarge(limit);
    }
    chunks.push(c as Buffer);
  }
  return Buffer.concat(chunks);
}

class BodyTooLarge extends Error {
  constructor(readonly limit: number) {
    super(`the request body is larger than ${limit} bytes`);
  }
}

function isJSON(contentType: string): boolean {
  const mt = contentType.split(";")[0].trim().toLowerCase();
  return mt === "application/json" || mt.endsWith("+json");
}

// requestPrint is j1: for a JSON body, b1: otherwise (as fingerprint.Bytes).
function requestPrint(method: string, contentType: string, body: Buffer): string {
  if (isJSON(contentType)) {
    let v: unknown;
    try {
      v = body.length === 0 ? null : JSON.parse(body.toString("utf8"));
    } catch (err) {
      throw new LedgerError(ErrorCode.VALIDATION_FAILED, `the body says it is JSON but is not: ${(err as Error).message}`);
    }
    return fingerprintJSON(method, v);
  }
  const [type, ...params] = contentType.split(";").map((s) => s.trim()).filter(Boolean);
  const mediaType = [(type ?? "").toLowerCase(), ...params.map((p) => {
    const [k, val = ""] = p.split("=");
    return `${k.trim().toLowerCase()}=${val.trim()}`;
  }).sort()].join("; ");
  const h = createHash("sha256");
  for (const part of [Buffer.from("b1"), Buffer.from(method), Buffer.from(mediaType), body]) {
    h.update(`${part.length}:`);
    h.update(part);
  }
  return "b1:" + h.digest("hex");
}

interface Recorded {
  status: number;
  headers: Record<string, string | string[]>;
  body: Buffer;
  overflow: boolean;
  unknown: boolean;
  send: () => void;
}

// record runs the handler with res's writes buffered, and returns what it
// wrote; send() then writes it to the client.
async function record(res: ServerResponse, limit: number, run: () => unknown): Promise<Recorded> {
  const orig = { writeHead: res.writeHead, write: res.write, end: res.end };
  const chunks: Buffer[] = [];
  let size = 0, overflow = false;
  let done!: () => void;
  const ended = new Promise<void>((r) => { done = r; });
  const take = (chunk: unknown, encoding?: unknown) => {
    if (chunk === undefined || chunk === null || typeof chunk === "function") return;
    const b = Buffer.isBuffer(chunk) ? chunk : Buffer.from(chunk as string, typeof encoding === "string" ? encoding as BufferEncoding : "utf8");
    size += b.length;
    if (size > limit) overflow = true;
    else chunks.push(b);
  };
  res.writeHead = function (status: number, ...rest: unknown[]) {
    res.statusCode = status;
    const headers = rest.find((r) => typeof r === "object" && r !== null) as Record<string, string | string[]> | undefined;
    for (const [k, v] of Object.entries(headers ?? {})) res.setHeader(k, v);
    return res;
  } as typeof res.writeHead;
  res.write = function (chunk: unknown, encoding?: unknown, cb?: unknown) {
    take(chunk, encoding);
    if (typeof cb === "function") cb();
    if (typeof encoding === "function") encoding();
    return true;
  } as typeof res.write;
  res.end = function (chunk?: unknown, encoding?: unknown, cb?: unknown) {
    take(chunk, encoding);
    done();
    if (typeof cb === "function") cb();
    if (typeof encoding === "function") encoding();
    if (typeof chunk === "function") chunk();
    return res;
  } as typeof res.end;
  try {
    await run();
    await ended;
  } finally {
    Object.assign(res, orig);
  }
  const headers: Record<string, string | string[]> = {};
  for (const [k, v] of Object.entries(res.getHeaders())) {
    if (v !== undefined) headers[k] = Array.isArray(v) ? v : String(v);
  }
  const body = Buffer.concat(chunks);
  return {
    status: res.statusCode, headers, body, overflow,
    unknown: (res as ServerResponse & { [unknownMark]?: boolean })[unknownMark] === true,
    send: () => { res.removeHeader("content-length"); res.setHeader("Content-Length", body.length); res.end(body); },
  };
}

// encode is a response as httpguard stores it: status, allow-listed
// headers (canonical names, lists), body (base64, as Go writes []byte).
function encode(r: Recorded, stored: string[]): Outcome["response"] {
  const header: Record<string, string[]> = {};
  for (const [k, v] of Object.entries(r.headers)) {
    if (stored.includes(k.toLowerCase())) header[canonical(k)] = Array.isArray(v) ? v : [v];
  }
  const json = JSON.stringify({ status: r.status, header, body: r.body.length ? r.body.toString("base64") : undefined });
  return { $typeName: "google.protobuf.Any", typeUrl: responseTypeUrl, value: new TextEncoder().encode(json) };
}

function canonical(h: string): string {
  return h.toLowerCase().replace(/(^|-)([a-z])/g, (_m, d: string, c: string) => d + c.toUpperCase());
}

// replay writes a stored outcome: a replay's (marked), or a fenced run's.
function replay(res: ServerResponse, o: Outcome, stripe: boolean, replayed = true): void {
  if (!o.response || o.response.typeUrl !== responseTypeUrl) {
    (stripe ? stripeError : problem)(res, o.status ? statusError(o.status) : new LedgerError(ErrorCode.INTERNAL, "the key holds an outcome of another kind"));
    return;
  }
  const r = JSON.parse(new TextDecoder().decode(o.response.value)) as { status: number; header?: Record<string, string[]>; body?: string };
  for (const [k, v] of Object.entries(r.header ?? {})) res.setHeader(k, v);
  if (replayed) {
    res.setHeader(ReplayedHeader, "true");
  }
  if (stripe) {
    if (replayed) {
      res.setHeader("Idempotent-Replayed", "true");
    }
    res.setHeader("Stripe-Should-Retry", "false"); // a retry gets this same answer
  }
  res.writeHead(r.status);
  res.end(r.body ? Buffer.from(r.body, "base64") : undefined);
}

function tooLargeStatus(limit: number): NonNullable<Outcome["status"]> {
  const le = new LedgerError(ErrorCode.OUTCOME_TOO_LARGE, `the request ran, but its response is larger than the ${limit} bytes relayed, so it was neither sent nor kept: do not retry this intent`,
    { metadata: { applied: "true", limitBytes: String(limit) } });
  return { code: 9, message: le.message, details: [detailAny(le)] };
}

// detailAny is le's ErrorDetail, packed: statusError reads it back.
function detailAny(le: LedgerError) {
  const d = create(ErrorDetailSchema, { code: le.code, retryable: le.retryable, metadata: le.metadata });
  return { $typeName: "google.protobuf.Any" as const, typeUrl: "type.googleapis.com/" + ErrorDetailSchema.typeName, value: toBinary(ErrorDetailSchema, d) };
}

const titles: Partial<Record<ErrorCode, string>> = {
  [ErrorCode.KEY_MISSING]: "Idempotency-Key is missing",
  [ErrorCode.KEY_INVALID]: "Idempotency-Key is malformed",
  [ErrorCode.KEY_REUSED]: "Idempotency-Key is already used for another request",
  [ErrorCode.IN_PROGRESS]: "A request with this Idempotency-Key is being processed",
  [ErrorCode.OUTCOME_UNKNOWN]: "The outcome of an earlier request with this Idempotency-Key is unknown",
  [ErrorCode.KEY_EXPIRED]: "The response of this Idempotency-Key is no longer kept",
  [ErrorCode.RETRY_TOO_LATE]: "This request is too old to be retried",
  [ErrorCode.UNAVAILABLE]: "The request cannot be served now",
  [ErrorCode.RATE_LIMITED]: "Too many requests",
  [ErrorCode.VALIDATION_FAILED]: "The request cannot be guarded",
  [ErrorCode.OUTCOME_TOO_LARGE]: "The response was too large to keep",
  [ErrorCode.UPSTREAM_TIMEOUT]: "The request ended before the idempotency ledger answered",
};

function httpStatus(le: LedgerError): number {
  switch (le.code) {
    case ErrorCode.KEY_MISSING: case ErrorCode.KEY_INVALID: case ErrorCode.VALIDATION_FAILED: return 400;
    case ErrorCode.KEY_REUSED: return 422;
    case ErrorCode.IN_PROGRESS: case ErrorCode.OUTCOME_UNKNOWN: case ErrorCode.KEY_EXPIRED: case ErrorCode.RETRY_TOO_LATE: case ErrorCode.OUTCOME_TOO_LARGE: return 409;
    case ErrorCode.RATE_LIMITED: return 429;
    case ErrorCode.UNAVAILABLE: return 503;
    case ErrorCode.UPSTREAM_TIMEOUT: return 504;
  }
  return le.metadata.applied === "true" ? 409 : 500;
}

/** The RFC 9457 problem the guard answers, as httpguard's Problem. */
export interface Problem {
  type: string;
  title: string;
  status: number;
  detail: string;
  code: string;
  retryable: boolean;
  retry_after_ms: number;
}

// problemOf is err as the ledger's error and as a problem.
function problemOf(err: unknown): [LedgerError, Problem] {
  const big = err instanceof BodyTooLarge ? err : undefined;
  const le = big ? new LedgerError(ErrorCode.VALIDATION_FAILED, big.message) : ledgerError(err) ?? new LedgerError(ErrorCode.INTERNAL, "internal error", { cause: err });
  const name = codeName(le.code);
  return [le, {
    type: "https://idemledger.io/problems/" + name.toLowerCase().replaceAll("_", "-"),
    title: titles[le.code] ?? "Internal error", status: big ? 413 : httpStatus(le), detail: le.message,
    code: name, retryable: le.retryable, retry_after_ms: le.retryAfterMs,
  }];
}

// stripeError answers err on a Stripe route: with Stripe-Should-Retry, and
// a Stripe error object where err is permanent (a Stripe SDK never retries
// one); a retryable err keeps its problem, which the header says to retry.
function stripeError(res: ServerResponse, err: unknown): void {
  const [le, p] = problemOf(err);
  if (res.headersSent) {
    res.destroy();
    return;
  }
  if (le.retryable) {
    res.setHeader("Stripe-Should-Retry", "true");
    problem(res, err);
    return;
  }
  res.setHeader("Stripe-Should-Retry", "false");
  let type = "api_error", status = p.status;
  switch (le.code) {
    case ErrorCode.KEY_REUSED: type = "idempotency_error"; status = 400; break; // as Stripe answers a reused key
    case ErrorCode.KEY_EXPIRED: case ErrorCode.RETRY_TOO_LATE: case ErrorCode.OUTCOME_UNKNOWN: type = "idempotency_error"; break;
    case ErrorCode.KEY_MISSING: case ErrorCode.KEY_INVALID: case ErrorCode.VALIDATION_FAILED: type = "invalid_request_error"; break;
  }
  res.setHeader("Content-Type", "application/json");
  res.writeHead(status);
  res.end(JSON.stringify({ error: { type, code: p.code.toLowerCase(), message: p.detail, doc_url: p.type } }));
}

function problem(res: ServerResponse, err: unknown): void {
  const [le, p] = problemOf(err);
  if (res.headersSent) {
    res.destroy();
    return;
  }
  res.setHeader("Content-Type", "application/problem+json");
  if (le.retryable && le.retryAfterMs > 0) res.setHeader("Retry-After", String(Math.ceil(le.retryAfterMs / 1000)));
  res.writeHead(p.status);
  res.end(JSON.stringify(p));
}
