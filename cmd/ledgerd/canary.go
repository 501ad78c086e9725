package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/idemledger/idemledger/ledger"
	"github.com/idemledger/idemledger/server"
)

// canary is ledgerd's readiness write: a claim and its release of a key of
// its own, in a namespace no credentials may name, through the same store
// calls a write service makes. Each check uses a new key, so every check
// writes; the released records expire after a minute and are swept.
type canary struct {
	instance string
	n        atomic.Uint64
}

// canaryNamespace is the reserved namespace of the canary.
const canaryNamespace = server.ReservedPrefix + "ledgerd"

func newCanary() *canary {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return &canary{instance: hex.EncodeToString(b)}
}

// write claims a new key and releases it; an error means the store cannot
// take a write now.
func (c *canary) write(ctx context.Context, s ledger.Store) error {
	sc := ledger.Scope{Namespace: canaryNamespace, Tenant: "canary", Key: fmt.Sprintf("%s-%d", c.instance, c.n.Add(1))}
	res, err := s.Claim(ctx, ledger.ClaimParams{
		Scope: sc, Fingerprint: "v1:" + strings.Repeat("0", 64), Method: "ledgerd/readiness",
		Lease: time.Second, Retention: time.Minute,
	})
	if err != nil {
		return fmt.Errorf("canary claim: %w", err)
	}
	if !res.Claimed {
		return fmt.Errorf("canary claim: the store did not claim a new key")
	}
	if err := s.Release(ctx, ledger.ReleaseParams{Scope: sc, Token: res.Record.Token}); err != nil {
		return fmt.Errorf("canary release: %w", err)
	}
	return nil
}
