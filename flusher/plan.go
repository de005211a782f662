package flusher

import (
	"cmp"
	"context"
	"iter"
	"math/rand/v2"
	"slices"

	"go.uber.org/zap"

	"github.com/hotcount/hotcount/aggregator"
	"github.com/hotcount/hotcount/store"
)

// maxLookups bounds the topics whose shard count one flush looks up.
const maxLookups = 4096

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
// The plan is where a counter's name becomes a store.Counter: the window
// keeps its counters by name, in its compact table (which goes back to
// the buffer as it is, a million topics during an outage), and the plan
// reads each name as it hands the counter on (counters). Past the plan,
// the flush knows counters, not names.
type plan struct {
	// write is the counters to write this flush, minute counters split
	// into a total and time buckets, and the messages behind them.
	write aggregator.Window
	// held is the counters and messages of topics that wait behind a
	// pending write (in doubt or journaled): back to the buffer whole, so
	// that a message is acknowledged, or journaled, with every count it
	// makes.
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

// newPlan plans the drained window w, which it takes: the plan's windows
// are made of its parts. down says the last flush found the store
// refusing everything; waiting is the topics with a pending write. The
// plan depends on nothing else, and newPlan has no other effect.
func newPlan(w aggregator.Window, down bool, waiting map[string]bool, c planning) plan {
	var untried *aggregator.Deltas
	// While the store refuses everything, a flush only probes it with a
	// few counters, and the rest goes back as it came: split, each topic's
	// minute would take three counters (total, minute, hour) of memory
	// through an outage of millions of topics. (Core mode: JetStream mode
	// stops fetching instead, and its messages stay with their counts.)
	if down && len(w.Acks) == 0 {
		untried = probe(&w, c.probe)
	}
	split(w.Deltas, c.minutes, c.hours)
	held := hold(&w, waiting)
	return plan{write: w, held: held, untried: untried, heldCounters: held.Len(), untriedCounters: untried.Len()}
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

// counterOf reads a counter's name. A damaged one (store.ParseName) reads
// as a total: written, not lost.
func counterOf(name string) store.Counter {
	c, _ := store.ParseName(name)
	return c
}

// counters yields the counters of d and their deltas.
func counters(d *aggregator.Deltas) iter.Seq2[store.Counter, int64] {
	return func(yield func(store.Counter, int64) bool) {
		for name, delta := range d.All() {
			if !yield(counterOf(name), delta) {
				return
			}
		}
	}
}

// split turns each minute counter (store.Fresh) of a drained window into
// the counters it is written to: its topic's total, and as --windows asks
// its minute and hour buckets. What a flush cannot write goes back as
// those, never as Fresh, so a mention reaches each once.
func split(d *aggregator.Deltas, minutes, hours bool) {
	var fresh []string
	for name := range d.All() {
		if counterOf(name).Kind == store.Fresh {
			fresh = append(fresh, name)
		}
	}
	for _, name := range fresh {
		delta, _ := d.Get(name)
		d.Delete(name)
		total, minute, hour := counterOf(name).Split()
		addTo(d, total, delta)
		if minutes {
			addTo(d, minute, delta)
		}
		if hours {
			addTo(d, hour, delta)
		}
	}
}

// addTo adds delta to c's delta in d, saturating like the aggregator.
func addTo(d *aggregator.Deltas, c store.Counter, delta int64) {
	v, _ := d.Ref(c.Name())
	*v, _ = store.SatAdd(*v, delta)
}

// hold moves out of w the counters and messages of the waiting topics:
// all their counters (total and time buckets) and their messages.
func hold(w *aggregator.Window, waiting map[string]bool) (held aggregator.Window) {
	held.Deltas = aggregator.NewDeltas(0)
	for name, d := range w.Deltas.All() {
		if waiting[counterOf(name).Topic] {
			held.Deltas.Set(name, d)
			w.Deltas.Delete(name)
		}
	}
	var acks []aggregator.Message
	for _, m := range w.Acks {
		if waiting[m.Topic] {
			held.Acks = append(held.Acks, m)
		} else {
			acks = append(acks, m)
		}
	}
	w.Acks = acks
	return held
}

type topicDelta struct {
	topic string
	delta int64
}

// busyTopics returns the topics of d whose shard count is worth a lookup,
// the busiest maxLookups at most. shards is the default count.
func busyTopics(d *aggregator.Deltas, shards int) []string {
	var busy []topicDelta
	for c, delta := range counters(d) {
		if c.IsBucket() {
			continue // written with its topic's shard count
		}
		// Topics start on one shard (the default): one mention in a
		// window is no hot key, so it goes to shard 0, always in the read
		// set, without a metadata read. A long tail of new topics then
		// costs one write each and nothing more; a topic another sidecar
		// raised still gets its writes spread once it is busy here too.
		if shards == 1 && delta < 2 {
			continue
		}
		busy = append(busy, topicDelta{c.Topic, delta})
	}
	// Spreading matters for the hottest topics only: the busiest
	// maxLookups are looked up, the rest go to their default shards.
	if len(busy) > maxLookups {
		slices.SortFunc(busy, func(a, b topicDelta) int { return cmp.Compare(b.delta, a.delta) })
		busy = busy[:maxLookups]
	}
	topics := make([]string, len(busy))
	for i, b := range busy {
		topics[i] = b.topic
	}
	return topics
}

// shardTable is the shard count of each topic one flush writes: looked up
// once, before the flush's first write (Flusher.shardCounts), and read
// only afterwards.
type shardTable struct {
	// looked is the shard count of the topics looked up (busyTopics),
	// nil when none were.
	looked map[string]int
	// def is the others' (Config.Shards).
	def int
}

// of is the shard count of c's topic.
func (t shardTable) of(c store.Counter) int {
	if n := t.looked[c.Topic]; n > 0 {
		return n
	}
	return t.def
}

// newWrite is a new write of delta to a random shard of c's topic, its seq
// not yet given.
func (t shardTable) newWrite(c store.Counter, delta int64, writer string) store.Write {
	return store.Write{Counter: c, Shard: rand.IntN(t.of(c)), Delta: delta, Writer: writer}
}

// writes is every counter of d as a new store.Write with a seq from next,
// a topic's time buckets next to its total: the journal keeps them in one
// entry, so a message's counts are journaled whole or not at all.
func (t shardTable) writes(d *aggregator.Deltas, writer string, next func() int64) []store.Write {
	ws := make([]store.Write, 0, d.Len())
	for c, delta := range counters(d) {
		w := t.newWrite(c, delta, writer)
		w.Seq = next()
		ws = append(ws, w)
	}
	slices.SortFunc(ws, func(a, b store.Write) int {
		return cmp.Or(cmp.Compare(a.Counter.Topic, b.Counter.Topic), cmp.Compare(a.Counter.Kind, b.Counter.Kind), cmp.Compare(a.Counter.Index, b.Counter.Index))
	})
	return ws
}

// shardCounts looks up the shard counts of the busy topics of d, the
// counters a flush is to write, in a quarter of the flush's budget: the
// counts it cannot give by then fall back to one shard, and the writes
// keep the rest of the budget (metadata never stands in front of counts).
func (f *Flusher) shardCounts(ctx context.Context, d *aggregator.Deltas) shardTable {
	t := shardTable{def: f.cfg.Shards}
	// While the store refuses writes, it answers no lookups either: the
	// window goes to its default shards, which is always safe.
	if f.shards == nil || d.Len() == 0 || f.down.Load() {
		return t
	}
	ctx, cancel := context.WithTimeout(ctx, f.cfg.Timeout/4)
	defer cancel()
	counts, err := f.shards.WriteCounts(ctx, busyTopics(d, f.cfg.Shards))
	if err != nil {
		// The counts are usable all the same (one shard for the topics it
		// could not look up): metadata never holds counts back.
		f.log.Warn("shard counts incomplete; those topics go to one shard this flush", zap.Error(err))
	}
	t.looked = counts
	return t
}
