// Package keyheader reads an Idempotency-Key header as stock clients send
// it, for every HTTP-borne adapter (httpguard, connectguard).
package keyheader

import (
	"strings"

	"github.com/dunglas/httpsfv"

	"github.com/idemledger/idemledger/ledger"
	"github.com/idemledger/idemledger/ledger/errcode"
)

// Parse returns the key that the header's values hold: "" for none; else
// one header line holding either a structured-field string
// ("8e03978e-…", RFC 9651) or, unquoted, the whole value with its
// surrounding whitespace trimmed, when it is 1 to ledger.MaxKeyBytes bytes
// of printable ASCII without '"', ',' or ';' (a bare UUID, stripe-go's
// "1796182444475302461_B8TIFA"). Two header lines, a list, parameters and
// anything else are KEY_INVALID. name is the header's, for the message.
func Parse(name string, values []string) (string, error) {
	if len(values) == 0 {
		return "", nil
	}
	invalid := errcode.Errorf(errcode.KeyInvalid, "the %s header must be one key: a structured-field string such as \"8e03978e-40d5-43e8-bc93-6894a57f9324\", or the key unquoted (1 to %d bytes of printable ASCII without '\"', ',' or ';')", name, ledger.MaxKeyBytes)
	if len(values) > 1 {
		return "", invalid
	}
	v := strings.Trim(values[0], " \t")
	if !strings.HasPrefix(v, `"`) {
		if !bare(v) {
			return "", invalid
		}
		return v, nil
	}
	item, err := httpsfv.UnmarshalItem([]string{v})
	if err != nil || len(item.Params.Names()) > 0 {
		return "", invalid
	}
	if key, ok := item.Value.(string); ok && key != "" {
		return key, nil
	}
	return "", invalid
}

// bare reports whether v is an unquoted key: 1 to ledger.MaxKeyBytes bytes
// of printable ASCII (0x21 to 0x7E) other than '"', ',' and ';'.
func bare(v string) bool {
	if v == "" || len(v) > ledger.MaxKeyBytes {
		return false
	}
	for i := range len(v) {
		if c := v[i]; c < 0x21 || c > 0x7e || c == '"' || c == ',' || c == ';' {
			return false
		}
	}
	return true
}
