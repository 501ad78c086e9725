package bench

import (
	"os"
	"path/filepath"
	"slices"
	"time"
)

// FsyncFloor is the median time of n writes of a 4 KiB page followed by
// an fdatasync, in a file in dir: the least a durable commit costs on
// that disk. A Begin+Complete pair commits twice, so one client cannot
// run more pairs a second than 1 / (2 × the floor).
func FsyncFloor(dir string, n int) (time.Duration, error) {
	f, err := os.CreateTemp(dir, "fsync-floor-")
	if err != nil {
		return 0, err
	}
	defer func() { _ = f.Close(); _ = os.Remove(filepath.Clean(f.Name())) }()
	page := make([]byte, 4096)
	took := make([]time.Duration, 0, n)
	for i := range max(n, 1) {
		start := time.Now()
		if _, err := f.WriteAt(page, int64(i%64)*int64(len(page))); err != nil {
			return 0, err
		}
		if err := fdatasync(f); err != nil {
			return 0, err
		}
		took = append(took, time.Since(start))
	}
	slices.Sort(took)
	return took[len(took)/2], nil
}
