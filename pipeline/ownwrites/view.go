// Package ownwrites is what a reader of totals may see of this sidecar's
// own writes. A mention accepted here is in the writer's buffer, in the
// window a flush holds, in a write on its way or in doubt, or landed in
// the store; a total read here (include=pending) counts it once wherever
// it is, and a cached total counts this sidecar's landed writes as soon
// as they land, not a TTL later.
//
// The writer (the flusher in core mode, the durable engine in the
// durable modes) tells the View where its counts are: Move, Sent,
// Resent, Answered. The lookup asks it: Mark before a gather, Landed and
// Read after, OnItsWay and UntilLanded around a write it raced, Floor for
// what it served. Neither calls the other, and the View calls neither:
// what it knows is pulled by the reader that needs it.
package ownwrites

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hotcount/hotcount/schema"
)

// Config bounds what the View keeps for readers.
type Config struct {
	// Keep is how long a cached total may be served after its gather
	// (--cache-stale): the landings and floors it may need are kept for
	// that long.
	Keep time.Duration
	// Topics bounds the topics whose landings and floors are kept
	// (--cache-size): past it the oldest go, and a cached total that
	// needed them is gathered again.
	Topics int
}

// View is what readers may see of this sidecar's writes. It is safe for
// concurrent use: the writer's calls come from its flush's goroutine, the
// readers' from any.
type View struct {
	cfg Config
	now func() time.Time

	// mu guards what follows, and every move of counts between the
	// writer's places: a reader holding its read lock sees each mention in
	// exactly one of them.
	mu       sync.RWMutex
	buffered func(topic string) int64 // the writer's buffer; nil: none
	held     func(topic string) int64 // the window a flush holds, unsent; nil: none
	sent     map[string]sending       // this flush's new writes, by topic
	doubt    map[string]sending       // writes in doubt, sent again at the next flush
	tracks   tracks                   // landings, for the topics readers gathered

	landings landings
	floors   floors
}

// sending is a write of a topic's total as readers see it: when it was
// first sent, its delta, and whether it is on its way now (sent and not
// answered: a total gathered since may or may not hold it).
type sending struct {
	at       time.Time
	delta    int64
	onItsWay bool
	back     bool // refused: the writer gives it back to its buffer at its next Move
}

// New returns a View with nothing attached: no writes, nothing pending.
func New(cfg Config, now func() time.Time) *View {
	cfg.Topics = max(cfg.Topics, 1)
	if cfg.Keep <= 0 {
		cfg.Keep = time.Second
	}
	v := &View{cfg: cfg, now: now, sent: make(map[string]sending), doubt: make(map[string]sending)}
	v.tracks = tracks{topics: make(map[string]*track), limit: 2*cfg.Topics + 1024}
	v.floors = newFloors(cfg, now)
	return v
}

// Outcome is how the store answered a write.
type Outcome int

const (
	// Applied: the write landed; its delta is in the store now.
	Applied Outcome = iota
	// Covered: the store holds the write's delta already, by an earlier
	// write or another writer's (the durable modes): it leaves the view
	// without a landing.
	Covered
	// InDoubt: it may or may not have landed; the writer sends it again.
	InDoubt
	// Refused: it did not land; its delta is the writer's again.
	Refused
)

// Answer is the store's answer to a write of Topic's total. Retry says it
// was a write in doubt sent again (Resent), not a new one (Sent).
type Answer struct {
	Topic   string
	Delta   int64
	Sent    time.Time
	Outcome Outcome
	Retry   bool
}

// Attach makes buffered the writer's buffer: what it holds of a topic
// and no flush has taken. Call it once, before the writer runs.
func (v *View) Attach(buffered func(topic string) int64) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.buffered = buffered
}

// Move runs fn, which moves counts between the writer's buffer and what
// its flush holds, in one step for readers, and makes what fn returns
// (nil: nothing) the window the flush holds with none of its writes
// started. Writes refused since the last Move leave the view: fn gives
// their deltas back.
func (v *View) Move(fn func() (held func(topic string) int64)) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.held = fn()
	clear(v.sent)
	for topic, d := range v.doubt {
		if d.back {
			delete(v.doubt, topic)
		}
	}
}

// Change runs fn under the lock, for a change to the window the flush
// holds that no reader's answer depends on (the counters of writes
// already answered leave it): readers never read the window while it
// changes. A large change goes in small steps: readers wait for each.
func (v *View) Change(fn func()) {
	v.mu.Lock()
	defer v.mu.Unlock()
	fn()
}

// Sent marks a new write of topic's total as on its way from now, and
// returns that time: the writer sends it next, and its answer carries
// it (Answer.Sent). The time is read under the lock that shows the write
// to readers, so that a reader that did not see it on its way gathered
// before it was sent: a time read before the lock could be older than a
// gather that ended while the writer waited for it, and the reader would
// take that gather to hold a write it cannot.
func (v *View) Sent(topic string) time.Time {
	v.mu.Lock()
	defer v.mu.Unlock()
	at := v.now()
	v.sent[topic] = sending{at: at, onItsWay: true}
	return at
}

