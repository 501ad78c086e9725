// The ledger's typed errors: the stable code, whether to retry and after
// how long, and the metadata, from a ConnectError's ErrorDetail (which
// travels in the error's details over the Connect, gRPC-Web and gRPC
// protocols alike), or made by the guard itself.
import { ConnectError } from "@connectrpc/connect";
import { ErrorCode, ErrorDetailSchema } from "./gen/idemledger/v1/errors_pb.js";

export { ErrorCode };

/** The codes whose calls may be sent again with the same key. */
const retryable = new Set<ErrorCode>([
  ErrorCode.RATE_LIMITED, ErrorCode.UNAVAILABLE, ErrorCode.UPSTREAM_TIMEOUT, ErrorCode.IN_PROGRESS, ErrorCode.CONTENTION,
]);

/** The name of code without its prefix, such as "KEY_REUSED". */
export function codeName(code: ErrorCode): string {
  return (ErrorCode[code] ?? "UNSPECIFIED").replace(/^ERROR_CODE_/, "");
}

/** A typed error of the ledger or of the guard. */
export class LedgerError extends Error {
  /** The stable code, such as ErrorCode.KEY_REUSED. */
  readonly code: ErrorCode;
  /** Whether the same call may be sent again (with the same key). */
  readonly retryable: boolean;
  /** How long to wait before sending it again, in milliseconds (0: none said). */
  readonly retryAfterMs: number;
  /** Facts about the error, such as the method that first used a key. */
  readonly metadata: Record<string, string>;
  /** The server's grpc-retry-pushback-ms, when it sent one. */
  readonly pushbackMs: number | undefined;

  constructor(code: ErrorCode, message: string, opts: { retryAfterMs?: number; metadata?: Record<string, string>; retryable?: boolean; pushbackMs?: number; cause?: unknown } = {}) {
    super(message, { cause: opts.cause });
    this.name = "LedgerError";
    this.code = code;
    this.retryable = opts.retryable ?? retryable.has(code);
    this.retryAfterMs = opts.retryAfterMs ?? 0;
    this.metadata = opts.metadata ?? {};
    this.pushbackMs = opts.pushbackMs;
  }

  /** The code's name, such as "KEY_REUSED". */
  get codeName(): string {
    return codeName(this.code);
  }
}

/**
 * ledgerError decodes the ledger's typed error from what a call threw, or
 * returns undefined when it carries none (a transport failure, an error
 * of another server).
 */
export function ledgerError(err: unknown): LedgerError | undefined {
  if (err instanceof LedgerError) {
    return err;
  }
  if (err === undefined) {
    return undefined; // nothing failed (ConnectError.from would make an error, and its stack, to say so)
  }
  const ce = ConnectError.from(err);
  if (ce.cause instanceof LedgerError) {
    return ce.cause; // an interceptor's own typed error, such as a misconfigured baseUrl
  }
  const [detail] = ce.findDetails(ErrorDetailSchema);
  if (detail === undefined) {
    return undefined;
  }
  const after = detail.retryAfter;
  const pushback = ce.metadata.get("grpc-retry-pushback-ms");
  return new LedgerError(detail.code, ce.rawMessage, {
    retryable: detail.retryable,
    retryAfterMs: after ? Number(after.seconds) * 1000 + Math.floor(after.nanos / 1e6) : 0,
    metadata: { ...detail.metadata },
    pushbackMs: pushback !== null && /^\d+$/.test(pushback) ? Number(pushback) : undefined,
    cause: err,
  });
}
