package flusher

import (
	"context"
	"maps"
	"slices"
	"time"

	"github.com/hotcount/hotcount/pipeline/aggregator"
	"github.com/hotcount/hotcount/pipeline/ownwrites"
	"github.com/hotcount/hotcount/pipeline/store"
	"github.com/hotcount/hotcount/schema"
)

// Flush drains the window once and writes every delta to a random shard,
// each write an idempotent store.Write with this writer's next seq.
//
// A write whose outcome is unknown (store.ErrAmbiguous) becomes the
// topic's pending write: each later flush sends it again, unchanged (same
// shard, delta and seq), until the store settles it; until then the
// topic's newer deltas wait in the buffer, so this writer never lands a
// newer seq on an item while an older one is in doubt. Writes refused for
// throughput move to another shard with a new seq (nothing was applied).
// Writes that fail, or that were not started before the flush deadline,
// are merged back into the buffer; the error says how many.
//
// The steps are those of docs/SEMANTICS.md.
func (f *Flusher) Flush(ctx context.Context) error {
	f.flushMu.Lock()
	defer f.flushMu.Unlock()
	start := f.now()
	defer func() { f.metrics.duration.Observe(f.now().Sub(start).Seconds()) }()

	// 1. Build the writes: totals and time buckets, a topic with a write
	// in doubt held back whole.
	p := f.drain()
	w := p.write // the window this flush holds: gather hands it on
	shards := f.shardCounts(ctx, w.Deltas)
	// 2. Writes in doubt go first, unchanged: a topic's newer deltas wait
	// behind them, so no newer seq lands while an older one is in doubt.
	unwritten := aggregator.Window{Deltas: aggregator.NewDeltas(0)}
	r := f.send(ctx, w, shards, start.Add(f.cfg.Timeout))
	f.gather(&w, r, &unwritten)
	// 3. Settle the writes in doubt now in the store; the new ones in
	// doubt take their place.
	f.ledger.settle(r.settled)
	f.ledger.doubted(r.doubt)
	f.observe(r)
	f.progress(r, unwritten)
	// 4. A write the store has refused for good for long enough goes to
	// the quarantine, out of its topic's way.
	f.quarantineRipe(ctx, r, &unwritten)
	f.ledger.keepPending()
	// What is left goes back to the buffer for the next flush.
	return f.end(p, r, unwritten)
}

// drain takes the buffer's window and plans it; what the plan does not
// write this flush goes back at once. The plan is built while readers see
// the drained window as it came (Window.Pending), not under the view's
// lock: a million-topic window takes seconds to plan. Only a probe of a
// store that is down (a few counters) is planned in the drain's step.
// From then on the buffer owns the plan's held and untried windows: the
// flush reads only their sizes.
func (f *Flusher) drain() plan {
	down, waiting := f.down.Load(), f.ledger.waiting()
	var w aggregator.Window
	var p plan
	f.view.Move(func() func(string) int64 {
		w = f.buf.Drain()
		if !down {
			return w.Pending
		}
		p = newPlan(w, true, waiting, f.planning)
		f.giveBack(p)
		return held(p.write.Deltas)
	})
	if down {
		return p
	}
	p = newPlan(w, false, waiting, f.planning)
	f.view.Move(func() func(string) int64 {
		f.giveBack(p)
		return held(p.write.Deltas)
	})
	return p
}

// giveBack hands what plan p does not write this flush back to the
// buffer.
func (f *Flusher) giveBack(p plan) {
	if p.untried != nil {
		rest := aggregator.Window{Deltas: p.untried}
		f.metrics.requeued.Add(float64(rest.Mentions()))
		f.buf.Merge(rest)
	}
	if p.heldCounters > 0 {
		f.metrics.requeued.Add(float64(p.held.Mentions()))
		f.buf.Merge(p.held)
	}
}

// held is what readers see the flush hold of a topic, in window d: its
// total's delta.
func held(d *aggregator.Deltas) func(topic string) int64 {
	if d == nil {
		return nil
	}
	return func(topic string) int64 {
		q, _ := d.Get(schema.TotalOf(topic).Name()) // 0 when not there
		return q
	}
}

// round is one flush's tally of its writes' answers. The flush's goroutine
// owns it: the batch hands it every answer (take).
type round struct {
	counters  int                            // counters the flush had to write
	wrote     []counterDelta                 // new writes applied
	settled   map[schema.Counter]int64       // writes in doubt now in the store
	doubt     map[schema.Counter]store.Write // new writes in doubt
	denied    map[schema.Counter]error       // new writes refused for good (store.Denied)
	denials   int                            // answers, new or resent, refusing for good
	failures  int                            // answers, new or resent, neither applied nor refusing for good
	written   int64                          // deltas applied, of both kinds
	refused   int                            // new writes refused with an answer, throttles aside
	throttled int                            // new writes throttled on every shard tried
	err       error                          // the first failure
}