// Resent marks topic's write in doubt as on its way again.
func (v *View) Resent(topic string) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if d, ok := v.doubt[topic]; ok {
		d.onItsWay = true
		v.doubt[topic] = d
	}
}

// Answered takes a batch of answers, in one step for readers. A write
// that landed leaves the view for the store's totals, recorded as a
// landing for the totals cached before it; one in doubt is held until
// sent again; one refused is neither in the store nor on its way.
func (v *View) Answered(batch []Answer) {
	if len(batch) == 0 {
		return
	}
	var landed []string
	v.mu.Lock()
	now := v.now()
	for _, a := range batch {
		if v.answer(a, now) {
			landed = append(landed, a.Topic)
		}
	}
	v.mu.Unlock()
	for _, topic := range landed {
		v.landings.land(topic)
	}
}

// AnsweredFrom takes the answers sent on ch until it is closed, in
// batches of those that have come in (Answered), and then returns: the
// writers of a flush send on ch, and readers wait on one lock per batch,
// not per answer.
func (v *View) AnsweredFrom(ch <-chan Answer) {
	var batch []Answer
	for a := range ch {
		batch = append(batch[:0], a)
	more:
		for {
			select {
			case a, ok := <-ch:
				if !ok {
					break more
				}
				batch = append(batch, a)
			default:
				break more
			}
		}
		v.Answered(batch)
	}
}

// answer takes one answer, under mu, and says whether it landed.
func (v *View) answer(a Answer, now time.Time) bool {
	d, doubted := v.doubt[a.Topic]
	if a.Retry {
		switch {
		case !doubted:
			return false
		case a.Outcome == Applied || a.Outcome == Covered:
			// Covered, a write in doubt sent again was in the store
			// already: its first send landed, at some time since.
			delete(v.doubt, a.Topic)
			v.tracks.land(a.Topic, landing{sent: d.at, landed: now, delta: a.Delta}, v.cfg.Keep)
			return true
		default:
			d.onItsWay, d.back = false, a.Outcome == Refused
			v.doubt[a.Topic] = d
		}
		return false
	}
	// A write in doubt that overlapped another writer's is sent on as a
	// new write of its rest (the durable engine): its answer settles the
	// doubt too.
	switch a.Outcome {
	case Applied:
		v.sent[a.Topic] = sending{at: a.Sent}
		delete(v.doubt, a.Topic)
		v.tracks.land(a.Topic, landing{sent: a.Sent, landed: now, delta: a.Delta}, v.cfg.Keep)
		return true
	case Covered:
		// In the store by another writer's write, at a time this view
		// cannot know: no longer pending (the window the flush holds
		// still has it), and no landing to raise a total by. A total
		// gathered before that write is short of it until its next
		// gather, never counts it twice.
		v.sent[a.Topic] = sending{at: a.Sent}
		delete(v.doubt, a.Topic)
	case InDoubt:
		v.sent[a.Topic] = sending{at: a.Sent}
		v.doubt[a.Topic] = sending{at: a.Sent, delta: a.Delta}
	default:
		delete(v.sent, a.Topic)
		if doubted {
			d.onItsWay, d.back = false, true
			v.doubt[a.Topic] = d
		}
	}
	return false
}

// Mark is how far a gather of a topic had counted the topic's landings
// when it began: Mark it before the gather.
type Mark struct {
	t    *track
	seen uint64
}

// Gather is a total as gathered: begun at Started, ended at At, with the
// landings Mark had counted by then; Peer says another sidecar gathered
// it and At is when it came.
type Gather struct {
	Mark    Mark
	Started time.Time
	At      time.Time
	Peer    bool
}

// Mark returns topic's mark as of now, to take before gathering it.
func (v *View) Mark(topic string) Mark {
	now := v.now()
	v.mu.RLock()
	t, ok := v.tracks.topics[topic]
	v.mu.RUnlock()
	if !ok {
		v.mu.Lock()
		t = v.tracks.get(topic, now, v.cfg.Keep)
		v.mu.Unlock()
	}
	t.used.Store(now.UnixNano())
	return Mark{t: t, seen: t.n.Load()}
}

// Landed returns what this sidecar's writes that landed since g's mark
// add to g's total, and the mark that counts them. ok is false when g
// may or may not hold one of them (its gather overlapped the write), or
// its landings are no longer kept: the total must be gathered again, and
// add is only what g certainly does not hold.
// Another sidecar's total is taken to hold every write that landed
// before it came. Without a landing since g's mark it takes no lock.
func (v *View) Landed(g Gather) (add int64, now Mark, ok bool) {
	if t := g.Mark.t; t == nil || t.n.Load() == g.Mark.seen && !t.gone.Load() {
		return 0, g.Mark, true
	}
	v.mu.RLock()
	defer v.mu.RUnlock()
	return v.landedSince(g)
}

