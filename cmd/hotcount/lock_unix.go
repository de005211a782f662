//go:build unix

package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
)

// lockDataDir takes dir for this process alone, before anything opens a
// file in it: two `hotcount dev` on one folder would otherwise share the
// JetStream store before the second one's store fails to open. The lock is
// the kernel's (flock), so it goes with the process however it ends.
func lockDataDir(dir string) (unlock func(), err error) {
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, fmt.Errorf("data dir %s: %w", dir, err)
	}
	path := filepath.Join(dir, "LOCK")
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("data dir %s: %w", dir, err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("data dir %s is in use by another hotcount process (another hotcount dev?): stop it, or give this one its own --data-dir", dir)
		}
		return nil, fmt.Errorf("data dir %s: lock: %w", dir, err)
	}
	return func() { f.Close() }, nil
}
