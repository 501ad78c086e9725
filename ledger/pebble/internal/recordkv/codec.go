// Package recordkv lays out ledger records for the embedded stores, which
// keep them in an ordered key-value engine: a scope key per record, an
// expiry index key per record, and the record's bytes. It also holds
// their clock (MonoClock).
package recordkv

import (
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/idemledger/idemledger/ledger"
)

// Version is the first byte of every stored value, the layout's: a new
// layout gets a new version. No store of an earlier layout was released,
// so Decode reads this one only.
const Version = 3

// ScopeKey is the bucket key of a scope: each part length-prefixed, so no
// two scopes share a key and every scope of a namespace shares a prefix.
func ScopeKey(s ledger.Scope) []byte {
	b := make([]byte, 0, 3*binary.MaxVarintLen16+len(s.Namespace)+len(s.Tenant)+len(s.Key))
	for _, part := range []string{s.Namespace, s.Tenant, s.Key} {
		b = binary.AppendUvarint(b, uint64(len(part)))
		b = append(b, part...)
	}
	return b
}

// DecodeScopeKey reads back the scope of a ScopeKey.
func DecodeScopeKey(b []byte) (ledger.Scope, error) {
	var parts [3]string
	for i := range parts {
		s, rest, err := readString(b)
		if err != nil {
			return ledger.Scope{}, err
		}
		parts[i], b = s, rest
	}
	if len(b) != 0 {
		return ledger.Scope{}, ErrCorrupt
	}
	return ledger.Scope{Namespace: parts[0], Tenant: parts[1], Key: parts[2]}, nil
}

// IndexAt is the time of a record's expiry index entry: when the sweeper
// first has work on it. At the end of a completed record's retention it
// drops the outcome (a tombstone is left), at ForgetAt it deletes the
// record. An attempt of the TAKEOVER policy is indexed at the end of its
// retention too, where its completion will be, so that a Complete leaves
// the entry where it is and writes only the record; if nobody completed
// it by then, it reads as absent, and the sweeper keeps it as the released
// tombstone it reads as.
func IndexAt(r *ledger.Record) time.Time {
	attempt := r.State == ledger.StateInProgress && r.OnLeaseExpiry == ledger.Takeover
	if (r.State == ledger.StateCompleted || attempt) && r.ExpiresAt.Before(r.ForgetAt) {
		return r.ExpiresAt
	}
	return r.ForgetAt
}

// ExpiryKey is the key of a record in the expiry index: its IndexAt as
// big-endian nanoseconds (so the index sorts by time), then its scope key.
func ExpiryKey(expires time.Time, scope []byte) []byte {
	b := binary.BigEndian.AppendUint64(make([]byte, 0, 8+len(scope)), uint64(expires.UnixNano()))
	return append(b, scope...)
}

// ErrCorrupt is what Decode and DecodeScopeKey say of bytes they cannot read.
var ErrCorrupt = errors.New("corrupt record")

// Encode lays out a record (its scope is the key, so it is left out). The
// outcome is encoded in place, after its length.
func Encode(r *ledger.Record) ([]byte, error) {
	outcome := 0
	if r.Outcome != nil {
		if err := r.Outcome.Validate(); err != nil {
			return nil, err
		}
		outcome = r.Outcome.BinarySize()
	}
	b := make([]byte, 0, 80+len(r.Method)+len(r.Fingerprint)+len(r.KeySource)+outcome)
	b = append(b, Version, byte(r.State))
	b = binary.AppendUvarint(b, r.Token)
	b = binary.AppendUvarint(b, uint64(r.Attempt))
	for _, t := range []time.Time{r.CreatedAt, r.LeaseExpiresAt, r.CompletedAt, r.ExpiresAt} {
		b = binary.AppendVarint(b, unixNano(t))
	}
	for _, s := range []string{r.Method, r.Fingerprint} {
		b = binary.AppendUvarint(b, uint64(len(s)))
		b = append(b, s...)
	}
	b = binary.AppendUvarint(b, uint64(outcome))
	if r.Outcome != nil {
		start := len(b)
		var err error
		if b, err = r.Outcome.AppendBinary(b); err != nil {
			return nil, err
		}
		if len(b)-start != outcome {
			return nil, fmt.Errorf("recordkv: outcome encoded in %d bytes, sized %d", len(b)-start, outcome)
		}
	}
	b = binary.AppendVarint(b, unixNano(r.ForgetAt))
	b = append(b, byte(r.OnLeaseExpiry))
	b = binary.AppendUvarint(b, uint64(len(r.KeySource)))
	return append(b, r.KeySource...), nil
}

