package lookup_test

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hotcount/hotcount/internal/testtools/testenv"
	"github.com/hotcount/hotcount/pipeline/lookup"
	"github.com/hotcount/hotcount/schema"
)

// TestUnknownTopicsKeepHotOnesCached: lookups of 1,000 random names (a
// scan, a typo storm) through a cache of 100 leave a hot topic cached: it
// costs no second gather, and each junk name costs one gather per TTL.
func TestUnknownTopicsKeepHotOnesCached(t *testing.T) {
	st, b := newStore(t)
	add(t, b, "golang", 0, 42)
	svc, reg := newService(t, st, time.Minute, time.Hour, nil)
	ctx := context.Background()
	for range 3 { // hot: read often
		if got, err := svc.Lookup(ctx, "golang", lookup.Cached); err != nil || got.Count != 42 {
			t.Fatalf("Lookup(golang) = %+v, %v", got, err)
		}
	}
	for i := range 1000 {
		junk := "junk-" + strconv.Itoa(i)
		for range 2 { // the second lookup is answered from the absent cache
			if got, err := svc.Lookup(ctx, junk, lookup.Cached); err != nil || got.Count != 0 {
				t.Fatalf("Lookup(%s) = %+v, %v", junk, got, err)
			}
		}
	}
	if g := st.gathers.Load(); g != 1+1000 {
		t.Errorf("%d gathers, want 1 for golang and 1 per junk name", g)
	}
	before := st.gathers.Load()
	got, err := svc.Lookup(ctx, "golang", lookup.Cached)
	if err != nil || got.Count != 42 || got.Source != "cache" || st.gathers.Load() != before {
		t.Errorf("after the junk storm: %+v, %v, %d new gathers; want golang still cached", got, err, st.gathers.Load()-before)
	}
	if n := testenv.Metric(t, reg, "hotcount_cache_evictions_total"); n != 0 {
		t.Errorf("%v totals evicted by unknown names", n)
	}
}

// TestBatchesShareGathers: 50 concurrent batches of the same 2 missing
// topics, and single lookups of one of them at the same time, gather each
// topic once (in one or two store calls, as the first lookup to arrive was
// a batch or a single one).
func TestBatchesShareGathers(t *testing.T) {
	st, b := newStore(t)
	add(t, b, "a", 0, 1)
	add(t, b, "b", 1, 2)
	st.gate = make(chan struct{})
	svc, reg := newService(t, st, time.Minute, time.Hour, nil)
	var wg sync.WaitGroup
	for i := range 60 {
		wg.Go(func() {
			if i%6 == 0 {
				if got, err := svc.Lookup(context.Background(), "b", lookup.Cached); err != nil || got.Count != 2 {
					t.Errorf("Lookup(b) = %+v, %v", got, err)
				}
				return
			}
			got, err := svc.LookupMany(context.Background(), []string{"a", "b"}, lookup.Cached)
			if err != nil || got[0].Count != 1 || got[1].Count != 2 {
				t.Errorf("LookupMany = %+v, %v", got, err)
			}
		})
	}
	// Every lookup has missed (10 singles of b, 50 batches of a and b)
	// and so waits for a gather, held at the gate.
	testenv.Eventually(t, 5*time.Second, func() error {
		if n := testenv.MetricWith(t, reg, "hotcount_cache_requests_total", "result", "miss"); n != 10+50*2 {
			return fmt.Errorf("%v misses, want 110", n)
		}
		return nil
	})
	close(st.gate)
	wg.Wait()
	if g, c := st.gathers.Load(), st.calls.Load(); g != 2 || c > 2 {
		t.Errorf("%d topics gathered in %d store calls for 60 concurrent lookups of 2 missing topics, want each gathered once", g, c)
	}
}

// lagging is a store whose eventually consistent reads can lag: while set,
// they return the shards as they were when the lag began.
type lagging struct {
	lookup.Store
	mu     sync.Mutex
	frozen map[string][]schema.Shard
}

func (l *lagging) freeze(topic string) {
	shards, _ := l.Store.Gather(context.Background(), topic, 4, true)
	l.mu.Lock()
	defer l.mu.Unlock()
	l.frozen = map[string][]schema.Shard{topic: shards}
}

func (l *lagging) GatherMany(ctx context.Context, topics []string, n int, consistent bool) (map[string][]schema.Shard, error) {
	m, err := l.Store.GatherMany(ctx, topics, n, consistent)
	l.mu.Lock()
	defer l.mu.Unlock()
	for t, s := range l.frozen {
		if _, ok := m[t]; ok && !consistent {
			m[t] = s
		}
	}
	return m, err
}

