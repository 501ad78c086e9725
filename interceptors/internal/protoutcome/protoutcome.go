// Package protoutcome is how the protobuf adapters (grpcguard,
// connectguard) store a handler's response: one encoding, so that a
// replay is the same message whichever adapter stored it.
package protoutcome

import (
	"context"

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

// Answer is a handler's answer, kept for the adapter to send when the
// guard ran the handler.
type Answer[R any] struct {
	Resp R
	Err  error
}

// Run is the guard's RunFunc for a handler: it calls handle, keeps its
// answer in a with its error made typed (the transport's form of a typed
// error), and has the answer encoded for the ledger (encode) only when the
// call is protected; an unkeyed call has nothing to store.
func Run[R any](a *Answer[R], handle func(context.Context) (R, error), typed func(error) error, encode func(R, error) (guard.Outcome, error)) guard.RunFunc {
	return func(ctx context.Context) (guard.Outcome, error) {
		a.Resp, a.Err = handle(ctx)
		a.Err = typed(a.Err)
		if _, protected := guard.ClaimFromContext(ctx); !protected {
			return guard.Outcome{}, nil
		}
		return encode(a.Resp, a.Err)
	}
}
