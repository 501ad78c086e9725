package fingerprint_test

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"

	"github.com/idemledger/idemledger/interceptors/fingerprint"
)

const tool = "mcp:tools/create_invoice"

func canonical(t *testing.T, in string, skip ...string) string {
	t.Helper()
	out, err := fingerprint.CanonicalJSON([]byte(in), skip...)
	if err != nil {
		t.Fatalf("CanonicalJSON(%s): %v", in, err)
	}
	return string(out)
}

// TestRFC8785Numbers: the number serialisation examples of RFC 8785,
// appendix B (IEEE 754 bits, and the text JCS writes for them).
func TestRFC8785Numbers(t *testing.T) {
	t.Parallel()
	for bits, want := range map[uint64]string{
		0x0000000000000000: "0",
		0x8000000000000000: "0",
		0x0000000000000001: "5e-324",
		0x8000000000000001: "-5e-324",
		0x7fefffffffffffff: "1.7976931348623157e+308",
		0xffefffffffffffff: "-1.7976931348623157e+308",
		0x4340000000000000: "9007199254740992",
		0xc340000000000000: "-9007199254740992",
		0x4430000000000000: "295147905179352830000",
		0x44b52d02c7e14af5: "9.999999999999997e+22",
		0x44b52d02c7e14af6: "1e+23",
		0x44b52d02c7e14af7: "1.0000000000000001e+23",
		0x444b1ae4d6e2ef4e: "999999999999999700000",
		0x444b1ae4d6e2ef4f: "999999999999999900000",
		0x444b1ae4d6e2ef50: "1e+21",
		0x3eb0c6f7a0b5ed8c: "9.999999999999997e-7",
		0x3eb0c6f7a0b5ed8d: "0.000001",
		0x41b3de4355555553: "333333333.3333332",
		0x41b3de4355555554: "333333333.33333325",
		0x41b3de4355555555: "333333333.3333333",
		0x41b3de4355555556: "333333333.3333334",
		0x41b3de4355555557: "333333333.33333343",
		0xbecbf647612f3696: "-0.0000033333333333333333",
		0x43143ff3c1cb0959: "1424953923781206.2",
	} {
		in := strconv.FormatFloat(math.Float64frombits(bits), 'g', -1, 64)
		if got := canonical(t, in); got != want {
			t.Errorf("%016x (%s): %s, want %s", bits, in, got, want)
		}
	}
	// NaN and the infinities have no JSON text; a number beyond the
	// double range is not I-JSON.
	for _, in := range []string{"NaN", "Infinity", "-Infinity", "1e400"} {
		if _, err := fingerprint.CanonicalJSON([]byte(in)); !errors.Is(err, fingerprint.ErrNotJSON) {
			t.Errorf("%s: %v, want ErrNotJSON", in, err)
		}
	}
}

// TestRFC8785Example: the example of RFC 8785, section 3.2.2: numbers,
// string escaping and literals.
func TestRFC8785Example(t *testing.T) {
	t.Parallel()
	in := `{
  "numbers": [333333333.33333329, 1E30, 4.50,
              2e-3, 0.000000000000000000000000001],
  "string": "\u20ac$\u000F\u000aA'\u0042\u0022\u005c\\\"\/",
  "literals": [null, true, false]
}`
	want := `{"literals":[null,true,false],"numbers":[333333333.3333333,1e+30,4.5,0.002,1e-27],"string":"€$\u000f\nA'B\"\\\\\"/"}`
	if got := canonical(t, in); got != want {
		t.Fatalf("got  %s\nwant %s", got, want)
	}
}

// TestRFC8785Ordering: member names sorted by their UTF-16 code units,
// section 3.2.3, where UTF-8 byte order and UTF-16 order differ.
func TestRFC8785Ordering(t *testing.T) {
	t.Parallel()
	in := `{
  "\u20ac": "Euro Sign",
  "\r": "Carriage Return",
  "\ufb33": "Hebrew Letter Dalet With Dagesh",
  "1": "One",
  "\ud83d\ude00": "Emoji: Grinning Face",
  "\u0080": "Control",
  "\u00f6": "Latin Small Letter O With Diaeresis"
}`
	want := "{\"\\r\":\"Carriage Return\",\"1\":\"One\",\"\u0080\":\"Control\",\"ö\":\"Latin Small Letter O With Diaeresis\"," +
		"\"€\":\"Euro Sign\",\"😀\":\"Emoji: Grinning Face\",\"\ufb33\":\"Hebrew Letter Dalet With Dagesh\"}"
	if got := canonical(t, in); got != want {
		t.Fatalf("got  %s\nwant %s", got, want)
	}
	// Skipping a member canonicalizes the rest again, in the same order.
	if got := canonical(t, in, "1"); got != strings.Replace(want, `"1":"One",`, "", 1) {
		t.Fatalf("with a member skipped: %s", got)
	}
}

