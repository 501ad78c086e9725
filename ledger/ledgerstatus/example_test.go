package ledgerstatus_test

import (
	"fmt"
	"time"

	"github.com/idemledger/idemledger/ledger/errcode"
	"github.com/idemledger/idemledger/ledger/ledgerstatus"
)

// A typed error becomes a gRPC status with its details, and a caller reads
// the type, the retryable flag and the retry-after back from it.
func ExampleErr() {
	err := ledgerstatus.Err(&errcode.Error{Code: errcode.InProgress, Message: "another attempt holds the key", RetryAfter: 250 * time.Millisecond})
	le := ledgerstatus.FromError(err)
	fmt.Println(le.Code, le.Retryable(), le.RetryAfter, ledgerstatus.Pushback(le))
	// Output: IN_PROGRESS true 250ms 250
}
