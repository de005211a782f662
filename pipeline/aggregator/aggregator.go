// Package aggregator coalesces mentions in memory: per topic, one running
// delta for the current window. The flusher drains the window and writes one
// increment per topic, which is how a million mentions a second become a few
// thousand store writes. It is core mode's buffer: the durable modes keep
// their own window (package durable).
//
// A window's deltas are a Deltas (deltas.go): a map from topic to delta in
// about half a Go map's memory, since a store outage leaves millions of
// topics in it.
//
// With time buckets on (WithBuckets), a mention counts in its topic's
// minute counter (a schema.Counter of kind schema.Fresh) instead of the
// topic's: one counter per topic per minute, which the flusher splits into
// the topic's total and its minute and hour buckets. A window keys its
// counters by name (schema.Counter.AppendName: a total's is its topic),
// the compact form, which spilling and merging back keep as it is; a
// window's topic and mention counts leave out the minute and hour bucket
// counters a failed flush hands back.
package aggregator

import (
	"cmp"
	"errors"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/hotcount/hotcount/pipeline/spill"
	"github.com/hotcount/hotcount/schema"
)

// DefaultMaxTopics is the default bound on distinct topics in one window.
const DefaultMaxTopics = 100_000

// TopicOverhead is what the memory budget counts for a buffered topic
// beyond its name's bytes. A window at rest takes 33–35 B a topic with
// names of 12 (BenchmarkWindowMemory: its slot in Deltas with the table's
// spare room, the length byte), but the budget must bound what an outage
// holds at its height: a table growing keeps the one it grows from until
// it is done, and a failed window merged back into the next holds both
// until it is spilled. Counted at 32 B, BenchmarkOutageRSS/spill's heap
// held 37.5 MiB live in Deltas' tables and names at its largest against
// a budget of 28.8 MiB (an eighth of GOMEMLIMIT under the manifests'
// 256 MiB limit), and its peak RSS went from 111-118 MiB to 123-160 MiB;
// at 64 B it is 93-104 MiB.
const TopicOverhead = 64

// Spiller keeps windows on disk past the memory budget (spill.Dir is one).
type Spiller interface {
	// Put stores deltas as one segment; on error the caller keeps them.
	Put(deltas spill.Deltas) error
	// Keep is Put past the disk budget.
	Keep(deltas spill.Deltas) error
	// Take removes and returns the oldest segment; nil when none is left.
	Take() (map[string]int64, error)
	// Next describes the segment Take would return: its bytes and its
	// topics (0 if unknown); all zero if none.
	Next() (bytes int64, topics int)
	// Stats returns the bytes and segments stored.
	Stats() (bytes int64, segments int)
}

// Option configures an Aggregator.
type Option func(*Aggregator)

// WithBuckets has every mention counted in its topic's minute counter:
// Add's at the time now gives (its arrival), AddAt's at the time it is
// given (the message's "at"; now when zero).
func WithBuckets(now func() time.Time) Option {
	return func(a *Aggregator) { a.now = now }
}

// WithBudget bounds the window's memory to about maxBytes (topic names plus
// TopicOverhead each). Past it, Full is signalled so that the flusher
// drains early, and (spill not nil) a window the flusher hands back
// unwritten goes to spill, to come back once the store writes again. A
// window that cannot be spilled because the disk budget is exhausted is
// shed: counted in hotcount_aggregator_shed_mentions_total and logged.
func WithBudget(maxBytes int64, spill Spiller, log *zap.Logger) Option {
	return func(a *Aggregator) {
		a.maxBytes, a.spill, a.log = maxBytes, spill, log
	}
}

// Window is a drained window: the per-topic deltas. The receiver owns it.
type Window struct {
	Deltas *Deltas
	// fresh is how Pending finds a topic's Fresh counters in Deltas, as
	// the aggregator kept it while the window was its own (Drain hands it
	// over); the zero value finds none.
	fresh freshIndex
}