func TestJSONFingerprint(t *testing.T) {
	t.Parallel()
	fp := func(in string, skip ...string) string {
		t.Helper()
		fp, err := fingerprint.JSON(tool, []byte(in), skip...)
		if err != nil {
			t.Fatalf("JSON(%s): %v", in, err)
		}
		return fp
	}
	base := fp(`{"a":1,"b":[true,"x"]}`)
	if !strings.HasPrefix(base, "j1:") || len(base) != 67 {
		t.Fatalf("fingerprint %q", base)
	}
	for _, same := range []string{
		`{"b":[true,"x"],"a":1}`,
		`{"a":1.0,"b":[true,"x"]}`,
		`{ "a" : 10E-1 , "b" : [ true , "\u0078" ] }`,
		`{"a":1,"b":[true,"x"],"idempotency_key":"k-1"}`,
	} {
		if got := fp(same, "idempotency_key"); got != base {
			t.Errorf("%s prints %s, want %s", same, got, base)
		}
	}
	for _, other := range []string{
		`{"a":1,"b":[true,"x"],"c":null}`, // null differs from absent
		`{"a":"1","b":[true,"x"]}`,
		`{"a":1,"b":["x",true]}`, // arrays keep their order
		`{"a":1,"b":[true,"x "]}`,
		`{"a":1,"b":[true,"x"],"idempotency_key":"k-1"}`, // not skipped
	} {
		if got := fp(other); got == base {
			t.Errorf("%s prints as %s", other, base)
		}
	}
	other, err := fingerprint.JSON("mcp:tools/refund", []byte(`{"a":1,"b":[true,"x"]}`))
	if err != nil || other == base {
		t.Fatalf("another method prints alike: %v", err)
	}
	if fp("") != fp("null") || fp("  ") != fp("null") {
		t.Fatal("an empty value is not null")
	}
	for _, bad := range []string{`{"a":1,"a":2}`, `{"a":`, "\"\xff\"", `{"a":1} x`, strings.Repeat("[", 10000)} {
		if _, err := fingerprint.JSON(tool, []byte(bad)); !errors.Is(err, fingerprint.ErrNotJSON) {
			t.Errorf("%q: %v, want ErrNotJSON", bad, err)
		}
	}
}

func TestBytesFingerprint(t *testing.T) {
	t.Parallel()
	const method = "http:POST /v1/uploads"
	base := fingerprint.Bytes(method, "text/plain; charset=utf-8", []byte("hello"))
	if !strings.HasPrefix(base, "b1:") || len(base) != 67 {
		t.Fatalf("fingerprint %q", base)
	}
	if got := fingerprint.Bytes(method, "Text/Plain;  charset=utf-8", []byte("hello")); got != base {
		t.Fatal("the media type's spelling changes the print")
	}
	for name, got := range map[string]string{
		"OtherBody":        fingerprint.Bytes(method, "text/plain; charset=utf-8", []byte("hello ")),
		"OtherType":        fingerprint.Bytes(method, "application/octet-stream", []byte("hello")),
		"OtherMethod":      fingerprint.Bytes("http:PUT /v1/uploads", "text/plain; charset=utf-8", []byte("hello")),
		"BoundaryShifted":  fingerprint.Bytes(method, "text/plain; charset=utf-8h", []byte("ello")),
		"JSONProfileAlike": mustJSON(t, method, `"hello"`),
	} {
		if got == base {
			t.Errorf("%s prints alike", name)
		}
	}
}

func mustJSON(t *testing.T, method, in string) string {
	t.Helper()
	fp, err := fingerprint.JSON(method, []byte(in))
	if err != nil {
		t.Fatal(err)
	}
	return fp
}

// FuzzJSONEqualValuesPrintAlike builds a JSON value from the fuzzer's
// seed, writes it twice in two spellings that RFC 8785 holds equal
// (member order, whitespace, number forms, string escapes), and requires
// one fingerprint. A changed leaf must change it.
func FuzzJSONEqualValuesPrintAlike(f *testing.F) {
	for _, seed := range []uint64{0, 1, 42, 1 << 40, math.MaxUint64} {
		f.Add(seed, seed^0x9e3779b97f4a7c15)
	}
	f.Fuzz(func(t *testing.T, shape, spelling uint64) {
		v := genValue(rand.New(rand.NewPCG(shape, 1)), 0)
		a := spell(v, rand.New(rand.NewPCG(spelling, 2)))
		b := spell(v, rand.New(rand.NewPCG(spelling, 3)))
		fa, err := fingerprint.JSON(tool, []byte(a))
		if err != nil {
			t.Fatalf("%s: %v", a, err)
		}
		fb, err := fingerprint.JSON(tool, []byte(b))
		if err != nil {
			t.Fatalf("%s: %v", b, err)
		}
		if fa != fb {
			t.Fatalf("equal values print differently:\n%s\n%s", a, b)
		}
		changed := spell(value{kind: 'a', items: []value{v, {kind: 'n', num: 7}}}, rand.New(rand.NewPCG(spelling, 4)))
		if fc := mustJSON(t, tool, changed); fc == fa {
			t.Fatalf("a different value prints alike: %s", changed)
		}
	})
}

