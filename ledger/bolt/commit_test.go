package bolt

import (
	"encoding/binary"
	"errors"
	"path/filepath"
	"sync"
	"testing"

	bbolt "go.etcd.io/bbolt"
)

// TestGroupCommit: many concurrent jobs each commit once, in shared
// transactions; a job that fails gets its own error and the others of its
// group still commit.
func TestGroupCommit(t *testing.T) {
	db, err := bbolt.Open(filepath.Join(t.TempDir(), "db"), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	bucket := []byte("b")
	if err := db.Update(func(tx *bbolt.Tx) error { _, err := tx.CreateBucket(bucket); return err }); err != nil {
		t.Fatal(err)
	}
	c := &committer{db: db, maxSize: 8}
	var txs sync.Map // the transactions that committed jobs
	boom := errors.New("boom")
	const n = 200
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			errs[i] = c.do(func(tx *bbolt.Tx) error {
				if i%50 == 7 {
					return boom
				}
				txs.Store(tx.ID(), true)
				return tx.Bucket(bucket).Put(binary.BigEndian.AppendUint32(nil, uint32(i)), []byte{1})
			})
		})
	}
	wg.Wait()
	written := 0
	_ = db.View(func(tx *bbolt.Tx) error {
		written = tx.Bucket(bucket).Stats().KeyN
		return nil
	})
	for i, err := range errs {
		if (i%50 == 7) != errors.Is(err, boom) {
			t.Fatalf("job %d: %v", i, err)
		}
	}
	shared := 0
	txs.Range(func(any, any) bool { shared++; return true })
	if written != n-4 || shared >= n-4 {
		t.Fatalf("%d keys written in %d transactions; want %d keys, in fewer transactions than jobs", written, shared, n-4)
	}
}