// Pending is topic's delta in w as the aggregator's Pending counts it:
// its total and its Fresh counters, found through the index the window
// had when it was drained. It reads w only: a flush that plans a drained
// window without changing it lets readers call Pending meanwhile.
// Counters unspilled into the window at the drain are left out until the
// plan is done, as they were while on disk.
func (w Window) Pending(topic string) int64 {
	v, _ := w.Deltas.Get(topic)
	var name []byte
	for _, m := range w.fresh.minutes[:w.fresh.n] {
		name = freshOf(topic, m).AppendName(name[:0])
		d, _ := w.Deltas.Get(string(name))
		v = satAdd(v, d)
	}
	d, _ := w.fresh.spread.Get(topic)
	return satAdd(v, d)
}

// Len is the number of topics in w.
func (w Window) Len() int { return w.Deltas.Len() }

// Mentions is the sum of w's mentions (the topics' and the Fresh
// counters' deltas; Minute and Hour counters repeat them).
func (w Window) Mentions() int64 { return mentionsOf(w.Deltas) }

// mentionCounters counts d's counters of mentions
// (schema.Counter.CountsMentions).
func mentionCounters(d *Deltas) int {
	n := 0
	for name := range d.All() {
		if countsMentions(name) {
			n++
		}
	}
	return n
}

func mentionsOf(d *Deltas) int64 {
	var n int64
	for name, v := range d.All() {
		if countsMentions(name) {
			n = satAdd(n, v)
		}
	}
	return n
}

// countsMentions says whether the counter named name counts mentions (a
// topic's total or its Fresh minute), not a bucket's repeat of them.
func countsMentions(name string) bool {
	c, _ := schema.ParseName(name)
	return c.CountsMentions()
}

// Aggregator holds the current window. It is safe for concurrent use. Its
// lock is held only to add to the window or to swap it out: no I/O and no
// allocation-heavy work happens under it.
type Aggregator struct {
	maxTopics int
	maxBytes  int64 // 0: no budget
	spill     Spiller
	log       *zap.Logger
	full      chan struct{} // capacity 1: "the window reached maxTopics"
	saturated prometheus.Counter
	spilled   prometheus.Counter
	shed      prometheus.Counter
	corrupt   prometheus.Counter
	now       func() time.Time // nil: no time buckets

	mu      sync.Mutex
	cur     Window
	total   int64      // sum of the window's mentions, for the buffered gauge
	buckets int        // Minute and Hour counters in the window (not topics)
	bytes   int64      // the window's memory, as the budget counts it
	name    []byte     // scratch for a counter's name
	fresh   freshIndex // where Pending finds the window's Fresh counters

	// Unspilling, under mu: whether the store took the last non-empty
	// window drained (not all of it came back through Merge), how
	// many topics the last drain had and how many came back, and while
	// the store is not taking writes, how many drains to skip before
	// trying segments again.
	storeOK         bool
	drained, merged int
	skip, backoff   int
	persisted       bool // Persist was called: segments stay on disk
	// carrying says the window drained last holds segments taken back
	// from disk: if any of it comes back through Merge, the window goes
	// back to disk at once, whatever its size, so that spilled mentions
	// are out of the folder only for the flush that writes them.
	carrying bool
	spillMu  sync.Mutex // one spill write at a time

	// shown is what the gauges and Stats read without the lock: the
	// window's topics, mentions and bytes, stored under mu by every change
	// (show), so that a scrape never waits for the ingest, nor it for one.
	shown struct{ topics, mentions, bytes atomic.Int64 }
}

// added publishes what an add changed for the gauges, the mentions and,
// if the window grew, its topics and bytes, and reports whether it is at
// its bound; mu must be held.
func (a *Aggregator) added(grew bool) (full bool) {
	a.shown.mentions.Store(a.total)
	if !grew {
		return false
	}
	a.shown.topics.Store(int64(a.cur.Deltas.Len() - a.buckets))
	a.shown.bytes.Store(a.bytes)
	return a.atBound()
}

// show publishes the window's figures for the gauges; mu must be held.
func (a *Aggregator) show() {
	a.shown.topics.Store(int64(a.cur.Deltas.Len() - a.buckets))
	a.shown.mentions.Store(a.total)
	a.shown.bytes.Store(a.bytes)
}

