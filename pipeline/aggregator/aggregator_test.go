package aggregator_test

import (
	"maps"
	"math"
	"runtime"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/hotcount/hotcount/internal/testtools/testenv"
	"github.com/hotcount/hotcount/pipeline/aggregator"
	"github.com/hotcount/hotcount/schema"
)

func TestAddDrainMerge(t *testing.T) {
	a := aggregator.New(100, prometheus.NewRegistry())
	a.Add("golang", 1)
	a.Add("golang", 4)
	a.Add("rust", 2)
	if p := a.Pending("golang"); p != 5 {
		t.Errorf("Pending(golang) = %d, want 5", p)
	}
	if n, m := a.Stats(); n != 2 || m != 7 {
		t.Errorf("Stats = %d topics, %d mentions; want 2, 7", n, m)
	}
	w := a.Drain().Deltas.Map()
	if len(w) != 2 || w["golang"] != 5 || w["rust"] != 2 {
		t.Errorf("Drain = %v, want golang:5 rust:2", w)
	}
	if w := a.Drain(); w.Len() != 0 {
		t.Errorf("second Drain = %v, want empty", w)
	}
	a.Add("golang", 1)
	a.Merge(aggregator.Window{Deltas: aggregator.DeltasOf(map[string]int64{"golang": 5, "zig": 3})})
	if w := a.Drain().Deltas.Map(); w["golang"] != 6 || w["zig"] != 3 {
		t.Errorf("Drain after Merge = %v, want golang:6 zig:3", w)
	}
}

func TestFullSignalsOnceAtBound(t *testing.T) {
	a := aggregator.New(3, prometheus.NewRegistry())
	a.Add("a", 1)
	a.Add("b", 1)
	select {
	case <-a.Full():
		t.Fatal("Full signalled below the bound")
	default:
	}
	a.Add("b", 1) // an existing topic does not count
	a.Add("c", 1)
	select {
	case <-a.Full():
	default:
		t.Fatal("Full not signalled at the bound")
	}
	a.Add("d", 1) // past the bound: accepted, never dropped
	if w := a.Drain(); w.Len() != 4 {
		t.Errorf("window holds %d topics, want 4: the bound is soft", w.Len())
	}
}

func TestSaturatesInsteadOfWrapping(t *testing.T) {
	reg := prometheus.NewRegistry()
	a := aggregator.New(10, reg)
	a.Add("x", math.MaxInt64-1)
	a.Add("x", 5)
	if p := a.Pending("x"); p != math.MaxInt64 {
		t.Errorf("Pending = %d, want MaxInt64", p)
	}
	if n := testenv.Metric(t, reg, "hotcount_aggregator_saturated_total"); n != 1 {
		t.Errorf("saturated_total = %v, want 1", n)
	}
}

// TestConcurrentAddsAndDrains checks conservation under -race: what the
// writers add equals what the drains take out.
func TestConcurrentAddsAndDrains(t *testing.T) {
	a := aggregator.New(1000, prometheus.NewRegistry())
	const writers, perWriter = 4, 20_000
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for i := range perWriter {
				a.Add("t"+strconv.Itoa((w+i)%50), 1)
			}
		})
	}
	done := make(chan struct{})
	var drained int64
	var dwg sync.WaitGroup
	dwg.Go(func() {
		for {
			drained += a.Drain().Mentions()
			select {
			case <-done:
				return
			default:
			}
		}
	})
	wg.Wait()
	close(done)
	dwg.Wait()
	drained += a.Drain().Mentions()
	if drained != writers*perWriter {
		t.Errorf("drained %d, added %d", drained, writers*perWriter)
	}
}

// TestAddDoesNotAllocate pins the hot path: adding to a topic already in
// the window allocates nothing.
func TestAddDoesNotAllocate(t *testing.T) {
	a := aggregator.New(100, prometheus.NewRegistry())
	a.Add("golang", 1)
	if n := testing.AllocsPerRun(1000, func() { a.Add("golang", 1) }); n != 0 {
		t.Errorf("Add of a known topic allocates %v times, want 0", n)
	}
}

// TestMinuteCounters: with buckets on, a mention counts in its topic's
// minute counter, one per topic and minute; the window's topics, mentions
// and Pending add them up as they did the topic's own; Add of a known
// counter still does not allocate.
func TestMinuteCounters(t *testing.T) {
	clk := testenv.NewClock(time.Date(2026, 12, 3, 10, 59, 30, 0, time.UTC))
	a := aggregator.New(100, prometheus.NewRegistry(), aggregator.WithBuckets(clk.Now))
	a.Add("golang", 2)
	a.Add("rust", 1)
	clk.Add(time.Minute)
	a.Add("golang", 3)
	a.AddAt("golang", 4, clk.Now().Add(-2*time.Minute)) // its "at" two minutes ago
	if n := testing.AllocsPerRun(1000, func() { a.Add("golang", 1) }); n != 0 {
		t.Errorf("Add of a known minute counter allocates %v times, want 0", n)
	}
	if p := a.Pending("golang"); p != 2+3+4+1001 {
		t.Errorf("Pending(golang) = %d, want %d", p, 2+3+4+1001)
	}
	topics, mentions := a.Stats()
	if topics != 4 || mentions != 2+1+3+4+1001 {
		t.Errorf("Stats = %d counters, %d mentions; want 4 (golang's three minutes and rust's) and %d", topics, mentions, 2+1+3+4+1001)
	}
	w := a.Drain()
	fresh := func(topic string, at time.Time) string {
		return schema.Counter{Topic: topic, Kind: schema.Fresh, Index: schema.Minute.Index(at)}.Name()
	}
	want := map[string]int64{
		fresh("golang", clk.Now().Add(-time.Minute)):   2,
		fresh("rust", clk.Now().Add(-time.Minute)):     1,
		fresh("golang", clk.Now()):                     1004,
		fresh("golang", clk.Now().Add(-2*time.Minute)): 4,
	}
	if got := w.Deltas.Map(); !maps.Equal(got, want) {
		t.Errorf("window %v, want %v", got, want)
	}
	if w.Mentions() != 2+1+3+4+1001 {
		t.Errorf("Mentions = %d", w.Mentions())
	}
}

