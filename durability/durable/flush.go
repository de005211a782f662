package durable

import (
	"context"
	"errors"
	"sync"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sync/errgroup"

	"github.com/hotcount/hotcount/durability/rules"
	"github.com/hotcount/hotcount/pipeline/ownwrites"
	"github.com/hotcount/hotcount/pipeline/store"
	"github.com/hotcount/hotcount/schema"
)

// outcome is what became of one counter's write.
type outcome uint8

const (
	applied outcome = iota // in the store now, by this write
	covered                // in the store already: the item's position was at or past the write's last
	inDoubt                // maybe applied (a lost answer): sent again unchanged next flush
	failed                 // not applied: the entry goes back to the window
)

// job is one counter's write: its entry, and whether an earlier attempt
// of exactly this write may have been applied.
type job struct {
	k     key
	e     entry
	retry bool
	// replay is the held entry this job writes (nil: a window's entry).
	replay *heldEntry
}

// result is a job's outcome, with the entry it ended with (a recount
// narrows it).
type result struct {
	job
	out outcome
	err error
}

// Flush writes the window: one conditional write per counter, to the
// counter's one item (shard 0), carrying the stream positions its delta
// covers. Writes in doubt from the last flush go again unchanged, and a
// counter's newer entry waits behind its write in doubt, so that no
// later span of this process lands before an earlier one. Held counters'
// entries go to their record, and every replayInterval the held entries
// are tried again. What is not written goes back to the window. Then each
// stream's record moves past what is in the store or held.
func (e *Engine) Flush(ctx context.Context) error {
	e.flushMu.Lock()
	defer e.flushMu.Unlock()
	start := e.now()
	var d drained
	e.view.Move(func() func(string) int64 { d = e.win.drain(); return heldTotals(d.counters) })
	e.inFlight.Store(e.doubtOldest())
	blocked := e.fence(ctx, d.counters)
	e.marks(ctx, d.marks, blocked)
	rd := newRound()
	e.tally(rd, e.sendAll(ctx, e.plan(ctx, rd, split(d.counters), blocked)))
	e.observe(rd.observed)
	e.progress(rd)
	e.checkpoint(ctx, d.read, rd.back, rd.changes)
	e.view.Move(func() func(string) int64 { e.win.giveBack(rd.back); return nil })
	e.retention(rd.back)
	e.flushed.fire()
	return e.finish(start, rd.first)
}

// round is one flush's bookkeeping: what goes back to the window, what
// changes in each stream's record, what the observers are told, and how
// the writes went.
type round struct {
	back             map[key]*entry
	changes          map[stream]*changes
	observed         map[schema.Counter]int64
	first            error // the first failure
	wrote, attempted int
	// denied and failed count the writes refused for good
	// (store.Denied: held once --quarantine-after passes) and the others
	// that failed.
	denied, failed int
}

func newRound() *round {
	return &round{back: make(map[key]*entry), changes: make(map[stream]*changes), observed: make(map[schema.Counter]int64)}
}

// of is the changes to s's record.
func (rd *round) of(s stream) *changes {
	if rd.changes[s] == nil {
		rd.changes[s] = &changes{hold: make(map[key]*entry), reasons: make(map[key]string), released: make(map[schema.Counter]heldEntry)}
	}
	return rd.changes[s]
}

// plan is the flush's writes: each counter's entry, unless it waits
// behind its write in doubt (back to the window) or is held (to its
// record); the writes in doubt again; and the held entries' replays.
func (e *Engine) plan(ctx context.Context, rd *round, counters map[key]*entry, blocked map[string]bool) []job {
	jobs := make([]job, 0, len(counters)+len(e.doubt))
	for k := range e.doubt {
		if e.stale(k.s) { // maybe applied: the re-read's write settles it by position
			delete(e.doubt, k)
		}
	}
	for k, ent := range counters {
		if e.stale(k.s) {
			continue // read before a rewind: read again, and written then
		}
		if _, waiting := e.doubt[k]; waiting || blocked[k.s.name] {
			rd.back[k] = ent
			continue
		}
		if e.held.has(k) {
			rd.of(k.s).hold[k] = ent
			continue
		}
		jobs = append(jobs, job{k: k, e: *ent})
	}
	for _, j := range e.doubt {
		jobs = append(jobs, j)
	}
	return append(jobs, e.replays(ctx)...)
}

