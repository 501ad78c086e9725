// Package bufpool lends byte slices that are not cleared: for a borrower
// that writes every byte of a buffer before it reads it, which gRPC's
// pools (they clear what they lend) and make (it zeroes) are not for.
package bufpool

import (
	"math/bits"
	"sync"

	"google.golang.org/grpc/mem"
)

// Pool lends byte slices whose capacity is the next power of two of the
// length asked, from 256 B to 16 MiB, without clearing them: a borrower
// writes a buffer before it reads it. A longer one is allocated and not
// kept.
var Pool mem.BufferPool = &pool{}

const (
	minShift = 8
	maxShift = 24
)

type pool struct {
	tiers [maxShift - minShift + 1]sync.Pool // of *[]byte
}

// tier is the index of the smallest tier of at least n bytes, or -1.
func tier(n int) int {
	switch {
	case n <= 1<<minShift:
		return 0
	case n > 1<<maxShift:
		return -1
	}
	return bits.Len(uint(n-1)) - minShift
}

func (p *pool) Get(n int) *[]byte {
	t := tier(n)
	if t < 0 {
		b := make([]byte, n)
		return &b
	}
	if buf, ok := p.tiers[t].Get().(*[]byte); ok {
		*buf = (*buf)[:n]
		return buf
	}
	b := make([]byte, n, 1<<(t+minShift))
	return &b
}

// Put keeps a slice Get lent, by its capacity, and drops any other.
func (p *pool) Put(buf *[]byte) {
	c := cap(*buf)
	if t := tier(c); t >= 0 && c == 1<<(t+minShift) {
		p.tiers[t].Put(buf)
	}
}