// warm returns an aggregator whose window already holds 1,000 topics.
func warm() (*aggregator.Aggregator, []string) {
	a := aggregator.New(aggregator.DefaultMaxTopics, prometheus.NewRegistry())
	topics := make([]string, 1000)
	for i := range topics {
		topics[i] = "topic-" + strconv.Itoa(i)
		a.Add(topics[i], 1)
	}
	return a, topics
}

// BenchmarkAdd measures Add over 1,000 topics already in the window, the
// steady state of a busy sidecar.
func BenchmarkAdd(b *testing.B) {
	a, topics := warm()
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		a.Add(topics[i%len(topics)], 1)
		i++
	}
}

// BenchmarkAddParallel is BenchmarkAdd from every core at once: the lock's
// contention, which decides whether it needs sharding.
func BenchmarkAddParallel(b *testing.B) {
	a, topics := warm()
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			a.Add(topics[i%len(topics)], 1)
			i++
		}
	})
}

// BenchmarkWindowMemory measures the heap a window costs per buffered topic
// (its slot in the Deltas table, and its name copied into its chunks; the topic
// strings passed in are allocated before measuring), at 10k, 100k and 1M
// topics. Run with -benchtime 1x: each iteration fills one window.
func BenchmarkWindowMemory(b *testing.B) {
	for _, n := range []int{10_000, 100_000, 1_000_000} {
		b.Run(strconv.Itoa(n), func(b *testing.B) {
			topics := make([]string, n)
			for i := range topics {
				topics[i] = "topic-" + strconv.Itoa(i)
			}
			var perTopic float64
			for b.Loop() {
				var before, after runtime.MemStats
				runtime.GC()
				runtime.ReadMemStats(&before)
				a := aggregator.New(n+1, prometheus.NewRegistry())
				for _, t := range topics {
					a.Add(t, 1)
				}
				runtime.GC()
				runtime.ReadMemStats(&after)
				perTopic = float64(after.HeapAlloc-before.HeapAlloc) / float64(n)
				runtime.KeepAlive(a)
			}
			b.ReportMetric(perTopic, "B/topic")
		})
	}
}

// BenchmarkPending measures Pending of one topic in a window whose Fresh
// counters span 1, 60 and 1,440 minutes (a day of late "at"s, or an
// outage's window coming back unsplit), 100 topics in each: the read
// path's cost under the ingest's lock.
func BenchmarkPending(b *testing.B) {
	for _, minutes := range []int{1, 60, 1440} {
		b.Run(strconv.Itoa(minutes), func(b *testing.B) {
			clk := testenv.NewClock(time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC))
			a := aggregator.New(aggregator.DefaultMaxTopics, prometheus.NewRegistry(), aggregator.WithBuckets(clk.Now))
			for m := range minutes {
				at := clk.Now().Add(-time.Duration(m) * time.Minute)
				for i := range 100 {
					a.AddAt("topic-"+strconv.Itoa(i), 1, at)
				}
			}
			b.ReportAllocs()
			for b.Loop() {
				if p := a.Pending("topic-7"); p != int64(minutes) {
					b.Fatalf("Pending = %d, want %d", p, minutes)
				}
			}
		})
	}
}

// TestDrainedWindowPending: a drained window answers Pending as the
// aggregator did before the drain, for windows whose minutes the index
// looks up by name and for those spread over more (a day of late "at"s),
// so that readers may read it while a flush plans it.
func TestDrainedWindowPending(t *testing.T) {
	for _, minutes := range []int{1, 60} {
		t.Run(strconv.Itoa(minutes), func(t *testing.T) {
			clk := testenv.NewClock(time.Date(2026, 12, 5, 10, 0, 0, 0, time.UTC))
			a := aggregator.New(aggregator.DefaultMaxTopics, prometheus.NewRegistry(), aggregator.WithBuckets(clk.Now))
			for m := range minutes {
				at := clk.Now().Add(-time.Duration(m) * time.Minute)
				for i := range 10 {
					a.AddAt("topic-"+strconv.Itoa(i), int64(i+1), at)
				}
			}
			want := a.Pending("topic-3")
			if want != int64(4*minutes) {
				t.Fatalf("before the drain: Pending = %d, want %d", want, 4*minutes)
			}
			w := a.Drain()
			if got := w.Pending("topic-3"); got != want {
				t.Errorf("the drained window: Pending = %d, want %d", got, want)
			}
			if got := a.Pending("topic-3"); got != 0 {
				t.Errorf("the aggregator after the drain: Pending = %d, want 0", got)
			}
			if got := w.Pending("nobody"); got != 0 {
				t.Errorf("a topic not in the window: Pending = %d, want 0", got)
			}
		})
	}
}
