//go:build unix

package datadir

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
)

// Lock takes dir for this process alone, creating it if need be, before
// anything opens a file in it. The lock is the kernel's (flock), so it goes
// with the process however it ends, and a lock file left by a killed
// process is taken again at once. unlock releases it; a second process
// gets a *LockedError naming the holder.
func Lock(dir string) (unlock func(), err error) {
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, fmt.Errorf("data dir %s: %w", dir, err)
	}
	path := filepath.Join(dir, LockFile)
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("data dir %s: %w", dir, err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, &LockedError{Dir: dir, PID: holder(path)}
		}
		return nil, fmt.Errorf("data dir %s: lock: %w", dir, err)
	}
	// The holder's id is for the error above only: a failure to write it
	// leaves that error less precise, not the lock less held.
	if f.Truncate(0) == nil {
		f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0) //nolint:errcheck // see above
	}
	return func() { f.Close() }, nil
}

// holder reads the process id the lock's holder wrote, 0 if none.
func holder(path string) int {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	pid, err := strconv.Atoi(string(bytes.TrimSpace(b)))
	if err != nil {
		return 0
	}
	return pid
}
