package bolt

import (
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	bbolt "go.etcd.io/bbolt"

	"github.com/idemledger/idemledger/ledger/internal/recordkv"
)

// IdentityFileName is the marker beside the store's file: the identity of
// the ledger the directory holds. With it, a data directory knows whether
// it was ever initialised, so an emptied, truncated, missing or replaced
// ledger.db is refused instead of silently starting as a new, empty ledger
// (which would run every retry's write again).
const IdentityFileName = "ledger.id"

var (
	metaBucket  = []byte("meta")     // store facts: identity
	identityKey = []byte("identity") // 16 random bytes, hex
)

// ErrRefused is the cause of every refusal to open a data directory whose
// file is not the ledger it should be. errors.Is(err, ErrRefused) tells it
// from an I/O failure worth retrying.
var ErrRefused = errors.New("bolt: refusing to open the store")

func refuse(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrRefused, fmt.Sprintf(format, args...))
}

// checkFile refuses, before bbolt maps it, a file bbolt would crash on or
// read as empty: a file of 0 bytes, one without a valid meta page, or one
// shorter than its meta page says (truncated). bbolt checks none of this
// and faults (SIGSEGV, SIGBUS) on a truncated file.
func checkFile(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return err
	}
	size := st.Size()
	if size == 0 {
		return refuse("%s is empty (0 bytes): it was truncated or replaced; restore it, or move the data directory aside to start a new ledger", path)
	}
	head := make([]byte, 64<<10)
	n, err := io.ReadFull(f, head)
	if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) {
		return err
	}
	head = head[:n]
	m0, ok0 := readMeta(head, 0)
	pageSize := uint64(os.Getpagesize())
	if ok0 {
		pageSize = uint64(m0.pageSize)
	}
	m1, ok1 := readMeta(head, pageSize)
	var m meta
	switch {
	case ok0 && ok1 && m1.txid > m0.txid, !ok0 && ok1:
		m = m1
	case ok0:
		m = m0
	default:
		return refuse("%s is not a ledger file (no valid meta page): it was damaged or replaced", path)
	}
	if need := m.pgid * uint64(m.pageSize); uint64(size) < need {
		return refuse("%s is truncated: %d bytes, but its meta page (transaction %d) needs %d; restore it from a backup", path, size, m.txid, need)
	}
	return nil
}

// meta is the part of a bbolt meta page the size check reads.
type meta struct {
	pageSize   uint32
	pgid, txid uint64
}

// readMeta parses the meta page at off (bbolt's layout: a 16-byte page
// header, then magic, version, page size, flags, the root bucket (16
// bytes), the freelist page, the high-water page id, the transaction id,
// and an FNV-64a checksum of the 56 bytes before it), in the machine's
// byte order, as bbolt writes it.
func readMeta(b []byte, off uint64) (meta, bool) {
	const header, sumOff, size = 16, 56, 64
	if off > uint64(len(b)) || uint64(len(b))-off < header+size {
		return meta{}, false
	}
	p := b[off+header : off+header+size]
	le := binary.NativeEndian
	h := fnv.New64a()
	_, _ = h.Write(p[:sumOff])
	if le.Uint32(p[0:]) != 0xED0CDAED || le.Uint32(p[4:]) != 2 || le.Uint64(p[sumOff:]) != h.Sum64() {
		return meta{}, false
	}
	m := meta{pageSize: le.Uint32(p[8:]), pgid: le.Uint64(p[40:]), txid: le.Uint64(p[48:])}
	return m, m.pageSize >= 512
}

// identity makes sure the file and the marker beside it name the same
// ledger. A new file gets a new identity; a file of an earlier version of
// this store, which has records but no identity, gets one. It returns the
// identity and whether the ledger was created now.
func identity(db *bbolt.DB, dir string, fileIsNew bool) (string, bool, error) {
	marker := filepath.Join(dir, IdentityFileName)
	want, err := os.ReadFile(marker)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		want = nil
	case err != nil:
		return "", false, fmt.Errorf("bolt: read %s: %w", marker, err)
	}
	wantID := strings.TrimSpace(string(want))
	if fileIsNew && wantID != "" {
		return "", false, refuse("%s is missing, but %s says this directory held ledger %s: restore the file, or move the directory aside to start a new ledger", filepath.Join(dir, FileName), marker, wantID)
	}
	var id string
	var created bool
	err = db.Update(func(tx *bbolt.Tx) error {
		b, err := tx.CreateBucketIfNotExists(metaBucket)
		if err != nil {
			return err
		}
		if v := b.Get(identityKey); v != nil {
			id = string(v)
			return nil
		}
		if wantID != "" {
			return refuse("%s has no identity but %s says ledger %s: the file was replaced", filepath.Join(dir, FileName), marker, wantID)
		}
		raw := make([]byte, 16)
		_, _ = rand.Read(raw)
		id = hex.EncodeToString(raw)
		created = fileIsNew
		return b.Put(identityKey, []byte(id))
	})
	if err != nil {
		if errors.Is(err, ErrRefused) {
			return "", false, err
		}
		return "", false, fmt.Errorf("bolt: identity: %w", err)
	}
	if wantID != "" && wantID != id {
		return "", false, refuse("%s belongs to ledger %s, but %s says ledger %s: the file was replaced", filepath.Join(dir, FileName), id, marker, wantID)
	}
	if wantID == "" {
		if err := writeMarker(marker, id); err != nil {
			return "", false, err
		}
	}
	return id, created, nil
}

// writeMarker writes the marker durably (recordkv.WriteMarker).
func writeMarker(path, id string) error {
	if err := recordkv.WriteMarker(path, id); err != nil {
		return fmt.Errorf("bolt: %w", err)
	}
	return nil
}
