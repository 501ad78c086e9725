package idempotency

import (
	"cmp"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"hash"
	"math"
	"slices"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/anypb"
)

// FingerprintVersion prefixes every fingerprint this package computes. A
// change to the walk below that changes any print is a new version.
const FingerprintVersion = "v1"

// Fingerprint returns the canonical fingerprint of a request to method (a
// full gRPC method name, "/pkg.Service/Method"): "v1:" and the hex SHA-256
// of the method and a walk of msg. Top-level fields named in skip (the
// idempotency key's field) are left out.
//
// The walk does not depend on how the message was encoded, so the print is
// stable across builds, languages and protobuf versions, which
// proto.Marshal bytes and protojson are not:
//   - fields in field-number order, each as its number, its kind and its
//     value; fields that are not populated (proto3 zero values included)
//     are left out, so an unset field and a zero one print alike;
//   - repeated fields in order; map entries sorted by key;
//   - strings and bytes length-prefixed; numbers as fixed-width big-endian;
//     floats by their IEEE bits, with every NaN alike;
//   - an Any whose type is registered is walked as the message it holds,
//     otherwise as its type URL and bytes;
//   - unknown fields are ignored.
//
// It is safe for concurrent use.
func Fingerprint(method string, msg proto.Message, skip ...protoreflect.Name) string {
	h := sha256.New()
	w := walker{h: h}
	w.bytes('S', []byte(method))
	if msg != nil {
		w.message(msg.ProtoReflect(), skip)
	}
	return FingerprintVersion + ":" + hex.EncodeToString(h.Sum(nil))
}

type walker struct {
	h   hash.Hash
	buf [binary.MaxVarintLen64 + 1]byte
}

func (w *walker) tag(kind byte, n uint64) {
	w.buf[0] = kind
	k := binary.PutUvarint(w.buf[1:], n)
	w.h.Write(w.buf[:1+k])
}

func (w *walker) fixed(kind byte, v uint64) {
	w.buf[0] = kind
	binary.BigEndian.PutUint64(w.buf[1:9], v)
	w.h.Write(w.buf[:9])
}

func (w *walker) bytes(kind byte, b []byte) {
	w.tag(kind, uint64(len(b)))
	w.h.Write(b)
}

// message writes {fields…}: a start, each populated field in number order,
// an end.
func (w *walker) message(m protoreflect.Message, skip []protoreflect.Name) {
	if a, ok := m.Interface().(*anypb.Any); ok && w.anyMessage(a) {
		return
	}
	w.tag('{', 0)
	fields := m.Descriptor().Fields()
	order := make([]protoreflect.FieldDescriptor, 0, fields.Len())
	for i := range fields.Len() {
		fd := fields.Get(i)
		if m.Has(fd) && !slices.Contains(skip, fd.Name()) {
			order = append(order, fd)
		}
	}
	slices.SortFunc(order, func(a, b protoreflect.FieldDescriptor) int { return cmp.Compare(a.Number(), b.Number()) })
	for _, fd := range order {
		w.tag('#', uint64(fd.Number()))
		w.field(fd, m.Get(fd))
	}
	w.tag('}', 0)
}

// anyMessage walks the message an Any holds when its type is registered.
func (w *walker) anyMessage(a *anypb.Any) bool {
	inner, err := a.UnmarshalNew()
	if err != nil {
		return false
	}
	w.bytes('A', []byte(a.GetTypeUrl()))
	w.message(inner.ProtoReflect(), nil)
	return true
}

func (w *walker) field(fd protoreflect.FieldDescriptor, v protoreflect.Value) {
	switch {
	case fd.IsList():
		list := v.List()
		w.tag('[', uint64(list.Len()))
		for i := range list.Len() {
			w.value(fd, list.Get(i))
		}
	case fd.IsMap():
		m := v.Map()
		keys := make([]protoreflect.MapKey, 0, m.Len())
		m.Range(func(k protoreflect.MapKey, _ protoreflect.Value) bool {
			keys = append(keys, k)
			return true
		})
		slices.SortFunc(keys, compareKeys)
		w.tag('<', uint64(len(keys)))
		for _, k := range keys {
			w.value(fd.MapKey(), k.Value())
			w.value(fd.MapValue(), m.Get(k))
		}
	default:
		w.value(fd, v)
	}
}

func (w *walker) value(fd protoreflect.FieldDescriptor, v protoreflect.Value) {
	switch fd.Kind() {
	case protoreflect.BoolKind:
		var b uint64
		if v.Bool() {
			b = 1
		}
		w.fixed('b', b)
	case protoreflect.EnumKind:
		w.fixed('e', uint64(v.Enum()))
	case protoreflect.Int32Kind, protoreflect.Sint32Kind, protoreflect.Sfixed32Kind,
		protoreflect.Int64Kind, protoreflect.Sint64Kind, protoreflect.Sfixed64Kind:
		w.fixed('i', uint64(v.Int()))
	case protoreflect.Uint32Kind, protoreflect.Fixed32Kind, protoreflect.Uint64Kind, protoreflect.Fixed64Kind:
		w.fixed('u', v.Uint())
	case protoreflect.FloatKind, protoreflect.DoubleKind:
		f := v.Float()
		if math.IsNaN(f) {
			f = math.NaN()
		}
		w.fixed('f', math.Float64bits(f))
	case protoreflect.StringKind:
		w.bytes('s', []byte(v.String()))
	case protoreflect.BytesKind:
		w.bytes('y', v.Bytes())
	case protoreflect.MessageKind, protoreflect.GroupKind:
		w.message(v.Message(), nil)
	}
}

// compareKeys orders map keys of one kind: bools, integers or strings.
func compareKeys(a, b protoreflect.MapKey) int {
	switch x := a.Interface().(type) {
	case bool:
		return cmp.Compare(boolInt(x), boolInt(b.Bool()))
	case int32, int64:
		return cmp.Compare(a.Int(), b.Int())
	case uint32, uint64:
		return cmp.Compare(a.Uint(), b.Uint())
	}
	return cmp.Compare(a.String(), b.String())
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}
