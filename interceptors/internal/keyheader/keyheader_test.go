package keyheader

import (
	"strings"
	"testing"

	"github.com/idemledger/idemledger/ledger/errcode"
)

// TestForms holds the boundary cases of docs/contract.md's
// "Keys as clients send them": an sf-string, or the whole trimmed unquoted value of
// 1 to 255 printable ASCII bytes without '"', ',' or ';'.
func TestForms(t *testing.T) {
	t.Parallel()
	longest := strings.Repeat("k", 255)
	for _, c := range []struct {
		name   string
		values []string // the header's lines; nil for none
		want   string   // the key; "" with ok for none
		ok     bool
	}{
		{"no header", nil, "", true},
		{"sf-string", []string{`"8e03978e-40d5-43e8-bc93-6894a57f9324"`}, "8e03978e-40d5-43e8-bc93-6894a57f9324", true},
		{"bare UUID starting with a digit", []string{"0e03978e-40d5-43e8-bc93-6894a57f9324"}, "0e03978e-40d5-43e8-bc93-6894a57f9324", true},
		{"stripe-go's own key", []string{"1796182444475302461_B8TIFA"}, "1796182444475302461_B8TIFA", true},
		{"digits only", []string{"1234"}, "1234", true},
		{"a token", []string{"k-token"}, "k-token", true},
		{"trimmed", []string{" \tk-1 \t"}, "k-1", true},
		{"sf-string trimmed", []string{`  "k-1"  `}, "k-1", true},
		{"sf-string with an escaped quote", []string{`"a\"b"`}, `a"b`, true},
		{"every printable byte but the three", []string{"!#$%&'()*+-./09:<=>?@AZ[\\]^_`az{|}~"}, "!#$%&'()*+-./09:<=>?@AZ[\\]^_`az{|}~", true},
		{"255 bytes", []string{longest}, longest, true},
		{"256 bytes", []string{longest + "k"}, "", false},
		{"empty", []string{""}, "", false},
		{"blank", []string{"  "}, "", false},
		{"empty sf-string", []string{`""`}, "", false},
		{"unterminated", []string{`"unterminated`}, "", false},
		{"a list", []string{`"k", "j"`}, "", false},
		{"a bare list", []string{"k,j"}, "", false},
		{"parameters", []string{"k;a=1"}, "", false},
		{"sf-string with parameters", []string{`"k";a=1`}, "", false},
		{"a quote inside", []string{`a"b`}, "", false},
		{"a space inside", []string{"bad key"}, "", false},
		{"a control byte", []string{"k\x01"}, "", false},
		{"non-ASCII", []string{"clé"}, "", false},
		{"two header lines", []string{"k", "k"}, "", false},
		{"sf-integer", []string{`"k" 1`}, "", false},
	} {
		t.Run(c.name, func(t *testing.T) {
			key, err := Parse("Idempotency-Key", c.values)
			switch {
			case c.ok && (err != nil || key != c.want):
				t.Fatalf("%q: %q, %v; want %q", c.values, key, err, c.want)
			case !c.ok && errcode.Of(err) != errcode.KeyInvalid:
				t.Fatalf("%q: %q, %v; want KEY_INVALID", c.values, key, err)
			}
		})
	}
}

// FuzzParse: any header lines give a key or KEY_INVALID, never a panic; a
// key is printable ASCII of 1 to 255 bytes, and its sf-string reads back
// as the same key.
func FuzzParse(f *testing.F) {
	for _, s := range []string{`"k"`, "k", "1796182444475302461_B8TIFA", `"a\"b"`, "k;a=1", `"k", "j"`, " ", `"`} {
		f.Add(s, "")
	}
	f.Add("k", "k")
	f.Fuzz(func(t *testing.T, a, b string) {
		values := []string{a}
		if b != "" {
			values = append(values, b)
		}
		key, err := Parse("Idempotency-Key", values)
		if err != nil {
			if errcode.Of(err) != errcode.KeyInvalid {
				t.Fatalf("%q: %v, want KEY_INVALID", values, err)
			}
			return
		}
		if len(values) > 1 || len(key) > 255 || (key == "" && strings.TrimSpace(a) != "") {
			t.Fatalf("%q: the key %q", values, key)
		}
		for i := range len(key) {
			if key[i] < 0x20 || key[i] > 0x7e {
				t.Fatalf("%q: the key %q has byte 0x%02x", values, key, key[i])
			}
		}
		if key == "" {
			return
		}
		quoted := `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(key) + `"`
		if again, err := Parse("Idempotency-Key", []string{quoted}); err != nil || again != key {
			t.Fatalf("%q: the key %q quoted reads back as %q, %v", values, key, again, err)
		}
	})
}
