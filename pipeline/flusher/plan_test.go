package flusher

import (
	"fmt"
	"maps"
	"testing"
	"time"

	"github.com/hotcount/hotcount/pipeline/aggregator"
	"github.com/hotcount/hotcount/schema"
)

var noon = time.Date(2026, 12, 3, 12, 0, 10, 0, time.UTC)

// fresh is topic's minute counter at noon, as the aggregator makes it.
func fresh(topic string) schema.Counter {
	return schema.Counter{Topic: topic, Kind: schema.Fresh, Index: schema.Minute.Index(noon)}
}

func minuteOf(topic string) schema.Counter {
	return schema.BucketOf(topic, schema.Minute, schema.Minute.Index(noon))
}

func hourOf(topic string) schema.Counter {
	return schema.BucketOf(topic, schema.Hour, schema.Hour.Index(noon))
}

// TestPlanSplitsMinuteCounters: a minute counter becomes its topic's
// total and the buckets --windows asks for, each with the whole delta.
func TestPlanSplitsMinuteCounters(t *testing.T) {
	for _, c := range []struct {
		minutes, hours bool
		want           map[string]int64
	}{
		{false, false, map[string]int64{"foo": 5}},
		{true, false, map[string]int64{"foo": 5, minuteOf("foo").Name(): 3}},
		{true, true, map[string]int64{"foo": 5, minuteOf("foo").Name(): 3, hourOf("foo").Name(): 3}},
	} {
		w := aggregator.Window{Deltas: aggregator.DeltasOf(map[string]int64{"foo": 2, fresh("foo").Name(): 3})}
		p := newPlan(w, false, nil, planning{probe: 4, minutes: c.minutes, hours: c.hours})
		if got := p.write.Deltas.Map(); !maps.Equal(got, c.want) {
			t.Errorf("minutes %v hours %v: plan writes %v, want %v", c.minutes, c.hours, got, c.want)
		}
	}
}

// TestPlanHoldsTopicsBehindDoubt: every counter of a topic with a write
// in doubt waits (its total and its buckets alike); the other topics are
// written.
func TestPlanHoldsTopicsBehindDoubt(t *testing.T) {
	w := aggregator.Window{Deltas: aggregator.DeltasOf(map[string]int64{"foo": 1, fresh("foo").Name(): 2, "bar": 4})}
	p := newPlan(w, false, map[string]bool{"foo": true}, planning{probe: 4, minutes: true, hours: true})
	if got := p.write.Deltas.Map(); !maps.Equal(got, map[string]int64{"bar": 4}) {
		t.Errorf("plan writes %v, want bar alone", got)
	}
	if got, want := p.held.Deltas.Map(), map[string]int64{"foo": 3, minuteOf("foo").Name(): 2, hourOf("foo").Name(): 2}; !maps.Equal(got, want) {
		t.Errorf("plan holds %v, want %v", got, want)
	}
	if p.heldCounters != 3 {
		t.Errorf("heldCounters = %d, want 3", p.heldCounters)
	}
}

// TestPlanProbesWhileDown: while the store is down, a flush tries only
// probe counters; the rest goes back as it came, its minute counters not
// split.
func TestPlanProbesWhileDown(t *testing.T) {
	window := func() aggregator.Window {
		m := map[string]int64{}
		for i := range 10 {
			m[fresh(fmt.Sprint("t", i)).Name()] = 1
		}
		return aggregator.Window{Deltas: aggregator.DeltasOf(m)}
	}
	c := planning{probe: 3, minutes: true}
	p := newPlan(window(), true, nil, c)
	if p.untriedCounters != 7 || p.untried.Len() != 7 {
		t.Fatalf("untried %d counters (%d counted), want 7", p.untried.Len(), p.untriedCounters)
	}
	for name := range p.untried.All() {
		if c, ok := schema.ParseName(name); !ok || c.Kind != schema.Fresh {
			t.Errorf("untried counter %q was split", name)
		}
	}
	if n := p.write.Len(); n != 6 {
		t.Errorf("plan writes %d counters, want 3 topics' totals and minutes", n)
	}
}

// TestBusyTopics: shard counts are looked up for topics that could use
// more than one shard: not buckets, not a lone mention on a one-shard
// default, and at most maxLookups, the busiest.
func TestBusyTopics(t *testing.T) {
	d := aggregator.DeltasOf(map[string]int64{"lone": 1, "busy": 2, minuteOf("busy").Name(): 2})
	if got := busyTopics(d, 1); fmt.Sprint(got) != "[busy]" {
		t.Errorf("default one shard: looked up %v, want [busy]", got)
	}
	if got := busyTopics(d, 4); len(got) != 2 {
		t.Errorf("default four shards: looked up %v, want busy and lone", got)
	}
	many := aggregator.NewDeltas(0)
	for i := range maxLookups + 10 {
		many.Set(fmt.Sprint("t", i), int64(i+2))
	}
	got := busyTopics(many, 1)
	if len(got) != maxLookups {
		t.Fatalf("%d looked up, want %d", len(got), maxLookups)
	}
	for _, topic := range got {
		if d, _ := many.Get(topic); d < 12 {
			t.Errorf("%s (delta %d) looked up ahead of busier topics", topic, d)
		}
	}
}

// TestPlanWrites: each counter's write goes to a shard of its topic's
// count, a bucket's by its topic's.
func TestPlanWrites(t *testing.T) {
	w := aggregator.Window{Deltas: aggregator.DeltasOf(map[string]int64{fresh("a").Name(): 1, fresh("b").Name(): 1, "c": 1})}
	p := newPlan(w, false, nil, planning{probe: 4, minutes: true, hours: true})
	shards := shardTable{looked: map[string]int{"a": 8}, def: 2}
	if shards.of(hourOf("a")) != 8 || shards.of(schema.TotalOf("b")) != 2 {
		t.Errorf("shards of a's hour %d (want 8), of b %d (want the default 2)", shards.of(hourOf("a")), shards.of(schema.TotalOf("b")))
	}
	n := 0
	for c, delta := range counters(p.write.Deltas) {
		n++
		x := shards.newWrite(c, delta, "w1")
		if x.Shard < 0 || x.Shard >= shards.of(c) || x.Writer != "w1" || x.Counter != c || x.Delta != 1 {
			t.Errorf("write %+v of %+v: shard out of range, or wrong writer, counter or delta", x, c)
		}
	}
	if n != 7 {
		t.Errorf("%d writes, want 7", n)
	}
}
