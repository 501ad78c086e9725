package fingerprint

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"mime"
	"strings"

	"github.com/gowebpki/jcs"
)

// Profiles of the fingerprints that are not protobuf walks.
const (
	// JSONVersion prefixes every JSON fingerprint.
	JSONVersion = "j1"
	// BytesVersion prefixes every Bytes fingerprint.
	BytesVersion = "b1"
)

// ErrNotJSON is the error of JSON and CanonicalJSON for a value that is
// not I-JSON (RFC 7493): malformed, a duplicate member name, a number out
// of the IEEE double range, a string that is not UTF-8, too deep.
var ErrNotJSON = errors.New("fingerprint: not an I-JSON value")

// CanonicalJSON returns the RFC 8785 (JCS) canonical form of a JSON value,
// with the top-level members named in skip left out when the value is an
// object. Numbers are written as ECMAScript writes doubles ({"a":1.0} is
// {"a":1}), members sorted by their UTF-16 code units, strings escaped
// only where they must be; a null member stays (it differs from an absent
// one). An empty value is JSON null.
func CanonicalJSON(value []byte, skip ...string) ([]byte, error) {
	if len(bytes.TrimSpace(value)) == 0 {
		value = []byte("null")
	}
	canonical, err := jcs.Transform(value)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrNotJSON, err)
	}
	if len(skip) == 0 || canonical[0] != '{' {
		return canonical, nil
	}
	// The canonical object has no duplicate members: decode it, drop the
	// skipped ones, and canonicalize again (encoding/json does not sort
	// members by UTF-16 code units; JCS does).
	var members map[string]json.RawMessage
	if err := json.Unmarshal(canonical, &members); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrNotJSON, err)
	}
	dropped := false
	for _, name := range skip {
		if _, ok := members[name]; ok {
			delete(members, name)
			dropped = true
		}
	}
	if !dropped {
		return canonical, nil
	}
	b, err := json.Marshal(members)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrNotJSON, err)
	}
	return jcs.Transform(b)
}

// JSON returns the fingerprint of a JSON value sent to method (MCP tool
// arguments, a JSON HTTP body): "j1:" and the hex SHA-256 of the method
// and the value's canonical form (CanonicalJSON, with the members in skip
// left out: the argument that carries the idempotency key). Values equal
// under RFC 8785 print alike. A value that is not I-JSON is ErrNotJSON.
func JSON(method string, value []byte, skip ...string) (string, error) {
	canonical, err := CanonicalJSON(value, skip...)
	if err != nil {
		return "", err
	}
	return digest(JSONVersion, method, canonical), nil
}

// Bytes returns the fingerprint of a body that is not JSON (or not
// fingerprinted as JSON): "b1:" and the hex SHA-256 of the method, the
// media type and the raw bytes. The media type is compared as
// mime.ParseMediaType reads it: its type lowercased, its parameters
// sorted, so "Text/Plain; charset=utf-8" is "text/plain; charset=utf-8".
func Bytes(method, contentType string, body []byte) string {
	return digest(BytesVersion, method, []byte(mediaType(contentType)), body)
}

// digest is "<profile>:" and the hex SHA-256 of the profile and the
// parts, each length-prefixed so that no two lists of parts collide.
func digest(profile string, method string, parts ...[]byte) string {
	h := sha256.New()
	frame := func(b []byte) {
		_, _ = fmt.Fprintf(h, "%d:", len(b))
		h.Write(b)
	}
	frame([]byte(profile))
	frame([]byte(method))
	for _, p := range parts {
		frame(p)
	}
	return profile + ":" + hex.EncodeToString(h.Sum(nil))
}

// mediaType is the canonical spelling of a Content-Type value, or the
// value trimmed when it does not parse.
func mediaType(contentType string) string {
	mt, params, err := mime.ParseMediaType(contentType)
	if err != nil {
		return strings.ToLower(strings.TrimSpace(contentType))
	}
	return mime.FormatMediaType(mt, params)
}
