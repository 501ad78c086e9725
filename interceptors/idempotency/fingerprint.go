package idempotency

import (
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/idemledger/idemledger/interceptors/fingerprint"
)

// FingerprintVersion prefixes every fingerprint the interceptor computes.
const FingerprintVersion = fingerprint.ProtoVersion

// Fingerprint returns the canonical fingerprint of a request to method (a
// full gRPC method name), as the interceptor computes it without
// WithRegistry: fingerprint.Proto with the top-level fields in skip (the
// key's field) left out, and the Anys of the request resolved among the
// messages of the request's own file and its imports.
func Fingerprint(method string, msg proto.Message, skip ...protoreflect.Name) string {
	return fingerprint.Proto(method, msg, fingerprint.ProtoOptions{Skip: skip})
}
