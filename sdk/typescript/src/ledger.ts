// The LedgerService client: Connect or gRPC to ledgerd, with the write
// service's bearer token and a deadline on every call.
import { createClient, type Client, type Interceptor } from "@connectrpc/connect";
import { createConnectTransport, createGrpcTransport } from "@connectrpc/connect-node";
import { LedgerService } from "./gen/idemledger/v1/ledger_pb.js";

/** A LedgerService client. */
export type Ledger = Client<typeof LedgerService>;

export interface LedgerOptions {
  /** ledgerd's HTTP listener (Connect), or its gRPC listener with protocol "grpc": "http://127.0.0.1:7071". */
  baseUrl: string;
  /** "connect" (the default) or "grpc". */
  protocol?: "connect" | "grpc";
  /** The write service's bearer token, when ledgerd checks tokens. */
  token?: string;
  /** The deadline of each call in milliseconds, unless the call sets its own (5 s when absent; 0: none). */
  timeoutMs?: number;
}

/** createLedger connects to ledgerd. */
export function createLedger(opts: LedgerOptions): Ledger {
  const interceptors: Interceptor[] = [];
  if (opts.token) {
    const header = `Bearer ${opts.token}`;
    interceptors.push((next) => (req) => {
      req.header.set("Authorization", header);
      return next(req);
    });
  }
  // connect-es takes a default timeout of 0 as "already past": 0 here is none.
  const common = { baseUrl: opts.baseUrl, interceptors, defaultTimeoutMs: opts.timeoutMs === 0 ? undefined : (opts.timeoutMs ?? 5000) };
  const transport = opts.protocol === "grpc"
    ? createGrpcTransport(common)
    : createConnectTransport({ ...common, httpVersion: "1.1" });
  return createClient(LedgerService, transport);
}