// New returns an empty aggregator. When a window reaches maxTopics distinct
// topics, Full is signalled so that the flusher drains early. The bound is
// soft: Add never refuses or drops a mention, so a window may overshoot by
// the topics that arrive before the drain, which follows at once.
func New(maxTopics int, reg prometheus.Registerer, opts ...Option) *Aggregator {
	a := &Aggregator{
		maxTopics: maxTopics,
		full:      make(chan struct{}, 1),
		cur:       Window{Deltas: NewDeltas(0)},
		log:       zap.NewNop(),
		storeOK:   true, // segments an earlier process left go first
	}
	for _, o := range opts {
		o(a)
	}
	a.saturated = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "hotcount_aggregator_saturated_total",
		Help: "Adds whose window total for a topic would have passed the int64 range and were capped (mentions lost to saturation; expected 0).",
	})
	a.spilled = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "hotcount_aggregator_spilled_mentions_total",
		Help: "Mentions moved from memory to the spill folder because the window passed its memory budget while the store was not taking them (core mode).",
	})
	a.shed = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "hotcount_aggregator_shed_mentions_total",
		Help: "Mentions dropped because the window passed its memory budget and the spill folder could not take them (disk budget exhausted or disk error). Expected 0.",
	})
	a.corrupt = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "hotcount_aggregator_spill_corrupt_total",
		Help: "Spill segments that could not be read back (damaged on disk) and were moved aside as .bad files: their mentions are not counted. Expected 0.",
	})
	reg.MustRegister(
		a.saturated, a.spilled, a.shed, a.corrupt,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "hotcount_aggregator_buffered_bytes",
			Help: "Memory of the current window as the budget counts it: topic names plus a fixed overhead per topic.",
		}, func() float64 { return float64(a.shown.bytes.Load()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "hotcount_aggregator_spill_bytes",
			Help: "Bytes of deltas in the spill folder, waiting for the store.",
		}, func() float64 {
			if a.spill == nil {
				return 0
			}
			n, _ := a.spill.Stats()
			return float64(n)
		}),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "hotcount_aggregator_buffered_topics",
			Help: "Distinct topics in the current window, not yet flushed.",
		}, func() float64 { n, _ := a.Stats(); return float64(n) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "hotcount_aggregator_buffered_mentions",
			Help: "Mentions in the current window, not yet flushed.",
		}, func() float64 { _, n := a.Stats(); return float64(n) }),
	)
	return a
}

// Add adds delta (positive) to topic's count in the current window. It does
// not allocate for a topic already in the window. A delta that would take
// the topic's window total past math.MaxInt64 saturates, and the saturation
// is counted in hotcount_aggregator_saturated_total: with deltas bounded by
// --max-count this takes over 9 × 10^12 messages for one topic in one window,
// so it is a guard, not a path.
func (a *Aggregator) Add(topic string, delta int64) {
	var at time.Time
	if a.now != nil {
		at = a.now()
	}
	a.mu.Lock()
	full := a.added(a.add(topic, delta, at))
	a.mu.Unlock()
	a.signal(full)
}

// AddAt is Add for mentions that happened at at (a message's "at", which
// the ingest has checked): with buckets on they count in at's minute, not
// the arrival's. Without buckets it is Add.
func (a *Aggregator) AddAt(topic string, delta int64, at time.Time) {
	a.mu.Lock()
	full := a.added(a.add(topic, delta, at))
	a.mu.Unlock()
	a.signal(full)
}

// Now is the time the aggregator places mentions by: the clock WithBuckets
// gave, else the wall clock. The ingest judges a mention's "at" against
// it (ingest.Clock), so that the lateness it allows and the minute Add
// picks come from one clock.
func (a *Aggregator) Now() time.Time {
	if a.now != nil {
		return a.now()
	}
	return time.Now()
}

