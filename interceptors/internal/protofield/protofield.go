// Package protofield reads and writes a message's top-level string field
// by name: where the interceptors find an idempotency key (AIP-155's
// request_id) or a tenant.
package protofield

import (
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// field returns msg's singular top-level string field called name, or nil.
func field(msg proto.Message, name protoreflect.Name) protoreflect.FieldDescriptor {
	if msg == nil || name == "" {
		return nil
	}
	fd := msg.ProtoReflect().Descriptor().Fields().ByName(name)
	if fd == nil || fd.Kind() != protoreflect.StringKind || fd.IsList() || fd.IsMap() {
		return nil
	}
	return fd
}

// String returns the top-level string field of msg called name, or "" when
// there is none or it is empty.
func String(msg proto.Message, name protoreflect.Name) string {
	if fd := field(msg, name); fd != nil {
		return msg.ProtoReflect().Get(fd).String()
	}
	return ""
}

// SetString sets the top-level string field of msg called name to v, and
// reports whether msg has such a field.
func SetString(msg proto.Message, name protoreflect.Name, v string) bool {
	fd := field(msg, name)
	if fd == nil {
		return false
	}
	msg.ProtoReflect().Set(fd, protoreflect.ValueOfString(v))
	return true
}
