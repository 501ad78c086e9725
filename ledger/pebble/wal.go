package pebble

import (
	"fmt"
	"io"
	"strings"
	"sync"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// Every acknowledged transition waits for an fdatasync of Pebble's
// write-ahead log. An fdatasync that overwrites blocks the file already
// has flushes the data alone; one that appends must also make the file's
// new size and its new blocks durable, a journal commit more
// (docs/performance.md has what each costs). Pebble recycles its obsolete
// logs for that reason, so a store that has run a while writes its log in
// place; but a store just opened has nothing to recycle, and its first
// logs would append for their first tens of megabytes.
//
// So Open readies spareLogs zero-filled files, each as large as a log
// gets (Pebble's own preallocation, 1.1 memtables), and Pebble's next new
// logs take them instead of empty files: the log Open starts, and the one
// after the first memtable, by which time Pebble has a log of its own to
// recycle. Pebble reads a log up to its first zeroed chunk, as it reads a
// preallocated or recycled one.
const spareLogs = 2

// lockName is the file the store locks in its directory before it
// touches the spares, and holds until Close: a second process that opens
// the directory fails there, before it can write a spare the first one is
// taking.
const lockName = "idemledger-lock"

// sparePrefix names the spare logs in the store's directory: Pebble leaves
// alone a name it does not know.
const sparePrefix = "idemledger-spare-log-"

func spareName(i int) string { return fmt.Sprint(sparePrefix, i) }

// logFS is the store's file system as Pebble sees it: a new log takes a
// spare while one is left.
type logFS struct {
	vfs.FS
	lock   io.Closer
	mu     sync.Mutex
	spares []string // paths of the spares ready, taken from the end
}

var _ vfs.FS = (*logFS)(nil)

// readySpares locks dir and writes the spare logs of size bytes in it,
// afresh: one left by an earlier run may not have been written whole. A
// disk without room for them gets fewer, or none: the logs then start
// empty. Close lets go of the lock.
func readySpares(fs vfs.FS, dir string, size int64) (*logFS, error) {
	if err := fs.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("pebble: store directory: %w", err)
	}
	lock, err := fs.Lock(fs.PathJoin(dir, lockName))
	if err != nil {
		return nil, fmt.Errorf("pebble: %s is in use by another store: %w", dir, err)
	}
	l := &logFS{FS: fs, lock: lock}
	zeros := make([]byte, min(size, 1<<20))
	for i := range spareLogs {
		path := fs.PathJoin(dir, spareName(i))
		if err := writeZeros(fs, path, zeros, size); err != nil {
			_ = fs.Remove(path)
			break
		}
		l.spares = append(l.spares, path)
	}
	return l, nil
}

// writeZeros writes size zero bytes to a new file at path, durably.
func writeZeros(fs vfs.FS, path string, zeros []byte, size int64) error {
	f, err := fs.Create(path, vfs.WriteCategoryUnspecified)
	if err != nil {
		return err
	}
	for n := int64(0); n < size && err == nil; n += int64(len(zeros)) {
		_, err = f.Write(zeros[:min(int64(len(zeros)), size-n)])
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// Create implements vfs.FS: a log takes a spare, renamed to its name and
// written from its start, while one is left.
func (l *logFS) Create(name string, category vfs.DiskWriteCategory) (vfs.File, error) {
	if strings.HasSuffix(l.PathBase(name), ".log") {
		if spare := l.take(); spare != "" && l.Rename(spare, name) == nil {
			return l.OpenReadWrite(name, category)
		}
	}
	return l.FS.Create(name, category)
}

// take takes a spare, "" when none is left.
func (l *logFS) take() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.spares) == 0 {
		return ""
	}
	spare := l.spares[len(l.spares)-1]
	l.spares = l.spares[:len(l.spares)-1]
	return spare
}

// close removes the spares no log took, and lets go of the lock.
func (l *logFS) close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, spare := range l.spares {
		_ = l.Remove(spare)
	}
	l.spares = nil
	_ = l.lock.Close()
}

// Unwrap implements vfs.FS.
func (l *logFS) Unwrap() vfs.FS { return l.FS }