// add adds delta to topic, or with buckets on to its minute counter for
// at; mu must be held. grew says whether the window took more memory (a
// counter new to it, or a topic new to its Fresh index), so that the
// caller checks its bounds.
func (a *Aggregator) add(topic string, delta int64, at time.Time) (grew bool) {
	if a.now == nil {
		_, isNew := a.addCounter(topic, delta, true)
		return isNew
	}
	if at.IsZero() {
		at = a.now()
	}
	// The minute as named (a name keeps its index within range): Pending
	// looks the counter up by that name.
	c := freshOf(topic, schema.Minute.Index(at)).Named()
	added, isNew := a.addCounter(a.scratch(c), delta, true)
	more := a.fresh.add(topic, c.Index, added)
	a.bytes += more
	return isNew || more > 0
}

// freshOf is topic's Fresh counter of minute m.
func freshOf(topic string, m int64) schema.Counter {
	return schema.Counter{Topic: topic, Kind: schema.Fresh, Index: m}
}

// scratch names c in a.name: a string valid until the next call
// (Deltas.Ref copies what it keeps). mu must be held.
func (a *Aggregator) scratch(c schema.Counter) string {
	a.name = c.AppendName(a.name[:0])
	if len(a.name) > maxShort {
		return string(a.name) // Deltas keeps a long name as given
	}
	return unsafe.String(&a.name[0], len(a.name))
}

// addCounter adds delta to the counter name (a topic or a bucket
// counter), which counts mentions or (a minute or hour bucket's) repeats
// them, and returns what it added (less than delta when the counter
// saturates); mu must be held.
func (a *Aggregator) addCounter(name string, delta int64, mentions bool) (added int64, isNew bool) {
	v, isNew := a.cur.Deltas.Ref(name)
	if sum, capped := schema.SatAdd(*v, delta); capped {
		a.saturated.Inc() // an atomic add: cheap enough under the lock
		delta = sum - *v
	}
	if isNew {
		a.bytes += int64(len(name)) + TopicOverhead
		if !mentions {
			a.buckets++
		}
	}
	*v += delta
	if mentions {
		a.total = satAdd(a.total, delta)
	}
	return delta, isNew
}

// atBound reports whether the window reached its topic bound or its memory
// budget; mu must be held.
func (a *Aggregator) atBound() bool {
	return a.cur.Deltas.Len()-a.buckets >= a.maxTopics || a.maxBytes > 0 && a.bytes > a.maxBytes
}

// signal tells the flusher, if full, without blocking.
func (a *Aggregator) signal(full bool) {
	if full {
		select {
		case a.full <- struct{}{}:
		default:
		}
	}
}

// satAdd is schema.SatAdd without its flag, for totals that say nothing
// of a cap.
func satAdd(x, y int64) int64 {
	sum, _ := schema.SatAdd(x, y)
	return sum
}

// Drain swaps the current window for a fresh one and returns the old one,
// which the caller owns. An empty window has Len 0.
//
// With a spill, Drain also takes segments back from disk while they fit in
// the memory budget, as long as the store took the last window drained.
// While it does not (all of the last window came back through Merge),
// segments stay on disk: Drain tries them again after a number of drains
// that doubles with each try, up to 64, so that an idle sidecar notices
// the store's return without reading and rewriting the spill every
// interval of an outage.
func (a *Aggregator) Drain() Window {
	a.mu.Lock()
	w := a.cur
	w.fresh = a.fresh // Window.Pending's index, the window's now
	// Size the next window like the last one (busy topics come back), but
	// not a huge one: a long tail leaves it behind at once.
	a.cur = Window{Deltas: NewDeltas(min(w.Deltas.Len(), 1<<16))}
	drained := w.Deltas.Len() - a.buckets // topics' counters, as Merge counts them
	a.total, a.bytes, a.buckets, a.fresh = 0, 0, 0, freshIndex{}
	if a.drained > 0 {
		// The store takes writes if it took any of the last window: the
		// rest may only have missed the flush's deadline.
		a.storeOK = a.merged < a.drained
	}
	unspill := false
	switch {
	case a.spill == nil || a.persisted:
	case a.storeOK:
		unspill, a.backoff, a.skip = true, 0, 0
	case a.skip > 0:
		a.skip--
	default:
		// Not a retry loop (no wait of its own): it spaces probes by drains, which the flush paces.
		unspill = true
		a.backoff = min(2*a.backoff+1, 64)
		a.skip = a.backoff
	}
	a.drained, a.merged, a.carrying = drained, 0, false
	a.show()
	a.mu.Unlock()
	// The drained window is the caller's: segments are read into it
	// without the lock, so the ingest never waits for the disk.
	if unspill && a.unspill(&w, a.maxBytes-windowBytes(w.Deltas)) {
		n := mentionCounters(w.Deltas) // the caller's window: counted outside the lock
		a.mu.Lock()
		a.drained, a.carrying = n, true
		a.mu.Unlock()
	}
	if w.Deltas.Len() == 0 {
		return Window{}
	}
	return w
}

