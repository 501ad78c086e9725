package main

import (
	"connectrpc.com/vanguard"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// opaqueJSON is the HTTP listener's JSON codec: vanguard's, with one
// addition. An Any whose type ledgerd does not know (httpguard's and
// mcpguard's outcomes, a write service's own response message) is carried
// as its bytes, {"@type": "<its URL>", "value": "<base64>"}, the JSON of
// a wrapped bytes value, both ways: a JSON client replays such an outcome
// (and completes one) instead of failing the call with an untyped error.
type opaqueJSON struct {
	*vanguard.JSONCodec
	known vanguard.TypeResolver
}

func newOpaqueJSON(res vanguard.TypeResolver) vanguard.Codec {
	c := vanguard.NewJSONCodec(opaqueResolver{res})
	// Strict, as the HTTP gate reads a request: a field the message does
	// not have (one beside an opaque value's "value" included) is an
	// error, never dropped.
	c.UnmarshalOptions.DiscardUnknown = false
	return opaqueJSON{JSONCodec: c, known: res}
}

func (o opaqueJSON) MarshalAppend(base []byte, msg proto.Message) ([]byte, error) {
	return o.JSONCodec.MarshalAppend(base, o.wrap(msg))
}

func (o opaqueJSON) MarshalAppendStable(base []byte, msg proto.Message) ([]byte, error) {
	return o.JSONCodec.MarshalAppendStable(base, o.wrap(msg))
}

func (o opaqueJSON) Unmarshal(data []byte, msg proto.Message) error {
	if err := o.JSONCodec.Unmarshal(data, msg); err != nil {
		return err
	}
	// What came as {"@type": unknown, "value": base64} was read as a
	// wrapped bytes value: keep its bytes.
	var err error
	eachAny(msg.ProtoReflect(), func(a *anypb.Any) {
		if o.opaque(a) && err == nil {
			var bv wrapperspb.BytesValue
			if err = proto.Unmarshal(a.GetValue(), &bv); err == nil {
				a.Value = bv.GetValue()
			}
		}
	})
	return err
}

// opaque reports whether a's type is one ledgerd does not know.
func (o opaqueJSON) opaque(a *anypb.Any) bool {
	_, err := o.known.FindMessageByURL(a.GetTypeUrl())
	return err != nil
}

// wrap is msg with the value of each Any of an unknown type wrapped as a
// bytes value, so that the resolver's bytes value reads it whole: a copy
// when there is one, msg itself otherwise.
func (o opaqueJSON) wrap(msg proto.Message) proto.Message {
	found := false
	eachAny(msg.ProtoReflect(), func(a *anypb.Any) { found = found || o.opaque(a) })
	if !found {
		return msg
	}
	msg = proto.Clone(msg)
	eachAny(msg.ProtoReflect(), func(a *anypb.Any) {
		if o.opaque(a) {
			a.Value = protowire.AppendBytes(protowire.AppendTag(nil, 1, protowire.BytesType), a.GetValue())
		}
	})
	return msg
}

// opaqueResolver resolves a type URL it does not know to the bytes value.
type opaqueResolver struct{ vanguard.TypeResolver }

func (r opaqueResolver) FindMessageByURL(url string) (protoreflect.MessageType, error) {
	if mt, err := r.TypeResolver.FindMessageByURL(url); err == nil {
		return mt, nil
	}
	return (&wrapperspb.BytesValue{}).ProtoReflect().Type(), nil
}

// eachAny calls f with every Any in m, however deep.
func eachAny(m protoreflect.Message, f func(*anypb.Any)) {
	if a, ok := m.Interface().(*anypb.Any); ok {
		f(a)
		return
	}
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		switch {
		case fd.IsMap():
			if fd.MapValue().Message() != nil {
				v.Map().Range(func(_ protoreflect.MapKey, mv protoreflect.Value) bool {
					eachAny(mv.Message(), f)
					return true
				})
			}
		case fd.Message() == nil:
		case fd.IsList():
			for i := range v.List().Len() {
				eachAny(v.List().Get(i).Message(), f)
			}
		default:
			eachAny(v.Message(), f)
		}
		return true
	})
}
