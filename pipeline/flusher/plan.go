package flusher

import (
	"iter"

	"github.com/hotcount/hotcount/pipeline/aggregator"
	"github.com/hotcount/hotcount/schema"
)

// planning is the part of Config a plan follows: a value, set by New and
// read only.
type planning struct {
	probe          int  // counters a flush tries while the store is down (Config.Concurrency)
	minutes, hours bool // the time buckets a minute counter is written to (--windows)
}

// plan is what one flush does with the window it drained, decided before
// anything is written: which counters it writes, and which go back to the
// buffer at once. newPlan builds it, and nothing changes it afterwards.
//
// Its windows are parts of the drained one, and each has one owner next:
// the flush takes write and hands it on piece by piece (see Flush), and
// held and untried go back to the buffer at once (Flusher.drain). Once
// they are the buffer's, the ingest changes them, so past drain only their
// sizes are read.
//
// The plan is where a counter's name becomes a schema.Counter: the window
// keeps its counters by name, in its compact table (33 B a topic, which
// goes back to the buffer as it is, a million topics during an outage),
// and the flush reads each name as it hands the counter on (counters: no
// allocation, a few byte compares), rather than hold a parsed copy of a
// million-counter window beside it. Past the flusher, stages know
// counters, not names.
type plan struct {
	// write is the counters to write this flush, minute counters split
	// into a total and time buckets.
	write aggregator.Window
	// held is the counters of topics that wait behind a write in doubt,
	// back to the buffer whole: a topic's newer deltas wait until its
	// write in doubt settles (see Flush).
	held aggregator.Window
	// untried is, while the store is down, the window past the probe:
	// back to the buffer as it came, not split (nil otherwise).
	untried *aggregator.Deltas
	// heldCounters is held's size: what the flush reports of held once
	// the buffer owns it.
	heldCounters int
	// untriedCounters is untried's size (0 when nil), for the same
	// reason.
	untriedCounters int
}

// newPlan plans the drained window w. down says the last flush found the
// store refusing everything; waiting is the topics with a write in doubt.
// The plan depends on nothing else, and newPlan has no other effect. It
// reads w and writes new windows, so that readers may read w while it
// runs (Flusher.drain), except while the store is down: then the few
// counters it probes leave w, and what is left of w is untried.
func newPlan(w aggregator.Window, down bool, waiting map[string]bool, c planning) plan {
	var untried *aggregator.Deltas
	// While the store refuses everything, a flush only probes it with a
	// few counters, and the rest goes back as it came: split, each topic's
	// minute would take three counters (total, minute, hour) of memory
	// through an outage of millions of topics.
	if down {
		untried = probe(&w, c.probe)
	}
	write := aggregator.Window{Deltas: aggregator.NewDeltas(w.Len())}
	held := aggregator.Window{Deltas: aggregator.NewDeltas(0)}
	sortInto(w.Deltas, write.Deltas, held.Deltas, waiting, c)
	return plan{write: write, held: held, untried: untried, heldCounters: held.Len(), untriedCounters: untried.Len()}
}

// probe keeps in w the first n counters of its window, the writes a flush
// tries before it takes the store for down, and returns the rest,
// untouched.
func probe(w *aggregator.Window, n int) (rest *aggregator.Deltas) {
	p := aggregator.NewDeltas(n)
	for name, d := range w.Deltas.All() {
		if p.Len() >= n {
			break
		}
		p.Set(name, d)
		w.Deltas.Delete(name)
	}
	rest, w.Deltas = w.Deltas, p
	return rest
}

// counterOf reads a counter's name. A damaged one (schema.ParseName) reads
// as a total: written, not lost.
func counterOf(name string) schema.Counter {
	c, _ := schema.ParseName(name)
	return c
}

// counters yields the counters of d and their deltas.
func counters(d *aggregator.Deltas) iter.Seq2[schema.Counter, int64] {
	return func(yield func(schema.Counter, int64) bool) {
		for name, delta := range d.All() {
			if !yield(counterOf(name), delta) {
				return
			}
		}
	}
}

// sortInto sorts the counters of src into write, or held for the waiting
// topics, in one walk that reads each name once and changes nothing of
// src: each minute counter (schema.Fresh) becomes the counters it is
// written to, its topic's total and as --windows asks its minute and hour
// buckets. What a flush cannot write goes back split, never as Fresh, so
// a mention reaches each counter once.
func sortInto(src, write, held *aggregator.Deltas, waiting map[string]bool, c planning) {
	for name, delta := range src.All() {
		x := counterOf(name)
		into := write
		if waiting[x.Topic] {
			into = held
		}
		if x.Kind != schema.Fresh {
			v, _ := into.Ref(name)
			*v, _ = schema.SatAdd(*v, delta)
			continue
		}
		total, minute, hour := x.Split()
		addTo(into, total, delta)
		if c.minutes {
			addTo(into, minute, delta)
		}
		if c.hours {
			addTo(into, hour, delta)
		}
	}
}

// addTo adds delta to c's delta in d, saturating like the aggregator.
func addTo(d *aggregator.Deltas, c schema.Counter, delta int64) {
	v, _ := d.Ref(c.Name())
	*v, _ = schema.SatAdd(*v, delta)
}