// Spilled reports whether segments wait in the spill folder.
func (a *Aggregator) Spilled() bool {
	if a.spill == nil {
		return false
	}
	_, n := a.spill.Stats()
	return n > 0
}

// unspill takes segments back into w while they fit in room (the first
// always does, when w is under half the budget).
func (a *Aggregator) unspill(w *Window, room int64) (took bool) {
	for {
		size, topics := a.spill.Next()
		if size == 0 {
			return took
		}
		if topics == 0 {
			topics = int(size / 8) // unknown: assume short topic names
		}
		// In memory, a topic costs its name (its record's bulk) plus the
		// overhead.
		need := size + int64(topics)*TopicOverhead
		if need > room && (took || room < a.maxBytes/2) {
			return took
		}
		deltas, err := a.spill.Take()
		if err != nil {
			// A damaged segment is moved aside (its mentions are lost, and
			// the log says where they are); a disk error is tried again
			// next drain.
			if errors.Is(err, spill.ErrCorrupt) {
				a.corrupt.Inc()
			}
			a.log.Error("spilled mentions could not be read back", zap.Error(err))
			return took
		}
		if w.Deltas == nil {
			w.Deltas = NewDeltas(len(deltas))
		}
		for topic, d := range deltas {
			v, _ := w.Deltas.Ref(topic)
			*v = satAdd(*v, d)
		}
		room -= need
		took = true
	}
}

func windowBytes(deltas *Deltas) int64 {
	var n int64
	for topic := range deltas.All() {
		n += int64(len(topic)) + TopicOverhead
	}
	return n
}

// Merge adds a window back into the current one: the flusher returns what
// it could not write, so a store failure delays mentions but never loses
// them. The larger of the two maps takes the smaller, so that a large
// failed window is not copied.
//
// Past the memory budget, with a spill, the whole window then goes to
// disk.
func (a *Aggregator) Merge(w Window) {
	// Every name of w is read here, before the lock: w is the caller's
	// until Merge takes it, and a window that comes back after an outage
	// may hold a million counters, which the ingest must not wait for.
	ws := statsOf(w.Deltas)
	a.mu.Lock()
	// Counted as Drain counts: counters of mentions, not the minute and
	// hour counters a split topic also brings back.
	a.merged += ws.counters
	if w.Deltas.Len() > a.cur.Deltas.Len() {
		// Swap: w's table becomes the window, and what arrived since the
		// drain (the smaller side) is added into it.
		small := a.cur.Deltas
		a.cur.Deltas, a.total, a.bytes, a.buckets, a.fresh = w.Deltas, ws.total, ws.bytes, ws.buckets, ws.fresh
		for name, d := range small.All() {
			a.addNamed(name, d)
		}
	} else {
		for name, d := range w.Deltas.All() {
			a.addNamed(name, d)
		}
	}
	// No Full signal here: a window that failed to flush must wait for the
	// next interval, not be retried at once against a failing store.
	var out *Deltas
	var mentions int64
	back := a.carrying && w.Deltas.Len() > 0
	if back {
		a.carrying = false
	}
	if a.spill != nil && (back || a.maxBytes > 0 && a.bytes > a.maxBytes) {
		out, mentions = a.cur.Deltas, a.total
		a.cur.Deltas = NewDeltas(0)
		a.total, a.bytes, a.buckets, a.fresh = 0, 0, 0, freshIndex{}
	}
	a.show()
	a.mu.Unlock()
	if out != nil {
		a.spillOut(out, mentions, back)
	}
}

