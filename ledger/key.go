package ledger

import (
	"fmt"
	"strings"

	"github.com/idemledger/idemledger/ledger/errcode"
)

// Scope is what a record belongs to: the authenticated namespace, the
// tenant and the idempotency key. One scope never sees another's records.
type Scope struct {
	Namespace string // the authenticated caller, never a request field
	Tenant    string // the customer account the write acts for
	Key       string // the idempotency key
}

func (s Scope) String() string { return s.Namespace + "/" + s.Tenant + "/" + s.Key }

// MaxKeyBytes is the most bytes a key, a tenant or a namespace may have.
const MaxKeyBytes = 255

// MaxFingerprintBytes is the most bytes a fingerprint may have.
const MaxFingerprintBytes = 128

// MaxMethodBytes is the most bytes a method name may have.
const MaxMethodBytes = 255

// MaxKeySourceBytes is the most bytes a key's source may have.
const MaxKeySourceBytes = 128

// printable reports whether s is 1 to max bytes of printable ASCII
// (0x21 to 0x7E), and if not, why.
func printable(s string, limit int) string {
	switch {
	case s == "":
		return "is empty"
	case len(s) > limit:
		return fmt.Sprintf("is %d bytes, more than %d", len(s), limit)
	}
	for i := range len(s) {
		if c := s[i]; c < 0x21 || c > 0x7e {
			return fmt.Sprintf("has byte 0x%02x at %d; only printable ASCII 0x21-0x7E is allowed", c, i)
		}
	}
	return ""
}

// ValidateKey returns KEY_MISSING for an empty key and KEY_INVALID for a key
// that is longer than limit bytes or not printable ASCII (0x21 to 0x7E).
func ValidateKey(key string, limit int) error {
	if key == "" {
		return errcode.Errorf(errcode.KeyMissing, "idempotency key is missing")
	}
	if why := printable(key, limit); why != "" {
		return errcode.Errorf(errcode.KeyInvalid, "idempotency key %s", why)
	}
	return nil
}

// ValidateScope checks every part of s: VALIDATION_FAILED for a bad
// namespace or tenant, KEY_MISSING or KEY_INVALID for a bad key.
func ValidateScope(s Scope, maxKey int) error {
	if why := printable(s.Namespace, MaxKeyBytes); why != "" {
		return errcode.Errorf(errcode.ValidationFailed, "namespace %s", why)
	}
	if why := printable(s.Tenant, MaxKeyBytes); why != "" {
		return errcode.Errorf(errcode.ValidationFailed, "tenant %s", why)
	}
	return ValidateKey(s.Key, maxKey)
}

// ValidateFingerprint checks that fp is a digest under a named profile: a
// lowercase letter and a version number ("v1", "j1", "b1"), ":" and a
// digest of letters, digits and "-_+/=". The profiles v1 (protobuf), j1
// (JSON, RFC 8785) and b1 (raw bytes) are SHA-256 as 64 lowercase hex
// digits; other profiles are accepted as they come, so that a new one
// needs no new ledger.
func ValidateFingerprint(fp string) error {
	if why := printable(fp, MaxFingerprintBytes); why != "" {
		return errcode.Errorf(errcode.ValidationFailed, "fingerprint %s", why)
	}
	profile, digest, ok := strings.Cut(fp, ":")
	if !ok || len(profile) < 2 || profile[0] < 'a' || profile[0] > 'z' || strings.Trim(profile[1:], "0123456789") != "" || digest == "" {
		return errcode.Errorf(errcode.ValidationFailed, "fingerprint must look like <profile>:<digest>, such as v1:<64 hex digits>")
	}
	for i := range len(digest) {
		c := digest[i]
		if ('a' > c || c > 'z') && ('A' > c || c > 'Z') && ('0' > c || c > '9') && strings.IndexByte("-_+/=", c) < 0 {
			return errcode.Errorf(errcode.ValidationFailed, "fingerprint digest has byte 0x%02x at %d", c, i)
		}
	}
	switch profile {
	case "v1", "j1", "b1":
		if len(digest) != 64 || strings.Trim(digest, "0123456789abcdef") != "" {
			return errcode.Errorf(errcode.ValidationFailed, "a %s fingerprint is 64 lowercase hex digits of SHA-256, got %d bytes", profile, len(digest))
		}
	}
	return nil
}

// ValidateKeySource checks a key's source: empty, or 1 to
// MaxKeySourceBytes of printable ASCII. The adapters name them "argument",
// "parameter", "meta", "host:<_meta key>", "header", "pointer:<JSON
// Pointer>" and "metadata".
func ValidateKeySource(s string) error {
	if len(s) > MaxKeySourceBytes {
		return errcode.Errorf(errcode.ValidationFailed, "key_source is longer than %d bytes", MaxKeySourceBytes)
	}
	for i := range len(s) {
		if c := s[i]; c < 0x20 || c > 0x7e {
			return errcode.Errorf(errcode.ValidationFailed, "key_source has byte 0x%02x at %d; only printable ASCII is allowed", c, i)
		}
	}
	return nil
}

// ValidateMethod checks that m names an operation: 1 to 255 bytes of
// printable ASCII, spaces allowed inside. The adapters name them by
// convention: "/pkg.Service/Method" for gRPC, "mcp:tools/<tool>" for MCP,
// "http:<METHOD> <route pattern>" for HTTP.
func ValidateMethod(m string) error {
	if m == "" || len(m) > MaxMethodBytes {
		return errcode.Errorf(errcode.ValidationFailed, "method must be 1 to %d bytes", MaxMethodBytes)
	}
	if strings.TrimSpace(m) != m {
		return errcode.Errorf(errcode.ValidationFailed, "method starts or ends with a space")
	}
	for i := range len(m) {
		if c := m[i]; c < 0x20 || c > 0x7e {
			return errcode.Errorf(errcode.ValidationFailed, "method has byte 0x%02x at %d; only printable ASCII is allowed", c, i)
		}
	}
	return nil
}