// value is a generated JSON value: kind is one of n(umber), s(tring),
// b(ool), z (null), a(rray), o(bject).
type value struct {
	kind  byte
	num   float64
	str   string
	bool  bool
	items []value
	names []string
}

func genValue(r *rand.Rand, depth int) value {
	kinds := "nsbzao"
	if depth > 3 {
		kinds = "nsbz"
	}
	switch kinds[r.IntN(len(kinds))] {
	case 'n':
		nums := []float64{0, 1, -1, 0.5, 1e21, 1e-7, 333333333.3333333, float64(r.IntN(1 << 20)), r.NormFloat64() * 1e6}
		return value{kind: 'n', num: nums[r.IntN(len(nums))]}
	case 's':
		strs := []string{"", "x", "€uro", "tab\there", "quote\"back\\slash", "😀", "\u0080", "a/b", "line\nfeed"}
		return value{kind: 's', str: strs[r.IntN(len(strs))]}
	case 'b':
		return value{kind: 'b', bool: r.IntN(2) == 0}
	case 'z':
		return value{kind: 'z'}
	case 'a':
		v := value{kind: 'a'}
		for range r.IntN(4) {
			v.items = append(v.items, genValue(r, depth+1))
		}
		return v
	}
	v := value{kind: 'o'}
	seen := map[string]bool{}
	for range r.IntN(5) {
		name := []string{"a", "b", "amount", "€", "😀", "\r", "1", "ö"}[r.IntN(8)]
		if seen[name] {
			continue
		}
		seen[name] = true
		v.names = append(v.names, name)
		v.items = append(v.items, genValue(r, depth+1))
	}
	return v
}

// spell writes v as JSON, choosing at random among equal spellings.
func spell(v value, r *rand.Rand) string {
	var sb strings.Builder
	ws := func() {
		sb.WriteString([]string{"", " ", "\n  ", "\t"}[r.IntN(4)])
	}
	var write func(v value)
	write = func(v value) {
		ws()
		switch v.kind {
		case 'n':
			sb.WriteString(spellNumber(v.num, r))
		case 's':
			sb.WriteString(spellString(v.str, r))
		case 'b':
			sb.WriteString(strconv.FormatBool(v.bool))
		case 'z':
			sb.WriteString("null")
		case 'a':
			sb.WriteByte('[')
			for i, it := range v.items {
				if i > 0 {
					sb.WriteByte(',')
				}
				write(it)
			}
			ws()
			sb.WriteByte(']')
		case 'o':
			order := r.Perm(len(v.items))
			sb.WriteByte('{')
			for i, j := range order {
				if i > 0 {
					sb.WriteByte(',')
				}
				ws()
				sb.WriteString(spellString(v.names[j], r))
				ws()
				sb.WriteByte(':')
				write(v.items[j])
			}
			ws()
			sb.WriteByte('}')
		}
		ws()
	}
	write(v)
	return sb.String()
}

func spellNumber(f float64, r *rand.Rand) string {
	forms := []string{
		strconv.FormatFloat(f, 'g', -1, 64),
		strconv.FormatFloat(f, 'e', -1, 64),
		strings.ToUpper(strconv.FormatFloat(f, 'E', -1, 64)),
	}
	if f == math.Trunc(f) && math.Abs(f) < 1e15 {
		forms = append(forms, strconv.FormatFloat(f, 'f', 1, 64)) // 1.0
	}
	return forms[r.IntN(len(forms))]
}

func spellString(s string, r *rand.Rand) string {
	var sb strings.Builder
	sb.WriteByte('"')
	for _, c := range s {
		escape := r.IntN(3) == 0
		switch {
		case c == '"' || c == '\\':
			sb.WriteByte('\\')
			sb.WriteRune(c)
		case c == '/' && escape:
			sb.WriteString(`\/`)
		case c < 0x20 || escape:
			for _, u := range utf16(c) {
				fmt.Fprintf(&sb, `\u%04x`, u)
			}
		default:
			sb.WriteRune(c)
		}
	}
	sb.WriteByte('"')
	return sb.String()
}

func utf16(c rune) []uint16 {
	if c < 0x10000 {
		return []uint16{uint16(c)}
	}
	c -= 0x10000
	return []uint16{uint16(0xd800 + (c >> 10)), uint16(0xdc00 + (c & 0x3ff))}
}
