// Package grpcguard provides the unary server interceptor that write
// services install to make their gRPC write methods idempotent through the
// idemledger LedgerService: the guard (package guard) for gRPC, beside
// httpguard and mcpguard.
//
// For every call to a protected method it takes the idempotency key (the
// idempotency-key header, or a request field such as AIP-155's request_id)
// and the tenant, fingerprints the request canonically (fingerprint.Proto),
// and asks the ledger to Begin:
//
//   - a claim runs the handler, with the claim in its context
//     (guard.ClaimFromContext) so it can fence its own writes with the token, and
//     with the lease extended while it runs past half of it;
//   - a replay returns the stored response or error without running the
//     handler, with the header idempotency-replayed: true;
//   - any other answer (IN_PROGRESS, KEY_REUSED, RETRY_TOO_LATE, ...) is
//     returned to the caller as the ledger's typed error.
//
// After the handler, the outcome goes to the ledger as the contract's table
// says: a response or a permanent error is completed (and replayed to every
// retry), a transient error releases the key (the retry runs afresh), and a
// panic leaves the lease to run out (the next attempt takes over with a
// higher token). Complete and Release run under context.WithoutCancel with
// their own timeout, tried again for up to 20 s (guard.WithCompletion), so
// a caller who hangs up, or a ledger that restarts, does not strand a
// claim.
//
// A ledger that cannot be reached at Begin fails the call closed:
// UNAVAILABLE, retryable, and the handler does not run.
//
// Clients must not let gRPC's own retry policy (service config retryPolicy)
// retry these methods: use package idemclient, which reuses one key across
// the retries of an intent.
package grpcguard
