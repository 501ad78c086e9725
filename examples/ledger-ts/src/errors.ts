// The ledger's typed errors, from a Connect error: its ErrorDetail (the
// code, whether to retry and after how long, and the metadata), which
// travels in the error's details over the Connect, gRPC-Web and gRPC
// protocols alike.
import { ConnectError } from "@connectrpc/connect";
import { ErrorCode, ErrorDetailSchema } from "./gen/idemledger/v1/errors_pb.js";

export { ErrorCode };

/** A typed error of the ledger. */
export interface LedgerError {
  /** The stable code, such as ErrorCode.KEY_REUSED. */
  code: ErrorCode;
  /** The code's name without its prefix, such as "KEY_REUSED". */
  name: string;
  /** Whether the same call may be sent again (with the same key). */
  retryable: boolean;
  /** How long to wait before sending it again, in milliseconds (0: none said). */
  retryAfterMs: number;
  /** Facts about the error, such as the method that first used a key. */
  metadata: Record<string, string>;
  /** The error's message. */
  message: string;
}

/**
 * ledgerError decodes the ledger's typed error from what a call threw, or
 * returns undefined when it carries none (a transport failure, an error
 * of another server).
 */
export function ledgerError(err: unknown): LedgerError | undefined {
  const ce = ConnectError.from(err);
  const [detail] = ce.findDetails(ErrorDetailSchema);
  if (detail === undefined) {
    return undefined;
  }
  const after = detail.retryAfter;
  return {
    code: detail.code,
    name: (ErrorCode[detail.code] ?? "UNSPECIFIED").replace(/^ERROR_CODE_/, ""),
    retryable: detail.retryable,
    retryAfterMs: after ? Number(after.seconds) * 1000 + Math.floor(after.nanos / 1e6) : 0,
    metadata: { ...detail.metadata },
    message: ce.rawMessage,
  };
}
