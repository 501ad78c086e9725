package pebble

import (
	"bytes"
	"context"
	"encoding/binary"
	"slices"
	"time"

	pebbledb "github.com/cockroachdb/pebble/v2"

	"github.com/idemledger/idemledger/ledger"
	"github.com/idemledger/idemledger/ledger/pebble/internal/recordkv"
)

// prefix is the key prefix of a namespace's records, or of a tenant's.
func prefix(namespace, tenant string) []byte {
	b := binary.AppendUvarint(bytes.Clone(recordPrefix), uint64(len(namespace)))
	b = append(b, namespace...)
	if tenant != "" {
		b = binary.AppendUvarint(b, uint64(len(tenant)))
		b = append(b, tenant...)
	}
	return b
}

// upperBound is the least key above every key that starts with pre.
func upperBound(pre []byte) []byte {
	end := bytes.Clone(pre)
	for i := len(end) - 1; i >= 0; i-- {
		if end[i] < 0xff {
			end[i]++
			return end[:i+1]
		}
	}
	return nil // every byte 0xff: no bound
}

// decodeAt decodes the record at an iterator's position.
func decodeAt(it *pebbledb.Iterator) (ledger.Record, error) {
	scope, err := recordkv.DecodeScopeKey(it.Key()[len(recordPrefix):])
	if err != nil {
		return ledger.Record{}, err
	}
	v, err := it.ValueAndErr()
	if err != nil {
		return ledger.Record{}, err
	}
	return recordkv.Decode(scope, v)
}

// List implements ledger.Store: the records under the namespace's
// (or tenant's) prefix, in key order, from one consistent view.
func (s *Store) List(ctx context.Context, p ledger.ListParams) (ledger.ListPage, error) {
	if err := ctx.Err(); err != nil {
		return ledger.ListPage{}, s.classify("list", err)
	}
	var page ledger.ListPage
	err := s.with(func(db *pebbledb.DB) error {
		l := ledger.NewLister(p, s.cfg.Now())
		pre := prefix(p.Namespace, p.Tenant)
		it, err := db.NewIter(&pebbledb.IterOptions{LowerBound: pre, UpperBound: upperBound(pre)})
		if err != nil {
			return err
		}
		defer it.Close()
		valid := it.First()
		if p.After != (ledger.Scope{}) {
			after := recordKey(p.After)
			if valid = it.SeekGE(after); valid && bytes.Equal(it.Key(), after) {
				valid = it.Next()
			}
		}
		for ; valid && !l.Full(); valid = it.Next() {
			rec, err := decodeAt(it)
			if err != nil {
				return err
			}
			l.Add(&rec)
		}
		page = l.Page
		return it.Error()
	})
	if err != nil {
		return ledger.ListPage{}, s.classify("list", err)
	}
	return page, nil
}

// purgeBatch is how many records one batch of Purge erases.
const purgeBatch = 128

// Purge implements ledger.Store. It walks the key's record, or the
// tenant's, purgeBatch records at a time, and erases each batch in one
// synced batch under the locks of its records' stripes until its sync has
// ended: no read answers that a record is gone before its erasure is
// durable, writers wait for one batch at a time, and a tenant's purge
// holds one batch of keys in memory, however many records the tenant has.
func (s *Store) Purge(ctx context.Context, p ledger.PurgeParams) (ledger.PurgeResult, error) {
	var res ledger.PurgeResult
	now := s.cfg.Now()
	if p.Scope.Key != "" {
		if err := ctx.Err(); err != nil {
			return ledger.PurgeResult{}, s.classify("purge", err)
		}
		if err := s.purge([][]byte{recordKey(p.Scope)}, now, p.Limit, &res); err != nil {
			return ledger.PurgeResult{}, s.classify("purge", err)
		}
		return res, nil
	}
	pre := prefix(p.Scope.Namespace, p.Scope.Tenant)
	for from, end := pre, upperBound(pre); from != nil; {
		if err := ctx.Err(); err != nil {
			return ledger.PurgeResult{}, s.classify("purge", err) // the batches before are erased
		}
		keys, next, err := s.keys(from, end, purgeBatch)
		if err == nil {
			err = s.purge(keys, now, p.Limit, &res)
		}
		if err != nil {
			return ledger.PurgeResult{}, s.classify("purge", err)
		}
		from = next
	}
	return res, nil
}