// tally takes the writes' results: applied or covered, done; in doubt,
// sent again next flush; failed, back to the window, or to the record
// once refused for good for QuarantineAfter. A replay done is released
// from its record; one not done stays held.
func (e *Engine) tally(rd *round, results []result) {
	for _, r := range results {
		if r.replay != nil {
			if r.out == applied || r.out == covered {
				rd.of(r.k.s).released[r.k.c] = *r.replay
			}
			if r.out == applied {
				rd.observed[r.k.c] += r.e.delta
			}
			continue
		}
		delete(e.doubt, r.k)
		rd.attempted++
		switch r.out {
		case applied:
			rd.wrote++
			rd.observed[r.k.c] += r.e.delta
			delete(e.denied, r.k)
		case covered:
			rd.wrote++
			delete(e.denied, r.k)
			if r.retry { // in doubt, found in the store: that was this write
				rd.observed[r.k.c] += r.e.delta
			}
		case inDoubt:
			r.retry = true
			e.doubt[r.k] = r.job
		case failed:
			if store.Denied(r.err) {
				rd.denied++
			} else {
				rd.failed++
			}
			if e.refused(r.k, r.err) {
				c := rd.of(r.k.s)
				ent := r.e
				c.hold[r.k], c.reasons[r.k] = &ent, r.err.Error()
				continue
			}
			giveBackTo(rd.back, r.k, &r.e)
			if rd.first == nil {
				rd.first = r.err
			}
			if r.k.c.Kind == schema.Total {
				e.metrics.requeued.Add(float64(r.e.delta))
			}
		}
	}
}

// finish sets the flush's metrics and returns its error: the first
// failure, or writes left in doubt.
func (e *Engine) finish(start time.Time, err error) error {
	e.metrics.pending.Set(float64(len(e.doubt)))
	e.metrics.duration.Observe(e.now().Sub(start).Seconds())
	if err == nil && len(e.doubt) > 0 {
		err = errors.New("durable: writes in doubt, sent again next flush")
	}
	if err != nil {
		e.metrics.flushes.WithLabelValues("error").Inc()
		return err
	}
	e.metrics.flushes.WithLabelValues("ok").Inc()
	e.metrics.lastSuccess.Set(float64(e.now().UnixNano()) / 1e9)
	return nil
}

// giveBackTo merges ent into k's entry in back: two spans of one counter
// (a newer one waiting behind a write in doubt, and that write's) never
// replace each other.
func giveBackTo(back map[key]*entry, k key, ent *entry) {
	if prev, ok := back[k]; ok {
		prev.merge(*ent)
		return
	}
	cp := *ent
	back[k] = &cp
}

// sendAll sends the jobs, at most Concurrency at once, and returns their
// results.
func (e *Engine) sendAll(ctx context.Context, jobs []job) []result {
	results := make([]result, len(jobs))
	answers := make(chan ownwrites.Answer, max(e.cfg.Concurrency, 1))
	var shown sync.WaitGroup
	shown.Go(func() { e.view.AnsweredFrom(answers) })
	var g errgroup.Group
	g.SetLimit(max(e.cfg.Concurrency, 1))
	for i, j := range jobs {
		g.Go(func() error {
			results[i] = e.send(ctx, j, answers)
			return nil
		})
	}
	_ = g.Wait() // the jobs return no errors: their results say
	close(answers)
	shown.Wait()
	return results
}

// heldTotals is what readers see a flush hold of each topic in counters:
// its total's delta, and its Fresh counters', which the flush splits.
func heldTotals(counters map[key]*entry) func(string) int64 {
	totals := make(map[string]int64)
	for k, ent := range counters {
		if k.c.Kind == schema.Total || k.c.Kind == schema.Fresh {
			totals[k.c.Topic], _ = schema.SatAdd(totals[k.c.Topic], ent.delta)
		}
	}
	return func(topic string) int64 { return totals[topic] }
}

// shown is what readers of totals see of a job's write: a write of a
// total, not a replay of a held entry (whose mentions they do not see
// pending).
func shown(j job) bool { return j.k.c.Kind == schema.Total && j.replay == nil }

// answer tells the readers, through answers, of j's write's outcome.
func answer(answers chan<- ownwrites.Answer, j job, out outcome, sent time.Time) {
	if !shown(j) {
		return
	}
	o := ownwrites.Refused
	switch out {
	case applied:
		o = ownwrites.Applied
	case covered:
		o = ownwrites.Covered
	case inDoubt:
		o = ownwrites.InDoubt
	}
	answers <- ownwrites.Answer{Topic: j.k.c.Topic, Delta: j.e.delta, Sent: sent, Outcome: o, Retry: j.retry}
}

