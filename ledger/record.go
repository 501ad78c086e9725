package ledger

import (
	"bytes"
	"fmt"
	"time"

	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/idemledger/idemledger/ledger/errcode"
)

// State is the state of a stored record.
type State uint8

const (
	// StateAbsent is no record. Reads of absent, released and expired
	// records answer NOT_FOUND.
	StateAbsent State = iota
	// StateInProgress is a record whose attempt holds a lease.
	StateInProgress
	// StateCompleted is a record whose outcome is stored.
	StateCompleted
	// StateReleased is a tombstone that keeps the token counter after a
	// Release; it reads as absent.
	StateReleased
	// StateExpired is a tombstone: the write happened, and its outcome is
	// past its retention (the sweeper dropped it, or will). Begin answers
	// KEY_EXPIRED until ForgetAt.
	StateExpired
	// StateUnknown is never stored: it is how an IN_PROGRESS record of the
	// HOLD policy reads once its lease ran out. Begin answers
	// OUTCOME_UNKNOWN until someone resolves it.
	StateUnknown
)

func (s State) String() string {
	switch s {
	case StateAbsent:
		return "ABSENT"
	case StateInProgress:
		return "IN_PROGRESS"
	case StateCompleted:
		return "COMPLETED"
	case StateReleased:
		return "RELEASED"
	case StateExpired:
		return "EXPIRED"
	case StateUnknown:
		return "OUTCOME_UNKNOWN"
	}
	return fmt.Sprintf("State(%d)", s)
}

// LeaseExpiry is what a Begin does with an attempt whose lease ran out. It
// is stored with the record at its first claim.
type LeaseExpiry uint8

const (
	// Takeover takes the record over with the token plus one (the default).
	Takeover LeaseExpiry = iota
	// Hold turns the record OUTCOME_UNKNOWN: nothing runs again until
	// someone resolves it.
	Hold
)

func (p LeaseExpiry) String() string {
	if p == Hold {
		return "HOLD"
	}
	return "TAKEOVER"
}

// Record is the stored record of a scope.
type Record struct {
	Scope          Scope
	State          State
	Method         string // the full gRPC method that first used the key
	Fingerprint    string
	Token          uint64 // fencing token, monotonic per stored row
	Attempt        uint32 // attempts of this record, from 1
	CreatedAt      time.Time
	LeaseExpiresAt time.Time
	CompletedAt    time.Time // zero unless completed
	ExpiresAt      time.Time // the end of the outcome's retention
	// ForgetAt is when the record is gone for good: ExpiresAt plus the
	// tombstone retention. Until then a completed record past ExpiresAt is
	// a tombstone, and a record of the HOLD policy whose lease ran out
	// stays OUTCOME_UNKNOWN.
	ForgetAt      time.Time
	OnLeaseExpiry LeaseExpiry
	Outcome       *Outcome // nil unless completed
	// KeySource says where the first claim's caller found the key
	// ("argument", "meta", "host:claudecode/toolUseId", "header", …); ""
	// when it did not say.
	KeySource string
}

// View returns the state the record is in at now, as every read and rule
// sees it: StateAbsent for no record, a released one, an attempt of the
// TAKEOVER policy past its retention, or anything past ForgetAt;
// StateUnknown for an attempt of the HOLD policy whose lease ran out;
// StateExpired for a completed record past its retention.
func (r *Record) View(now time.Time) State {
	switch {
	case r == nil || r.State == StateReleased || !now.Before(r.ForgetAt):
		return StateAbsent
	case r.State == StateInProgress && r.OnLeaseExpiry == Hold && !now.Before(r.LeaseExpiresAt):
		return StateUnknown
	case r.State == StateInProgress && !now.Before(r.ExpiresAt):
		return StateAbsent
	case r.State == StateCompleted && !now.Before(r.ExpiresAt), r.State == StateExpired:
		return StateExpired
	}
	return r.State
}

// Forgotten reports whether the record is past ForgetAt: a sweeper may
// delete it. A record that reads as absent before then (released, or an
// attempt past its retention) is kept until then, so that the next claim's
// token is above its own.
func (r *Record) Forgotten(now time.Time) bool { return !now.Before(r.ForgetAt) }

// Shrinkable reports whether the record is completed and past its
// retention: a sweeper may drop its outcome and keep it as a tombstone.
func (r *Record) Shrinkable(now time.Time) bool {
	return r.State == StateCompleted && !now.Before(r.ExpiresAt) && !r.Forgotten(now)
}