// Decode reads what Encode wrote. It never panics: anything it
// cannot read is ErrCorrupt. The record shares no memory with b.
func Decode(scope ledger.Scope, b []byte) (ledger.Record, error) {
	version := byte(0)
	if len(b) >= 2 {
		version = b[0]
	}
	if version != Version || ledger.State(b[1]) > ledger.StateExpired {
		return ledger.Record{}, ErrCorrupt
	}
	r := ledger.Record{Scope: scope, State: ledger.State(b[1])}
	b = b[2:]
	var ok bool
	if r.Token, b, ok = uvarint(b); !ok {
		return ledger.Record{}, ErrCorrupt
	}
	attempt, b, ok := uvarint(b)
	if !ok || attempt > 1<<32-1 {
		return ledger.Record{}, ErrCorrupt
	}
	r.Attempt = uint32(attempt)
	for _, t := range []*time.Time{&r.CreatedAt, &r.LeaseExpiresAt, &r.CompletedAt, &r.ExpiresAt} {
		n, k := binary.Varint(b)
		if k <= 0 {
			return ledger.Record{}, ErrCorrupt
		}
		*t, b = fromUnixNano(n), b[k:]
	}
	var outcome []byte
	var err error
	for _, s := range []*string{&r.Method, &r.Fingerprint} {
		if *s, b, err = readString(b); err != nil {
			return ledger.Record{}, err
		}
	}
	if outcome, b, err = readBytes(b); err != nil {
		return ledger.Record{}, err
	}
	n, k := binary.Varint(b)
	if k <= 0 || len(b) < k+1 || ledger.LeaseExpiry(b[k]) > ledger.Hold {
		return ledger.Record{}, ErrCorrupt
	}
	r.ForgetAt, r.OnLeaseExpiry, b = fromUnixNano(n), ledger.LeaseExpiry(b[k]), b[k+1:]
	if r.KeySource, b, err = readString(b); err != nil {
		return ledger.Record{}, err
	}
	if len(b) != 0 {
		return ledger.Record{}, ErrCorrupt
	}
	if len(outcome) > 0 {
		r.Outcome = new(ledger.Outcome)
		if err := r.Outcome.UnmarshalBinary(outcome); err != nil { // protobuf copies what it keeps
			return ledger.Record{}, errors.Join(ErrCorrupt, err)
		}
		if err := r.Outcome.Validate(); err != nil {
			return ledger.Record{}, errors.Join(ErrCorrupt, err)
		}
	}
	return r, nil
}

func uvarint(b []byte) (uint64, []byte, bool) {
	n, k := binary.Uvarint(b)
	if k <= 0 {
		return 0, nil, false
	}
	return n, b[k:], true
}

func readString(b []byte) (string, []byte, error) {
	s, rest, err := readBytes(b)
	return string(s), rest, err
}

// readBytes reads a length and as many bytes, in place.
func readBytes(b []byte) ([]byte, []byte, error) {
	n, rest, ok := uvarint(b)
	if !ok || n > uint64(len(rest)) {
		return nil, nil, ErrCorrupt
	}
	return rest[:n], rest[n:], nil
}

// unixNano stores the zero time as 0, which no real record time is.
func unixNano(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

func fromUnixNano(n int64) time.Time {
	if n == 0 {
		return time.Time{}
	}
	return time.Unix(0, n).UTC()
}
