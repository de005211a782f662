package flusher_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap/zaptest"

	"github.com/hotcount/hotcount/pipeline/aggregator"
	"github.com/hotcount/hotcount/pipeline/flusher"
	"github.com/hotcount/hotcount/pipeline/store"
	"github.com/hotcount/hotcount/schema"
)

// TestOutageKeepsMinutesWhole: while the store refuses everything, a flush
// tries Concurrency counters and hands the rest back as it came, one minute
// counter a topic (not split into three); once the store is back, every
// total, minute and hour is written once.
func TestOutageKeepsMinutesWhole(t *testing.T) {
	now := time.Date(2026, 12, 3, 10, 0, 10, 0, time.UTC)
	reg := prometheus.NewRegistry()
	b, err := store.OpenBolt(t.TempDir(), store.NewMetrics(reg))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	st := &faulty{Bolt: b, tried: map[schema.Counter][]int{}, down: true}
	agg := aggregator.New(100_000, reg, aggregator.WithBuckets(func() time.Time { return now }))
	c := cfg
	c.Minutes, c.Hours = true, true
	fl := flusher.New(c, agg, st, zaptest.NewLogger(t), flusher.NewMetrics(reg), time.Now)
	ctx := context.Background()
	agg.Add("first", 1)
	fl.Flush(ctx) //nolint:errcheck // down: the first failure
	for i := range 1000 {
		agg.Add("t"+strconv.Itoa(i), 1)
	}
	fl.Flush(ctx) //nolint:errcheck // down: a probe
	if counters, mentions := agg.Stats(); mentions != 1001 || counters > 1000+3+c.Concurrency*3 {
		t.Errorf("after a flush while down the buffer holds %d counters for 1,001 topics (%d mentions): split, not handed back whole", counters, mentions)
	}
	st.mu.Lock()
	st.down = false
	st.mu.Unlock()
	for range 3 {
		if fl.Flush(ctx) == nil {
			break
		}
	}
	for _, topic := range []string{"first", "t0", "t999"} {
		var minute, hour int64
		for shard := range c.Shards {
			keys := []string{schema.BucketKey(topic, schema.Minute, schema.Minute.Index(now), shard), schema.BucketKey(topic, schema.Hour, schema.Hour.Index(now), shard)}
			got, err := b.Counts(ctx, keys, false)
			if err != nil {
				t.Fatal(err)
			}
			minute, hour = minute+got[keys[0]], hour+got[keys[1]]
		}
		total, err := b.Gather(ctx, topic, c.Shards, false)
		if err != nil {
			t.Fatal(err)
		}
		if sum, _ := schema.Sum(total); minute != 1 || hour != 1 || sum != 1 {
			t.Errorf("%s: minute %d, hour %d, total %d; want 1 each", topic, minute, hour, sum)
		}
	}
}