// Live reports whether the record is visible at now: anything but absent.
func (r *Record) Live(now time.Time) bool { return r.View(now) != StateAbsent }

// AsOf returns the record as a read at now shows it: its State is its view,
// and a tombstone has no outcome. It reports false when the record is
// absent at now.
func (r *Record) AsOf(now time.Time) (Record, bool) {
	v := r.View(now)
	if v == StateAbsent {
		return Record{}, false
	}
	c := *r
	c.State = v
	if v == StateExpired {
		c.Outcome = nil
	}
	return c, true
}

// Outcome is what a write produced: exactly one of a response (type URL and
// bytes, kept byte for byte) or an error status.
type Outcome struct {
	Response *anypb.Any
	Status   *spb.Status
}

// Validate checks that exactly one of Response and Status is set, that a
// response names its type, and that a status is an error status.
func (o *Outcome) Validate() error {
	switch {
	case o == nil || (o.Response == nil) == (o.Status == nil):
		return errcode.Errorf(errcode.ValidationFailed, "outcome must be exactly one of response or status")
	case o.Response != nil && o.Response.GetTypeUrl() == "":
		return errcode.Errorf(errcode.ValidationFailed, "outcome response has no type URL")
	case o.Response != nil && len(o.Response.GetTypeUrl()) > 2048:
		return errcode.Errorf(errcode.ValidationFailed, "outcome response type URL is longer than 2048 bytes")
	case o.Status != nil && (o.Status.GetCode() <= int32(codes.OK) || o.Status.GetCode() > int32(codes.Unauthenticated)):
		return errcode.Errorf(errcode.ValidationFailed, "outcome status code %d is not a gRPC error code", o.Status.GetCode())
	}
	return nil
}

const (
	outcomeResponse = 'R'
	outcomeStatus   = 'S'
)

// MarshalBinary encodes the outcome for a store: one tag byte, then the
// deterministic protobuf encoding of the response Any or the status.
func (o *Outcome) MarshalBinary() ([]byte, error) {
	return o.AppendBinary(nil)
}

// AppendBinary appends MarshalBinary's encoding of the outcome to b.
func (o *Outcome) AppendBinary(b []byte) ([]byte, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	tag, msg := o.wire()
	b, err := proto.MarshalOptions{Deterministic: true}.MarshalAppend(append(b, tag), msg)
	if err != nil {
		return nil, fmt.Errorf("ledger: encode outcome: %w", err)
	}
	return b, nil
}

// BinarySize is the length of MarshalBinary's encoding of a valid outcome.
func (o *Outcome) BinarySize() int {
	_, msg := o.wire()
	return 1 + proto.Size(msg)
}

// wire is the tag and the message of the outcome's encoding.
func (o *Outcome) wire() (byte, proto.Message) {
	if o.Status != nil {
		return outcomeStatus, o.Status
	}
	return outcomeResponse, o.Response
}

// UnmarshalBinary decodes what MarshalBinary encoded.
func (o *Outcome) UnmarshalBinary(b []byte) error {
	if len(b) == 0 {
		return fmt.Errorf("ledger: decode outcome: empty")
	}
	*o = Outcome{}
	switch b[0] {
	case outcomeResponse:
		o.Response = new(anypb.Any)
		return proto.Unmarshal(b[1:], o.Response)
	case outcomeStatus:
		o.Status = new(spb.Status)
		return proto.Unmarshal(b[1:], o.Status)
	}
	return fmt.Errorf("ledger: decode outcome: unknown tag 0x%02x", b[0])
}

// Equal reports whether two outcomes are the same, byte for byte.
func (o *Outcome) Equal(p *Outcome) bool {
	if o == nil || p == nil {
		return o == p
	}
	a, errA := o.MarshalBinary()
	b, errB := p.MarshalBinary()
	return errA == nil && errB == nil && bytes.Equal(a, b)
}

// Clone returns a deep copy, so that a store never shares memory with its
// callers.
func (o *Outcome) Clone() *Outcome {
	if o == nil {
		return nil
	}
	c := &Outcome{}
	if o.Response != nil {
		c.Response = proto.CloneOf(o.Response)
	}
	if o.Status != nil {
		c.Status = proto.CloneOf(o.Status)
	}
	return c
}
