// @idemledger/guard: the idempotency guard for TypeScript MCP servers.
export * from "./gen/idemledger/v1/ledger_pb.js";
export * from "./gen/idemledger/v1/errors_pb.js";
export { codeName, LedgerError, ledgerError } from "./errors.js";
export { createLedger, LedgerConfigError, type Ledger, type LedgerOptions } from "./ledger.js";
export { fingerprintJSON } from "./fingerprint.js";
export { Guard, OutcomeUnknownError, statusError, type Call, type Claim, type GuardOptions, type OnInProgress, type OnLeaseExpiryPolicy, type Outcome, type Policy, type Result, type Run } from "./guard.js";
export * from "./mcp.js";
export { FenceTable, writeFence, type FenceRow, type FenceScope, type Queryable } from "./fence.js";
export { mintKey } from "./keys.js";
export { callTool, type CallToolOptions, type ToolClient } from "./client.js";
export { defaultRelease, DefaultStoredHeaders, FirstAttemptHeader, httpGuard, KeyHeader, markOutcomeUnknown, ReplayedHeader, requestKey, type GuardedRequest, type HttpRouteOptions, type Problem } from "./http.js";