// counterDelta is a counter's delta.
type counterDelta struct {
	counter schema.Counter
	delta   int64
}

// take tallies one answer.
func (r *round) take(a answer) {
	c := a.write.Counter
	switch {
	case a.outcome == applied:
	case store.Denied(a.err):
		r.denials++
	default:
		r.failures++
	}
	switch {
	case a.outcome == applied && a.resend:
		r.settled[c] = a.write.Delta
		r.written += a.write.Delta
		return
	case a.outcome == applied:
		r.wrote = append(r.wrote, counterDelta{c, a.write.Delta})
		r.written += a.write.Delta
		return
	case a.resend:
	case a.outcome == inDoubt:
		r.doubt[c] = a.write
	case a.outcome == throttled:
		r.throttled++ // the store is up: this topic is hot
	default:
		r.refused++
		if store.Denied(a.err) {
			r.denied[c] = a.err
		}
	}
	if r.err == nil {
		r.err = a.err
	}
}

// down says the store refused a whole round of writes and took none: the
// rest of the window waits for the next flush instead of costing a failed
// call each (a million topics during an outage).
func (r *round) down(limit int) bool { return r.refused >= limit && r.written == 0 }

// send sends the ledger's writes in doubt again, then new ones of the
// counters of w, the window the flush holds, while the deadline, the
// context and the store allow, and tallies their answers. A write not
// started is no ambiguity: its delta waits for the next flush.
func (f *Flusher) send(ctx context.Context, w aggregator.Window, shards shardTable, deadline time.Time) *round {
	r := &round{counters: w.Len(), settled: make(map[schema.Counter]int64), doubt: make(map[schema.Counter]store.Write), denied: make(map[schema.Counter]error)}
	b := f.writer.batch(func(as []answer) {
		f.view.Answered(viewed(as))
		for _, a := range as {
			r.take(a)
		}
	})
	// A write starts only before the flush's deadline and with room to
	// finish before ctx's (the shutdown's): one cut off in flight would be
	// in doubt, where one never started keeps its delta whole.
	inTime := func() bool { return !f.now().After(deadline) && !f.tooLate(ctx) }
	for c, pw := range f.ledger.resendable(inTime) {
		if !b.acquire(inTime) {
			break
		}
		if c.Kind == schema.Total {
			f.view.Resent(c.Topic)
		}
		b.run(func() answer {
			a := f.writer.resend(ctx, pw)
			f.landed(a)
			return a
		})
	}
	for c, delta := range counters(w.Deltas) {
		b.collect()
		if r.down(f.cfg.Concurrency) || !b.acquire(func() bool { return !r.down(f.cfg.Concurrency) && inTime() }) {
			continue
		}
		x, n, sentAt := shards.newWrite(c, delta, f.cfg.Writer), shards.of(c), f.now()
		if c.Kind == schema.Total {
			sentAt = f.view.Sent(c.Topic)
		}
		b.run(func() answer {
			a := f.writer.send(ctx, x, n)
			a.sentAt = sentAt
			f.landed(a)
			return a
		})
	}
	b.wait()
	return r
}

// viewed is what readers see of a batch of answers: those to writes of
// topics' totals (a time bucket's is no total). A write in doubt sent
// again and not applied stays in doubt: the ledger sends it again.
func viewed(as []answer) []ownwrites.Answer {
	out := make([]ownwrites.Answer, 0, len(as))
	for _, a := range as {
		c := a.write.Counter
		if c.Kind != schema.Total {
			continue
		}
		o := ownwrites.Refused
		switch {
		case a.outcome == applied:
			o = ownwrites.Applied
		case a.outcome == inDoubt || a.resend:
			o = ownwrites.InDoubt
		}
		out = append(out, ownwrites.Answer{Topic: c.Topic, Delta: a.write.Delta, Sent: a.sentAt, Outcome: o, Retry: a.resend})
	}
	return out
}

// landed counts an applied write's mentions as it lands, not at the
// flush's end: a long flush shows its progress. A time bucket's repeat a
// total's.
func (f *Flusher) landed(a answer) {
	if a.outcome == applied && !a.write.Counter.IsBucket() {
		f.metrics.flushed.Add(float64(a.write.Delta))
	}
}

