package flusher

import (
	"errors"
	"fmt"
)

// The errors a flush returns are values that say where every mention it
// did not write is, so that callers (and tests) read fields, not text.

// ErrStoreDown is the cause of a flush that tried only a probe because
// the store refused the flush before (IncompleteError.Err), and of one
// whose probe went through with the rest left for the next flush
// (ProbedError).
var ErrStoreDown = errors.New("the store refused the last flush")

// ErrFlushDeadline is the cause of a flush that ran out of time before it
// had sent every write (IncompleteError.Err).
var ErrFlushDeadline = errors.New("flush deadline passed")

// IncompleteError is a flush that left counters for the next one: they
// are back in the buffer, and the next flush (or Final) writes them.
type IncompleteError struct {
	// UnwrittenCounters counters were not written: they are back in the
	// buffer with their Kept mentions. Counters is how many the flush had
	// to write.
	UnwrittenCounters, Counters int
	Kept                        int64
	// Pending writes are in doubt (the ledger's).
	Pending int
	// Held counters waited behind writes in doubt; Untried were not tried
	// because the store is down.
	Held, Untried int
	// Err is why: a write's error, HeldError, ErrStoreDown or
	// ErrFlushDeadline.
	Err error
}

func (e *IncompleteError) Error() string {
	return fmt.Sprintf("flusher: %d of %d counters not written (%d mentions kept), %d writes in doubt, %d counters held back, %d not tried (the store is down): %v",
		e.UnwrittenCounters, e.Counters, e.Kept, e.Pending, e.Held, e.Untried, e.Err)
}

func (e *IncompleteError) Unwrap() error { return e.Err }

// HeldError is the cause of a flush that wrote everything it tried but
// held Counters back behind writes in doubt.
type HeldError struct{ Counters int }

func (e *HeldError) Error() string {
	return fmt.Sprintf("%d counters waited behind writes in doubt", e.Counters)
}

// ProbedError is a flush after an outage whose probe of Probed counters
// went through: the store is back, and Left counters wait for the next
// flush. It wraps ErrStoreDown.
type ProbedError struct{ Probed, Left int }

func (e *ProbedError) Error() string {
	return fmt.Sprintf("flusher: %v; %d counters probed and written, %d left for the next flush", ErrStoreDown, e.Probed, e.Left)
}

func (e *ProbedError) Unwrap() error { return ErrStoreDown }

// ShutdownError is Final giving up at the shutdown deadline: where every
// mention it could not write is.
type ShutdownError struct {
	// Mentions over Counters counters (topics' totals and their minutes
	// not yet split) were unwritten, and Buckets increments of time
	// buckets (their mentions are in a total).
	Mentions int64
	Counters int
	Buckets  int64
	Doubt    int64 // mentions in writes in doubt: each may or may not be in
	Spilled  int64 // mentions kept in the spill folder for the next start
	Err      error // the last flush's error
}

func (e *ShutdownError) Error() string {
	return fmt.Sprintf("flusher: shutdown deadline passed (or too close for another try) with %d mentions over %d counters unwritten (and %d increments of time buckets), %d in writes in doubt and %d kept in the spill folder for the next start: %v",
		e.Mentions, e.Counters, e.Buckets, e.Doubt, e.Spilled, e.Err)
}

func (e *ShutdownError) Unwrap() error { return e.Err }
