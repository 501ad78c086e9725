package fingerprint_test

import (
	"cmp"
	"fmt"
	"math"
	"regexp"
	"slices"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/idemledger/idemledger/interceptors/fingerprint"
	testpb "github.com/idemledger/idemledger/internal/testpb"
	"github.com/idemledger/idemledger/ledger"
)

const createInvoice = "/idemledger.testing.v1.InvoiceService/CreateInvoice"

// printOf is how the gRPC interceptor prints a request by default.
func printOf(method string, msg proto.Message, skip ...protoreflect.Name) string {
	return fingerprint.Proto(method, msg, fingerprint.ProtoOptions{Skip: skip})
}

func full() *testpb.CreateInvoiceRequest {
	memo := "thanks"
	return &testpb.CreateInvoiceRequest{
		RequestId: "k", Tenant: "acme", CustomerId: "cus_1", Currency: "EUR",
		LineItems: []*testpb.LineItem{{Description: "a", Quantity: 1, UnitAmountMicros: 5}, {Description: "b", Quantity: 2}},
		Labels:    map[string]string{"x": "1", "y": "2", "z": "3"},
		Memo:      &memo, DueAt: timestamppb.New(time.Date(2030, 1, 2, 3, 4, 5, 6, time.UTC)),
		Delivery: &testpb.CreateInvoiceRequest_Email{Email: "ap@acme.test"}, SendNow: true,
		DiscountRate: 0.1, Attachment: []byte{0, 1, 2}, Terms: testpb.Terms_TERMS_NET_30,
		NotesByLine: map[int64]string{-1: "neg", 0: "zero", 7: "seven"},
	}
}

