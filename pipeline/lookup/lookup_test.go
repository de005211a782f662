package lookup_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/hotcount/hotcount/internal/testtools/testenv"
	"github.com/hotcount/hotcount/pipeline/lookup"
	"github.com/hotcount/hotcount/pipeline/store"
	"github.com/hotcount/hotcount/schema"
)

// counting wraps a real store, counting gathers and store calls, and can
// fail them or hold them until released.
type counting struct {
	lookup.Store
	gathers    atomic.Int64 // topics gathered
	calls      atomic.Int64 // Gather/GatherMany calls
	consistent atomic.Int64 // calls with consistent reads
	fail       atomic.Bool
	delay      time.Duration
	gate       chan struct{} // when set, each call waits for a receive... of a close
}

func (c *counting) before(n int, consistent bool) error {
	c.calls.Add(1)
	c.gathers.Add(int64(n))
	if consistent {
		c.consistent.Add(1)
	}
	time.Sleep(c.delay) // hold the gather open so that readers pile up on it
	if g := c.gate; g != nil {
		<-g
	}
	if c.fail.Load() {
		return errors.New("injected: store down")
	}
	return nil
}

func (c *counting) Gather(ctx context.Context, topic string, n int, consistent bool) ([]schema.Shard, error) {
	if err := c.before(1, consistent); err != nil {
		return nil, err
	}
	return c.Store.Gather(ctx, topic, n, consistent)
}

func (c *counting) GatherMany(ctx context.Context, topics []string, n int, consistent bool) (map[string][]schema.Shard, error) {
	if err := c.before(len(topics), consistent); err != nil {
		return nil, err
	}
	return c.Store.GatherMany(ctx, topics, n, consistent)
}

