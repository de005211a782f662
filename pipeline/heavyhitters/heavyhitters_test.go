package heavyhitters_test

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/hotcount/hotcount/internal/testtools/testenv"
	"github.com/hotcount/hotcount/pipeline/heavyhitters"
	"github.com/hotcount/hotcount/schema"
)

// TestFindsHeavyHitters: among 10,000 topics with a Zipf tail, the sketch of
// 64 finds the true top 5 in order, never under-counts, and its error bound
// holds.
func TestFindsHeavyHitters(t *testing.T) {
	clk := testenv.NewClock(time.Unix(1_800_000_000, 0))
	tr := heavyhitters.New(64, 10*time.Second, clk.Now)
	truth := map[string]int64{}
	r := rand.New(rand.NewPCG(1, 2))
	z := rand.NewZipf(r, 1.3, 1, 9999)
	for flush := range 100 {
		w := map[schema.Counter]int64{}
		for range 1000 {
			topic := fmt.Sprintf("t%d", z.Uint64())
			w[schema.TotalOf(topic)]++
			truth[topic]++
		}
		if flush == 0 {
			w[schema.TotalOf("burst")] = 1 // a one-off topic must not end on top
			truth["burst"]++
		}
		tr.Observe(w)
	}
	top := tr.Top(5)
	if len(top) != 5 {
		t.Fatalf("Top(5) = %v", top)
	}
	for i, want := range []string{"t0", "t1", "t2", "t3", "t4"} {
		got := top[i]
		if got.Topic != want {
			t.Errorf("top %d = %s, want %s (%v)", i, got.Topic, want, top)
		}
		if got.Count < truth[got.Topic] || got.Count-got.Error > truth[got.Topic] {
			t.Errorf("%s: count %d error %d, truth %d: outside Space-Saving's bounds", got.Topic, got.Count, got.Error, truth[got.Topic])
		}
	}
}

// TestRatesRotate: rates are of the last complete period; a topic that
// stopped falls out after a period without it. Time buckets repeat their
// topics' deltas and are left out.
func TestRatesRotate(t *testing.T) {
	clk := testenv.NewClock(time.Unix(1_800_000_000, 0))
	tr := heavyhitters.New(8, 10*time.Second, clk.Now)
	tr.Observe(map[schema.Counter]int64{schema.TotalOf("old"): 500, schema.BucketOf("old", schema.Minute, 30_000_000): 500})
	clk.Add(10 * time.Second)
	tr.Observe(map[schema.Counter]int64{schema.TotalOf("new"): 30})
	top := tr.Top(10)
	if len(top) != 1 || top[0].Topic != "old" || top[0].Rate != 50 {
		t.Fatalf("Top after one period = %+v, want old at 50/s", top)
	}
	clk.Add(10 * time.Second)
	top = tr.Top(10)
	if len(top) != 1 || top[0].Topic != "new" || top[0].Rate != 3 {
		t.Fatalf("Top after two periods = %+v, want new at 3/s", top)
	}
}

// BenchmarkObserveEvictions: a flush of 100,000 distinct topics into a full
// sketch, every one an eviction: O(log k) each, not a scan of the sketch.
func BenchmarkObserveEvictions(b *testing.B) {
	w := make(map[schema.Counter]int64, 100_000)
	for i := range 100_000 {
		w[schema.TotalOf(fmt.Sprintf("topic-%d", i))] = int64(i%7 + 1)
	}
	tr := heavyhitters.New(heavyhitters.DefaultCapacity, time.Hour, time.Now)
	b.ResetTimer()
	for range b.N {
		tr.Observe(w)
	}
}
