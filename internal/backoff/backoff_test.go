package backoff

import (
	"testing"
	"time"
)

func TestFullJitterBounds(t *testing.T) {
	tests := []struct {
		name          string
		base, limit   time.Duration
		attempt       int
		wantCeilingAt time.Duration // every wait is below it
	}{
		{"First", 50 * time.Millisecond, 5 * time.Second, 1, 50 * time.Millisecond},
		{"Doubles", 50 * time.Millisecond, 5 * time.Second, 4, 400 * time.Millisecond},
		{"Capped", 50 * time.Millisecond, 5 * time.Second, 10, 5 * time.Second},
		{"Overflow", time.Second, time.Minute, 200, time.Minute},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var most time.Duration
			for range 2000 {
				d := FullJitter(tt.base, tt.limit, tt.attempt)
				if d < 0 || d >= tt.wantCeilingAt {
					t.Fatalf("FullJitter = %s, want in [0, %s)", d, tt.wantCeilingAt)
				}
				most = max(most, d)
			}
			if most < tt.wantCeilingAt/2 {
				t.Fatalf("the longest of 2000 waits is %s: not spread up to %s", most, tt.wantCeilingAt)
			}
		})
	}
	for _, attempt := range []int{0, -1} {
		if d := FullJitter(time.Second, time.Minute, attempt); d != 0 {
			t.Fatalf("attempt %d: %s, want 0", attempt, d)
		}
	}
}