// TestTotalsNeverGoBackwards: a refresh whose eventually consistent read
// lags behind the cached total is a stale read: it is read again strongly,
// counted, and the lower total is never served.
func TestTotalsNeverGoBackwards(t *testing.T) {
	st, b := newStore(t)
	lag := &lagging{Store: st}
	add(t, b, "hot", 0, 5)
	lag.freeze("hot") // a replica stuck at 5
	add(t, b, "hot", 1, 3)
	clk := testenv.NewClock(time.Unix(1_800_000_000, 0))
	svc, reg := newService(t, lag, time.Second, time.Hour, clk.Now)
	ctx := context.Background()
	got, err := svc.Lookup(ctx, "hot", lookup.Consistency(lookup.Strong))
	if err != nil || got.Count != 8 {
		t.Fatalf("strong Lookup = %+v, %v", got, err)
	}
	// The first cached gather reads the lagging replica: 5. A later one
	// must not serve less than what was served since: prime the cache with
	// the true 8 through a strong read the cache saw (a refresh that read
	// fresh), then lag.
	lag.mu.Lock()
	lag.frozen = nil
	lag.mu.Unlock()
	if got, err := svc.Lookup(ctx, "hot", lookup.Cached); err != nil || got.Count != 8 {
		t.Fatalf("cached Lookup = %+v, %v", got, err)
	}
	lag.mu.Lock()
	lag.frozen = map[string][]schema.Shard{"hot": {{Count: 5}, {}, {}, {}}}
	lag.mu.Unlock()
	clk.Add(2 * time.Second)
	for range 50 {
		got, err := svc.Lookup(ctx, "hot", lookup.Cached)
		if err != nil || got.Count < 8 {
			t.Fatalf("Lookup after a lagging refresh = %+v, %v; never below 8", got, err)
		}
	}
	testenv.Eventually(t, 5*time.Second, func() error {
		if n := testenv.Metric(t, reg, "hotcount_cache_regressions_total"); n < 1 {
			return fmt.Errorf("regressions = %v, want the lagging read counted", n)
		}
		return nil
	})
	if st.consistent.Load() < 2 {
		t.Errorf("%d strong reads, want the regression read again strongly", st.consistent.Load())
	}
}

// TestRefreshesBounded: a storm over 80 stale topics while the store hangs
// runs at most 16 refreshes at once.
func TestRefreshesBounded(t *testing.T) {
	st, b := newStore(t)
	var topics []string
	for i := range 80 { // within the cache's 100
		topic := "t" + strconv.Itoa(i)
		add(t, b, topic, 0, 1)
		topics = append(topics, topic)
	}
	clk := testenv.NewClock(time.Unix(1_800_000_000, 0))
	c := &concurrency{Store: st, gate: make(chan struct{})}
	svc, _ := newService(t, c, time.Second, time.Hour, clk.Now)
	ctx := context.Background()
	c.open.Store(true)
	for _, topic := range topics {
		if _, err := svc.Lookup(ctx, topic, lookup.Cached); err != nil {
			t.Fatal(err)
		}
	}
	c.open.Store(false)
	clk.Add(2 * time.Second)
	for _, topic := range topics { // each starts a refresh
		if got, err := svc.Lookup(ctx, topic, lookup.Cached); err != nil || !got.Stale {
			t.Fatalf("Lookup(%s) = %+v, %v; want the stale total at once", topic, got, err)
		}
	}
	// 80 refreshes wait for 16 workers: all of those busy, none more.
	testenv.Eventually(t, 5*time.Second, func() error {
		if n := c.max.Load(); n != 16 {
			return fmt.Errorf("%d refreshes at once, want 16", n)
		}
		return nil
	})
	// Every worker is held in a gather: the other 64 refreshes wait in the
	// queue, where none can start until the gate opens.
	if n := c.now.Load(); n != 16 || lookup.Queued(svc) < 64 {
		t.Errorf("%d refreshes in gathers, %d tasks queued; want 16 busy and the other 64 queued", n, lookup.Queued(svc))
	}
	if n := c.max.Load(); n != 16 {
		t.Errorf("%d refreshes at once, want at most 16", n)
	}
	close(c.gate)
}

// concurrency counts gathers in flight; closed gates hold them.
type concurrency struct {
	lookup.Store
	gate     chan struct{}
	open     atomic.Bool // let calls through without holding them
	now, max atomic.Int64
}

func (c *concurrency) GatherMany(ctx context.Context, topics []string, n int, consistent bool) (map[string][]schema.Shard, error) {
	if !c.open.Load() && c.gate != nil {
		cur := c.now.Add(1)
		defer c.now.Add(-1)
		for {
			m := c.max.Load()
			if cur <= m || c.max.CompareAndSwap(m, cur) {
				break
			}
		}
		<-c.gate
	}
	return c.Store.GatherMany(ctx, topics, n, consistent)
}

// TestKnownListsCachedTotals: Known lists the topics the cache holds, with
// their cached totals, and reads nothing from the store.
func TestKnownListsCachedTotals(t *testing.T) {
	st, b := newStore(t)
	add(t, b, "golang", 0, 5)
	add(t, b, "rust", 0, 3)
	svc, _ := newService(t, st, time.Minute, time.Hour, nil)
	for _, topic := range []string{"golang", "rust"} {
		if _, err := svc.Lookup(context.Background(), topic, lookup.Cached); err != nil {
			t.Fatal(err)
		}
	}
	calls := st.calls.Load()
	got := map[string]int64{}
	for _, k := range svc.Known(10) {
		got[k.Topic] = k.Count
	}
	if got["golang"] != 5 || got["rust"] != 3 || len(got) != 2 {
		t.Errorf("Known = %v, want golang:5 rust:3", got)
	}
	if len(svc.Known(1)) != 1 {
		t.Error("Known(1) listed more than one")
	}
	if st.calls.Load() != calls {
		t.Error("Known read the store")
	}
}
