//go:build !linux

package bench

import "errors"

// Place pins the database and this process to separate CPUs; it needs
// Linux.
func Place(dbPID int, dbCPUs string) (db, rest string, err error) {
	return "", "", errors.New("CPU placement needs Linux")
}