// send writes one counter's entry. A write refused because the item
// holds part of its span already (another reader wrote it, or an earlier
// attempt of a narrower span) is recounted from the stream after the
// item's position and sent again for the rest.
func (e *Engine) send(ctx context.Context, j job, answers chan<- ownwrites.Answer) result {
	for range 3 {
		sent := e.now()
		switch {
		case !shown(j):
		case j.retry:
			e.view.Resent(j.k.c.Topic)
		default:
			sent = e.view.Sent(j.k.c.Topic)
		}
		err := e.add(ctx, j)
		var overlap *store.OverlapError
		switch {
		case err == nil:
			e.metrics.writes.WithLabelValues("applied").Inc()
			answer(answers, j, applied, sent)
			return result{job: j, out: applied}
		case errors.Is(err, store.ErrCovered):
			e.metrics.writes.WithLabelValues("covered").Inc()
			answer(answers, j, covered, sent)
			return result{job: j, out: covered}
		case errors.Is(err, store.ErrAmbiguous) && !store.Denied(err):
			// A write in doubt that the store now refuses for good is
			// refused, not in doubt: held in its turn, it would stay in
			// doubt for ever, its counter's later mentions behind it.
			// Whether an earlier attempt landed, the positions settle when
			// it is written (or held, then written) with them.
			e.metrics.writes.WithLabelValues("in_doubt").Inc()
			answer(answers, j, inDoubt, sent)
			return result{job: j, out: inDoubt, err: err}
		case !errors.As(err, &overlap):
			e.metrics.writes.WithLabelValues("failed").Inc()
			answer(answers, j, failed, sent)
			return result{job: j, out: failed, err: err}
		}
		e.metrics.writes.WithLabelValues("overlap").Inc()
		rest, err := e.recount(ctx, j.k, overlap.Recorded.Seq+1, j.e.last)
		if err != nil {
			answer(answers, j, failed, sent)
			return result{job: j, out: failed, err: err}
		}
		if rest.delta == 0 {
			answer(answers, j, covered, sent)
			return result{job: j, out: covered}
		}
		rest.since = j.e.since
		j = job{k: j.k, e: rest, replay: j.replay}
	}
	answer(answers, j, failed, time.Time{})
	return result{job: j, out: failed, err: errors.New("durable: the item's position kept moving under the write")}
}

// add is one attempt of a job's write.
func (e *Engine) add(ctx context.Context, j job) error {
	wctx, cancel := context.WithTimeout(ctx, e.cfg.WriteTimeout)
	defer cancel()
	return e.st.Add(wctx, store.Write{
		Counter: j.k.c,
		Delta:   j.e.delta,
		Retry:   j.retry,
		Span:    &store.Span{Stream: j.k.s.name, Epoch: j.k.s.epoch, First: j.e.first, Last: j.e.last},
	}, e.now())
}

// checkpoint moves each stream's record: its sequence to the last the
// flush had read, or to just below the first sequence of an entry still
// unwritten (back in the window, or in doubt), whichever is lower; its
// held counters as the flush held and released them, in the same
// compare-and-set. An entry that could not be held goes back (into back,
// which the caller returns to the window) and holds the sequence.
func (e *Engine) checkpoint(ctx context.Context, read map[stream]uint64, back map[key]*entry, ch map[stream]*changes) {
	for s, c := range ch { // what cannot be held lowers the sequence below
		if _, ok := read[s]; !ok {
			for k, ent := range c.hold {
				giveBackTo(back, k, ent)
			}
			c.hold = nil
		}
	}
	e.ckptFailing = false
	defer func() { e.ckptFailed.Store(e.ckptFailing) }()
	for s, n := range e.lows(read, back, ch) {
		if e.stale(s) {
			continue // read before a rewind: its record is not its to move
		}
		p := store.Position{Epoch: s.epoch, Seq: n}
		if c := ch[s]; moved(p, e.advanced[s.name]) || c != nil {
			e.storeRecord(ctx, s, p, c, back)
		}
	}
}

// lows is, per stream, the sequence its checkpoint may move to: the last
// the flush had read, or just below the first sequence of an entry still
// unwritten (back, or in doubt), whichever is lower; 0 (no move) for a
// stream not read here whose record changes (a replay).
func (e *Engine) lows(read map[stream]uint64, back map[key]*entry, ch map[stream]*changes) map[stream]uint64 {
	low := make(map[stream]uint64, len(read))
	for s, n := range read {
		low[s] = n
	}
	lower := func(k key, ent entry) {
		if n, ok := low[k.s]; ok && ent.first-1 < n {
			low[k.s] = ent.first - 1
		}
	}
	for k, ent := range back {
		lower(k, *ent)
	}
	for _, j := range e.doubt {
		lower(j.k, j.e)
	}
	for s := range ch {
		if _, ok := low[s]; !ok {
			low[s] = 0
		}
	}
	return low
}

