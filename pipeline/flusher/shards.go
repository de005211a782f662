package flusher

import (
	"cmp"
	"context"
	"math/rand/v2"
	"slices"

	"go.uber.org/zap"

	"github.com/hotcount/hotcount/pipeline/aggregator"
	"github.com/hotcount/hotcount/pipeline/store"
	"github.com/hotcount/hotcount/schema"
)

// The shard of each write: the shard counts of a flush's busy topics are
// looked up once, before its first write (shardCounts, the flush's one
// read of metadata), and each new write draws its shard from its topic's
// count as it is made (shardTable.newWrite).

// maxLookups bounds the topics whose shard count one flush looks up.
const maxLookups = 4096

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
func (t shardTable) of(c schema.Counter) int {
	if n := t.looked[c.Topic]; n > 0 {
		return n
	}
	return t.def
}

// newWrite is a new write of delta to a random shard of c's topic, its seq
// not yet given.
func (t shardTable) newWrite(c schema.Counter, delta int64, writer string) store.Write {
	return store.Write{Counter: c, Shard: rand.IntN(t.of(c)), Delta: delta, Writer: writer}
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
