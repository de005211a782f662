package fleet_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/hotcount/hotcount/fleet"
	"github.com/hotcount/hotcount/internal/testtools/testenv"
	"github.com/hotcount/hotcount/pipeline/lookup"
	"github.com/hotcount/hotcount/pipeline/store"
)

// runShares runs shares until the test ends and returns once the server
// has their subscriptions: totals published from then on reach them.
func runShares(t testing.TB, ns *server.Server, shares ...*fleet.Shares) {
	t.Helper()
	before := ns.NumSubscriptions()
	for _, sh := range shares {
		start(t, sh.Run)
	}
	testenv.Eventually(t, 5*time.Second, func() error {
		if n := ns.NumSubscriptions() - before; n < uint32(len(shares)) {
			return fmt.Errorf("%d of %d subscriptions on the server", n, len(shares))
		}
		return nil
	})
}

// service returns a lookup service over st whose background work runs
// until the test ends.
func service(t *testing.T, cfg lookup.Config, st lookup.Store, reg *prometheus.Registry, now func() time.Time) *lookup.Service {
	svc := lookup.New(cfg, st, reg, now)
	t.Cleanup(svc.Close)
	start(t, svc.Run)
	return svc
}

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
	var shares [2]*fleet.Shares
	for i := range svcs {
		regs[i] = prometheus.NewRegistry()
		svcs[i] = service(t, lookup.Config{Shards: 1, CacheTTL: time.Hour, CacheStale: time.Hour, CacheSize: 100, MaxTopicBytes: 64, Share: true}, st, regs[i], time.Now)
		shares[i] = fleet.NewShares(testenv.Connect(t, ns.ClientURL()), fleet.DefaultSharesSubject, []string{"a", "b"}[i], "test", svcs[i], regs[i], zap.NewNop())
		svcs[i].ShareWith(shares[i])
	}
	runShares(t, ns, shares[:]...)
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
	if err := pub.Publish(fleet.DefaultSharesSubject, []byte(`{"from":"b","scope":"test","topic":"hot","count":9,"shards":1}`)); err != nil {
		t.Fatal(err)
	}
	if err := pub.Publish(fleet.DefaultSharesSubject, []byte(`not json`)); err != nil {
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
	// A lower total (a lagging peer) is refused: once a has counted it
	// received (after offering it), it still serves 9.
	if err := pub.Publish(fleet.DefaultSharesSubject, []byte(`{"from":"b","scope":"test","topic":"hot","count":3,"shards":1}`)); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 5*time.Second, func() error {
		if n := testenv.Metric(t, regs[0], "hotcount_peers_received_total"); n < 3 {
			return fmt.Errorf("received = %v, want the lower total received", n)
		}
		return nil
	})
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
	clk := testenv.NewClock(time.Unix(1_800_000_000, 0))
	svc := service(t, lookup.Config{Shards: 1, CacheTTL: 50 * time.Millisecond, CacheStale: 300 * time.Millisecond, CacheSize: 100, MaxTopicBytes: 64, Share: true}, bolt, reg, clk.Now)
	runShares(t, ns, fleet.NewShares(testenv.Connect(t, ns.ClientURL()), fleet.DefaultSharesSubject, "a", "table-1", svc, reg, zap.NewNop()))
	if got, err := svc.Lookup(ctx, "hot", lookup.Cached); err != nil || got.Count != 5 {
		t.Fatalf("Lookup = %+v, %v", got, err)
	}
	pub := testenv.Connect(t, ns.ClientURL())
	publish := func(msg string) {
		t.Helper()
		if err := pub.Publish(fleet.DefaultSharesSubject, []byte(msg)); err != nil {
			t.Fatal(err)
		}
	}
	// Another table's total, then one past any shard count: once the
	// second is counted invalid, the first has been handled too (one
	// publisher's messages arrive in order).
	publish(`{"from":"x","scope":"table-2","topic":"hot","count":777,"shards":1}`)
	publish(`{"from":"x","scope":"table-1","topic":"hot","count":5,"shards":5000}`)
	testenv.Eventually(t, 5*time.Second, func() error {
		if n := testenv.Metric(t, reg, "hotcount_peers_invalid_total"); n != 1 {
			return fmt.Errorf("invalid = %v, want 1", n)
		}
		return nil
	})
	if got, _ := svc.Lookup(ctx, "hot", lookup.Cached); got.Count != 5 {
		t.Fatalf("serves %d after another table's total, want 5", got.Count)
	}
	publish(`{"from":"x","scope":"table-1","topic":"hot","count":1000000,"shards":1}`)
	testenv.Eventually(t, 5*time.Second, func() error {
		if got, _ := svc.Lookup(ctx, "hot", lookup.Cached); got.Count != 1000000 {
			return fmt.Errorf("serves %d, want the wrong shared total taken first", got.Count)
		}
		return nil
	})
	// Past its TTL (jittered up to 60 ms) the next read refreshes it: the
	// gather reads lower, and again strongly.
	clk.Add(100 * time.Millisecond)
	testenv.Eventually(t, 5*time.Second, func() error {
		svc.Lookup(ctx, "hot", lookup.Cached) //nolint:errcheck // starts the refresh
		if n := testenv.Metric(t, reg, "hotcount_cache_regressions_total"); n < 1 {
			return fmt.Errorf("regressions = %v, want the lower gather counted", n)
		}
		return nil
	})
	// What was served is held for --cache-stale from the first lookup,
	// then the store's word is.
	clk.Add(250 * time.Millisecond)
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
