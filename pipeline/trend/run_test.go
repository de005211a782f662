package trend

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap"

	"github.com/hotcount/hotcount/internal/testtools/testenv"
	"github.com/hotcount/hotcount/pipeline/store"
	"github.com/hotcount/hotcount/schema"
)

// TestSketchRunKeepsTheFleetsSummaries: NewSketch starts nothing; Run
// merges every summary published on the subject (another sidecar's
// included), counts one it cannot read, and returns when its context ends.
func TestSketchRunKeepsTheFleetsSummaries(t *testing.T) {
	srv := testenv.NATS(t)
	nc := testenv.Connect(t, srv.ClientURL())
	now := time.Date(2026, 12, 3, 12, 0, 30, 0, time.UTC)
	clock := func() time.Time { return now }
	sk := NewSketch(nc, "trend.test", "me", prometheus.NewRegistry(), zap.NewNop(), clock)

	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- sk.Run(ctx) }()

	minute := schema.Minute.Index(now)
	data, err := json.Marshal(Summary{Writer: "other", Minutes: map[int64]map[string]int64{minute: {"storm": 700}}})
	if err != nil {
		t.Fatal(err)
	}
	// Run subscribes on its own goroutine: publish until a summary is in.
	testenv.Eventually(t, 10*time.Second, func() error {
		if testutil.ToFloat64(sk.merged) > 0 {
			return nil
		}
		if err := nc.Publish("trend.test", data); err != nil {
			return err
		}
		return fmt.Errorf("no summary merged yet")
	})
	cfg := Config{Minutes: true, Hours: true}
	window, _ := cfg.plan(5*time.Minute, now)
	if got := sk.candidates(window, cfg.baseline(window), 5, ByMentions, 0, 0, nil); !slices.Contains(got, "storm") {
		t.Errorf("candidates %v, want the other sidecar's storm", got)
	}

	if err := nc.Publish("trend.test", []byte("{not json")); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, func() error {
		if n := testutil.ToFloat64(sk.dropped); n != 1 {
			return fmt.Errorf("%v unreadable summaries counted, want 1", n)
		}
		return nil
	})

	stop()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Run: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run still running 10s after its context ended")
	}
}

// TestOwnSummaryIsMergedOnce: Observe merges this sidecar's summary as it
// publishes it, before Run may have subscribed, and Run skips its echo.
func TestOwnSummaryIsMergedOnce(t *testing.T) {
	srv := testenv.NATS(t)
	nc := testenv.Connect(t, srv.ClientURL())
	now := time.Date(2026, 12, 3, 12, 0, 30, 0, time.UTC)
	sk := NewSketch(nc, "trend.test", "me", prometheus.NewRegistry(), zap.NewNop(), func() time.Time { return now })
	minute := schema.Minute.Index(now)
	sk.Observe(map[schema.Counter]int64{schema.BucketOf("mine", schema.Minute, minute): 9})
	if n := testutil.ToFloat64(sk.merged); n != 1 {
		t.Fatalf("%v summaries merged before Run, want this sidecar's own", n)
	}

	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	go sk.Run(ctx) //nolint:errcheck // returns nil when ctx ends
	data, err := json.Marshal(Summary{Writer: "other", Minutes: map[int64]map[string]int64{minute: {"theirs": 5}}})
	if err != nil {
		t.Fatal(err)
	}
	rounds := int64(0)
	testenv.Eventually(t, 10*time.Second, func() error {
		// Ours again, then theirs, on one connection: the server delivers
		// them in that order, so once theirs is in, every echo of ours
		// before it has reached Run.
		sk.Observe(map[schema.Counter]int64{schema.BucketOf("mine", schema.Minute, minute): 1})
		rounds++
		if err := nc.Publish("trend.test", data); err != nil {
			return err
		}
		sk.mu.Lock()
		defer sk.mu.Unlock()
		if sk.mentions.minutes[minute]["theirs"] == 0 {
			return errors.New("the other sidecar's summary is not in yet")
		}
		return nil
	})
	sk.mu.Lock()
	mine := sk.mentions.minutes[minute]["mine"]
	sk.mu.Unlock()
	if mine != 9+rounds {
		t.Errorf("mine counts %d in the sketch, want %d: this sidecar's summaries merged once each", mine, 9+rounds)
	}
}

// TestAnswersExpireByTheClock: a windowed count is served from the cache
// until the service's clock passes CacheTTL, then read again: the TTL runs
// on the injected clock, not on the wall's.
func TestAnswersExpireByTheClock(t *testing.T) {
	ctx := context.Background()
	st := openBolt(t)
	now := time.Date(2026, 12, 3, 12, 0, 30, 0, time.UTC)
	clock := func() time.Time { return now }
	s := New(Config{Minutes: true, Hours: true, CacheTTL: 10 * time.Second, CacheSize: 10}, st, prometheus.NewRegistry(), clock)
	minute := schema.Minute.Index(now)
	add := func(n int64) {
		if err := st.Add(ctx, testenv.Inc(schema.BucketOf("t", schema.Minute, minute), 0, n), now); err != nil {
			t.Fatal(err)
		}
	}
	read := func() Count {
		c, err := s.Window(ctx, "t", "5m")
		if err != nil {
			t.Fatal(err)
		}
		return c
	}

	add(3)
	if c := read(); c.Count != 3 || c.Source != "store" {
		t.Fatalf("first read %d from %s, want 3 from the store", c.Count, c.Source)
	}
	add(4)
	now = now.Add(9 * time.Second)
	if c := read(); c.Count != 3 || c.Source != "cache" || c.AgeMs != 9000 {
		t.Errorf("read within the TTL: %d from %s, %d ms old; want 3 from the cache, 9000 ms old", c.Count, c.Source, c.AgeMs)
	}
	now = now.Add(2 * time.Second)
	if c := read(); c.Count != 7 || c.Source != "store" {
		t.Errorf("read past the TTL: %d from %s, want 7 from the store", c.Count, c.Source)
	}
}

// openBolt is an embedded store in the test's folder, closed at its end.
func openBolt(t *testing.T) *store.Bolt {
	t.Helper()
	st, err := store.OpenBolt(t.TempDir(), store.NewMetrics(prometheus.NewRegistry()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}
