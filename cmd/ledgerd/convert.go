package main

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/idemledger/idemledger/ledger"
	"github.com/idemledger/idemledger/ledger/bolt"
	"github.com/idemledger/idemledger/ledger/pebble"
)

// convertedSuffix is added to ledger.db once its records live in a Pebble
// store: the file stays, as a backup, under a name no engine opens.
const convertedSuffix = ".converted"

// convertingDir is where a conversion builds the Pebble store before it
// moves it into place.
const convertingDir = "converting-to-pebble"

// convertToPebble copies the bolt ledger in dir into a new Pebble store
// with the same identity, before --engine pebble opens it for the first
// time. Every record moves as it is stored (tombstones and leases
// included), so no key is forgotten and no retry runs its write again.
//
// It is safe to interrupt: the copy is made in a directory of its own and
// renamed into place whole; ledger.db is renamed last. Found both with
// the same identity (an interruption between the renames), it finishes.
func convertToPebble(ctx context.Context, dir string, log *slog.Logger) error {
	boltFile, pebbleDir := filepath.Join(dir, bolt.FileName), filepath.Join(dir, pebble.DirName)
	if _, err := os.Stat(boltFile); err != nil {
		return nil // nothing to convert
	}
	src, err := bolt.Open(dir, bolt.Config{})
	if err != nil {
		return err
	}
	defer src.Close()
	id := src.Identity()
	if _, err := os.Stat(pebbleDir); err == nil {
		dst, err := pebble.Open(dir, pebble.Config{})
		if err != nil {
			return err
		}
		same := dst.Identity() == id
		_ = dst.Close()
		if !same {
			return fmt.Errorf("%w: %s holds ledger %s and %s ledger %s; keep one", errOtherEngine, boltFile, id, pebbleDir, dst.Identity())
		}
		log.WarnContext(ctx, "finishing an interrupted conversion to pebble", "data_dir", dir, "identity", id)
		if err := os.RemoveAll(filepath.Join(dir, convertingDir)); err != nil {
			return err
		}
		return retire(src, boltFile)
	}

	work := filepath.Join(dir, convertingDir)
	if err := os.RemoveAll(work); err != nil { // an interrupted copy
		return err
	}
	dst, err := pebble.Open(work, pebble.Config{Identity: id})
	if err != nil {
		return err
	}
	n, err := copyRecords(ctx, src, dst)
	if cerr := dst.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("converting %s to pebble: %w", boltFile, err)
	}
	if err := os.Rename(filepath.Join(work, pebble.DirName), pebbleDir); err != nil {
		return err
	}
	if err := os.Rename(filepath.Join(work, pebble.IdentityFileName), filepath.Join(dir, pebble.IdentityFileName)); err != nil {
		return err
	}
	if err := os.RemoveAll(work); err != nil {
		return err
	}
	log.WarnContext(ctx, "converted the embedded ledger from bolt to pebble", "data_dir", dir, "identity", id, "records", n,
		"backup", boltFile+convertedSuffix)
	return retire(src, boltFile)
}

// copyRecords copies every record of src into dst, a thousand a batch.
func copyRecords(ctx context.Context, src *bolt.Store, dst *pebble.Store) (int, error) {
	const batch = 1000
	var buf []ledger.Record
	n := 0
	flush := func() error {
		if len(buf) == 0 {
			return nil
		}
		err := dst.Load(ctx, buf)
		n += len(buf)
		buf = buf[:0]
		return err
	}
	err := src.Records(ctx, func(r ledger.Record) error {
		if buf = append(buf, r); len(buf) == batch {
			return flush()
		}
		return nil
	})
	if err == nil {
		err = flush()
	}
	return n, err
}

// retire closes src and renames its file, and its marker, out of the way.
func retire(src *bolt.Store, file string) error {
	if err := src.Close(); err != nil {
		return err
	}
	if err := os.Rename(file, file+convertedSuffix); err != nil {
		return err
	}
	marker := filepath.Join(filepath.Dir(file), bolt.IdentityFileName)
	if err := os.Rename(marker, marker+convertedSuffix); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}
