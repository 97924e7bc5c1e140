//go:build linux || darwin

package hub

import (
	"os"
	"syscall"
)

// freeSpace is the space available to an unprivileged user on dir's file
// system.
func freeSpace(dir string) (int64, error) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return -1, &os.PathError{Op: "statfs", Path: dir, Err: err}
	}
	return int64(st.Bavail) * int64(st.Bsize), nil
}

// lockFile takes an exclusive advisory lock on f without waiting; it is
// released when f is closed.
func lockFile(f *os.File) error {
	return syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
}
