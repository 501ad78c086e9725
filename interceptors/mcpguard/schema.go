package mcpguard

import (
	"github.com/google/jsonschema-go/jsonschema"
)

// KeyDescription is the description of a key argument, written for the
// model that fills it in.
const KeyDescription = "Idempotency key of this call: a new random value (such as a UUID) for each new intent, " +
	"and the same value on every retry of that intent, so that it is done once however often it is sent. " +
	"It is not part of the request itself."

// KeySchema returns a copy of an object schema with the key argument
// (name, or DefaultKeyArgument when "") added as an optional string
// property described for a model. Use it as a protected tool's
// InputSchema, for instance over jsonschema.For of the tool's input type.
func KeySchema(schema *jsonschema.Schema, name string) *jsonschema.Schema {
	if name == "" {
		name = DefaultKeyArgument
	}
	out := &jsonschema.Schema{Type: "object"}
	if schema != nil {
		out = schema.CloneSchemas()
	}
	props := make(map[string]*jsonschema.Schema, len(out.Properties)+1)
	for k, v := range out.Properties {
		props[k] = v
	}
	props[name] = &jsonschema.Schema{Type: "string", MinLength: ptr(1), MaxLength: ptr(255), Description: KeyDescription}
	out.Properties = props
	if len(out.PropertyOrder) > 0 {
		out.PropertyOrder = append(append([]string(nil), out.PropertyOrder...), name)
	}
	return out
}

func ptr(n int) *int { return &n }
