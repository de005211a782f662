// Package datadir gives one process a data directory to itself. Two
// processes on one folder would share what only one may own: the embedded
// store's file, dev's JetStream store, and the spill folder, whose segments
// both would name alike, so that one replaces the other's mentions.
package datadir

import (
	"fmt"
)

// LockFile is the file in the data directory that the lock is held on. It
// holds the holder's process id, for the error a second process gets.
const LockFile = "LOCK"

// LockedError is Lock's answer when another process holds the folder.
type LockedError struct {
	Dir string
	// PID is the holder's process id, 0 when it could not be read.
	PID int
}

func (e *LockedError) Error() string {
	holder := "another hotcount process"
	if e.PID > 0 {
		holder = fmt.Sprintf("hotcount process %d", e.PID)
	}
	return fmt.Sprintf("data dir %s is in use by %s: stop it, or give this one its own --data-dir", e.Dir, holder)
}
