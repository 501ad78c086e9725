// The LedgerService client: Connect or gRPC to ledgerd, with the write
// service's bearer token and a deadline on every call.
import { Code, ConnectError, createClient, type Interceptor } from "@connectrpc/connect";
import { createConnectTransport, createGrpcTransport } from "@connectrpc/connect-node";
import { ErrorCode, ErrorDetailSchema } from "./gen/idemledger/v1/errors_pb.js";
import { LedgerService } from "./gen/idemledger/v1/ledger_pb.js";
import { LedgerError } from "./errors.js";
import { StreamLedger, type LedgerCalls } from "./stream.js";
import { newSessions, type StreamEndpoint } from "./wire.js";

/**
 * A LedgerService client for a write service: its calls go over one
 * LedgerService.Stream (StreamLedger), which close ends.
 */
export type Ledger = LedgerCalls & { close(): void };

export interface LedgerOptions {
  /** ledgerd's HTTP listener (Connect, --http-listen): "http://127.0.0.1:7072"; or its gRPC listener (7070) with protocol "grpc". Never the admin listener (7071). */
  baseUrl: string;
  /** "connect" (the default) or "grpc". */
  protocol?: "connect" | "grpc";
  /** The write service's bearer token, when ledgerd checks tokens. */
  token?: string;
  /** The deadline of each call in milliseconds, unless the call sets its own (5 s when absent; 0: none). */
  timeoutMs?: number;
  /** Where a configuration error is written, once per client (console.error when absent). */
  log?: (message: string) => void;
}

/**
 * LedgerConfigError is the cause of the INTERNAL error that a call gets
 * when baseUrl does not answer as ledgerd's LedgerService: a 404, or an
 * answer that is not Connect or gRPC (the admin listener, another
 * server). It is the service's configuration, not a retryable outage.
 */
export class LedgerConfigError extends Error {
  constructor(message: string, opts: { cause?: unknown } = {}) {
    super(message, opts);
    this.name = "LedgerConfigError";
  }
}

/**
 * createLedger connects to ledgerd. Its calls share one stream over
 * HTTP/2 (cleartext, or TLS with an https baseUrl), on either protocol.
 */
export function createLedger(opts: LedgerOptions): Ledger {
  const config = misconfigured(opts);
  const interceptors: Interceptor[] = [(next) => async (req) => {
    try {
      return await next(req);
    } catch (err) {
      throw config(err, req.method.name);
    }
  }];
  if (opts.token) {
    const header = `Bearer ${opts.token}`;
    interceptors.push((next) => (req) => {
      req.header.set("Authorization", header);
      return next(req);
    });
  }
  const common = { baseUrl: opts.baseUrl, interceptors, useBinaryFormat: true };
  const endpoint: StreamEndpoint = {
    sessions: newSessions(opts.baseUrl),
    protocol: opts.protocol ?? "connect",
    headers: opts.token ? { authorization: `Bearer ${opts.token}` } : {},
  };
  // gRPC's unary calls share the stream's connection, so a connection the
  // stream finds lost is left by both.
  const unary = opts.protocol === "grpc" ? createGrpcTransport({ ...common, sessionManager: endpoint.sessions }) : createConnectTransport({ ...common, httpVersion: "1.1" });
  return new StreamLedger(endpoint, createClient(LedgerService, unary), opts.timeoutMs ?? 5000, config);
}

// misconfigured turns an answer that no ledgerd gives (a 404 without the
// ledger's error detail, or a body that is neither Connect nor gRPC) into
// an INTERNAL LedgerError whose cause, a LedgerConfigError, says what to
// fix; it is written to opts.log the first time. A 503 from a proxy or a
// refused connection stays what it is: UNAVAILABLE, retryable.
function misconfigured(opts: LedgerOptions): (err: unknown, method: string) => unknown {
  let logged = false;
  const log = opts.log ?? ((m: string) => console.error(m));
  return (err, method) => {
    const ce = ConnectError.from(err);
    const contentType = ce.metadata.get("content-type") ?? "";
    const ours = /^application\/(json|proto|grpc|connect)/.test(contentType) || ce.findDetails(ErrorDetailSchema).length > 0;
    const foreign = ce.code === Code.Unimplemented || (ce.code === Code.Unknown && contentType !== "");
    if (ours || !foreign || err instanceof LedgerError) {
      return err;
    }
    const what = ce.code === Code.Unimplemented ? ce.rawMessage : `an answer of type ${contentType}`;
    const cause = new LedgerError(ErrorCode.INTERNAL, "internal error", {
      cause: new LedgerConfigError(
        `idemledger: ${opts.baseUrl} is not ledgerd's LedgerService (${what} to ${method}): ` +
        `set baseUrl to ledgerd's HTTP listener (--http-listen, 7072 by default), not its admin listener (7071)`, { cause: err }),
    });
    if (!logged) {
      logged = true;
      log(String((cause.cause as Error).message));
    }
    return cause;
  };
}
