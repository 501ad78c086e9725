// Package syncbuf is a buffer that several goroutines may write and read.
package syncbuf

import (
	"bytes"
	"sync"
)

// Buffer is a bytes.Buffer that several goroutines may write and read,
// such as a logger's output that a test inspects while servers run.
type Buffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

// Write appends p to the buffer.
func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// String returns what was written so far.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