// storeRecord moves s's record to p and applies c (nil: none) to its held
// counters, in one compare-and-set; what it could not hold goes into back
// and keeps the sequence below it.
func (e *Engine) storeRecord(ctx context.Context, s stream, p store.Position, c *changes, back map[key]*entry) {
	var kept map[key]*entry
	stored, stale := p, false
	timeout := 2 * time.Second
	if c != nil && len(c.hold) > 0 {
		timeout = 30 * time.Second // a hold may recount
	}
	cctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var dropped map[string]heldEntry // an older stream's holds, replaced (counted once stored)
	var fenced uint64                // a newer generation found: a rewind
	foreign := false                 // the record is another table's, the fleet's
	took := false                    // the record was another table's, and is this one's now
	err := e.ckpt.update(cctx, s.name, func(r *record) (bool, error) {
		dropped, took, foreign = nil, false, false // update may call this again, on a newer record
		if r.Gen > s.gen {
			fenced = r.Gen
			return false, nil
		}
		if r.Table != "" && r.Table != e.cfg.Table {
			if e.tableNow(s.name, rules.Rules{}).Table != e.cfg.Table {
				foreign = true // rewound for the fleet's table; this one is not
				return false, nil
			}
			// Another table's record, and this sidecar's is the table the
			// rules name now: it read the stream from its first message
			// (begin), and the record is this table's from here on.
			r.Table, r.held, took = e.cfg.Table, nil, true
		}
		if r.Epoch != s.epoch && r.Epoch != 0 {
			// Which of the two streams is the live one, the server says:
			// creation times are the servers' clocks, and a clock set back
			// could make the newer stream's epoch the smaller.
			live, err := e.liveEpoch(cctx, s.name)
			if err != nil {
				return false, err
			}
			if stale = live != s.epoch; stale {
				return false, nil // a newer stream's: nothing of this one counts there
			}
		}
		if r.Epoch != s.epoch {
			// The record of a stream since deleted (or none yet): its
			// held counters were that stream's mentions, and went with it.
			dropped = r.held
			*r = record{Position: store.Position{Epoch: s.epoch}, Gen: r.Gen, Table: r.Table}
		}
		stored = p
		if c != nil {
			kept = e.apply(cctx, r, *c)
			for _, ent := range kept { // not held: the sequence stays below it
				stored.Seq = min(stored.Seq, ent.first-1)
			}
		}
		if took || after(stored, r.Position) {
			r.Position = stored
		}
		return true, nil
	})
	switch {
	case fenced > 0:
		// Rewound: what this flush would have held was read before the
		// rewind, and is read again.
		e.raise(s.name, fenced)
	case foreign: // not held: the window keeps it
		c.giveBack(back)
	case err != nil:
		e.ckptFailing = true
		e.sampled.Warn("checkpoint not stored; the next flush tries again", zap.String("stream", s.name), zap.Error(err))
		c.giveBack(back)
	case stale: // the stream was created again: what it held went with it
		e.dropHolds(s, c)
	default:
		e.lostHeld(s.name, dropped)
		e.settled(s, c, kept, back)
		if moved(stored, e.advanced[s.name]) {
			e.advanced[s.name] = stored
			e.metrics.checkpoint.Set(float64(stored.Seq))
		}
	}
}

// giveBack returns the counters c would have held to back, the window's:
// the record did not take them. c may be nil.
func (c *changes) giveBack(back map[key]*entry) {
	if c == nil {
		return
	}
	for k, ent := range c.hold {
		giveBackTo(back, k, ent)
	}
}

// dropHolds reports the counters c would have held in s's record as lost
// with s, which was created again. c may be nil.
func (e *Engine) dropHolds(s stream, c *changes) {
	if c == nil {
		return
	}
	lost := make(map[string]heldEntry, len(c.hold))
	for k, ent := range c.hold {
		e.held.set(k, false)
		lost[k.c.Name()] = heldEntry{Topic: k.c.Topic, First: ent.first, Last: ent.last, Delta: ent.delta}
	}
	e.lostHeld(s.name, lost)
}

