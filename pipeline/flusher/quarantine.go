package flusher

import (
	"context"
	"time"

	"go.uber.org/zap"

	"github.com/hotcount/hotcount/pipeline/aggregator"
	"github.com/hotcount/hotcount/pipeline/quarantine"
	"github.com/hotcount/hotcount/pipeline/store"
	"github.com/hotcount/hotcount/schema"
)

// DefaultQuarantineAfter is how long a counter's writes may be refused for
// good before the write is quarantined (--quarantine-after): long enough
// for a policy being rolled out or a key being re-enabled. After that
// first time, the topic's later writes refused for good go at once, until
// one of its writes lands: a hot poison topic holds its deltas in the
// buffer for one bound, not one every bound.
const DefaultQuarantineAfter = 5 * time.Minute

// Quarantine holds the writes the store refuses for good (quarantine.Dir).
// Once Put returns nil the write survives restarts, and `hotcount
// quarantine replay` writes it, exactly once.
type Quarantine interface {
	Put(ctx context.Context, e quarantine.Entry) error
}

// WithQuarantine moves a write that the store has refused for good
// (store.Denied) for Config.QuarantineAfter into q, so that it stops
// holding its topic.
func WithQuarantine(q Quarantine) Option { return func(f *Flusher) { f.quarantine = q } }

// denial is a counter's run of refusals for good: since the first one,
// with the last one's error. The zero denial is none.
type denial struct {
	since time.Time
	err   error
}

// answered follows one answer: a refusal for good starts or continues the
// run, any other answer ends it.
func (d *denial) answered(err error, now time.Time) {
	if !store.Denied(err) {
		*d = denial{}
		return
	}
	if d.since.IsZero() {
		d.since = now
	}
	d.err = err
}

// ripe says whether the run has lasted after. Whether the store takes
// other keys meanwhile does not matter: a refusal for good of every key (a
// role without its grant) is quarantined too, and replayed as exactly,
// rather than hold every topic's deltas until someone fixes it.
func (d denial) ripe(now time.Time, after time.Duration) bool {
	return !d.since.IsZero() && now.Sub(d.since) >= after
}

// quarantineRipe moves the writes whose denial is ripe out of the way,
// after the flush's sends. A new write refused goes back to the buffer
// with its delta (in u, the window going back): the run of refusals is
// followed by counter across flushes, and a ripe counter's delta leaves u
// for the quarantine. A write the quarantine does not take stays where it
// was, and is tried again next flush. A write in doubt never goes (it may
// be in the store already: a replay under another identity could count
// it twice); it stays pending until the store settles it.
func (f *Flusher) quarantineRipe(ctx context.Context, r *round, u *aggregator.Window) {
	if f.quarantine == nil {
		return
	}
	now := f.now()
	for _, x := range r.wrote {
		delete(f.poisoned, x.counter.Topic) // the store takes it again
		delete(f.denied, x.counter)
	}
	for c := range r.settled {
		delete(f.poisoned, c.Topic)
	}
	if len(r.denied) == 0 && len(f.denied) == 0 {
		return
	}
	for c, err := range r.denied {
		d := f.denied[c]
		d.answered(err, now)
		f.denied[c] = d
	}
	var out []schema.Counter
	for c, d := range f.denied {
		name := c.Name()
		// Not in u: held back or untried this flush, still in the buffer;
		// its run goes on until a write of it is applied.
		if delta, ok := u.Deltas.Get(name); ok && (d.ripe(now, f.cfg.QuarantineAfter) || f.poisoned[c.Topic]) {
			w := store.Write{Counter: c, Delta: delta, Writer: f.cfg.Writer, Seq: f.seq.Next()} // never sent: no mark to fear
			if f.handOver(ctx, w, d) {
				out = append(out, c)
				delete(f.denied, c)
				f.poisoned[c.Topic] = true
			}
		}
	}
	if len(out) > 0 {
		f.view.Move(func() func(string) int64 {
			for _, c := range out {
				u.Deltas.Delete(c.Name())
			}
			return held(u.Deltas)
		})
	}
}

// handOver puts w, denied since d.since, in the quarantine, and says
// whether it took it. One it did not take is tried again next flush.
func (f *Flusher) handOver(ctx context.Context, w store.Write, d denial) bool {
	e := quarantine.Of(w, d.err.Error(), d.since, f.now())
	if err := f.quarantine.Put(ctx, e); err != nil {
		f.log.Warn("cannot quarantine a write refused for good; it is tried again", zap.String("counter", e.Counter), zap.Error(err))
		return false
	}
	f.metrics.quarantined.Inc()
	if w.Counter.CountsMentions() {
		f.metrics.quarantinedMentions.Add(float64(w.Delta))
	}
	f.log.Error("write refused for good since "+d.since.UTC().Format(time.RFC3339)+"; quarantined: `hotcount quarantine replay` writes it once the cause is fixed",
		zap.String("topic", w.Counter.Topic), zap.String("counter", e.Counter), zap.Int64("delta", w.Delta),
		zap.String("writer", w.Writer), zap.Int64("seq", w.Seq), zap.String("reason", e.Reason))
	return true
}
