package server

import (
	"strings"
	"sync"
	"unicode/utf8"

	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/idemledger/idemledger/internal/protocodec"
	"github.com/idemledger/idemledger/ledger/errcode"
)

// Codec returns the gRPC codec of LedgerService: protobuf, with buffers
// that are not cleared before they are written (a large outcome is not
// cleared twice over on its way in), and with one exception: a request
// whose string fields are not valid UTF-8 is decoded anyway and marked, so
// that the server answers it with a typed error (KEY_INVALID for the key,
// VALIDATION_FAILED for any other field) instead of gRPC's untyped
// INTERNAL, which no caller can act on. TransportOptions install it.
func Codec() encoding.CodecV2 { return codec{protocodec.Codec()} }

type codec struct{ encoding.CodecV2 }

// badUTF8 marks the requests Codec let through: the path of the first
// field that was not UTF-8, by request. The server takes the mark off
// when it answers the request (takeBadUTF8).
var badUTF8 sync.Map // proto.Message -> string

func (c codec) Unmarshal(data mem.BufferSlice, v any) error {
	err := c.CodecV2.Unmarshal(data, v)
	msg, ok := v.(proto.Message)
	if err == nil || !ok || !strings.Contains(err.Error(), "UTF-8") {
		return err
	}
	clean, path := validUTF8(msg.ProtoReflect().Descriptor(), data.Materialize(), "")
	if path == "" {
		return err
	}
	if uerr := proto.Unmarshal(clean, msg); uerr != nil {
		return err
	}
	badUTF8.Store(msg, path)
	return nil
}

// takeBadUTF8 returns the typed error for a request Codec marked, and takes
// the mark off; nil for any other request.
func takeBadUTF8(req proto.Message) error {
	v, ok := badUTF8.LoadAndDelete(req)
	if !ok {
		return nil
	}
	path := v.(string)
	if path == "key" || strings.HasSuffix(path, ".key") {
		return errcode.Errorf(errcode.KeyInvalid, "idempotency key is not valid UTF-8; only printable ASCII 0x21-0x7E is allowed")
	}
	return errcode.Errorf(errcode.ValidationFailed, "%s is not valid UTF-8", path)
}

// hasBadUTF8 reports whether Codec marked req.
func hasBadUTF8(req proto.Message) bool {
	_, ok := badUTF8.Load(req)
	return ok
}

// validUTF8 returns b, a message of md's type, with every string field that
// is not valid UTF-8 made valid, and the path of the first such field ("" if
// none). Fields it does not know are copied as they are.
func validUTF8(md protoreflect.MessageDescriptor, b []byte, prefix string) ([]byte, string) {
	out := make([]byte, 0, len(b))
	first := ""
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return nil, ""
		}
		m := protowire.ConsumeFieldValue(num, typ, b[n:])
		if m < 0 {
			return nil, ""
		}
		field := b[:n+m]
		b = b[n+m:]
		fd := md.Fields().ByNumber(num)
		if typ != protowire.BytesType || fd == nil {
			out = append(out, field...)
			continue
		}
		v, _ := protowire.ConsumeBytes(field[n:])
		path := prefix + string(fd.Name())
		switch fd.Kind() {
		case protoreflect.StringKind:
			if !utf8.Valid(v) {
				v = []byte(strings.ToValidUTF8(string(v), "\uFFFD"))
				if first == "" {
					first = path
				}
			}
		case protoreflect.MessageKind:
			var bad string
			if v, bad = validUTF8(fd.Message(), v, path+"."); v == nil {
				return nil, ""
			}
			if first == "" {
				first = bad
			}
		}
		out = protowire.AppendTag(out, num, typ)
		out = protowire.AppendBytes(out, v)
	}
	return out, first
}
