package recordstate

import (
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	ledgerv1 "github.com/idemledger/idemledger/gen/idemledger/v1"
)

// TestOf: a record's name as read at a time, lease_expired for an
// in_progress record read at or after its lease's end; and each name a
// search takes finds the records of that name.
func TestOf(t *testing.T) {
	now := time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)
	lease := func(d time.Duration) *timestamppb.Timestamp { return timestamppb.New(now.Add(d)) }
	for _, c := range []struct {
		rec  *ledgerv1.Record
		want string
	}{
		{&ledgerv1.Record{State: ledgerv1.State_STATE_IN_PROGRESS, LeaseExpiresAt: lease(time.Second)}, InProgress},
		{&ledgerv1.Record{State: ledgerv1.State_STATE_IN_PROGRESS, LeaseExpiresAt: lease(0)}, LeaseExpired},
		{&ledgerv1.Record{State: ledgerv1.State_STATE_IN_PROGRESS, LeaseExpiresAt: lease(-time.Minute)}, LeaseExpired},
		{&ledgerv1.Record{State: ledgerv1.State_STATE_OUTCOME_UNKNOWN, LeaseExpiresAt: lease(-time.Minute)}, OutcomeUnknown},
		{&ledgerv1.Record{State: ledgerv1.State_STATE_COMPLETED}, Completed},
		{&ledgerv1.Record{State: ledgerv1.State_STATE_EXPIRED}, Expired},
	} {
		got := Of(c.rec, now)
		if got != c.want {
			t.Errorf("Of(%v) = %s, want %s", c.rec, got, c.want)
		}
		st, keep, ok := Filter(got)
		if !ok || st != c.rec.GetState() || !keep(c.rec, now) {
			t.Errorf("Filter(%s) = %v, %v: does not find %v", got, st, ok, c.rec)
		}
		for _, other := range Names {
			if st, keep, _ := Filter(other); other != got && st == c.rec.GetState() && keep(c.rec, now) {
				t.Errorf("Filter(%s) finds %v, which is %s", other, c.rec, got)
			}
		}
	}
	if _, _, ok := Filter("IN_PROGRESS"); ok {
		t.Error("Filter takes a name outside the vocabulary")
	}
}
