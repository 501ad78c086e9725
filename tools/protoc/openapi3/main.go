// Command openapi3 converts the OpenAPI 2.0 document that
// protoc-gen-openapiv2 writes into OpenAPI 3.0 (kin-openapi's conversion),
// validated, for oapi-codegen and for readers that take 3.0 only.
//
//	openapi3 in.swagger.json out.openapi3.json
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"

	"github.com/getkin/kin-openapi/openapi2"
	"github.com/getkin/kin-openapi/openapi2conv"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "openapi3:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	if len(args) != 2 {
		return fmt.Errorf("usage: openapi3 in.swagger.json out.openapi3.json")
	}
	b, err := os.ReadFile(args[0])
	if err != nil {
		return err
	}
	var v2 openapi2.T
	if err := json.Unmarshal(b, &v2); err != nil {
		return fmt.Errorf("%s: %w", args[0], err)
	}
	v3, err := openapi2conv.ToV3(&v2)
	if err != nil {
		return err
	}
	if err := v3.Validate(context.Background()); err != nil {
		return fmt.Errorf("the OpenAPI 3.0 document does not validate: %w", err)
	}
	out, err := json.MarshalIndent(v3, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(args[1], append(out, '\n'), 0o644)
}
