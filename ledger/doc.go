// Package ledger is the idempotency ledger's domain: scopes and keys,
// records and their lifecycle, the typed error taxonomy, the Store the ledger
// consumes, and Ledger, which applies every rule of the contract on top of a
// Store.
//
// The lifecycle of a record:
//
//	absent --Begin--> IN_PROGRESS(token g, lease) --Complete--> COMPLETED(outcome) --retention--> absent
//	                   |  lease expired, next Begin: takeover, token g+1 (fencing)
//	                   '--Release--> absent
//
// A record past its retention reads as absent whether or not a sweep has
// removed it yet. A released record is kept as an invisible tombstone until
// it expires so that tokens stay monotonic per scope: the next claim after a
// release gets a higher token than the released one, and a stale holder can
// never complete someone else's attempt.
//
// Package ledger imports no other package of this module. Stores live in
// subpackages (memory, pebble, crdb) and the wire mapping in ledgerstatus.
package ledger
