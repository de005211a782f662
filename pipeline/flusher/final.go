package flusher

import (
	"context"
	"errors"
	"math"
	"time"

	"github.com/cenkalti/backoff/v5"
	"go.uber.org/zap"

	"github.com/hotcount/hotcount/internal/waits"
)

// Final flushes until the buffer is empty and no write is in doubt, or ctx
// ends (or is too close for another try), for shutdown, after ingest has
// stopped. What is still buffered then goes to the spill folder (lost only
// without one: counted in hotcount_flusher_unflushed_total); the error
// says where every mention is. Writes still in doubt are reported too:
// each may or may not be in the store.
//
// A retry the deadline would cut off in flight leaves its writes in doubt;
// one never started leaves its mentions whole, for the spill folder. So a
// retry starts only with time left for it (retryRoom), and Final gives up
// before the deadline when there is none. When ctx ends while Final waits
// to retry (SIGTERM's budget spent), it gives up at once.
//
// What is left goes to the spill folder after the last flush, and that
// write is not cut off (cutting it would lose the window). So Final's
// flushes end early enough before ctx's deadline to leave it the time its
// bytes take (persistRoom, at most half of Final's time), and the phases
// after the final flush keep their reserve.
func (f *Flusher) Final(ctx context.Context) error {
	// Persist's time is taken from at most half of Final's: past that the
	// store, if it answers, is the better home for the window (a spill
	// folder on an emptyDir goes with its pod).
	most := time.Duration(math.MaxInt64)
	if d, ok := ctx.Deadline(); ok {
		most = time.Until(d) / 2
	}
	pace := newFinalPace(ctx, func() time.Duration { return min(f.persistRoom(), most) })
	var last error // the last flush's, for abandon
	_, err := backoff.Retry(ctx, func() (struct{}, error) {
		fctx, cancel := pace.flushContext(ctx)
		defer cancel()
		if fctx.Err() != nil {
			// Not even one flush has room before the window must go to
			// disk.
			if last == nil {
				last = fctx.Err()
			}
			return struct{}{}, backoff.Permanent(last)
		}
		start := time.Now()
		err := f.Flush(fctx)
		pace.room, pace.spilling = retryRoom(time.Since(start), f.cfg.WriteTimeout), false
		if err == nil {
			if p, ok := f.buf.(persister); !ok || !p.Spilled() {
				return struct{}{}, nil
			}
			// The store takes writes and the spill comes back window by
			// window: go on at once.
			err, pace.spilling = errSpilledLeft, true
		} else {
			f.log.Warn("final flush incomplete", zap.Error(err))
		}
		last = err
		return struct{}{}, err
	}, backoff.WithBackOff(pace), backoff.WithMaxElapsedTime(0))
	if err == nil {
		return nil
	}
	return f.abandon(last)
}

// errSpilledLeft is a final flush that wrote everything in memory while
// the spill folder still holds windows: Final goes on at once.
var errSpilledLeft = errors.New("flusher: spilled mentions left")

// finalPace is the wait between Final's flushes, as a backoff.BackOff: a
// doubling back-off (50 ms to 1 s) after a failed flush, none while the
// spill comes back, and backoff.Stop when the next flush would not have
// room to finish before its deadline: ctx's, less the time Persist needs
// for what is buffered then. Final's goroutine owns it.
type finalPace struct {
	failed   *backoff.ExponentialBackOff
	deadline time.Time // zero: none
	persist  func() time.Duration
	room     time.Duration
	spilling bool // the last flush wrote everything, and more is spilled
}

func newFinalPace(ctx context.Context, persist func() time.Duration) *finalPace {
	b := waits.Shutdown()
	deadline, _ := ctx.Deadline()
	return &finalPace{failed: b, deadline: deadline, persist: persist}
}

// flushDeadline is when a flush starting now must end: ctx's deadline
// less the time Persist needs for what is buffered now.
func (p *finalPace) flushDeadline() time.Time {
	if p.deadline.IsZero() {
		return p.deadline
	}
	return p.deadline.Add(-p.persist())
}

// flushContext is ctx ending at flushDeadline.
func (p *finalPace) flushContext(ctx context.Context) (context.Context, context.CancelFunc) {
	d := p.flushDeadline()
	if d.IsZero() {
		return context.WithCancel(ctx)
	}
	return context.WithDeadline(ctx, d)
}

func (p *finalPace) NextBackOff() time.Duration {
	var wait time.Duration
	if !p.spilling {
		wait = p.failed.NextBackOff()
	}
	if d := p.flushDeadline(); !d.IsZero() && time.Until(d) < wait+p.room {
		return backoff.Stop
	}
	return wait
}

func (p *finalPace) Reset() { p.failed.Reset() }

// retryRoom is the time a final flush's retry needs before the deadline:
// four times the last attempt (a loaded machine's attempts vary), at least
// 50 ms, at most a write's timeout.
func retryRoom(last, writeTimeout time.Duration) time.Duration {
	return min(writeTimeout, max(4*last, 50*time.Millisecond))
}

// persistRate is the write speed persistRoom assumes for the spill folder:
// a slow volume's, a quarter of what BenchmarkPersist measures on a
// development machine's disk (docs/BENCHMARKS.md).
const persistRate = 64 << 20 // bytes a second

// persistRoom is the time Persist needs for what is buffered now (none
// without a spill folder): its bytes at persistRate,
// plus 100 ms for the file's creation and sync.
func (f *Flusher) persistRoom() time.Duration {
	p, ok := f.buf.(persister)
	if !ok {
		return 0
	}
	n := p.PersistBytes()
	if n == 0 {
		return 0
	}
	return 100*time.Millisecond + time.Duration(float64(n)/persistRate*float64(time.Second))
}

// abandon ends Final at (or just before) the deadline: what is buffered
// goes to the spill folder, and the error says where every mention is.
func (f *Flusher) abandon(err error) error {
	var spilled int64
	if p, ok := f.buf.(persister); ok {
		// With a spill folder, what is left waits there for the next
		// process on the folder, instead of being lost.
		var err error
		if spilled, err = p.Persist(); err != nil {
			f.log.Error("unwritten mentions could not be spilled at shutdown", zap.Error(err))
		}
	}
	w := f.buf.Drain()
	f.metrics.unflushed.Add(float64(w.Mentions()))
	f.flushMu.Lock()
	doubt := f.ledger.atExit()
	f.flushMu.Unlock()
	f.metrics.doubtAtExit.Add(float64(doubt))
	var bucketed int64 // time buckets' increments left unwritten (their mentions are in a total)
	for c, d := range counters(w.Deltas) {
		if !c.CountsMentions() {
			bucketed += d
		}
	}
	return &ShutdownError{Mentions: w.Mentions(), Counters: w.Len(), Buckets: bucketed, Doubt: doubt, Spilled: spilled, Err: err}
}
