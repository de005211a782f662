package durable

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/hotcount/hotcount/schema"
)

// stream names one incarnation of a partition stream: its partition, its
// name and its epoch (creation time, Unix microseconds). A stream deleted
// and created again is another stream with the same name.
type stream struct {
	p     int
	name  string
	epoch int64
	// gen is the generation of the checkpoint record the reading began
	// under: a rewind raises it, and what was read under an older one is
	// never written (Engine.stale).
	gen uint64
}

// key is one counter fed by one stream incarnation: a window keeps a
// recreated stream's mentions apart from the old one's, since their
// positions do not compare.
type key struct {
	s stream
	c schema.Counter
}

// entry is a counter's unwritten delta: the sum of the counter's mentions
// at stream sequences first..last, every one of them (the reader hands
// the window a partition in order, and a write that fails comes back
// whole), so that a write of it can claim the item includes everything up
// to last.
type entry struct {
	delta       int64
	first, last uint64
	since       int64 // the publication (Unix ns) of its oldest mention: how close the stream's max age is
}

// merge adds o, which covers other sequences of the same counter, to e.
func (e *entry) merge(o entry) {
	e.delta, _ = schema.SatAdd(e.delta, o.delta)
	e.first, e.last = min(e.first, o.first), max(e.last, o.last)
	if e.since == 0 || o.since != 0 && o.since < e.since {
		e.since = o.since // 0 is unknown (a recount's), not oldest
	}
}

// window is what the readers have read and the flusher has not yet
// written: per stream, the last sequence handed in (counted or not),
// which bounds the checkpoint, and per counter its entry. It is safe for
// concurrent use; its lock is held only to add or to swap.
//
// It is kept per stream, not in one map keyed by stream and counter: a
// reader adds one mention at a time, and hashing and comparing the
// stream's name with every counter's key was most of what an add cost.
type window struct {
	mu sync.Mutex
	// flight is the publication (Unix ns) of the oldest mention drained
	// and not yet back or written (0: none), for oldest.
	flight  int64
	streams map[stream]*streamWindow // kept across drains, for each stream's read
	entries atomic.Int64             // the counters held: the readers' pause asks it without the lock
}

// streamWindow is one stream's share of the window.
type streamWindow struct {
	read     uint64 // the last sequence handed in: kept across drains
	counters map[schema.Counter]*entry
	// mark is the last sequence counted and its publication: no write
	// of the stream's spans reaches past it (the high-water mark).
	mark mark
	// oldest is the publication (Unix ns) of the oldest mention put in
	// since the last drain (0: none): the unwritten age, at any moment.
	oldest int64
}

// mark is a stream sequence and the publication (Unix ns) of its message.
type mark struct {
	seq uint64
	at  int64
}

func newWindow() *window {
	return &window{streams: make(map[stream]*streamWindow)}
}

// of is s's share of the window, made on first use; mu must be held.
func (w *window) of(s stream) *streamWindow {
	sw, ok := w.streams[s]
	if !ok {
		sw = &streamWindow{counters: make(map[schema.Counter]*entry)}
		w.streams[s] = sw
	}
	return sw
}

// add counts delta at sequence seq of s into counter c (a topic's
// total, or with time buckets its Fresh counter of one minute, which the
// flush splits: one map operation per mention). A sequence at or below
// what the window has already been handed of s is ignored: the engine
// reads each sequence once.
func (w *window) add(s stream, seq uint64, delta int64, published time.Time, cs ...schema.Counter) {
	w.mu.Lock()
	defer w.mu.Unlock()
	sw := w.of(s)
	if seq <= sw.read {
		return
	}
	sw.read = seq
	sw.mark = mark{seq: seq, at: published.UnixNano()}
	for _, c := range cs {
		w.put(sw, c, entry{delta: delta, first: seq, last: seq, since: published.UnixNano()})
	}
}

// skip notes that seq of s was read and counts nothing (a rejected
// message): the checkpoint may pass it.
func (w *window) skip(s stream, seq uint64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	sw := w.of(s)
	sw.read = max(sw.read, seq)
}

