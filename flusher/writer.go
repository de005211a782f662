package flusher

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/hotcount/hotcount/store"
)

// maxReroutes is how many other shards a throttled write tries within one
// flush before its delta waits for the next flush.
const maxReroutes = 2

// outcome is what the store's answer to a write means for its delta.
type outcome uint8

const (
	// applied: in the store, once.
	applied outcome = iota
	// refused: a definite answer, nothing applied; the delta is free to
	// be written again, with a new write.
	refused
	// throttled: refused for throughput, nothing applied (after the
	// reroutes, for a new write).
	throttled
	// inDoubt: maybe applied; the write is sent again unchanged until the
	// store settles it.
	inDoubt
)

// outcomeOf reads a Store.Add error. Doubt wins over a throttle: a call
// whose first attempt lost its answer and whose retry was throttled is in
// doubt.
func outcomeOf(err error) outcome {
	switch {
	case err == nil:
		return applied
	case errors.Is(err, store.ErrAmbiguous):
		return inDoubt
	case errors.Is(err, store.ErrThrottled):
		return throttled
	}
	return refused
}

// answer is how one write ended: a value, sent from the write's goroutine
// to the flush's.
type answer struct {
	write   store.Write // as last sent: when in doubt, the one to send again
	resend  bool        // a pending write sent again, not a new delta
	sentAt  time.Time   // when a new write was first sent
	outcome outcome
	err     error // nil when applied
}

// writer sends writes to the store and says what each answer means. It is
// safe for concurrent use: New sets its fields once, and the store, the
// shard counts and the sequencer are safe for concurrent use. The Flusher
// owns it.
type writer struct {
	store    Store
	shards   Shards // nil: a throttle raises no shard count
	seq      *store.Sequencer
	timeout  time.Duration // one write, the SDK's retries included
	limit    int           // writes in flight at once
	log      *zap.Logger
	rerouted prometheus.Counter
	now      func() time.Time
	// slow is a decaying maximum of how long a write took (wall time, in
	// nanoseconds): a flush stops starting writes that much and more
	// before its context's deadline (room).
	slow atomic.Int64
}

// room is how long before its context's deadline a flush stops starting
// writes, so that the writes in flight finish rather than being cut off
// in doubt (with no journal to settle them, in core mode at shutdown):
// twice the recent slowest write, at least 50 ms, at most a write's
// timeout.
func (wr *writer) room() time.Duration {
	return min(wr.timeout, max(2*time.Duration(wr.slow.Load()), 50*time.Millisecond))
}

// took notes that a write took d: slow rises to it at once, and falls by
// a sixteenth a write, so a store that speeds up is seen within a round
// or two of writes.
func (wr *writer) took(d time.Duration) {
	for {
		old := wr.slow.Load()
		next := max(int64(d), old-old/16)
		if wr.slow.CompareAndSwap(old, next) {
			return
		}
	}
}

// tooLate says whether a write started now could outlast ctx's deadline.
func (wr *writer) tooLate(ctx context.Context) bool {
	d, ok := ctx.Deadline()
	return ctx.Err() != nil || ok && time.Until(d) < wr.room()
}

// send writes w (a new delta, on a shard of n) with this writer's next
// seq; when the shard is throttled (nothing applied) it tries up to
// maxReroutes other shards with new seqs, since the throttle is per
// partition and the other shards are other partitions, and tells the shard
// counts, which may raise them. The answer holds the last write sent: in
// doubt, the one to send again.
func (wr *writer) send(ctx context.Context, w store.Write, n int) answer {
	for attempt := 0; ; attempt++ {
		w.Seq = wr.seq.Next()
		err := wr.add(ctx, w)
		if errors.Is(err, store.ErrUnresolvable) {
			err = nil // the store counted it; see resend
		}
		if err == nil || !errors.Is(err, store.ErrThrottled) || attempt == maxReroutes {
			return answer{write: w, outcome: outcomeOf(err), err: err}
		}
		if wr.shards != nil && attempt == 0 {
			n = max(n, wr.shards.Throttled(ctx, w.Counter.Topic))
		}
		if n == 1 {
			return answer{write: w, outcome: outcomeOf(err), err: err}
		}
		wr.rerouted.Inc()
		w.Shard = (w.Shard + 1 + rand.IntN(n-1)) % n
	}
}

// resend sends a pending write again, unchanged. Applied means in the
// store exactly once (store.ErrUnresolvable counts as that, and is
// logged).
func (wr *writer) resend(ctx context.Context, w store.Write) answer {
	err := wr.add(ctx, w)
	if errors.Is(err, store.ErrThrottled) && wr.shards != nil {
		wr.shards.Throttled(ctx, w.Counter.Topic) // may raise the topic for its next writes
	}
	if errors.Is(err, store.ErrUnresolvable) {
		wr.log.Error("write in doubt too long to tell whether it was applied; counted as applied",
			zap.String("key", w.Key()), zap.Int64("delta", w.Delta), zap.Int64("seq", w.Seq))
		err = nil
	}
	return answer{write: w, resend: true, outcome: outcomeOf(err), err: err}
}

// add sends w once, within the write timeout; a writer behind the item's
// floor catches up with it.
func (wr *writer) add(ctx context.Context, w store.Write) error {
	ctx, cancel := context.WithTimeout(ctx, wr.timeout)
	defer cancel()
	start := time.Now()
	err := wr.store.Add(ctx, w, wr.now())
	wr.took(time.Since(start))
	var behind *store.FloorError
	if errors.As(err, &behind) {
		wr.seq.Raise(behind.Floor)
	}
	return err
}

// batch is one flush's writes in flight: at most the writer's limit at
// once, each in a goroutine of its own, and each answer handed back to the
// goroutine that runs the batch (take), so that what a flush tallies has
// one owner and no lock. Only that goroutine calls its methods.
type batch struct {
	slots   chan struct{} // one per write in flight
	answers chan answer   // room for every write in flight: a write never waits to answer
	running int           // writes started whose answer is not taken
	take    func(answer)
}

// batch starts a batch whose answers go to take.
func (wr *writer) batch(take func(answer)) *batch {
	return &batch{slots: make(chan struct{}, wr.limit), answers: make(chan answer, wr.limit), take: take}
}

// start runs write in a goroutine of its own as soon as there is room,
// taking the answers that come in meanwhile.
func (b *batch) start(write func() answer) {
	for {
		select {
		case b.slots <- struct{}{}:
			b.running++
			go func() {
				b.answers <- write()
				<-b.slots // after the answer is in: answers never outnumber slots
			}()
			return
		case a := <-b.answers:
			b.running--
			b.take(a)
		}
	}
}

// collect takes the answers already in, without waiting for others.
func (b *batch) collect() {
	for {
		select {
		case a := <-b.answers:
			b.running--
			b.take(a)
		default:
			return
		}
	}
}

// wait takes every answer still to come.
func (b *batch) wait() {
	for ; b.running > 0; b.running-- {
		b.take(<-b.answers)
	}
}
