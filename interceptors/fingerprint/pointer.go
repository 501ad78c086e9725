package fingerprint

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// ErrBadPointer is the error of a JSON Pointer that is not RFC 6901's
// syntax: not empty and not starting with "/", or with a "~" that is not
// "~0" or "~1".
var ErrBadPointer = errors.New("fingerprint: not an RFC 6901 JSON Pointer")

// CheckPointer reports whether ptr is an RFC 6901 JSON Pointer.
func CheckPointer(ptr string) error {
	_, err := tokens(ptr)
	return err
}

// Pointer returns the value at the RFC 6901 JSON Pointer ptr in the JSON
// document doc ("" is the whole document), and whether there is one. A
// document that is not JSON is ErrNotJSON.
func Pointer(doc []byte, ptr string) (json.RawMessage, bool, error) {
	toks, err := tokens(ptr)
	if err != nil {
		return nil, false, err
	}
	cur := json.RawMessage(bytes.TrimSpace(doc))
	if !json.Valid(cur) {
		return nil, false, ErrNotJSON
	}
	for _, tok := range toks {
		switch {
		case len(cur) > 0 && cur[0] == '{':
			var obj map[string]json.RawMessage
			if err := json.Unmarshal(cur, &obj); err != nil {
				return nil, false, fmt.Errorf("%w: %w", ErrNotJSON, err)
			}
			next, ok := obj[tok]
			if !ok {
				return nil, false, nil
			}
			cur = next
		case len(cur) > 0 && cur[0] == '[':
			var arr []json.RawMessage
			if err := json.Unmarshal(cur, &arr); err != nil {
				return nil, false, fmt.Errorf("%w: %w", ErrNotJSON, err)
			}
			i, ok := arrayIndex(tok, len(arr))
			if !ok {
				return nil, false, nil
			}
			cur = arr[i]
		default:
			return nil, false, nil // a scalar has no members
		}
	}
	return cur, true, nil
}

// arrayIndex is the array index a reference token names, in an array of n
// elements: decimal digits without a leading zero ("-", past the end, has
// no value here).
func arrayIndex(tok string, n int) (int, bool) {
	if tok == "" || (len(tok) > 1 && tok[0] == '0') {
		return 0, false
	}
	i, err := strconv.Atoi(tok)
	return i, err == nil && i >= 0 && i < n
}

// tokens splits an RFC 6901 pointer into its reference tokens, unescaped.
func tokens(ptr string) ([]string, error) {
	if ptr == "" {
		return nil, nil
	}
	if ptr[0] != '/' {
		return nil, fmt.Errorf("%w: %q does not start with /", ErrBadPointer, ptr)
	}
	toks := strings.Split(ptr[1:], "/")
	for i, t := range toks {
		for j := range len(t) {
			if t[j] == '~' && (j+1 == len(t) || (t[j+1] != '0' && t[j+1] != '1')) {
				return nil, fmt.Errorf("%w: %q has a ~ that is not ~0 or ~1", ErrBadPointer, ptr)
			}
		}
		toks[i] = strings.ReplaceAll(strings.ReplaceAll(t, "~1", "/"), "~0", "~")
	}
	return toks, nil
}

// JSONParts returns the fingerprint of the parts of a JSON value that the
// pointers name, the rest ignored: "j1:" over the canonical form of an
// object whose members are the pointers and whose values are theirs (a
// pointer with no value is left out, so that absent differs from null).
// Two values alike at every pointer print alike, whatever else differs.
func JSONParts(method string, value []byte, pointers []string) (string, error) {
	parts := make(map[string]json.RawMessage, len(pointers))
	for _, p := range pointers {
		v, ok, err := Pointer(value, p)
		if err != nil {
			return "", err
		}
		if ok {
			parts[p] = v
		}
	}
	b, err := json.Marshal(parts)
	if err != nil {
		return "", fmt.Errorf("%w: %w", ErrNotJSON, err)
	}
	return JSON(method, b)
}
