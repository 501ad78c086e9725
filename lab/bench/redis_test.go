package bench

import (
	"os"
	"os/exec"
	"testing"

	"github.com/redis/go-redis/v9"
)

// startRedis starts a throwaway durable redis-server for t: skipped
// without one, failed under CI=true (.ci/run installs it).
func startRedis(t *testing.T) *redis.Client {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("redis-server is not installed")
		}
		t.Skip("redis-server is not installed")
	}
	addr, _, stop, err := StartRedis(t.Context(), t.TempDir(), "always")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	c := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// TestRedisTarget: the Redis peer is durable (appendfsync always), and
// its workloads do what the ledger's do: a fresh key is claimed once and
// holds its outcome, a replay returns that outcome and claims nothing, a
// hot key is claimed and released.
func TestRedisTarget(t *testing.T) {
	c := startRedis(t)
	ctx := t.Context()
	cfg, err := c.ConfigGet(ctx, "appendfsync").Result()
	if err != nil || cfg["appendfsync"] != "always" {
		t.Fatalf("appendfsync = %v (%v), want always", cfg, err)
	}
	r := &Redis{Client: c, Prefix: "t"}
	if err := r.PrepareReplays(ctx); err != nil {
		t.Fatal(err)
	}
	stored, err := c.Get(ctx, "t-f--1-7").Bytes()
	if err != nil || string(stored) != string(defaultOutcome.stored) {
		t.Fatalf("stored %q (%v), want the outcome", stored, err)
	}
	if ttl := c.TTL(ctx, "t-f--1-7").Val(); ttl < redisRetention-redisLease {
		t.Fatalf("outcome kept for %v, want about %v", ttl, redisRetention)
	}
	// Claiming a key twice fails the second time.
	if err := r.Fresh()(ctx, -1, 7); err == nil {
		t.Fatal("a completed key was claimed again")
	}
	for n := range int64(50) {
		if err := r.Replay()(ctx, 3, n); err != nil {
			t.Fatal(err)
		}
		if err := r.Hot()(ctx, 3, n); err != nil {
			t.Fatal(err)
		}
	}
	if got := c.Get(ctx, "t-f--1-7").Val(); got != string(defaultOutcome.stored) {
		t.Fatal("a replay changed the stored outcome")
	}
	if n := c.Exists(ctx, "t-h-0", "t-h-1", "t-h-2", "t-h-3").Val(); n != 0 {
		t.Fatalf("%d hot keys left claimed", n)
	}
	// A replay of a key nobody completed claims it, and says so.
	if err := (&Redis{Client: c, Prefix: "empty"}).Replay()(ctx, 0, 0); err == nil {
		t.Fatal("a replay of a missing key passed")
	}
}

// TestFsyncFloor: a durable page write takes some time, and less than a
// second.
func TestFsyncFloor(t *testing.T) {
	d, err := FsyncFloor(t.TempDir(), 20)
	if err != nil {
		t.Fatal(err)
	}
	if d <= 0 || d > 1e9 {
		t.Fatalf("fsync floor %v", d)
	}
}
