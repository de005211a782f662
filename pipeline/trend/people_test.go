package trend

import (
	"fmt"
	"math"
	"runtime"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/hotcount/hotcount/pipeline/store"
)

func TestPrecision(t *testing.T) {
	if newWho() == nil {
		t.Fatalf("precision %d is outside the library's range", Precision)
	}
	if want := 1.04 / math.Sqrt(1<<Precision); math.Abs(want-StandardError) > 0.0005 {
		t.Errorf("StandardError %v, precision %d gives %v", StandardError, Precision, want)
	}
}

// summaryOf is what a sidecar whose collector saw these contributors per
// topic in minute i would publish.
func summaryOf(t *testing.T, i int64, who map[string][]string) Summary {
	t.Helper()
	c := NewContributors(prometheus.NewRegistry())
	for topic, ids := range who {
		for _, id := range ids {
			c.Saw(topic, store.Minute.Start(i), []byte(id))
		}
	}
	sum := Summary{Contributors: map[int64]map[string][]byte{}}
	for m, tws := range c.take() {
		sum.Contributors[m] = map[string][]byte{}
		for _, tw := range tws {
			b, err := tw.who.MarshalBinary()
			if err != nil {
				t.Fatal(err)
			}
			sum.Contributors[m][tw.topic] = b
		}
	}
	return sum
}

func ids(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s%d", prefix, i)
	}
	return out
}

// TestContributorsMergeOnce: two sidecars' sketches of overlapping
// contributors merge into the count of the union; within the distinct
// minutes a contributor counts once over a window, per minute in the
// ranking's unit; once a minute leaves them it keeps its estimate.
func TestContributorsMergeOnce(t *testing.T) {
	now := time.Date(2026, 12, 5, 12, 30, 30, 0, time.UTC)
	clock := now
	s := newSketch(func() time.Time { return clock })
	i := store.Minute.Index(now)
	// Minute i-1: a and b each saw 300 of 400 contributors (200 in both).
	s.Merge(summaryOf(t, i-1, map[string][]string{"t": ids("u", 300)}))
	s.Merge(summaryOf(t, i-1, map[string][]string{"t": ids("u", 400)[100:]}))
	// Minute i: the same 400 again, and 100 new.
	s.Merge(summaryOf(t, i, map[string][]string{"t": ids("u", 500)}))
	window := Span{G: store.Minute, First: i - 1, Last: i, From: store.Minute.Start(i - 1), To: now}
	rec, _, _ := s.crowds(window, Span{G: store.Minute, First: i - 9, Last: i - 2, From: store.Minute.Start(i - 9), To: store.Minute.Start(i - 1)})
	if got := rec["t"]; got.distinct != 500 || got.perMinute != 900 {
		t.Errorf("t: %+v, want 500 distinct and 900 per minute (400 + 500)", got)
	}
	// Past the distinct minutes, each minute is its estimate.
	clock = now.Add(distinctMinutes * time.Minute)
	s.Merge(Summary{})
	if len(s.people.who) != 0 {
		t.Fatalf("%d minutes still sketched past the distinct range", len(s.people.who))
	}
	rec, _, _ = s.crowds(window, Span{})
	if got := rec["t"]; got.distinct != 900 || got.perMinute != 900 {
		t.Errorf("t past the distinct range: %+v, want 900 both (once per minute)", got)
	}
}

// TestContributorsBounded: a minute keeps sketches for the whoTopics
// topics with the most contributors, a collector takes at most
// collectKeys topic-minutes between two flushes and counts the rest, and
// bytes that are no sketch are counted and skipped.
func TestContributorsBounded(t *testing.T) {
	now := time.Date(2026, 12, 5, 12, 30, 30, 0, time.UTC)
	s := newSketch(func() time.Time { return now })
	i := store.Minute.Index(now)
	who := map[string][]string{"big": ids("b", 50)}
	for k := range 3 * whoTopics {
		who[fmt.Sprintf("small-%d", k)] = []string{"x"}
	}
	s.Merge(summaryOf(t, i, who))
	if n := len(s.people.who[i]); n > 2*whoTopics {
		t.Errorf("%d topics sketched in a minute, more than %d", n, 2*whoTopics)
	}
	if e := s.people.who[i]["big"]; e == nil || e.estimate() != 50 {
		t.Errorf("the topic with the most contributors lost its sketch: %+v", e)
	}

	reg := prometheus.NewRegistry()
	c := NewContributors(reg)
	for k := range collectKeys + 10 {
		c.Saw(fmt.Sprintf("t%d", k), now, []byte("x"))
	}
	if got := testutil.ToFloat64(c.untracked); got != 10 {
		t.Errorf("untracked %v, want 10", got)
	}
	if got := c.take()[i]; len(got) != SummaryTopics {
		t.Errorf("a summary names %d topics' contributors, want SummaryTopics (%d)", len(got), SummaryTopics)
	}
	if got := len(c.seen); got != 0 {
		t.Errorf("%d topic-minutes left after take", got)
	}

	before := testutil.ToFloat64(s.dropped)
	s.Merge(Summary{Contributors: map[int64]map[string][]byte{i: {"junk": []byte("not a sketch")}}})
	if got := testutil.ToFloat64(s.dropped); got != before+1 {
		t.Errorf("a summary with junk: dropped %v, want %v", got, before+1)
	}
}

// BenchmarkContributorsMemory measures the sketch's memory for
// contributors at its bound: a million distinct contributors a minute,
// each mentioning one of 1,000 topics (1,000 each, sketches near their
// dense 4 KiB), for 20 minutes, through a collector, the summaries and
// the merge, as a sidecar runs them. It reports the heap the sketch holds
// after the last minute (MiB) against the stated bound (whoTopics ×
// 2 × distinctMinutes sketches of 4.2 KiB).
func BenchmarkContributorsMemory(b *testing.B) {
	for b.Loop() {
		clock := time.Date(2026, 12, 5, 12, 0, 30, 0, time.UTC)
		s := newSketch(func() time.Time { return clock })
		s.CountContributors(NewContributors(prometheus.NewRegistry()))
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		id := make([]byte, 0, 16)
		for range 20 {
			for k := range 1_000_000 {
				id = fmt.Appendf(id[:0], "c%d", k)
				s.collect.Saw(fmt.Sprintf("topic-%d", k%1000), clock, id)
				if k%100_000 == 99_999 {
					s.Observe(nil) // a flush: the collector's sketches into the fleet's
				}
			}
			clock = clock.Add(time.Minute)
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/(1<<20), "MiB")
		b.ReportMetric(float64(2*whoTopics*distinctMinutes*4300)/(1<<20), "bound-MiB")
		runtime.KeepAlive(s)
	}
}