// resume is where a reader of s starts again in this process: after what
// the window was handed, never before, so that a partition lost and won
// back is not counted twice into entries not yet written.
func (w *window) resume(s stream) uint64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	if sw, ok := w.streams[s]; ok {
		return sw.read
	}
	return 0
}

// put merges e into c's entry of sw; mu must be held. Only a new
// counter's entry goes to the heap: taking e's address would move every
// mention's e there.
func (w *window) put(sw *streamWindow, c schema.Counter, e entry) {
	if e.since != 0 && (sw.oldest == 0 || e.since < sw.oldest) {
		sw.oldest = e.since
	}
	if cur, ok := sw.counters[c]; ok {
		cur.merge(e)
		return
	}
	fresh := new(entry)
	*fresh = e
	sw.counters[c] = fresh
	w.entries.Add(1)
}

// drained is a window taken by the flusher: its counters and, per
// stream, how far it had read when taken.
type drained struct {
	counters map[key]*entry
	read     map[stream]uint64
	marks    map[stream]mark
	oldest   int64 // the publication (Unix ns) of its oldest mention (0: none)
}

// drain takes the window's counters.
func (w *window) drain() drained {
	w.mu.Lock()
	defer w.mu.Unlock()
	d := drained{counters: make(map[key]*entry, w.entries.Load()), read: make(map[stream]uint64, len(w.streams)), marks: make(map[stream]mark, len(w.streams))}
	for s, sw := range w.streams {
		d.read[s] = sw.read
		d.marks[s] = sw.mark
		if sw.oldest != 0 && (d.oldest == 0 || sw.oldest < d.oldest) {
			d.oldest = sw.oldest
		}
		sw.oldest = 0
		for c, e := range sw.counters {
			d.counters[key{s, c}] = e
		}
		sw.counters = make(map[schema.Counter]*entry, len(sw.counters))
	}
	w.entries.Store(0)
	return d
}

// giveBack merges entries the flusher did not write into the window: the
// drained ones are all back or written.
func (w *window) giveBack(back map[key]*entry) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.flight = 0
	for k, e := range back {
		w.put(w.of(k.s), k.c, *e)
	}
}

// pending is topic's unwritten total in the window (with buckets on, an
// approximation: its Fresh counters of the current and the last minute,
// where nearly all of a window's mentions are): a few look-ups per
// stream the window has read, never a walk of the window.
func (w *window) pending(topic string, minute int64) int64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	var n int64
	for _, sw := range w.streams {
		for _, c := range []schema.Counter{schema.TotalOf(topic), freshOf(topic, minute), freshOf(topic, minute-1)} {
			if e, ok := sw.counters[c]; ok {
				n += e.delta
			}
		}
	}
	return n
}

func freshOf(topic string, minute int64) schema.Counter {
	return schema.Counter{Topic: topic, Kind: schema.Fresh, Index: minute}
}

// split turns the Fresh counters of a drained window into the counters
// they count in (schema.Counter.Split): the topic's total, and its minute
// and hour buckets as they are on. Each takes the Fresh counter's span;
// one counter fed by several merges their spans, which stay a run of
// the counter's mentions without a gap since the window holds all of them.
func split(counters map[key]*entry) map[key]*entry {
	out := make(map[key]*entry, len(counters))
	put := func(k key, e entry) {
		if cur, ok := out[k]; ok {
			cur.merge(e)
			return
		}
		out[k] = &e
	}
	for k, e := range counters {
		if k.c.Kind != schema.Fresh {
			put(k, *e)
			continue
		}
		total, minute, hour := k.c.Split()
		put(key{k.s, total}, *e)
		put(key{k.s, minute}, *e)
		put(key{k.s, hour}, *e)
	}
	return out
}

// oldest is the publication (Unix ns) of the oldest mention in the
// window (0: none).
func (w *window) oldest() int64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	o := w.flight
	for _, sw := range w.streams {
		if sw.oldest != 0 && (o == 0 || sw.oldest < o) {
			o = sw.oldest
		}
	}
	return o
}

// size is the window's counters. It takes no lock: the readers ask it
// before every message.
func (w *window) size() int { return int(w.entries.Load()) }
