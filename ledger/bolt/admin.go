package bolt

import (
	"bytes"
	"context"
	"encoding/binary"

	"go.etcd.io/bbolt"

	"github.com/idemledger/idemledger/ledger"
	"github.com/idemledger/idemledger/ledger/internal/recordkv"
)

var _ ledger.AdminStore = (*Store)(nil)

// prefix is the key prefix of a namespace's rows, or of a tenant's.
func prefix(namespace, tenant string) []byte {
	b := binary.AppendUvarint(nil, uint64(len(namespace)))
	b = append(b, namespace...)
	if tenant != "" {
		b = binary.AppendUvarint(b, uint64(len(tenant)))
		b = append(b, tenant...)
	}
	return b
}

// List implements ledger.AdminStore: the rows under the namespace's (or
// tenant's) prefix, in key order (tenant by tenant, shorter names first),
// in one read transaction.
func (s *Store) List(ctx context.Context, p ledger.ListParams) (ledger.ListPage, error) {
	if err := ctx.Err(); err != nil {
		return ledger.ListPage{}, s.classify("list", err)
	}
	var page ledger.ListPage
	err := waitFor(ctx, func() error {
		return s.db.View(func(tx *bbolt.Tx) error {
			page = ledger.ListPage{Now: s.cfg.Now()}
			pre := prefix(p.Namespace, p.Tenant)
			c := tx.Bucket(recordsBucket).Cursor()
			k, v := c.Seek(pre)
			if p.After != (ledger.Scope{}) {
				after := recordkv.ScopeKey(p.After)
				if k, v = c.Seek(after); bytes.Equal(k, after) {
					k, v = c.Next()
				}
			}
			for ; k != nil && bytes.HasPrefix(k, pre); k, v = c.Next() {
				if page.Scanned == p.Limit {
					page.More = true
					break
				}
				scope, err := recordkv.DecodeScopeKey(k)
				if err != nil {
					return err
				}
				rec, err := recordkv.Decode(scope, v)
				if err != nil {
					return err
				}
				page.Scanned++
				page.Last = scope
				if live, ok := rec.AsOf(page.Now); ok {
					page.Records = append(page.Records, live)
				}
			}
			return nil
		})
	})
	if err != nil {
		return ledger.ListPage{}, s.classify("list", err)
	}
	return page, nil
}

// Purge implements ledger.AdminStore, in one write transaction.
func (s *Store) Purge(ctx context.Context, p ledger.PurgeParams) (ledger.PurgeResult, error) {
	if err := ctx.Err(); err != nil {
		return ledger.PurgeResult{}, s.classify("purge", err)
	}
	var res ledger.PurgeResult
	err := waitFor(ctx, func() error {
		return s.db.Update(func(tx *bbolt.Tx) error {
			res = ledger.PurgeResult{}
			now := s.cfg.Now()
			records, expiry := tx.Bucket(recordsBucket), tx.Bucket(expiryBucket)
			purge := func(key, v []byte) error {
				scope, err := recordkv.DecodeScopeKey(key)
				if err != nil {
					return err
				}
				rec, err := recordkv.Decode(scope, v)
				if err != nil {
					return err
				}
				if !rec.Purgeable(now) {
					res.Skipped++
					return nil
				}
				if rec.View(now) != ledger.StateAbsent {
					res.Purged++
				}
				if err := expiry.Delete(recordkv.ExpiryKey(recordkv.SweepAt(&rec), key)); err != nil {
					return err
				}
				return records.Delete(key)
			}
			held := func(key, v []byte) error {
				scope, err := recordkv.DecodeScopeKey(key)
				if err != nil {
					return err
				}
				rec, err := recordkv.Decode(scope, v)
				if err != nil {
					return err
				}
				if rec.Purgeable(now) {
					res.More = true
				} else {
					res.Skipped++
				}
				return nil
			}
			if p.Scope.Key != "" {
				key := recordkv.ScopeKey(p.Scope)
				if v := records.Get(key); v != nil {
					return purge(key, v)
				}
				return nil
			}
			pre := prefix(p.Scope.Namespace, p.Scope.Tenant)
			c := records.Cursor()
			for k, v := c.Seek(pre); k != nil && bytes.HasPrefix(k, pre); {
				key := append([]byte(nil), k...)
				if res.Purged < p.Limit {
					if err := purge(key, v); err != nil {
						return err
					}
				} else if err := held(key, v); err != nil { // past the limit: only counting what is held
					return err
				}
				// Seek past the key: a deletion moves the cursor.
				if k, v = c.Seek(key); bytes.Equal(k, key) {
					k, v = c.Next()
				}
			}
			return nil
		})
	})
	if err != nil {
		return ledger.PurgeResult{}, s.classify("purge", err)
	}
	return res, nil
}

var _ ledger.Census = (*Store)(nil)

// CountByState implements ledger.Census, in one read transaction.
func (s *Store) CountByState(ctx context.Context) (map[ledger.State]int, error) {
	if err := ctx.Err(); err != nil {
		return nil, s.classify("census", err)
	}
	counts := map[ledger.State]int{}
	err := waitFor(ctx, func() error {
		return s.db.View(func(tx *bbolt.Tx) error {
			clear(counts)
			now := s.cfg.Now()
			return tx.Bucket(recordsBucket).ForEach(func(k, v []byte) error {
				scope, err := recordkv.DecodeScopeKey(k)
				if err != nil {
					return err
				}
				rec, err := recordkv.Decode(scope, v)
				if err != nil {
					return err
				}
				if st := rec.View(now); st != ledger.StateAbsent {
					counts[st]++
				}
				return nil
			})
		})
	})
	if err != nil {
		return nil, s.classify("census", err)
	}
	return counts, nil
}

// Records calls fn with every record the file holds, as stored (expired
// records and tombstones included), in key order, from one read
// transaction: what a conversion to another engine copies. It stops at
// fn's first error and returns it.
func (s *Store) Records(ctx context.Context, fn func(ledger.Record) error) error {
	if err := ctx.Err(); err != nil {
		return s.classify("records", err)
	}
	err := s.db.View(func(tx *bbolt.Tx) error {
		return tx.Bucket(recordsBucket).ForEach(func(k, v []byte) error {
			if err := ctx.Err(); err != nil {
				return err
			}
			scope, err := recordkv.DecodeScopeKey(k)
			if err != nil {
				return err
			}
			rec, err := recordkv.Decode(scope, v)
			if err != nil {
				return err
			}
			return fn(rec)
		})
	})
	return s.classify("records", err)
}
