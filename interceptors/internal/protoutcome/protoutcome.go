// Package protoutcome is how the protobuf adapters (grpcguard,
// connectguard) store a handler's response: one encoding, so that a
// replay is the same message whichever adapter stored it.
package protoutcome

import (
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/idemledger/idemledger/interceptors/guard"
)

// Response is msg as the guard stores it: its deterministic encoding, in
// an Any named by its type.
func Response(msg proto.Message) (guard.Outcome, error) {
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(msg)
	if err != nil {
		return guard.Outcome{}, err
	}
	return guard.Outcome{Response: &anypb.Any{TypeUrl: "type.googleapis.com/" + string(msg.ProtoReflect().Descriptor().FullName()), Value: b}}, nil
}
