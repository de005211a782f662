package sidecar_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/hotcount/hotcount/config"
	"github.com/hotcount/hotcount/internal/testtools/ddbfault"
	"github.com/hotcount/hotcount/internal/testtools/testenv"
	"github.com/hotcount/hotcount/pipeline/store"
	"github.com/hotcount/hotcount/schema"
	"github.com/hotcount/hotcount/tools/loadgen"
)

func metas(t *testing.T, e *env, topics []string) map[string]schema.Meta {
	t.Helper()
	st := store.NewDynamoDB(e.dyn.Client(), e.cfg.Table, store.NewMetrics(prometheus.NewRegistry()))
	m, err := st.Metas(context.Background(), topics)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func topicNames(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("topic-%d", i)
	}
	return out
}

// TestShardChangesKeepTotals: two sidecars with --shards 4 and 8 write the
// same topics at once, then a third with --shards 2 writes old and new
// topics: each topic keeps the count recorded by its first writer, and
// every total is exact.
func TestShardChangesKeepTotals(t *testing.T) {
	a := newEnv(t, func(c *config.Config) { c.Shards = 4 })
	b := newEnvOn(t, a, func(c *config.Config) { c.Shards, c.DataDir = 8, t.TempDir() })
	first := publish(t, a.nats, loadgen.Config{Prefix: "mentions.", Topics: 40, Messages: 8_000, Count: 1, Seed: 70})
	testenv.Eventually(t, 10*time.Second, func() error {
		f := testenv.Metric(t, a.sc.Registry(), "hotcount_flusher_flushed_mentions_total") +
			testenv.Metric(t, b.sc.Registry(), "hotcount_flusher_flushed_mentions_total")
		if f != float64(first.Mentions) {
			return fmt.Errorf("%v of %d flushed", f, first.Mentions)
		}
		return nil
	})
	if err := errors.Join(a.stop(), b.stop()); err != nil {
		t.Fatal(err)
	}
	c := newEnvOn(t, a, func(c *config.Config) { c.Shards, c.DataDir = 2, t.TempDir() })
	second := publish(t, a.nats, loadgen.Config{Prefix: "mentions.", Topics: 60, Messages: 6_000, Count: 1, Seed: 71})
	if err := c.stop(); err != nil {
		t.Fatal(err)
	}
	exact(t, a, first, second)
	topics := topicNames(60)
	m := metas(t, a, topics)
	for _, topic := range topics {
		_, old := first.PerTopic[topic]
		switch n := m[topic].Write(); {
		case old && n != 4 && n != 8:
			t.Errorf("%s, first written by the 4- and 8-shard sidecars, has %d shards", topic, n)
		case !old && second.PerTopic[topic] > 0 && n != 2:
			t.Errorf("%s, first written by the 2-shard sidecar, has %d shards", topic, n)
		}
	}
}

// TestAdaptiveRaisesTheHotTopic: with --adaptive, behind the emulator's
// per-key ceiling, the one hot topic is raised until its throttles stop,
// quiet topics keep one row and no metadata, and every mention lands.
func TestAdaptiveRaisesTheHotTopic(t *testing.T) {
	// 5 writes/s per key with a second's burst (DynamoDB keeps unused
	// capacity for bursts too); a flush every 50 ms writes the hot topic's
	// total, minute and hour 20 times a second each: one shard is
	// throttled, eight are not. A burst of 1 would throttle two writes that
	// happen to pick the same shard within 200 ms, however many shards.
	e := newFaultEnv(t, &ddbfault.Config{WriteUnits: 5, WriteBurst: 5}, func(c *config.Config) {
		c.Adaptive = true
		c.MaxShards = 8
		c.FlushInterval = 50 * time.Millisecond
		c.ShardsCache = 200 * time.Millisecond
	})
	hot := publish(t, e.nats, loadgen.Config{Prefix: "mentions.", Topics: 1, Rate: 1000, Duration: 3 * time.Second, Count: 1, Seed: 80})
	throttledAfter := e.fault.Stats().Did[ddbfault.Throttled]
	quiet := publish(t, e.nats, loadgen.Config{Prefix: "mentions.quiet.", Topics: 20, Messages: 40, Count: 1, Seed: 81})
	// Every mention accepted and written, the hot topic's backlog
	// included: throttles counted from here on ("late") are those of its
	// writes after the raise.
	testenv.Eventually(t, 20*time.Second, func() error {
		reg := e.sc.Registry()
		accepted := testenv.Metric(t, reg, "hotcount_ingest_mentions_total")
		buffered := testenv.Metric(t, reg, "hotcount_aggregator_buffered_mentions")
		pending := testenv.Metric(t, reg, "hotcount_flusher_pending_writes")
		if accepted != float64(hot.Mentions+quiet.Mentions) || buffered != 0 || pending != 0 {
			return fmt.Errorf("%v of %d mentions accepted, %v buffered, %v writes pending", accepted, hot.Mentions+quiet.Mentions, buffered, pending)
		}
		return nil
	})
	if err := e.stop(); err != nil {
		t.Fatal(err)
	}
	got, items := e.dyn.Counts(t, e.cfg.Table)
	if got["topic-0"] != hot.Mentions || sum(got) != hot.Mentions+quiet.Mentions {
		t.Errorf("table: hot %d of %d, all %d of %d", got["topic-0"], hot.Mentions, sum(got), hot.Mentions+quiet.Mentions)
	}
	for topic, n := range quiet.PerTopic {
		if got["quiet."+topic] != n {
			t.Errorf("quiet.%s: %d, want %d", topic, got["quiet."+topic], n)
		}
	}
	m := metas(t, e, []string{"topic-0", "quiet.topic-0"})
	if m["topic-0"].Write() < 4 {
		t.Errorf("hot topic has %d shards, want it raised to at least 4", m["topic-0"].Write())
	}
	if m["quiet.topic-0"].Exists() {
		t.Error("a quiet topic got metadata")
	}
	if n := testenv.Metric(t, e.sc.Registry(), "hotcount_shards_raised_total"); n < 2 {
		t.Errorf("raised %v times, want at least 2 (1 -> 2 -> 4)", n)
	}
	if quietItems := items - m["topic-0"].Write(); quietItems > len(quiet.PerTopic) {
		t.Errorf("%d items for %d quiet topics, want one row each", quietItems, len(quiet.PerTopic))
	}
	late := e.fault.Stats().Did[ddbfault.Throttled] - throttledAfter
	t.Logf("hot topic at %d shards; %d throttles while raising, %d after", m["topic-0"].Write(), throttledAfter, late)
	if throttledAfter == 0 {
		t.Error("no throttles: the test never reached the ceiling")
	}
	if late > 2 {
		t.Errorf("%d throttles after the raise, want them stopped", late)
	}
}