func TestFingerprintIsCanonical(t *testing.T) {
	t.Parallel()
	base := printOf(createInvoice, full())
	if !regexp.MustCompile(`^v1:[0-9a-f]{64}$`).MatchString(base) {
		t.Fatalf("fingerprint %q is not v1:<64 hex>", base)
	}
	if err := ledger.ValidateFingerprint(base); err != nil {
		t.Fatalf("the ledger refuses the fingerprint: %v", err)
	}
	// The same message however it was built or encoded.
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(full())
	if err != nil {
		t.Fatal(err)
	}
	// Put the fields on the wire in descending number order (the elements
	// of a repeated field keep theirs) and add an unknown one.
	type record struct {
		num  protowire.Number
		data []byte
	}
	var records []record
	for rest := b; len(rest) > 0; {
		num, _, n := protowire.ConsumeField(rest)
		records = append(records, record{num, rest[:n]})
		rest = rest[n:]
	}
	slices.SortStableFunc(records, func(a, b record) int { return cmp.Compare(b.num, a.num) })
	var reversed []byte
	for _, r := range records {
		reversed = append(reversed, r.data...)
	}
	reversed = protowire.AppendVarint(protowire.AppendTag(reversed, 999, protowire.VarintType), 5)
	parsed := &testpb.CreateInvoiceRequest{}
	if err := proto.Unmarshal(reversed, parsed); err != nil {
		t.Fatal(err)
	}
	if got := printOf(createInvoice, parsed); got != base {
		t.Fatal("the same message decoded from reordered bytes with an unknown field prints differently")
	}
	for range 20 { // map iteration order is random
		if got := printOf(createInvoice, full()); got != base {
			t.Fatal("the print depends on map order")
		}
	}
	zero := &testpb.CreateInvoiceRequest{Tenant: "acme", SendNow: false, Currency: ""}
	if printOf(createInvoice, zero) != printOf(createInvoice, &testpb.CreateInvoiceRequest{Tenant: "acme"}) {
		t.Fatal("an explicit proto3 zero prints unlike an unset field")
	}

	// Anything else changes it.
	changes := map[string]func(r *testpb.CreateInvoiceRequest){
		"Tenant":      func(r *testpb.CreateInvoiceRequest) { r.Tenant = "globex" },
		"NestedField": func(r *testpb.CreateInvoiceRequest) { r.LineItems[1].Quantity = 3 },
		"ListOrder": func(r *testpb.CreateInvoiceRequest) {
			r.LineItems[0], r.LineItems[1] = r.LineItems[1], r.LineItems[0]
		},
		"ListLength":    func(r *testpb.CreateInvoiceRequest) { r.LineItems = r.LineItems[:1] },
		"EmptyNested":   func(r *testpb.CreateInvoiceRequest) { r.LineItems = append(r.LineItems, &testpb.LineItem{}) },
		"MapValue":      func(r *testpb.CreateInvoiceRequest) { r.Labels["y"] = "3" },
		"MapKey":        func(r *testpb.CreateInvoiceRequest) { delete(r.Labels, "z"); r.Labels["w"] = "3" },
		"IntMapKey":     func(r *testpb.CreateInvoiceRequest) { delete(r.NotesByLine, -1); r.NotesByLine[1] = "neg" },
		"OptionalEmpty": func(r *testpb.CreateInvoiceRequest) { e := ""; r.Memo = &e },
		"OptionalUnset": func(r *testpb.CreateInvoiceRequest) { r.Memo = nil },
		"OneofBranch": func(r *testpb.CreateInvoiceRequest) {
			r.Delivery = &testpb.CreateInvoiceRequest_PostalAddress{PostalAddress: "ap@acme.test"}
		},
		"Timestamp":         func(r *testpb.CreateInvoiceRequest) { r.DueAt.Nanos++ },
		"Bool":              func(r *testpb.CreateInvoiceRequest) { r.SendNow = false },
		"Double":            func(r *testpb.CreateInvoiceRequest) { r.DiscountRate = math.Nextafter(0.1, 1) },
		"Bytes":             func(r *testpb.CreateInvoiceRequest) { r.Attachment = []byte{0, 1} },
		"Enum":              func(r *testpb.CreateInvoiceRequest) { r.Terms = testpb.Terms_TERMS_DUE_ON_RECEIPT },
		"StringBoundary":    func(r *testpb.CreateInvoiceRequest) { r.CustomerId, r.Currency = "cus_1E", "UR" },
		"KeyIsPartOfPrint":  func(r *testpb.CreateInvoiceRequest) { r.RequestId = "other" },
		"NegativeZeroFloat": func(r *testpb.CreateInvoiceRequest) { r.DiscountRate = math.Copysign(0, -1) },
	}
	for name, change := range changes {
		t.Run(name, func(t *testing.T) {
			r := full()
			change(r)
			if printOf(createInvoice, r) == base {
				t.Fatal("the change did not change the print")
			}
		})
	}
	if printOf("/idemledger.testing.v1.InvoiceService/GetInvoice", full()) == base {
		t.Fatal("the method is not part of the print")
	}
	other := full()
	other.RequestId = "another key"
	if printOf(createInvoice, other, "request_id") != printOf(createInvoice, full(), "request_id") {
		t.Fatal("a skipped field changed the print")
	}
}

// TestFingerprintOfAny: an Any whose type the resolver knows prints as
// the message it holds, whatever the order of its fields on the wire; any
// other Any prints by its type URL and bytes.
func TestFingerprintOfAny(t *testing.T) {
	t.Parallel()
	ts := timestamppb.New(time.Date(2030, 1, 2, 0, 0, 0, 0, time.UTC))
	a, err := anypb.New(ts)
	if err != nil {
		t.Fatal(err)
	}
	// The same Timestamp packed with its fields on the wire in another
	// order is the same Any.
	var swapped []byte
	swapped = protowire.AppendVarint(protowire.AppendTag(swapped, 2, protowire.VarintType), uint64(ts.GetNanos()))
	swapped = protowire.AppendVarint(protowire.AppendTag(swapped, 1, protowire.VarintType), uint64(ts.GetSeconds()))
	b := &anypb.Any{TypeUrl: a.GetTypeUrl(), Value: swapped}
	c := &anypb.Any{TypeUrl: a.GetTypeUrl(), Value: append(swapped, protowire.AppendVarint(protowire.AppendTag(nil, 77, protowire.VarintType), 1)...)}
	knows := fingerprint.ProtoOptions{Resolve: fingerprint.Related(timestamppb.File_google_protobuf_timestamp_proto)}
	at := func(m proto.Message) string { return fingerprint.Proto("/x.Y/Z", m, knows) }
	if at(a) != at(b) || at(b) != at(c) {
		t.Fatal("an Any of a known type prints by its encoding")
	}
	// Without the type in the resolver, the bytes are the print.
	if fingerprint.Proto("/x.Y/Z", a, fingerprint.ProtoOptions{}) == fingerprint.Proto("/x.Y/Z", b, fingerprint.ProtoOptions{}) {
		t.Fatal("an Any of an unknown type prints alike for different bytes")
	}
	unknown := &anypb.Any{TypeUrl: "type.googleapis.com/nope.Unknown", Value: []byte{1}}
	if at(unknown) == at(&anypb.Any{TypeUrl: unknown.TypeUrl, Value: []byte{2}}) {
		t.Fatal("an unresolved Any's bytes are not in the print")
	}
}

