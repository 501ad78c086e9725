// A client of idemledger's LedgerService for TypeScript services: the
// generated types and service, and the typed errors.
export * from "./gen/idemledger/v1/ledger_pb.js";
export * from "./gen/idemledger/v1/errors_pb.js";
export { ledgerError, type LedgerError } from "./errors.js";
