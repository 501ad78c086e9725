package pebble

import (
	"bytes"
	"context"
	"encoding/binary"
	"time"

	pebbledb "github.com/cockroachdb/pebble/v2"

	"github.com/idemledger/idemledger/ledger"
	"github.com/idemledger/idemledger/ledger/pebble/internal/recordkv"
)

// Sweep works through up to limit records whose time came, oldest first: a
// completed record past its retention shrinks to a tombstone (its outcome
// dropped), an attempt past its retention, which reads as absent, becomes
// a released tombstone, and a record past ForgetAt is deleted. It returns
// how many it handled. Reads already see such records as tombstones or
// absent; the sweep only frees the space, which compaction then gives
// back.
//
// Each record is handled under its scope's lock in a batch of its own,
// committed without an fsync (a sweep lost in a crash is done again), so
// writers wait for one record at a time, never for the whole sweep.
//
// A sweep that handles a full batch leaves the next one to start after
// the last entry it handled. The index is a queue: its front is the
// entries the sweeps deleted, and until compaction drops them a listing
// from the front walks every one of them again (after a backlog of a
// million records, tens of milliseconds a batch). A sweep that handles
// less than a full batch ended the backlog, and the next one starts at
// the front again: it finds an entry that came due behind where the last
// batch stopped (a record restored with its times, a clock step).
// Sweeps run one at a time.
func (s *Store) Sweep(ctx context.Context, limit int) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, s.classify("sweep", err)
	}
	s.sweeping.Lock()
	defer s.sweeping.Unlock()
	if s.cfg.OnBackground != nil {
		defer s.cfg.OnBackground()()
	}
	from := s.sweepFrom
	if from == nil {
		from = expiryPrefix
	}
	s.sweepFrom = nil // unless this one handles a full batch
	now := s.cfg.Now()
	upper := binary.BigEndian.AppendUint64(bytes.Clone(expiryPrefix), uint64(now.UnixNano())+1)
	due, next, err := s.keys(from, upper, limit)
	if err != nil {
		return 0, s.classify("sweep", err)
	}
	n := 0
	for _, entry := range due {
		if err := ctx.Err(); err != nil {
			return n, s.classify("sweep", err)
		}
		if err := s.sweepOne(entry, now); err != nil {
			return n, s.classify("sweep", err)
		}
		n++
	}
	s.sweepFrom = next // after a full batch, the first key after its last
	return n, nil
}

// sweepOne handles the record of one expiry index entry.
func (s *Store) sweepOne(entry []byte, now time.Time) error {
	if len(entry) < len(expiryPrefix)+8 {
		return recordkv.ErrCorrupt
	}
	key := append(bytes.Clone(recordPrefix), entry[len(expiryPrefix)+8:]...)
	scope, err := recordkv.DecodeScopeKey(key[len(recordPrefix):])
	if err != nil {
		return err
	}
	st := s.stripe(key)
	st.Lock()
	defer st.Unlock()
	return s.with(func(db *pebbledb.DB) error {
		b := db.NewBatch()
		defer b.Close()
		if err := b.Delete(entry, nil); err != nil {
			return err
		}
		rec, err := getRecord(db, scope, key)
		if err != nil {
			return err
		}
		after := rec
		switch {
		case rec == nil || !bytes.Equal(indexKey(rec, key), entry):
			// A stale entry: the record moved on, and has its own.
			return s.commit(b, pebbledb.NoSync)
		case rec.Forgotten(now):
			if err := b.Delete(key, nil); err != nil {
				return err
			}
			after = nil
		default:
			switch {
			case rec.Shrinkable(now):
				rec.State, rec.Outcome = ledger.StateExpired, nil
			case rec.State == ledger.StateInProgress && rec.View(now) == ledger.StateAbsent:
				// An attempt past its retention reads as absent: it is
				// kept as the released tombstone it reads as, until
				// ForgetAt, so that the next claim's token is above its.
				rec.State = ledger.StateReleased
			}
			// Index it again at its next event, the record rewritten.
			if err := put(b, key, nil, rec); err != nil {
				return err
			}
		}
		err = s.commit(b, pebbledb.NoSync)
		if err != nil {
			after = nil // it may have landed: read it next time
		}
		st.wrote(key, after)
		return err
	})
}

// Run sweeps every Config.SweepInterval, Config.SweepBatch records at a
// time and at most Config.SweepShare of the time while a backlog lasts,
// until ctx ends; onError, when set, hears of failed sweeps.
func (s *Store) Run(ctx context.Context, onError func(error)) error {
	saved := make(chan struct{})
	go func() {
		defer close(saved)
		s.keepWatermark(ctx, onError)
	}()
	defer func() { <-saved }()
	return ledger.Sweeps{Interval: s.cfg.SweepInterval, Batch: s.cfg.SweepBatch, Share: s.cfg.SweepShare, Sweep: s.Sweep, OnError: onError}.Run(ctx)
}

// keepWatermark records the last acknowledged write every
// Config.WatermarkInterval until ctx ends. onError hears the first of a
// run of failures (a full disk fails every one).
func (s *Store) keepWatermark(ctx context.Context, onError func(error)) {
	t := time.NewTicker(s.cfg.WatermarkInterval)
	defer t.Stop()
	failing := false
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		err := s.mark.save()
		if err != nil && !failing && onError != nil {
			onError(err)
		}
		failing = err != nil
	}
}

// SweepShare is the share of the time Run spends sweeping a backlog.
func (s *Store) SweepShare() float64 { return s.cfg.SweepShare }

// SweepBatch is how many records Run sweeps before it rests.
func (s *Store) SweepBatch() int { return s.cfg.SweepBatch }
