package pebble

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	pebbledb "github.com/cockroachdb/pebble/v2"

	"github.com/idemledger/idemledger/ledger/pebble/internal/recordkv"
)

// WatermarkFileName is the file beside the store that records how far its
// write-ahead log reached: the sequence number after the last write
// acknowledged, rewritten every Config.WatermarkInterval while Run runs,
// and at Close. A store that opens behind it lost acknowledged writes
// (its log was deleted, cut short or damaged), and Open refuses it.
const WatermarkFileName = "ledger.seq"

// watermark tracks the sequence after the last acknowledged write, and
// the value its file holds.
type watermark struct {
	path  string
	acked atomic.Uint64
	mu    sync.Mutex // one writer of the file at a time
	saved uint64     // under mu
}

// ack notes a batch committed with an fsync.
func (w *watermark) ack(b *pebbledb.Batch) {
	next := uint64(b.SeqNum()) + uint64(b.Count())
	for {
		cur := w.acked.Load()
		if next <= cur || w.acked.CompareAndSwap(cur, next) {
			return
		}
	}
}

// save writes the watermark durably if it moved.
func (w *watermark) save() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	v := w.acked.Load()
	if v == w.saved {
		return nil
	}
	if err := recordkv.WriteMarker(w.path, strconv.FormatUint(v, 10)); err != nil {
		return fmt.Errorf("pebble: watermark: %w", err)
	}
	w.saved = v
	return nil
}

// openWatermark checks db against the watermark in dir: a store whose
// sequence is behind it lost the acknowledged writes in between. Without
// a watermark file (a new store, or the file removed to accept a loss),
// the store's sequence becomes the watermark.
func openWatermark(db *pebbledb.DB, dir string) (*watermark, error) {
	w := &watermark{path: filepath.Join(dir, WatermarkFileName)}
	at := visibleSeq(db)
	b, err := os.ReadFile(w.path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return nil, fmt.Errorf("pebble: watermark: %w", err)
	default:
		want, perr := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
		if perr != nil {
			return nil, refuse("%s is not a sequence number (%q): restore it from a backup, or remove it to skip this check once", w.path, b)
		}
		if at < want {
			return nil, refuse("%s opened at sequence %d, behind the %d that %s says it had acknowledged: "+
				"its write-ahead log was deleted, cut short or damaged, and up to %d acknowledged writes with it. "+
				"Restore the directory from a backup; removing %s accepts the loss, and the writes of the lost records run again on their retries",
				filepath.Join(dir, DirName), at, want, w.path, want-at, w.path)
		}
		w.saved = want
	}
	w.acked.Store(at)
	if err := w.save(); err != nil {
		return nil, err
	}
	return w, nil
}

// visibleSeq is the sequence number the next write gets: one past every
// write the store holds.
func visibleSeq(db *pebbledb.DB) uint64 {
	snap := db.NewSnapshot()
	defer snap.Close()
	return uint64(db.Metrics().Snapshots.EarliestSeqNum)
}