// gather adds to u what the flush did not write of w, the window it holds
// (not applied, not in doubt), and leaves w without counters. During an
// outage a million-topic window is handed back without a copy: only the
// counters written leave it. They leave in steps of gatherStep under the
// view's lock: readers see an answered write's topic by its answer, not
// by the window, so no step changes what they see, and none holds them
// up for long. The hand-over to u is one step.
func (f *Flusher) gather(w *aggregator.Window, r *round, u *aggregator.Window) {
	left := w.Deltas
	var name []byte // the window keeps counters by name; Delete keeps nothing of its argument
	for i := 0; i < len(r.wrote); i += gatherStep {
		f.view.Change(func() {
			for _, x := range r.wrote[i:min(i+gatherStep, len(r.wrote))] {
				name = x.counter.AppendName(name[:0])
				left.Delete(string(name))
			}
		})
	}
	doubt := slices.Collect(maps.Keys(r.doubt)) // few, unless the store lost many answers
	for i := 0; i < len(doubt); i += gatherStep {
		f.view.Change(func() {
			for _, c := range doubt[i:min(i+gatherStep, len(doubt))] {
				name = c.AppendName(name[:0])
				left.Delete(string(name))
			}
		})
	}
	f.view.Move(func() func(string) int64 {
		if left.Len() > u.Deltas.Len() {
			u.Deltas, left = left, u.Deltas
		}
		for counter, d := range left.All() {
			u.Deltas.Set(counter, d)
		}
		w.Deltas = nil        // u's now
		return held(u.Deltas) // refused or not sent: pending again
	})
}

// gatherStep is how many written counters leave the window per step of
// gather: a few milliseconds of the view's lock.
const gatherStep = 4096

// observe tells the observers what the flush wrote, new writes and
// settled ones.
func (f *Flusher) observe(r *round) {
	if f.observer == nil || r.written == 0 {
		return
	}
	observed := make(map[schema.Counter]int64, len(r.settled)+len(r.wrote))
	for _, x := range r.wrote {
		observed[x.counter] = x.delta
	}
	for c, d := range r.settled {
		observed[c] += d
	}
	f.observer.Observe(observed)
}

// progress is what liveness and the outage probe follow: a flush that
// wrote something (or had nothing to write, or was refused only for good)
// moved on, even if one poison topic keeps failing; only a flush that
// wrote nothing of its work means the store is not taking writes.
func (f *Flusher) progress(r *round, unwritten aggregator.Window) {
	attempted := r.counters > 0 || f.ledger.writes() > 0 || unwritten.Len() > 0 || len(r.settled) > 0
	// A flush whose every failure refused for good is no outage: the
	// store answers, about some keys. Taking the store for down would
	// hold the other topics to a probe a flush, and restart the sidecar;
	// the quarantine deals with those keys.
	wrote := r.written > 0 || !attempted
	progress := wrote || r.denials > 0 && r.failures == 0
	if progress {
		f.lastProgress.Store(f.now().UnixNano())
	}
	if wrote {
		f.lastWrite.Store(f.now().UnixNano())
	}
	f.down.Store(!progress && r.refused > 0 && r.throttled == 0)
}

// end hands what is left back to the buffer and reports the flush.
// Held-back and untried deltas count as unwritten too: Final must flush
// again.
func (f *Flusher) end(p plan, r *round, u aggregator.Window) error {
	if u.Len() > 0 || f.ledger.writes() > 0 || p.heldCounters > 0 || p.untriedCounters > 0 && r.written == 0 {
		return f.requeue(p, r, u)
	}
	f.view.Move(func() func(string) int64 { return nil })
	if p.untriedCounters > 0 {
		// The probe went through: the store is back, and the next flush
		// takes the rest, which Final must not leave behind.
		f.metrics.flushes.WithLabelValues("error").Inc()
		return &ProbedError{Probed: r.counters, Left: p.untriedCounters}
	}
	f.metrics.flushes.WithLabelValues("ok").Inc()
	f.metrics.lastSuccess.Set(float64(f.now().UnixNano()) / 1e9)
	return nil
}

// requeue merges u back into the buffer and says what the flush left and
// why.
func (f *Flusher) requeue(p plan, r *round, u aggregator.Window) error {
	kept, unwritten := u.Mentions(), u.Len()
	f.view.Move(func() func(string) int64 { f.buf.Merge(u); return nil })
	f.metrics.requeued.Add(float64(kept))
	f.metrics.flushes.WithLabelValues("error").Inc()
	err := r.err
	switch {
	case err != nil:
	case p.heldCounters > 0:
		err = &HeldError{Counters: p.heldCounters}
	case p.untriedCounters > 0:
		err = ErrStoreDown
	default:
		err = ErrFlushDeadline
	}
	return &IncompleteError{UnwrittenCounters: unwritten, Counters: r.counters, Kept: kept, Pending: f.ledger.writes(), Held: p.heldCounters, Untried: p.untriedCounters, Err: err}
}
