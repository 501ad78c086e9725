package ledgerstatus

import (
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/anypb"

	ledgerv1 "github.com/idemledger/idemledger/gen/idemledger/v1"
)

// Fields is a message with the fields of google.rpc.Status, field for
// field: ledgerv1.StoredStatus (a stored outcome), ledgerv1.CallStatus (a
// call's error on a Stream) and google.rpc.Status itself.
type Fields interface {
	GetCode() int32
	GetMessage() string
	GetDetails() []*anypb.Any
}

// FromFields returns the status whose fields f carries; nil f gives an OK
// status.
func FromFields(f Fields) *status.Status {
	return status.FromProto(&spb.Status{Code: f.GetCode(), Message: f.GetMessage(), Details: f.GetDetails()})
}

// ToStored returns st as the status of a stored outcome.
func ToStored(st *status.Status) *ledgerv1.StoredStatus {
	p := st.Proto()
	return &ledgerv1.StoredStatus{Code: p.GetCode(), Message: p.GetMessage(), Details: p.GetDetails()}
}

// ToCall returns st as the error of a call on a Stream.
func ToCall(st *status.Status) *ledgerv1.CallStatus {
	p := st.Proto()
	return &ledgerv1.CallStatus{Code: p.GetCode(), Message: p.GetMessage(), Details: p.GetDetails()}
}
