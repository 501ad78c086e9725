// Package fingerprint computes the versioned digests that bind an
// idempotency key to the request it was first used with. The prefix of a
// fingerprint names its profile, so a change of profile is KEY_REUSED,
// never a silent second run:
//
//   - "v1:" (Proto): SHA-256 over the method and a canonical walk of a
//     protobuf message, for gRPC;
//   - "j1:" (JSON): SHA-256 over the method and the RFC 8785 (JCS)
//     canonical form of a JSON value, for MCP tool arguments and JSON
//     HTTP bodies;
//   - "b1:" (Bytes): SHA-256 over the method, the media type and the raw
//     bytes, for any other HTTP body.
//
// Every function here is safe for concurrent use.
package fingerprint

import (
	"cmp"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"hash"
	"math"
	"slices"
	"strings"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/dynamicpb"
	"google.golang.org/protobuf/types/known/anypb"
)

// ProtoVersion prefixes every Proto fingerprint. A change to the walk that
// changes any print is a new version.
const ProtoVersion = "v1"

const anyName protoreflect.FullName = "google.protobuf.Any"

// Resolver finds the descriptor of a message type by its full name, for
// the Any fields of a request.
type Resolver func(protoreflect.FullName) (protoreflect.MessageDescriptor, bool)

// ProtoOptions shape a Proto fingerprint. The zero value works.
type ProtoOptions struct {
	// Skip names top-level fields left out of the print: the field that
	// carries the idempotency key.
	Skip []protoreflect.Name
	// Resolve finds the types of the Anys the request holds. nil resolves
	// the messages declared in the request's own file and the files it
	// imports (Related): a rule that depends only on the request's
	// definition, never on which other types a binary happens to link, so
	// two builds of a service print every request alike.
	Resolve Resolver
}

// Proto returns the canonical fingerprint of a request to method (a full
// gRPC method name, "/pkg.Service/Method"): "v1:" and the hex SHA-256 of the
// method and a walk of msg.
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
//   - an Any whose type the resolver knows is walked as the message it
//     holds; any other Any is walked as its type URL and bytes;
//   - unknown fields are ignored.
func Proto(method string, msg proto.Message, o ProtoOptions) string {
	h := sha256.New()
	w := walker{h: h, resolve: o.Resolve}
	w.bytes('S', []byte(method))
	if msg != nil {
		m := msg.ProtoReflect()
		if w.resolve == nil {
			w.resolve = Related(m.Descriptor().ParentFile())
		}
		w.message(m, o.Skip)
	}
	return ProtoVersion + ":" + hex.EncodeToString(h.Sum(nil))
}

// Related resolves the messages declared in file and in the files it
// imports, transitively.
func Related(file protoreflect.FileDescriptor) Resolver {
	seen := map[protoreflect.FullName]protoreflect.MessageDescriptor{}
	var addMessages func(ms protoreflect.MessageDescriptors)
	addMessages = func(ms protoreflect.MessageDescriptors) {
		for i := range ms.Len() {
			md := ms.Get(i)
			seen[md.FullName()] = md
			addMessages(md.Messages())
		}
	}
	files := map[string]bool{}
	var addFile func(f protoreflect.FileDescriptor)
	addFile = func(f protoreflect.FileDescriptor) {
		if f == nil || files[f.Path()] {
			return
		}
		files[f.Path()] = true
		addMessages(f.Messages())
		for i := range f.Imports().Len() {
			addFile(f.Imports().Get(i).FileDescriptor)
		}
	}
	addFile(file)
	return func(name protoreflect.FullName) (protoreflect.MessageDescriptor, bool) {
		md, ok := seen[name]
		return md, ok
	}
}

// FromTypes resolves the message types of types (a registry the service
// chose, such as the one it gave the interceptor with WithRegistry).
func FromTypes(types *protoregistry.Types) Resolver {
	return func(name protoreflect.FullName) (protoreflect.MessageDescriptor, bool) {
		mt, err := types.FindMessageByName(name)
		if err != nil {
			return nil, false
		}
		return mt.Descriptor(), true
	}
}

type walker struct {
	h       hash.Hash
	resolve Resolver
	buf     [binary.MaxVarintLen64 + 1]byte
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
	if m.Descriptor().FullName() == anyName {
		a := &anypb.Any{TypeUrl: m.Get(m.Descriptor().Fields().ByNumber(1)).String(), Value: m.Get(m.Descriptor().Fields().ByNumber(2)).Bytes()}
		if w.anyMessage(a) {
			return
		}
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

// anyMessage walks the message an Any holds when the resolver knows its
// type and its bytes parse as it; otherwise the Any is walked as the
// message it is (its type URL and bytes).
func (w *walker) anyMessage(a *anypb.Any) bool {
	if w.resolve == nil {
		return false
	}
	url := a.GetTypeUrl()
	md, ok := w.resolve(protoreflect.FullName(url[strings.LastIndexByte(url, '/')+1:]))
	if !ok {
		return false
	}
	inner := dynamicpb.NewMessage(md)
	if err := (proto.UnmarshalOptions{}).Unmarshal(a.GetValue(), inner); err != nil {
		return false
	}
	w.bytes('A', []byte(url))
	w.message(inner, nil)
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