func newBolt(t testing.TB) *store.Bolt {
	b, err := store.OpenBolt(t.TempDir(), store.NewMetrics(prometheus.NewRegistry()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

func newStore(t testing.TB) (*counting, *store.Bolt) {
	b := newBolt(t)
	return &counting{Store: b}, b
}

// clock is a settable time for freshness decisions.

func newService(t testing.TB, st lookup.Store, ttl, stale time.Duration, now func() time.Time) (*lookup.Service, *prometheus.Registry) {
	reg := prometheus.NewRegistry()
	if now == nil {
		now = time.Now
	}
	svc := lookup.New(lookup.Config{Shards: 4, CacheTTL: ttl, CacheStale: stale, CacheSize: 100, MaxTopicBytes: 32}, st, reg, now)
	t.Cleanup(svc.Close)
	run(t, svc)
	return svc, reg
}

// run runs svc's background work until the test ends (stopped before
// Close: cleanups run last first), once its workers are up.
func run(t testing.TB, svc *lookup.Service) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- svc.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	testenv.Eventually(t, 5*time.Second, func() error {
		if !lookup.Serving(svc) {
			return errors.New("refresh workers not up")
		}
		return nil
	})
}

func add(t testing.TB, b *store.Bolt, topic string, shard int, n int64) {
	t.Helper()
	if err := b.Add(context.Background(), testenv.W(topic, shard, n), time.UnixMilli(1796198815543)); err != nil {
		t.Fatal(err)
	}
}

// TestCacheAbsorbsConcurrentReads: 64 readers × 200 lookups of one topic
// within one TTL cost one gather, and all see the right total.
func TestCacheAbsorbsConcurrentReads(t *testing.T) {
	st, b := newStore(t)
	st.delay = 20 * time.Millisecond
	for shard, n := range []int64{3, 0, 5, 2} {
		add(t, b, "golang", shard, n)
	}
	svc, reg := newService(t, st, time.Minute, 10*time.Minute, nil)
	var wg sync.WaitGroup
	for range 64 {
		wg.Go(func() {
			for range 200 {
				got, err := svc.Lookup(context.Background(), "golang", lookup.Cached)
				if err != nil || got.Count != 10 {
					t.Errorf("Lookup = %+v, %v; want count 10", got, err)
					return
				}
			}
		})
	}
	wg.Wait()
	if g := st.gathers.Load(); g != 1 {
		t.Errorf("%d gathers for 12800 concurrent lookups in one TTL, want 1", g)
	}
	hits := testenv.MetricWith(t, reg, "hotcount_cache_requests_total", "result", "hit")
	misses := testenv.MetricWith(t, reg, "hotcount_cache_requests_total", "result", "miss")
	if hits+misses != 64*200 || misses < 1 {
		t.Errorf("hits %v + misses %v, want 12800 with at least one miss", hits, misses)
	}
}

// TestStaleWhileRevalidate: past the TTL a reader gets the old total at once
// (stale) while one background gather runs, even when that gather hangs;
// then the new total is served fresh.
func TestStaleWhileRevalidate(t *testing.T) {
	st, b := newStore(t)
	clk := testenv.NewClock(time.Unix(1_800_000_000, 0))
	svc, reg := newService(t, st, time.Second, time.Hour, clk.Now)
	ctx := context.Background()
	add(t, b, "hot", 0, 5)
	if got, err := svc.Lookup(ctx, "hot", lookup.Cached); err != nil || got.Count != 5 || got.Source != "store" {
		t.Fatalf("first Lookup = %+v, %v", got, err)
	}
	add(t, b, "hot", 1, 2)
	st.gate = make(chan struct{}) // the refresh will hang until released
	clk.Add(1500 * time.Millisecond)

	for range 1000 { // a storm during the refresh: nobody waits
		got, err := svc.Lookup(ctx, "hot", lookup.Cached)
		if err != nil || got.Count != 5 || !got.Stale || got.Source != "cache" || got.AgeMs != 1500 {
			t.Fatalf("Lookup during refresh = %+v, %v; want the stale 5 at once", got, err)
		}
	}
	testenv.Eventually(t, 5*time.Second, func() error {
		if g := st.gathers.Load(); g != 2 {
			return fmt.Errorf("%d gathers, want 2: the first, and one refresh for the whole storm", g)
		}
		return nil
	})
	close(st.gate)
	testenv.Eventually(t, 5*time.Second, func() error {
		got, err := svc.Lookup(ctx, "hot", lookup.Cached)
		if err != nil {
			return err
		}
		if got.Count != 7 || got.Stale {
			return fmt.Errorf("got %+v, want a fresh 7", got)
		}
		return nil
	})
	if n := testenv.MetricWith(t, reg, "hotcount_cache_requests_total", "result", "stale"); n < 1000 {
		t.Errorf("stale results = %v, want at least 1000", n)
	}
}

// TestStaleSurvivesStoreFailure: a refresh that fails keeps the stale total
// served, up to --cache-stale; past it readers miss and get the error.
func TestStaleSurvivesStoreFailure(t *testing.T) {
	st, b := newStore(t)
	clk := testenv.NewClock(time.Unix(1_800_000_000, 0))
	svc, reg := newService(t, st, 20*time.Millisecond, 300*time.Millisecond, clk.Now)
	ctx := context.Background()
	add(t, b, "x", 2, 9)
	if _, err := svc.Lookup(ctx, "x", lookup.Cached); err != nil {
		t.Fatal(err)
	}
	st.fail.Store(true)
	clk.Add(40 * time.Millisecond) // past the TTL, inside the stale bound
	got, err := svc.Lookup(ctx, "x", lookup.Cached)
	if err != nil || got.Count != 9 || !got.Stale {
		t.Fatalf("Lookup with the store down = %+v, %v; want the stale 9", got, err)
	}
	testenv.Eventually(t, 5*time.Second, func() error {
		if testenv.Metric(t, reg, "hotcount_cache_refresh_errors_total") < 1 {
			return errors.New("no failed refresh yet")
		}
		return nil
	})
	clk.Add(300 * time.Millisecond) // past the stale bound
	testenv.Eventually(t, 5*time.Second, func() error {
		if _, err := svc.Lookup(ctx, "x", lookup.Cached); err == nil {
			return errors.New("still served past the stale bound")
		}
		return nil
	})
}

// TestReadCostBoundedByTTL: a storm of readers for a second costs at most
// (duration / TTL + 1) gathers of one topic.
func TestReadCostBoundedByTTL(t *testing.T) {
	st, b := newStore(t)
	add(t, b, "storm", 0, 1)
	const ttl = 100 * time.Millisecond
	svc, _ := newService(t, st, ttl, 10*ttl, nil)
	start := time.Now()
	var wg sync.WaitGroup
	var lookups atomic.Int64
	for range 8 {
		wg.Go(func() {
			for time.Since(start) < time.Second {
				if _, err := svc.Lookup(context.Background(), "storm", lookup.Cached); err != nil {
					t.Error(err)
					return
				}
				lookups.Add(1)
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	bound := int64(elapsed/ttl) + 1
	if g := st.gathers.Load(); g > bound {
		t.Errorf("%d gathers in %s for %d lookups, bound %d", g, elapsed, lookups.Load(), bound)
	}
	t.Logf("%d lookups in %s cost %d gathers (%d shard reads); bound %d gathers", lookups.Load(), elapsed, st.gathers.Load(), 4*st.gathers.Load(), bound)
}

// TestLookupManySharesOneGather: hits come from the cache and all misses of
// a batch are gathered in one store call.
func TestLookupManySharesOneGather(t *testing.T) {
	st, b := newStore(t)
	add(t, b, "a", 0, 1)
	add(t, b, "c", 3, 3)
	svc, _ := newService(t, st, time.Minute, time.Hour, nil)
	ctx := context.Background()
	if _, err := svc.Lookup(ctx, "a", lookup.Cached); err != nil {
		t.Fatal(err)
	}
	calls := st.calls.Load()
	got, err := svc.LookupMany(ctx, []string{"a", "b", "c", "b"}, lookup.Cached)
	if err != nil {
		t.Fatal(err)
	}
	if st.calls.Load()-calls != 1 || st.gathers.Load() != 1+2 {
		t.Errorf("%d store calls for %d topics, want one call for the 2 misses", st.calls.Load()-calls, st.gathers.Load()-1)
	}
	want := []struct {
		topic  string
		count  int64
		source string
	}{{"a", 1, "cache"}, {"b", 0, "store"}, {"c", 3, "store"}, {"b", 0, "store"}}
	for i, w := range want {
		if got[i].Topic != w.topic || got[i].Count != w.count || got[i].Source != w.source {
			t.Errorf("result %d = %+v, want %+v", i, got[i], w)
		}
	}
}

// TestConsistencyLevels: eventual and strong skip the cache; strong asks the
// store for consistent reads; neither serves a cached value.
func TestConsistencyLevels(t *testing.T) {
	st, b := newStore(t)
	svc, _ := newService(t, st, time.Minute, time.Hour, nil)
	ctx := context.Background()
	add(t, b, "c", 0, 1)
	if _, err := svc.Lookup(ctx, "c", lookup.Cached); err != nil {
		t.Fatal(err)
	}
	add(t, b, "c", 1, 1)
	for _, tc := range []struct {
		c          lookup.Consistency
		want       int64
		consistent int64
	}{{lookup.Cached, 1, 0}, {lookup.Eventual, 2, 0}, {lookup.Strong, 2, 1}} {
		got, err := svc.Lookup(ctx, "c", tc.c)
		if err != nil || got.Count != tc.want {
			t.Errorf("consistency %d: %+v, %v; want %d", tc.c, got, err, tc.want)
		}
		if n := st.consistent.Load(); n != tc.consistent {
			t.Errorf("consistency %d: %d consistent store calls, want %d", tc.c, n, tc.consistent)
		}
	}
}
