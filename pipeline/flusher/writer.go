package flusher

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/hotcount/hotcount/pipeline/store"
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
	slow     slowest // how long writes take, for room
}

// room is how long before a deadline a flush stops starting writes, so
// that the writes in flight finish rather than being cut off in doubt
// (at shutdown, nothing would settle them): twice the
// recent slowest write, at least 50 ms, at most a write's timeout.
func (wr *writer) room() time.Duration {
	return min(wr.timeout, max(2*wr.slow.get(), 50*time.Millisecond))
}

// slowest is a decaying maximum of how long writes took (wall time): it
// rises to a slower write at once and halves every second after, so that
// one write that ran to its timeout keeps writes from starting near a
// deadline for a few seconds, not until another write is fast (none would
// start to show it). Safe for concurrent use; the zero value is none.
type slowest struct {
	mu sync.Mutex
	d  time.Duration
	at time.Time
}

// halfLife is how fast slowest forgets a slow write.
const halfLife = time.Second

func (s *slowest) decayed(now time.Time) time.Duration {
	if s.at.IsZero() {
		return 0
	}
	return time.Duration(float64(s.d) * math.Exp2(-now.Sub(s.at).Seconds()/halfLife.Seconds()))
}

func (s *slowest) note(d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	s.d, s.at = max(d, s.decayed(now)), now
}

func (s *slowest) get() time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.decayed(time.Now())
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
	wr.slow.note(time.Since(start))
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
	take    func([]answer)
	in      []answer // the answers being taken, kept for the next
}

// batch starts a batch whose answers go to take, as many at once as have
// come in: the view takes a lock per call, not per answer.
func (wr *writer) batch(take func([]answer)) *batch {
	return &batch{slots: make(chan struct{}, wr.limit), answers: make(chan answer, wr.limit), take: take}
}

// takeWith takes a, and every answer already in after it.
func (b *batch) takeWith(a answer) {
	b.in = append(b.in[:0], a)
	b.running--
	for more := true; more; {
		select {
		case a := <-b.answers:
			b.in = append(b.in, a)
			b.running--
		default:
			more = false
		}
	}
	b.take(b.in)
	clear(b.in) // drop the errors' references
}

// acquire waits for room for one more write, taking the answers that come
// in meanwhile, and keeps it if ok still holds then (the deadline is
// checked when the write would start, not before the wait): a true
// return must be followed by run.
func (b *batch) acquire(ok func() bool) bool {
	for {
		select {
		case b.slots <- struct{}{}:
			if !ok() {
				<-b.slots
				return false
			}
			return true
		case a := <-b.answers:
			b.takeWith(a)
		}
	}
}

// run runs write, in the room acquire kept, in a goroutine of its own.
func (b *batch) run(write func() answer) {
	b.running++
	go func() {
		b.answers <- write()
		<-b.slots // after the answer is in: answers never outnumber slots
	}()
}

// collect takes the answers already in, without waiting for others.
func (b *batch) collect() {
	select {
	case a := <-b.answers:
		b.takeWith(a)
	default:
	}
}

// wait takes every answer still to come.
func (b *batch) wait() {
	for b.running > 0 {
		b.takeWith(<-b.answers)
	}
}
