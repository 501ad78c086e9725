package idemclient_test

import (
	"context"
	"fmt"

	"github.com/idemledger/idemledger/interceptors/idemclient"
)

// One key per intent: attach it once, and every call and retry made with
// the context carries it.
func ExampleWithKey() {
	ctx := idemclient.WithKey(context.Background(), "0193c6f4-5a8e-7d21-9b3f-2f1c0e8a4d77")
	key, ok := idemclient.KeyFromContext(ctx)
	fmt.Println(key, ok)
	_, ok = idemclient.KeyFromContext(context.Background())
	fmt.Println(ok)
	// Output:
	// 0193c6f4-5a8e-7d21-9b3f-2f1c0e8a4d77 true
	// false
}
