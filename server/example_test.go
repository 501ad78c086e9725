package server_test

import (
	"fmt"
	"strings"

	"github.com/idemledger/idemledger/server"
)

// A token file holds only hashes: HashToken makes the first field of a
// line for a token.
func ExampleParseTokens() {
	line := server.HashToken("s3cret") + " billing acme,globex\n"
	tokens, err := server.ParseTokens(strings.NewReader(line))
	fmt.Println(strings.HasPrefix(line, "sha256:"), strings.Contains(line, "s3cret"), tokens != nil, err)
	// Output: true false true <nil>
}