// keys lists up to n keys from from (inclusive) to end, and where the next
// listing starts: nil unless it listed n.
func (s *Store) keys(from, end []byte, n int) (keys [][]byte, next []byte, err error) {
	err = s.with(func(db *pebbledb.DB) error {
		it, err := db.NewIter(&pebbledb.IterOptions{LowerBound: from, UpperBound: end})
		if err != nil {
			return err
		}
		for valid := it.First(); valid && len(keys) < n; valid = it.Next() {
			keys = append(keys, bytes.Clone(it.Key()))
		}
		return it.Close()
	})
	if n > 0 && len(keys) == n {
		next = append(bytes.Clone(keys[n-1]), 0) // the first key after the last
	}
	return keys, next, err
}

// purge erases, in one synced batch, the records at keys that may be
// purged while res.Purged is under limit, and counts them in res.
func (s *Store) purge(keys [][]byte, now time.Time, limit int, res *ledger.PurgeResult) error {
	// The stripes are locked in their order: whoever else holds a
	// stripe's lock holds no other, or took it in the same order.
	at := make([]uint64, len(keys))
	for i, key := range keys {
		at[i] = s.stripeAt(key)
	}
	var locked []*stripe
	for _, i := range slices.Compact(slices.Sorted(slices.Values(at))) {
		st := &s.locks[i]
		st.Lock()
		defer st.Unlock()
		locked = append(locked, st)
	}
	return s.with(func(db *pebbledb.DB) error {
		b := db.NewBatch()
		defer b.Close()
		var erased []int
		for i, key := range keys {
			scope, err := recordkv.DecodeScopeKey(key[len(recordPrefix):])
			if err != nil {
				return err
			}
			rec, err := s.locks[at[i]].read(db, scope, key)
			switch {
			case err != nil:
				return err
			case rec == nil:
				continue
			case !rec.Purgeable(now):
				res.Skipped++
				continue
			case res.Purged >= limit:
				res.More = true // past the limit: only counting what is left
				continue
			}
			if rec.View(now) != ledger.StateAbsent {
				res.Purged++
			}
			if err := b.Delete(indexKey(rec, key), nil); err != nil {
				return err
			}
			if err := b.Delete(key, nil); err != nil {
				return err
			}
			erased = append(erased, i)
		}
		if len(erased) == 0 {
			return nil
		}
		for _, st := range locked {
			st.syncing.Add(1)
		}
		defer func() { // after wrote, for settled
			for _, st := range locked {
				st.syncing.Add(-1)
			}
		}()
		err := s.commit(b, pebbledb.Sync)
		for _, i := range erased {
			s.locks[at[i]].wrote(keys[i], nil)
		}
		if err == nil {
			s.mark.ack(b)
		}
		return err
	})
}

// CountByState implements ledger.Store, from one consistent view.
func (s *Store) CountByState(ctx context.Context) (ledger.Census, error) {
	if err := ctx.Err(); err != nil {
		return nil, s.classify("census", err)
	}
	counts := ledger.Census{}
	err := s.with(func(db *pebbledb.DB) error {
		now := s.cfg.Now()
		it, err := db.NewIter(&pebbledb.IterOptions{LowerBound: recordPrefix, UpperBound: upperBound(recordPrefix)})
		if err != nil {
			return err
		}
		defer it.Close()
		for valid := it.First(); valid; valid = it.Next() {
			rec, err := decodeAt(it)
			if err != nil {
				return err
			}
			if st := rec.View(now); st != ledger.StateAbsent {
				counts.Add(rec.Scope.Namespace, st)
			}
		}
		return it.Error()
	})
	if err != nil {
		return nil, s.classify("census", err)
	}
	return counts, nil
}
