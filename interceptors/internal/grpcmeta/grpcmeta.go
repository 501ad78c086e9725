// Package grpcmeta names the gRPC metadata of the idempotency contract, a
// leaf that both sides import: the server's interceptor (grpcguard) and
// the client's (idemclient).
package grpcmeta

// The metadata keys.
const (
	// Key carries the idempotency key.
	Key = "idempotency-key"
	// FirstAttempt carries when the intent's first attempt was made (RFC
	// 3339).
	FirstAttempt = "idempotency-first-attempt-at"
	// Replayed is "true" on a replayed response.
	Replayed = "idempotency-replayed"
)
