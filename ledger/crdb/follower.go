package crdb

import (
	"context"
	"fmt"
	"sync/atomic"

	"github.com/idemledger/idemledger/ledger"
)

// Replays from a follower (Config.FollowerReads).
//
// A completed record never changes until its retention ends: its outcome,
// fingerprint and token are final (a purge erases it, and then nothing
// replays it). So a copy of it, however stale, is still the record while
// its retention runs, and a replay may be answered from the nearest
// replica instead of the leaseholder, a region away for a tenant homed
// elsewhere. The claim reads the record first, at most FollowerReads stale
// (CockroachDB's bounded-staleness read, with_max_staleness, served by the
// nearest replica that is fresh enough, or by the leaseholder), and
// answers from it only when the record
//   - reads as COMPLETED both at the read's clock and FollowerReads later
//     (so a stale clock cannot stretch its retention), and
//   - carries the claim's fingerprint (a mismatch, KEY_REUSED, is left to
//     the leaseholder: a stale copy must not refuse a key the leaseholder
//     has since forgotten and given to a new request).
//
// Everything else (no row, an attempt in progress or unknown, a tombstone,
// an error) goes to the leaseholder as any claim does, which decides. The
// stale path thus only ever answers "replay this outcome", which is the
// answer the leaseholder would give (TestFollowerReadsNeverClaim), and a
// replay never becomes a second claim. The cost: a claim of a new key of
// a tenant homed away pays the follower read (a local round trip) before
// the leaseholder's. A record purged less than FollowerReads ago may
// still be replayed from a copy that predates the purge.
//
// On PostgreSQL the same read goes to the primary, in the statement's own
// snapshot.

// followerReader reads a record as a replica near this instance has it.
type followerReader func(ctx context.Context, sc ledger.Scope) (row, error)

// FollowerReadStats counts the claims that read a follower first: Served
// were answered from it (replays), Missed went on to the leaseholder.
type FollowerReadStats struct {
	Served, Missed uint64
}

type followerStats struct{ served, missed atomic.Uint64 }

// FollowerReadStats returns the counters since the Store opened.
func (s *Store) FollowerReadStats() FollowerReadStats {
	return FollowerReadStats{Served: s.reads.served.Load(), Missed: s.reads.missed.Load()}
}

// followerReadSQL reads a record and the clock. On CockroachDB from the
// nearest replica at most staleness old (one row by its full key, as a
// bounded-staleness read must be).
func followerReadSQL(d Dialect, staleness string) string {
	asOf := ""
	if d == Cockroach {
		asOf = fmt.Sprintf(" AS OF SYSTEM TIME with_max_staleness('%s')", staleness)
	}
	return `SELECT ` + columns + `, COALESCE($4::TIMESTAMPTZ, now()) FROM idempotency_records` + asOf +
		` WHERE namespace = $1 AND tenant = $2 AND idem_key = $3`
}

// readFollower is the Store's followerReader.
func (s *Store) readFollower(ctx context.Context, sc ledger.Scope) (row, error) {
	var r row
	err := scanInto(s.pool.QueryRow(ctx, s.followSQL, sc.Namespace, sc.Tenant, sc.Key, s.now()), &r, &r.now)
	return r, err
}

// followsFor reports whether a claim of tenant reads a follower first:
// with FollowerReads on, for a tenant homed outside Config.Region (every
// tenant without Homes or Region), unless the homes restrict placement:
// then no replica of a tenant homed away is near, and the read would cost
// a second far round trip (docs/multi-region.md).
func (s *Store) followsFor(tenant string) bool {
	if s.cfg.FollowerReads <= 0 || s.cfg.Homes != nil && s.cfg.Homes.placement == "restricted" {
		return false
	}
	return s.cfg.Homes == nil || s.cfg.Region == "" || s.cfg.Homes.Home(tenant) != s.cfg.Region
}

// replayFromFollower answers a claim from a follower's copy of a completed
// record with the claim's fingerprint, or says to ask the leaseholder.
func (s *Store) replayFromFollower(ctx context.Context, p ledger.ClaimParams) (ledger.ClaimResult, bool) {
	if !s.followsFor(p.Scope.Tenant) {
		return ledger.ClaimResult{}, false
	}
	r, err := s.follow(ctx, p.Scope)
	if err != nil || r.rec.Fingerprint != p.Fingerprint ||
		r.rec.View(r.now) != ledger.StateCompleted || r.rec.View(r.now.Add(s.cfg.FollowerReads)) != ledger.StateCompleted {
		s.reads.missed.Add(1)
		return ledger.ClaimResult{}, false
	}
	s.reads.served.Add(1)
	return ledger.ClaimResult{Record: r.rec, Now: r.now}, true
}