// Persist moves the window to the spill folder, whatever its size, and
// stops Drain from taking segments back: at the shutdown deadline, what
// the store did not take waits on disk for the next process on the folder
// rather than being lost. It does nothing without a spill, and returns
// the mentions it kept.
func (a *Aggregator) Persist() (int64, error) {
	a.mu.Lock()
	if a.spill == nil {
		a.mu.Unlock()
		return 0, nil
	}
	a.persisted = true
	out, mentions := a.cur.Deltas, a.total
	a.cur.Deltas = NewDeltas(0)
	a.total, a.bytes, a.buckets, a.fresh = 0, 0, 0, freshIndex{}
	a.show()
	a.mu.Unlock()
	a.spillMu.Lock()
	err := a.spill.Keep(out) // lost otherwise
	a.spillMu.Unlock()
	if err != nil {
		// Back in the window, for the caller to count as unwritten. (No
		// spill from this Merge: the same Put would fail again.)
		a.mu.Lock()
		for name, d := range out.All() {
			a.addNamed(name, d)
		}
		a.show()
		a.mu.Unlock()
		return 0, err
	}
	a.spilled.Add(float64(mentions))
	return mentions, nil
}

// spillOut writes a window taken out of memory to the spill folder, in
// segments of at most half the memory budget (so that each fits when it
// comes back), or sheds what the folder cannot take. force (the window
// holds segments just taken back) writes past the disk budget: those
// mentions had their room a moment ago.
func (a *Aggregator) spillOut(deltas *Deltas, mentions int64, force bool) {
	a.spillMu.Lock()
	defer a.spillMu.Unlock()
	put := a.spill.Put
	if force {
		put = a.spill.Keep
	}
	for _, seg := range split(deltas, a.maxBytes/2) {
		n := mentionsOf(seg)
		if err := put(seg); err != nil {
			// Holding it in memory past the budget is what the budget is
			// there to prevent: the kernel would take everything.
			a.shed.Add(float64(n))
			a.log.Error("window past its memory budget could not be spilled; its mentions are dropped",
				zap.Int("topics", seg.Len()), zap.Int64("mentions", n), zap.Error(err))
			continue
		}
		a.spilled.Add(float64(n))
	}
}

// split cuts deltas into windows of at most limit bytes as the budget
// counts them (no limit: one).
func split(deltas *Deltas, limit int64) []*Deltas {
	if limit <= 0 || windowBytes(deltas) <= limit {
		return []*Deltas{deltas}
	}
	var out []*Deltas
	cur, size := NewDeltas(0), int64(0)
	for topic, d := range deltas.All() {
		cost := int64(len(topic)) + TopicOverhead
		if size+cost > limit && cur.Len() > 0 {
			out = append(out, cur)
			cur, size = NewDeltas(0), 0
		}
		cur.Set(topic, d)
		size += cost
	}
	return append(out, cur)
}

// Pending returns topic's delta in the current window: accepted by this
// sidecar and not yet written to the store (its total's counter and its
// minutes'). It makes at most directMinutes+2 lookups under the lock,
// however many minutes the window spans (freshIndex).
func (a *Aggregator) Pending(topic string) int64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	v, _ := a.cur.Deltas.Get(topic)
	for _, m := range a.fresh.minutes[:a.fresh.n] {
		d, _ := a.cur.Deltas.Get(a.scratch(freshOf(topic, m)))
		v = satAdd(v, d)
	}
	d, _ := a.fresh.spread.Get(topic)
	return satAdd(v, d)
}

// directMinutes is how many minutes of a window's Fresh counters Pending
// looks up by name. A window drained every flush interval (a second by
// default) spans one minute, two across a minute's turn; the rest leaves
// room for late "at"s before the spread has to take any.
const directMinutes = 4