// TestFingerprintDoesNotDependOnLinkedTypes: two builds of a service, one
// of which links (registers) a type the other does not, print a request
// that carries an Any of that type alike, because the default resolver
// knows only the request's own file and its imports. With an explicit
// registry, the print follows that registry, and two registries that
// differ only in an unrelated type print alike.
func TestFingerprintDoesNotDependOnLinkedTypes(t *testing.T) {
	t.Parallel()
	inner, err := structpb.NewStruct(map[string]any{"b": 2, "a": 1})
	if err != nil {
		t.Fatal(err)
	}
	packed, err := anypb.New(inner)
	if err != nil {
		t.Fatal(err)
	}
	// The request: an Any holding a Struct (linked into this test binary,
	// so in the global registry, but not imported by any.proto).
	req := packed
	withoutLinking := fingerprint.Proto("/x.Y/Z", req, fingerprint.ProtoOptions{Resolve: fingerprint.FromTypes(new(protoregistry.Types))})
	if got := fingerprint.Proto("/x.Y/Z", req, fingerprint.ProtoOptions{}); got != withoutLinking {
		t.Fatal("the default print of an Any depends on the types linked into the binary")
	}
	// Two explicit registries: one with Struct, and one with Struct and an
	// unrelated type.
	one, two := new(protoregistry.Types), new(protoregistry.Types)
	for _, reg := range []*protoregistry.Types{one, two} {
		for _, mt := range []protoreflect.MessageType{(&structpb.Struct{}).ProtoReflect().Type(), (&structpb.Value{}).ProtoReflect().Type(), (&structpb.ListValue{}).ProtoReflect().Type()} {
			if err := reg.RegisterMessage(mt); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := two.RegisterMessage((&timestamppb.Timestamp{}).ProtoReflect().Type()); err != nil {
		t.Fatal(err)
	}
	a := fingerprint.Proto("/x.Y/Z", req, fingerprint.ProtoOptions{Resolve: fingerprint.FromTypes(one)})
	b := fingerprint.Proto("/x.Y/Z", req, fingerprint.ProtoOptions{Resolve: fingerprint.FromTypes(two)})
	if a != b {
		t.Fatal("two registries that differ in an unrelated type print a request apart")
	}
	// Struct is resolved there: its map prints by its entries, not by the
	// order Go put them on the wire.
	reordered := &anypb.Any{TypeUrl: packed.GetTypeUrl(), Value: reverseEntries(t, packed.GetValue())}
	if fingerprint.Proto("/x.Y/Z", reordered, fingerprint.ProtoOptions{Resolve: fingerprint.FromTypes(one)}) != a {
		t.Fatal("a resolved Struct prints by its encoding")
	}
}

// reverseEntries reverses the order of a Struct's map entries on the wire.
func reverseEntries(t *testing.T, b []byte) []byte {
	t.Helper()
	var fields [][]byte
	for rest := b; len(rest) > 0; {
		_, _, n := protowire.ConsumeField(rest)
		if n < 0 {
			t.Fatal("bad wire")
		}
		fields = append(fields, rest[:n])
		rest = rest[n:]
	}
	slices.Reverse(fields)
	return slices.Concat(fields...)
}

// FuzzFingerprint builds a structpb.Struct (maps, lists, nesting, numbers,
// strings, bools, nulls) from the fuzzer's input: a copy built in another
// order prints alike, a copy through the wire prints alike, and changing
// any one value changes the print.
func FuzzFingerprint(f *testing.F) {
	f.Add("a", "b", 1.5, true, uint8(3))
	f.Add("", "x", math.Inf(-1), false, uint8(0))
	f.Add("k", "k", 0.0, true, uint8(200))
	f.Fuzz(func(t *testing.T, k1, k2 string, num float64, flag bool, depth uint8) {
		build := func(reverse bool) *structpb.Struct {
			fields := map[string]*structpb.Value{}
			items := []struct {
				k string
				v *structpb.Value
			}{
				{k1, structpb.NewNumberValue(num)},
				{k2 + "#", structpb.NewBoolValue(flag)},
				{"list", structpb.NewListValue(&structpb.ListValue{Values: []*structpb.Value{structpb.NewStringValue(k1), structpb.NewNullValue(), structpb.NewNumberValue(float64(depth))}})},
			}
			if reverse {
				items[0], items[2] = items[2], items[0]
			}
			for _, it := range items {
				fields[it.k] = it.v
			}
			s := &structpb.Struct{Fields: fields}
			for range depth % 8 {
				s = &structpb.Struct{Fields: map[string]*structpb.Value{k2: structpb.NewStructValue(s)}}
			}
			return s
		}
		base := printOf("/x.Y/Z", build(false))
		if got := printOf("/x.Y/Z", build(true)); got != base {
			t.Fatal("equal messages print differently")
		}
		// Through the wire, when it can go there (strings must be UTF-8).
		if wire, err := proto.Marshal(build(false)); err == nil {
			parsed := &structpb.Struct{}
			if err := proto.Unmarshal(wire, parsed); err != nil {
				t.Fatal(err)
			}
			if got := printOf("/x.Y/Z", parsed); got != base {
				t.Fatal("the message through the wire prints differently")
			}
		}
		// Change each leaf value in turn.
		leaves := 0
		var visit func(m protoreflect.Message)
		visit = func(m protoreflect.Message) {
			m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
				switch {
				case fd.IsMap():
					v.Map().Range(func(_ protoreflect.MapKey, mv protoreflect.Value) bool { visit(mv.Message()); return true })
				case fd.IsList():
					for i := range v.List().Len() {
						visit(v.List().Get(i).Message())
					}
				case fd.Kind() == protoreflect.MessageKind:
					visit(v.Message())
				default:
					leaves++
				}
				return true
			})
		}
		visit(build(false).ProtoReflect())
		for leaf := range leaves {
			changed := build(false)
			n := 0
			var mutate func(m protoreflect.Message) bool
			mutate = func(m protoreflect.Message) bool {
				done := false
				m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
					switch {
					case fd.IsMap():
						v.Map().Range(func(_ protoreflect.MapKey, mv protoreflect.Value) bool { done = mutate(mv.Message()); return !done })
					case fd.IsList():
						for i := 0; i < v.List().Len() && !done; i++ {
							done = mutate(v.List().Get(i).Message())
						}
					case fd.Kind() == protoreflect.MessageKind:
						done = mutate(v.Message())
					default:
						if n == leaf {
							m.Set(fd, flip(fd, v))
							done = true
						}
						n++
					}
					return !done
				})
				return done
			}
			mutate(changed.ProtoReflect())
			if printOf("/x.Y/Z", changed) == base {
				t.Fatalf("changing leaf %d of %d did not change the print", leaf, leaves)
			}
		}
	})
}

// flip returns another value of the field's kind.
func flip(fd protoreflect.FieldDescriptor, v protoreflect.Value) protoreflect.Value {
	switch fd.Kind() {
	case protoreflect.BoolKind:
		return protoreflect.ValueOfBool(!v.Bool())
	case protoreflect.DoubleKind:
		if f := v.Float(); f == 1 || math.IsNaN(f) {
			return protoreflect.ValueOfFloat64(2)
		}
		return protoreflect.ValueOfFloat64(1)
	case protoreflect.StringKind:
		return protoreflect.ValueOfString(v.String() + "x")
	case protoreflect.EnumKind:
		return protoreflect.ValueOfEnum(v.Enum() + 1)
	}
	panic(fmt.Sprintf("flip: kind %s", fd.Kind()))
}
