package ledger

import (
	"bytes"
	"fmt"
	"time"

	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
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
	}
	return fmt.Sprintf("State(%d)", s)
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
	ExpiresAt      time.Time
	Outcome        *Outcome // nil unless completed
}

// Live reports whether the record is visible at now: in progress or
// completed, and not past its retention.
func (r *Record) Live(now time.Time) bool {
	return r != nil && (r.State == StateInProgress || r.State == StateCompleted) && now.Before(r.ExpiresAt)
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
		return Errorf(CodeValidationFailed, "outcome must be exactly one of response or status")
	case o.Response != nil && o.Response.GetTypeUrl() == "":
		return Errorf(CodeValidationFailed, "outcome response has no type URL")
	case o.Response != nil && len(o.Response.GetTypeUrl()) > 2048:
		return Errorf(CodeValidationFailed, "outcome response type URL is longer than 2048 bytes")
	case o.Status != nil && (o.Status.GetCode() <= int32(codes.OK) || o.Status.GetCode() > int32(codes.Unauthenticated)):
		return Errorf(CodeValidationFailed, "outcome status code %d is not a gRPC error code", o.Status.GetCode())
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
	if err := o.Validate(); err != nil {
		return nil, err
	}
	tag, msg := byte(outcomeResponse), proto.Message(o.Response)
	if o.Status != nil {
		tag, msg = outcomeStatus, o.Status
	}
	b, err := proto.MarshalOptions{Deterministic: true}.MarshalAppend([]byte{tag}, msg)
	if err != nil {
		return nil, fmt.Errorf("ledger: encode outcome: %w", err)
	}
	return b, nil
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
