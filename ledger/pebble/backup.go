package pebble

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"

	pebbledb "github.com/cockroachdb/pebble/v2"
)

// Backup is what Store.Backup wrote.
type Backup struct {
	// Dir is the backup: a data directory, to be opened as it is.
	Dir string
	// Bytes is the size of its files (hard links of the store's tables
	// share their blocks with the store until compaction moves on).
	Bytes int64
	// Sequence is the store's acknowledged writes when it began: the
	// backup holds every one of them.
	Sequence uint64
}

// Backup writes an online backup of the store to dest, which must not
// exist: a Pebble checkpoint of the store (its tables hard-linked where the
// file system allows, its write-ahead log flushed into it), beside the
// markers of a data directory, so that Open(dest) opens it as this ledger,
// with every write acknowledged before Backup was called. Writes go on
// meanwhile.
//
// A ledger restored from a backup has lost the records written after it:
// a retry of one of those intents runs its write again (docs/ledgerd.md,
// "Back up and restore").
func (s *Store) Backup(dest string) (b Backup, err error) {
	defer func() {
		if r := recover(); r != nil { // a fatal error of Pebble's is an error here
			err = fmt.Errorf("pebble: backup: %v", r)
		}
	}()
	if _, err := os.Stat(dest); !errors.Is(err, fs.ErrNotExist) {
		return Backup{}, fmt.Errorf("pebble: backup: %s exists: a backup goes to a new directory", dest)
	}
	if err := os.MkdirAll(dest, 0o700); err != nil {
		return Backup{}, fmt.Errorf("pebble: backup: %w", err)
	}
	acked := s.mark.acked.Load()
	if err := s.db.Checkpoint(filepath.Join(dest, DirName), pebbledb.WithFlushedWAL()); err != nil {
		return Backup{}, fmt.Errorf("pebble: backup: %w", err)
	}
	// The markers: this ledger's identity, and the sequence the backup
	// reaches at least, which Open checks it against (a backup cut short
	// is refused, not opened as if whole).
	if err := writeMarker(filepath.Join(dest, IdentityFileName), s.id); err != nil {
		return Backup{}, err
	}
	if err := writeFileSynced(filepath.Join(dest, WatermarkFileName), []byte(strconv.FormatUint(acked, 10)+"\n")); err != nil {
		return Backup{}, err
	}
	b = Backup{Dir: dest, Sequence: acked}
	err = filepath.WalkDir(dest, func(_ string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		info, err := d.Info()
		if err == nil {
			b.Bytes += info.Size()
		}
		return err
	})
	return b, err
}

// writeFileSynced writes data to path and syncs it and its directory.
func writeFileSynced(path string, data []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("pebble: backup: %w", err)
	}
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("pebble: backup: %w", err)
	}
	d, err := os.Open(filepath.Dir(path))
	if err != nil {
		return fmt.Errorf("pebble: backup: %w", err)
	}
	defer d.Close()
	return d.Sync()
}