// freshIndex is how Pending finds a topic's Fresh counters in a bounded
// number of lookups, however many minutes the window spans (a day of late
// "at"s, or a window that an outage hands back unsplit, may span 1,440):
// the counters of up to directMinutes minutes are looked up by name, and
// for the window's other minutes spread keeps each topic's sum. A minute
// is one or the other for as long as the window lives, so each counter is
// counted once. Only the spread costs memory (counted in the budget), and
// only for windows that span more minutes than that. The zero value is
// an empty window's.
type freshIndex struct {
	minutes [directMinutes]int64 // looked up by name: the first the window met, or for a window merged back its busiest
	n       int                  // of minutes in use
	spread  *Deltas              // topic → the sum of its Fresh counters in the other minutes; nil while none
}

// add notes delta added to topic's Fresh counter of minute m (as its name
// has it), and returns the memory that took, as the budget counts it:
// none unless topic is new to the spread.
func (f *freshIndex) add(topic string, m, delta int64) (bytes int64) {
	if slices.Contains(f.minutes[:f.n], m) {
		return 0
	}
	if f.n < directMinutes {
		// No counter of m is in the spread: a minute goes there only once
		// every slot is taken, and slots are freed only with the window.
		f.minutes[f.n] = m
		f.n++
		return 0
	}
	if f.spread == nil {
		f.spread = NewDeltas(0)
	}
	v, isNew := f.spread.Ref(topic)
	*v = satAdd(*v, delta)
	if isNew {
		return int64(len(topic)) + TopicOverhead
	}
	return 0
}

// indexFresh returns d's freshIndex, given how many Fresh counters d has
// in each minute, and the memory its spread takes: d's busiest minutes
// are looked up by name, so that the spread holds as few topics as it
// can.
func indexFresh(d *Deltas, perMinute map[int64]int) (f freshIndex, bytes int64) {
	minutes := slices.Collect(maps.Keys(perMinute))
	slices.SortFunc(minutes, func(x, y int64) int { return cmp.Compare(perMinute[y], perMinute[x]) })
	f.n = copy(f.minutes[:], minutes)
	if len(minutes) <= directMinutes {
		return f, 0
	}
	for name, v := range d.All() {
		if c, _ := schema.ParseName(name); c.Kind == schema.Fresh {
			bytes += f.add(c.Topic, c.Index, v)
		}
	}
	return f, bytes
}

// windowStats is what the aggregator keeps of a window beside its table.
type windowStats struct {
	total    int64      // its mentions (saturating)
	bytes    int64      // its memory, as the budget counts it (its Fresh index's included)
	buckets  int        // its Minute and Hour counters
	counters int        // its counters of mentions (topics and Fresh minutes)
	fresh    freshIndex // its Fresh counters, for Pending
}

// statsOf reads every counter of d once (twice when its Fresh counters
// span more than directMinutes minutes); it takes no lock.
func statsOf(d *Deltas) windowStats {
	var ws windowStats
	var perMinute map[int64]int // Fresh counters in each minute
	for name, v := range d.All() {
		ws.bytes += int64(len(name)) + TopicOverhead
		c, _ := schema.ParseName(name)
		if !c.CountsMentions() {
			ws.buckets++
			continue
		}
		ws.counters++
		ws.total = satAdd(ws.total, v)
		if c.Kind == schema.Fresh {
			if perMinute == nil {
				perMinute = make(map[int64]int, 1)
			}
			perMinute[c.Index]++
		}
	}
	var more int64
	ws.fresh, more = indexFresh(d, perMinute)
	ws.bytes += more
	return ws
}

// addNamed adds delta to the counter name of a window merged back or
// taken back from disk, reading what it counts from the name, and notes
// a Fresh counter for Pending; mu must be held.
func (a *Aggregator) addNamed(name string, delta int64) {
	c, _ := schema.ParseName(name)
	added, _ := a.addCounter(name, delta, c.CountsMentions())
	if c.Kind == schema.Fresh {
		a.bytes += a.fresh.add(c.Topic, c.Index, added)
	}
}

// Stats returns the number of topics and the sum of the deltas in the
// current window.
func (a *Aggregator) Stats() (topics int, mentions int64) {
	return int(a.shown.topics.Load()), a.shown.mentions.Load()
}

// Full is signalled (without blocking the sender) when the window reaches
// its topic bound. It has room for one signal: signals coalesce.
func (a *Aggregator) Full() <-chan struct{} { return a.full }
