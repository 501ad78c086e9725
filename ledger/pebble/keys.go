package pebble

// The store's keys and values: a record and its expiry index entry.

import (
	"bytes"
	"errors"
	"io"

	pebbledb "github.com/cockroachdb/pebble/v2"

	"github.com/idemledger/idemledger/ledger"
	"github.com/idemledger/idemledger/ledger/pebble/internal/recordkv"
)

// Keys: a record under 'r' + its scope key, its expiry index entry under
// 'x' + recordkv.ExpiryKey, the ledger's identity under 'm' + "identity".
var (
	recordPrefix = []byte{'r'}
	expiryPrefix = []byte{'x'}
	identityKey  = []byte("midentity")
)

// recordKey is the key of a scope's record.
func recordKey(sc ledger.Scope) []byte {
	return append(bytes.Clone(recordPrefix), recordkv.ScopeKey(sc)...)
}

// indexKey is the key of a record's expiry index entry; key is its
// record key.
func indexKey(rec *ledger.Record, key []byte) []byte {
	return append(bytes.Clone(expiryPrefix), recordkv.ExpiryKey(recordkv.IndexAt(rec), key[len(recordPrefix):])...)
}

// reader is what getRecord reads from: the database or a snapshot.
type reader interface {
	Get(key []byte) ([]byte, io.Closer, error)
}

// get returns a copy of key's value, nil when absent.
func get(r reader, key []byte) ([]byte, error) {
	var out []byte
	err := use(r, key, func(v []byte) error {
		out = bytes.Clone(v)
		return nil
	})
	return out, err
}

// getRecord returns key's record, nil when absent. It decodes Pebble's
// value in place: Decode copies what it keeps.
func getRecord(r reader, scope ledger.Scope, key []byte) (*ledger.Record, error) {
	var rec *ledger.Record
	err := use(r, key, func(v []byte) error {
		d, err := recordkv.Decode(scope, v)
		rec = &d
		return err
	})
	if err != nil {
		return nil, err
	}
	return rec, nil
}

// use hands key's value to f while Pebble holds it (f must copy what it
// keeps), and does nothing when key is absent.
func use(r reader, key []byte, f func(v []byte) error) error {
	v, closer, err := r.Get(key)
	if errors.Is(err, pebbledb.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	defer closer.Close()
	return f(v)
}

// put stores rec in place of cur in b, and moves its expiry index entry
// when its time moved: a Complete writes the record alone.
func put(b *pebbledb.Batch, key []byte, cur, rec *ledger.Record) error {
	v, err := recordkv.Encode(rec)
	if err != nil {
		return err
	}
	if cur == nil || !recordkv.IndexAt(cur).Equal(recordkv.IndexAt(rec)) {
		if cur != nil {
			if err := b.Delete(indexKey(cur, key), nil); err != nil {
				return err
			}
		}
		if err := b.Set(indexKey(rec, key), nil, nil); err != nil {
			return err
		}
	}
	return b.Set(key, v, nil)
}
