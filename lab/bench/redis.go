package bench

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// Redis is the peer a user would pick instead of the ledger: a claim is a
// SET NX with a lease, a completion a SET XX of the outcome, each made
// durable before the answer (appendfsync always, StartRedis).
type Redis struct {
	Client  *redis.Client
	Prefix  string
	Outcome *Outcome // nil: DefaultOutcomeSize
}

// The lease a claim takes, and how long an outcome is kept: the ledger's
// defaults.
const (
	redisLease     = 30 * time.Second
	redisRetention = 24 * time.Hour
)

// Fresh claims a key nobody used and stores its outcome: two commands.
func (r *Redis) Fresh() Op {
	stored := r.Outcome.or().stored
	return func(ctx context.Context, c int, n int64) error {
		key := fmt.Sprintf("%s-f-%d-%d", r.Prefix, c, n)
		ok, err := r.Client.SetNX(ctx, key, "claimed", redisLease).Result()
		if err != nil {
			return err
		}
		if !ok {
			return errors.New("bench: not claimed")
		}
		return r.Client.SetArgs(ctx, key, stored, redis.SetArgs{Mode: "XX", TTL: redisRetention}).Err()
	}
}

// PrepareReplays stores the outcomes Replay reads.
func (r *Redis) PrepareReplays(ctx context.Context) error { return prepareReplays(ctx, r.Fresh()) }

// Replay claims a completed key and gets its outcome back in the same
// command (SET NX GET), as the ledger answers a replay.
func (r *Redis) Replay() Op {
	size := len(r.Outcome.or().stored)
	return func(ctx context.Context, c int, n int64) error {
		key := fmt.Sprintf("%s-f--1-%d", r.Prefix, (int64(c)*7919+n)%ReplayKeys)
		old, err := r.Client.SetArgs(ctx, key, "claimed", redis.SetArgs{Mode: "NX", Get: true, TTL: redisLease}).Result()
		if errors.Is(err, redis.Nil) {
			return errors.New("bench: a completed key was claimed")
		}
		if err == nil && len(old) != size {
			return fmt.Errorf("bench: replayed %d bytes, want %d", len(old), size)
		}
		return err
	}
}

// Hot claims one of HotKeys keys and, when it won, releases it (DEL).
func (r *Redis) Hot() Op {
	return func(ctx context.Context, c int, n int64) error {
		key := fmt.Sprintf("%s-h-%d", r.Prefix, (int64(c)+n)%HotKeys)
		ok, err := r.Client.SetNX(ctx, key, "claimed", redisLease).Result()
		if err != nil || !ok {
			return err
		}
		return r.Client.Del(ctx, key).Err()
	}
}

// StartRedis starts a throwaway redis-server on loopback with its
// append-only file in dir and no snapshots. appendfsync is Redis's
// setting of that name: "always" makes each write durable before it
// answers; "no" leaves the writes to the OS, which measures what Redis
// costs without its disk. pid is its process's; stop kills it.
func StartRedis(ctx context.Context, dir, appendfsync string) (addr string, pid int, stop func(), err error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return "", 0, nil, err
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", 0, nil, err
	}
	port := l.Addr().(*net.TCPAddr).Port
	_ = l.Close()
	cmd := exec.Command(bin, "--bind", "127.0.0.1", "--port", strconv.Itoa(port), "--dir", dir,
		"--appendonly", "yes", "--appendfsync", appendfsync, "--save", "", "--protected-mode", "yes",
		"--logfile", filepath.Join(dir, "redis.log"))
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Start(); err != nil {
		return "", 0, nil, err
	}
	stop = func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }
	addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	c := redis.NewClient(&redis.Options{Addr: addr})
	defer c.Close()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	for {
		if err = c.Ping(ctx).Err(); err == nil {
			return addr, cmd.Process.Pid, stop, nil
		}
		select {
		case <-ctx.Done():
			stop()
			return "", 0, nil, fmt.Errorf("redis-server did not answer on %s: %w", addr, err)
		case <-time.After(20 * time.Millisecond):
		}
	}
}
