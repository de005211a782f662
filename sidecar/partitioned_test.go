package sidecar_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/hotcount/hotcount/config"
	"github.com/hotcount/hotcount/durability/streams"
	"github.com/hotcount/hotcount/internal/testtools/testenv"
	"github.com/hotcount/hotcount/tools/loadgen"
)

// partitioned tunes a sidecar for partitioned mode with n partitions.
func partitioned(n int) func(*config.Config) {
	return func(c *config.Config) {
		c.NATSMode = config.ModePartitioned
		c.Partitions = n
		c.FlushInterval = 100 * time.Millisecond
	}
}

// partitionsIdle waits until every partition stream's checkpoint is at
// its end: the sidecars have written every mention stored.
func partitionsIdle(t *testing.T, url string, cfg config.Config, timeout time.Duration) {
	t.Helper()
	names := make([]string, cfg.Partitions)
	for p := range names {
		names[p] = streams.Layout{Stream: cfg.Stream, Partitions: cfg.Partitions}.Name(p)
	}
	testenv.Checkpointed(t, url, names, timeout)
}

// owned returns the partitions each sidecar consumes now.
func owned(t *testing.T, es ...*env) (counts []float64, total float64) {
	for _, e := range es {
		n := testenv.Metric(t, e.sc.Registry(), "hotcount_ingest_partitions_owned")
		counts = append(counts, n)
		total += n
	}
	return counts, total
}

// TestPartitionedFleetCountsExactly: three sidecars in partitioned mode
// divide the partitions among them; a fourth joins and one leaves while
// mentions stream in (two rebalances). The table holds exactly what the
// streams acknowledged, and every partition ends checkpointed at its end.
// Partitions go by rendezvous hashing of random ids, so each sidecar's
// share is a draw: with 32 partitions the chance that one of them draws
// none (which the test would take for a rebalance not done) is about
// 10^-4; with 12 it was about 3% for the newcomer alone, and CI met it.
func TestPartitionedFleetCountsExactly(t *testing.T) {
	const parts = 32
	a := newEnv(t, partitioned(parts))
	others := func(c *config.Config) { partitioned(parts)(c); c.DataDir = t.TempDir() }
	b, c := newEnvOn(t, a, others), newEnvOn(t, a, others)
	testenv.Eventually(t, 20*time.Second, func() error {
		counts, total := owned(t, a, b, c)
		if total != parts || counts[0] == 0 || counts[1] == 0 || counts[2] == 0 {
			return fmt.Errorf("partitions owned %v, want all %d shared by the three", counts, parts)
		}
		return nil
	})

	// Probes, as `hotcount stream create` and `hotcount load` publish
	// them, left in the streams: acknowledged, never counted (sum(got)
	// below would hold them).
	js, err := jetstream.New(testenv.Connect(t, a.nats))
	if err != nil {
		t.Fatal(err)
	}
	for i := range 20 {
		m := nats.NewMsg(fmt.Sprintf("mentions.hotcount-probe.%d", i))
		m.Header.Set(streams.ProbeHeader, "test")
		if _, err := js.PublishMsg(context.Background(), m); err != nil {
			t.Fatal(err)
		}
	}
	first := publish(t, a.nats, loadgen.Config{Prefix: "mentions.", Topics: 300, Zipf: 1.2, Messages: 20_000, Count: 1, Seed: 21, JetStream: true})
	var second loadgen.Report
	var wg sync.WaitGroup
	wg.Go(func() {
		second = publish(t, a.nats, loadgen.Config{Prefix: "mentions.", Topics: 300, Zipf: 1.2, Messages: 30_000, Rate: 10_000, Count: 2, Seed: 22, JetStream: true})
	})
	accepted := func(es ...*env) (n float64) {
		for _, e := range es {
			n += testenv.Metric(t, e.sc.Registry(), "hotcount_ingest_mentions_total")
		}
		return n
	}
	testenv.Eventually(t, 20*time.Second, func() error { // the second stream is being counted
		if n := accepted(a, b, c); n < float64(first.Mentions)+2_000 {
			return fmt.Errorf("%v mentions accepted, want the first %d and some of the second", n, first.Mentions)
		}
		return nil
	})
	d := newEnvOn(t, a, others) // joins mid-stream
	// The first rebalance done: the newcomer owns partitions.
	testenv.Eventually(t, 20*time.Second, func() error {
		if n := testenv.Metric(t, d.sc.Registry(), "hotcount_ingest_partitions_owned"); n == 0 {
			return fmt.Errorf("the newcomer owns no partition yet")
		}
		return nil
	})
	if err := b.stop(); err != nil { // leaves mid-stream
		t.Fatalf("b's shutdown: %v", err)
	}
	wg.Wait()
	testenv.Eventually(t, 20*time.Second, func() error {
		counts, total := owned(t, a, c, d)
		if total != parts || counts[2] == 0 {
			return fmt.Errorf("partitions owned %v, want all %d, the newcomer's among them", counts, parts)
		}
		return nil
	})
	partitionsIdle(t, a.nats, a.cfg, 30*time.Second)
	for _, e := range []*env{a, c, d} {
		if err := e.stop(); err != nil {
			t.Fatalf("shutdown: %v", err)
		}
	}

	got, _ := tableCounts(t, a.dyn, a.cfg.Table)
	want := make(map[string]int64)
	for _, r := range []loadgen.Report{first, second} {
		for topic, n := range r.PerTopic {
			want[topic] += n
		}
	}
	if sum(got) != sum(want) {
		t.Errorf("table holds %d mentions, the stream acknowledged %d", sum(got), sum(want))
	}
	for topic, n := range want {
		if got[topic] != n {
			t.Errorf("topic %s: table %d, acknowledged %d", topic, got[topic], n)
		}
	}
}