// landedSince is Landed under mu.
func (v *View) landedSince(g Gather) (add int64, now Mark, ok bool) {
	t := g.Mark.t
	if t == nil {
		return 0, g.Mark, true
	}
	if t.gone.Load() || g.Mark.seen < t.first {
		return 0, g.Mark, false
	}
	ok = true
	for _, l := range t.landings[g.Mark.seen-t.first:] {
		switch {
		case l.landed.Before(g.Started):
			// Landed before the gather began: it holds it.
		case l.sent.After(g.At):
			add, _ = schema.SatAdd(add, l.delta) // sent after it ended: it cannot
		case g.Peer:
			// Another sidecar's total may or may not hold it: gathering
			// again would undo the sharing, so the total stands (the
			// floor with pending holds the answer) until the next one.
		default:
			ok = false // it may or may not: add is only what it cannot hold
		}
	}
	if !ok {
		return add, g.Mark, false
	}
	return add, Mark{t: t, seen: t.first + uint64(len(t.landings))}, true
}

// Read returns, in one step, what this sidecar's writes add to the total
// g: landed is as Landed's; pending is the mentions accepted here that
// such a gather cannot hold. They are in the buffer, in the window a
// flush holds and has not sent, or in a write (in doubt included) first
// sent after the gather ended and not landed. A write sent before it
// ended is left out: it may be in the store already, and counting it
// could count it twice. ok is false, as for Landed, also when such a
// write is still on its way: g may or may not hold it, and the total
// must be gathered again, which waits for it to land (a gather settles
// the writes it raced, but only up to a few reads). Another sidecar's
// total stands, as for Landed.
func (v *View) Read(topic string, g Gather) (landed, pending int64, ok bool) {
	v.mu.RLock()
	defer v.mu.RUnlock()
	landed, _, ok = v.landedSince(g)
	var p, q int64
	if v.buffered != nil {
		p = v.buffered(topic)
	}
	if v.held != nil {
		q = v.held(topic)
	}
	// A new write answered is landed or in doubt (below); one still on
	// its way is left out of a total gathered after it was sent, which
	// may hold it already.
	if s, sent := v.sent[topic]; sent && (!s.onItsWay || !g.At.Before(s.at)) {
		q = 0
		if s.onItsWay && !g.Peer {
			ok = false
		}
	}
	if d, ok := v.doubt[topic]; ok && g.At.Before(d.at) {
		q += d.delta // first sent after the gather ended: it cannot be in it
	}
	pending, _ = schema.SatAdd(p, q)
	return landed, pending, ok
}

// OnItsWay says whether a write of topic is on its way to the store: a
// total gathered now may or may not hold it.
func (v *View) OnItsWay(topic string) bool {
	v.mu.RLock()
	defer v.mu.RUnlock()
	s, ok := v.sent[topic]
	d, doubted := v.doubt[topic]
	return ok && s.onItsWay || doubted && d.onItsWay
}

// unlandedPoll is how often UntilLanded asks again, for a write that
// stops being on its way without landing (in doubt, refused,
// quarantined): only a landing wakes it at once.
const unlandedPoll = 10 * time.Millisecond

// UntilLanded waits until no write of topic is on its way, or ctx ends
// (false). A write that lands wakes it at once.
func (v *View) UntilLanded(ctx context.Context, topic string) bool {
	return v.untilLanded(ctx, topic, unlandedPoll)
}

func (v *View) untilLanded(ctx context.Context, topic string, poll time.Duration) bool {
	tick := time.NewTimer(poll)
	defer tick.Stop()
	for {
		// Waiting before asking: a landing in between is not missed.
		landed, done := v.landings.wait(topic)
		if !v.OnItsWay(topic) {
			done()
			return true
		}
		select {
		case <-ctx.Done():
			done()
			return false
		case <-landed:
		case <-tick.C:
		}
		done()
		tick.Reset(poll)
	}
}

// CleanUp drops the floors past Keep (the lookup's Run calls it every
// second, so that memory follows time while nobody reads).
func (v *View) CleanUp() { v.floors.cleanUp() }

// landings are what readers waiting for a topic's write to land wait on:
// a channel per topic, closed as a write of the topic lands.
type landings struct {
	waited atomic.Int64 // topics with a channel: while none, a landing takes no lock
	mu     sync.Mutex
	topics map[string]*waiting
}

// waiting is a topic's channel and how many wait on it.
type waiting struct {
	ch      chan struct{}
	waiters int
}

// wait returns a channel closed when a write of topic lands from now on,
// and the function that ends the wait.
func (l *landings) wait(topic string) (<-chan struct{}, func()) {
	l.mu.Lock()
	defer l.mu.Unlock()
	w, ok := l.topics[topic]
	if !ok {
		if l.topics == nil {
			l.topics = make(map[string]*waiting)
		}
		w = &waiting{ch: make(chan struct{})}
		l.topics[topic] = w
		l.waited.Add(1)
	}
	w.waiters++
	return w.ch, func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		if w.waiters--; w.waiters == 0 && l.topics[topic] == w {
			delete(l.topics, topic)
			l.waited.Add(-1)
		}
	}
}

// land wakes the readers waiting for a write of topic.
func (l *landings) land(topic string) {
	if l.waited.Load() == 0 {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if w, ok := l.topics[topic]; ok {
		close(w.ch)
		delete(l.topics, topic)
		l.waited.Add(-1)
	}
}
