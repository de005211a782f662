package peers_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/hotcount/hotcount/internal/testenv"
	"github.com/hotcount/hotcount/lookup"
	"github.com/hotcount/hotcount/peers"
	"github.com/hotcount/hotcount/store"
)

// TestSharedTotalIsTaken: a total one sidecar gathers reaches another that
// caches the topic, which serves it without gathering; a lower total is
// refused (totals never go back), and junk on the subject is counted and
// ignored.
func TestSharedTotalIsTaken(t *testing.T) {
	ns := testenv.NATS(t)
	bolt := hotStore(t)
	ctx := context.Background()
	st := &counted{Store: bolt}
	var svcs [2]*lookup.Service
	var regs [2]*prometheus.Registry
	for i := range svcs {
		regs[i] = prometheus.NewRegistry()
		svcs[i] = lookup.New(lookup.Config{Shards: 1, CacheTTL: time.Hour, CacheStale: time.Hour, CacheSize: 100, MaxTopicBytes: 64, Share: true}, st, regs[i], time.Now)
		defer svcs[i].Close()
		p, err := peers.Join(testenv.Connect(t, ns.ClientURL()), peers.DefaultSubject, []string{"a", "b"}[i], "test", svcs[i], regs[i], zap.NewNop())
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close() //nolint:errcheck // closing
		svcs[i].ShareWith(p)
	}
	for _, svc := range svcs { // both cache hot at 5
		if got, err := svc.Lookup(ctx, "hot", lookup.Cached); err != nil || got.Count != 5 {
			t.Fatalf("Lookup = %+v, %v", got, err)
		}
	}
	// b's gather reaches a: a serves 9 from its cache without gathering.
	if err := bolt.Add(ctx, testenv.W("hot", 0, 4), time.Now()); err != nil {
		t.Fatal(err)
	}
	if _, err := svcs[1].Lookup(ctx, "hot", lookup.Eventual); err != nil { // not cached: no share
		t.Fatal(err)
	}
	svcs[1].Offer("never-cached", 1, 1) // ignored: b does not cache it
	gathers := st.gathers.Load()
	pub := testenv.Connect(t, ns.ClientURL())
	if err := pub.Publish(peers.DefaultSubject, []byte(`{"from":"b","scope":"test","topic":"hot","count":9,"shards":1}`)); err != nil {
		t.Fatal(err)
	}
	if err := pub.Publish(peers.DefaultSubject, []byte(`not json`)); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 5*time.Second, func() error {
		got, err := svcs[0].Lookup(ctx, "hot", lookup.Cached)
		if err != nil {
			return err
		}
		if got.Count != 9 || got.Stale {
			return fmt.Errorf("a serves %+v, want the shared 9, fresh", got)
		}
		return nil
	})
	if st.gathers.Load() != gathers {
		t.Errorf("a gathered %d times to serve the shared total", st.gathers.Load()-gathers)
	}
	// A lower total (a lagging peer) is refused.
	if err := pub.Publish(peers.DefaultSubject, []byte(`{"from":"b","scope":"test","topic":"hot","count":3,"shards":1}`)); err != nil {
		t.Fatal(err)
	}
	pub.Flush() //nolint:errcheck // checked below
	time.Sleep(100 * time.Millisecond)
	if got, _ := svcs[0].Lookup(ctx, "hot", lookup.Cached); got.Count != 9 {
		t.Errorf("after a lower shared total a serves %d, want 9", got.Count)
	}
	if n := testenv.Metric(t, regs[0], "hotcount_peers_invalid_total"); n != 1 {
		t.Errorf("invalid = %v, want 1", n)
	}
	// a's own totals come back to it and are not counted as received.
	if n := testenv.Metric(t, regs[0], "hotcount_peers_received_total"); n != 3 { // b's first gather, 9 and 3
		t.Errorf("received = %v, want 3", n)
	}
}

// TestWrongSharedTotalIsUndone: a shared total far above the store (a bug,
// a stray publisher) is served for a while, but the next gather reads
// lower, reads again strongly and serves the store's word: within
// --cache-stale the answer is right again. Totals of another table are
// never taken.
func TestWrongSharedTotalIsUndone(t *testing.T) {
	ns := testenv.NATS(t)
	bolt := hotStore(t)
	ctx := context.Background()
	reg := prometheus.NewRegistry()
	svc := lookup.New(lookup.Config{Shards: 1, CacheTTL: 50 * time.Millisecond, CacheStale: 300 * time.Millisecond, CacheSize: 100, MaxTopicBytes: 64, Share: true}, bolt, reg, time.Now)
	defer svc.Close()
	p, err := peers.Join(testenv.Connect(t, ns.ClientURL()), peers.DefaultSubject, "a", "table-1", svc, reg, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close() //nolint:errcheck // closing
	if got, err := svc.Lookup(ctx, "hot", lookup.Cached); err != nil || got.Count != 5 {
		t.Fatalf("Lookup = %+v, %v", got, err)
	}
	pub := testenv.Connect(t, ns.ClientURL())
	if err := pub.Publish(peers.DefaultSubject, []byte(`{"from":"x","scope":"table-2","topic":"hot","count":777,"shards":1}`)); err != nil {
		t.Fatal(err)
	}
	pub.Flush() //nolint:errcheck // checked below
	time.Sleep(20 * time.Millisecond)
	if got, _ := svc.Lookup(ctx, "hot", lookup.Cached); got.Count != 5 {
		t.Fatalf("serves %d after another table's total, want 5", got.Count)
	}
	for _, msg := range []string{
		`{"from":"x","scope":"table-1","topic":"hot","count":5,"shards":5000}`, // past any shard count
		`{"from":"x","scope":"table-1","topic":"hot","count":1000000,"shards":1}`,
	} {
		if err := pub.Publish(peers.DefaultSubject, []byte(msg)); err != nil {
			t.Fatal(err)
		}
	}
	testenv.Eventually(t, 5*time.Second, func() error {
		if got, _ := svc.Lookup(ctx, "hot", lookup.Cached); got.Count != 1000000 {
			return fmt.Errorf("serves %d, want the wrong shared total taken first", got.Count)
		}
		return nil
	})
	testenv.Eventually(t, 5*time.Second, func() error {
		if got, _ := svc.Lookup(ctx, "hot", lookup.Cached); got.Count != 5 {
			return fmt.Errorf("serves %d, want the store's 5 again", got.Count)
		}
		return nil
	})
	if n := testenv.Metric(t, reg, "hotcount_peers_invalid_total"); n != 1 {
		t.Errorf("invalid = %v, want 1 (the shard count)", n)
	}
	if n := testenv.Metric(t, reg, "hotcount_cache_regressions_total"); n < 1 {
		t.Errorf("regressions = %v, want the lower gather counted", n)
	}
}

// hotStore is an embedded store holding 5 mentions of "hot".
func hotStore(t *testing.T) *store.Bolt {
	t.Helper()
	bolt, err := store.OpenBolt(t.TempDir(), store.NewMetrics(prometheus.NewRegistry()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { bolt.Close() })
	if err := bolt.Add(context.Background(), testenv.W("hot", 0, 5), time.Now()); err != nil {
		t.Fatal(err)
	}
	return bolt
}
