package bufpool_test

import (
	"fmt"
	"testing"

	"google.golang.org/grpc/mem"

	"github.com/idemledger/idemledger/internal/bufpool"
)

// TestGetSizes: a slice lent has the length asked and a capacity of the
// next power of two, at least 256 B; one over 16 MiB has just its length.
func TestGetSizes(t *testing.T) {
	for _, tc := range []struct{ n, cap int }{
		{0, 256}, {1, 256}, {256, 256}, {257, 512}, {4096, 4096}, {4097, 8192},
		{256 << 10, 256 << 10}, {256<<10 + 10, 512 << 10}, {16 << 20, 16 << 20}, {16<<20 + 1, 16<<20 + 1},
	} {
		buf := bufpool.Pool.Get(tc.n)
		if len(*buf) != tc.n || cap(*buf) != tc.cap {
			t.Errorf("Get(%d): len %d cap %d, want len %d cap %d", tc.n, len(*buf), cap(*buf), tc.n, tc.cap)
		}
		bufpool.Pool.Put(buf)
	}
}

// TestPutKeepsOnlyItsOwn: a slice given back is lent again at its tier,
// with its length set to the one asked; a slice of another capacity is
// dropped, not lent short.
func TestPutKeepsOnlyItsOwn(t *testing.T) {
	odd := make([]byte, 1000)
	bufpool.Pool.Put(&odd)
	for range 100 {
		buf := bufpool.Pool.Get(600)
		if len(*buf) != 600 || cap(*buf) != 1024 {
			t.Fatalf("Get(600): len %d cap %d, want 600 and 1024", len(*buf), cap(*buf))
		}
		*buf = (*buf)[:10] // a borrower may give back a prefix
		bufpool.Pool.Put(buf)
	}
}

// BenchmarkGetPut: a buffer for a message of 1 KiB and for one that
// carries a 256 KiB outcome, from gRPC's default pool (which clears what
// it lends, from a 1 MiB tier for the latter) and from Pool.
func BenchmarkGetPut(b *testing.B) {
	for _, n := range []int{1 << 10, 256<<10 + 64} {
		for _, p := range []struct {
			name string
			pool mem.BufferPool
		}{{"grpc", mem.DefaultBufferPool()}, {"bufpool", bufpool.Pool}} {
			b.Run(fmt.Sprintf("%s/%dB", p.name, n), func(b *testing.B) {
				b.SetBytes(int64(n))
				for b.Loop() {
					buf := p.pool.Get(n)
					(*buf)[n-1] = 1
					p.pool.Put(buf)
				}
			})
		}
	}
}