// settled notes a stored record's changes: held counters are held here
// from now on (their next entries go to the record), released ones are
// not, and entries the record could not take go back to the window.
func (e *Engine) settled(s stream, c *changes, kept map[key]*entry, back map[key]*entry) {
	if c == nil {
		return
	}
	for counter := range c.released {
		e.held.set(key{s, counter}, false)
		e.log.Info("a held counter is in the store now", zap.String("stream", s.name), zap.String("counter", counter.Name()))
	}
	for k, ent := range c.hold {
		if _, ok := kept[k]; ok {
			giveBackTo(back, k, ent)
			continue
		}
		e.held.set(k, true)
		if k.c.Kind == schema.Total {
			e.metrics.quarantinedMentions.Add(float64(ent.delta))
		}
		reason, refused := c.reasons[k]
		if !refused {
			continue // a held counter's later mentions, held with it
		}
		delete(e.denied, k)
		e.metrics.quarantined.Inc()
		e.log.Error("writes refused for good: the counter's mentions are held in its stream's checkpoint, and written once the store takes them",
			zap.String("stream", s.name), zap.String("counter", k.c.Name()), zap.Uint64("first", ent.first), zap.Uint64("last", ent.last),
			zap.String("reason", reason))
	}
}

// retention sets the retention gauges: the oldest mention not yet in the
// store (unwritten, in doubt, or unread by a reader that is behind), and
// the shortest max age of the streams read.
func (e *Engine) retention(map[key]*entry) {
	e.inFlight.Store(e.doubtOldest()) // the rest is back in the window, or written
	var shortest time.Duration
	e.ages.Range(func(_, v any) bool {
		if d := v.(time.Duration); d > 0 && (shortest == 0 || d < shortest) {
			shortest = d
		}
		return true
	})
	e.metrics.maxAge.Set(shortest.Seconds())
}

// doubtOldest is the publication (Unix ns) of the oldest mention in a
// write in doubt (0: none); flushMu must be held.
func (e *Engine) doubtOldest() int64 {
	var o int64
	for _, j := range e.doubt {
		o = minSince(o, j.e.since)
	}
	return o
}

// minSince is the older of two publications, 0 being none.
func minSince(a, b int64) int64 {
	if a == 0 || b != 0 && b < a {
		return b
	}
	return a
}

// unwrittenAge is hotcount_durable_oldest_unwritten_seconds, at the
// scrape: the oldest mention in the window, being written or in doubt,
// or unread while a reader is behind.
func (e *Engine) unwrittenAge() float64 {
	oldest := minSince(e.win.oldest(), e.inFlight.Load())
	e.unread.Range(func(_, v any) bool { oldest = minSince(oldest, v.(int64)); return true })
	if oldest == 0 {
		return 0
	}
	return max(e.now().Sub(time.Unix(0, oldest)).Seconds(), 0)
}

// observe tells the observers what was applied.
func (e *Engine) observe(written map[schema.Counter]int64) {
	if len(written) == 0 {
		return
	}
	for _, o := range e.observers {
		o.Observe(written)
	}
	for c, d := range written {
		if c.Kind == schema.Total {
			e.metrics.flushed.Add(float64(d))
		}
	}
}

// progress notes whether the flush moved on: it wrote something, had
// nothing to write, or was refused for good only (a poisoned topic, which
// the quarantine takes out of the way after --quarantine-after: a restart
// would not mend it, and would start that wait again), as core mode's
// flusher judges it.
func (e *Engine) progress(rd *round) {
	if rd.wrote > 0 || rd.attempted == 0 {
		e.lastWrite.Store(e.now().UnixNano())
	}
	if rd.wrote > 0 || rd.attempted == 0 || rd.denied > 0 && rd.failed == 0 {
		e.lastProgress.Store(e.now().UnixNano())
		e.failing.Store(false)
		return
	}
	e.failing.Store(true)
}

// broadcast wakes every waiter once per fire.
type broadcast struct {
	mu sync.Mutex
	ch chan struct{}
}

func (b *broadcast) wait() <-chan struct{} {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.ch == nil {
		b.ch = make(chan struct{})
	}
	return b.ch
}

func (b *broadcast) fire() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.ch != nil {
		close(b.ch)
		b.ch = nil
	}
}

// lostHeld counts and logs held counters of stream whose stream was
// deleted (and created again) before the store took them: they went
// with it, like the mentions it held unread.
func (e *Engine) lostHeld(stream string, held map[string]heldEntry) {
	for name, h := range held {
		e.metrics.retentionLost.Add(float64(h.Last - h.First + 1))
		e.log.Error("the stream was deleted and created again while the store refused a counter's writes: its held mentions went with it",
			zap.String("stream", stream), zap.String("counter", name), zap.Int64("delta", h.Delta), zap.Uint64("first", h.First), zap.Uint64("last", h.Last))
	}
}
