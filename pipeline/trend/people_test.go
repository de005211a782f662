package trend

import (
	"fmt"
	"math"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/hotcount/hotcount/schema"
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
			c.Saw(topic, schema.Minute.Start(i), []byte(id))
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
// ranking's unit; once a minute leaves them it keeps its estimate, and
// distinct is then at least the largest minute's.
func TestContributorsMergeOnce(t *testing.T) {
	now := time.Date(2026, 12, 5, 12, 30, 30, 0, time.UTC)
	clock := now
	s := newSketch(func() time.Time { return clock })
	i := schema.Minute.Index(now)
	// Minute i-1: a and b each saw 300 of 400 contributors (200 in both).
	s.Merge(summaryOf(t, i-1, map[string][]string{"t": ids("u", 300)}))
	s.Merge(summaryOf(t, i-1, map[string][]string{"t": ids("u", 400)[100:]}))
	// Minute i: the same 400 again, and 100 new.
	s.Merge(summaryOf(t, i, map[string][]string{"t": ids("u", 500)}))
	window := Span{G: schema.Minute, First: i - 1, Last: i, From: schema.Minute.Start(i - 1), To: now}
	rec, _, _ := s.crowds(window, Span{G: schema.Minute, First: i - 9, Last: i - 2, From: schema.Minute.Start(i - 9), To: schema.Minute.Start(i - 1)})
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
	if got := rec["t"]; got.distinct != 500 || got.perMinute != 900 {
		t.Errorf("t past the distinct range: %+v, want 500 distinct (at least the largest minute's) and 900 per minute", got)
	}
}

// TestContributorsBounded: an open minute takes up to openTopics topics'
// sketches and, once closed, keeps the whoTopics with the most
// contributors; a collector past its bytes counts the rest; bytes that
// are no sketch are counted and skipped.
func TestContributorsBounded(t *testing.T) {
	now := time.Date(2026, 12, 5, 12, 30, 30, 0, time.UTC)
	clock := now
	s := newSketch(func() time.Time { return clock })
	i := schema.Minute.Index(now)
	who := map[string][]string{"big": ids("b", 50)}
	more := map[string][]string{}
	for k := range openTopics + 10 {
		if k < SummaryTopics-1 {
			who[fmt.Sprintf("small-%d", k)] = []string{"x"}
		} else {
			more[fmt.Sprintf("small-%d", k)] = []string{"x"}
		}
	}
	s.Merge(summaryOf(t, i, who))
	s.Merge(summaryOf(t, i, more)) // another sidecar's
	if n := len(s.people.who[i]); n != openTopics {
		t.Errorf("%d topics sketched in an open minute, want openTopics (%d)", n, openTopics)
	}
	clock = now.Add(openMinutes * time.Minute)
	s.Merge(Summary{})
	if n := len(s.people.who[i]); n != whoTopics {
		t.Errorf("%d topics sketched in a closed minute, want whoTopics (%d)", n, whoTopics)
	}
	if e := s.people.who[i]["big"]; e == nil || e.estimate() != 50 {
		t.Errorf("the topic with the most contributors lost its sketch: %+v", e)
	}

	c := NewContributors(prometheus.NewRegistry())
	topics := 0
	for ; c.bytes+keyBytes+16 <= collectBytes; topics++ {
		c.Saw(fmt.Sprintf("t%08d", topics), now, []byte("x"))
	}
	for range 10 {
		c.Saw("one more", now, []byte("x"))
	}
	if got := testutil.ToFloat64(c.untracked); got != 10 {
		t.Errorf("untracked %v, want 10", got)
	}
	if got := c.take()[i]; len(got) != SummaryTopics {
		t.Errorf("a summary names %d topics' contributors, want SummaryTopics (%d)", len(got), SummaryTopics)
	}
	if got := testutil.ToFloat64(c.untracked); got != float64(10+topics-SummaryTopics) {
		t.Errorf("untracked %v after take, want %d (the topics past SummaryTopics too)", got, 10+topics-SummaryTopics)
	}
	if got := len(c.seen); got != 0 || c.bytes != 0 {
		t.Errorf("%d topic-minutes and %d bytes left after take", got, c.bytes)
	}

	before := testutil.ToFloat64(s.dropped)
	s.Merge(Summary{Contributors: map[int64]map[string][]byte{schema.Minute.Index(clock): {"junk": []byte("not a sketch")}}})
	if got := testutil.ToFloat64(s.dropped); got != before+1 {
		t.Errorf("a summary with junk: dropped %v, want %v", got, before+1)
	}
}

// TestContributorsAnyOrder: sidecars that merge the same summaries in
// different orders keep the same sketches and rank the same, however many
// topics each minute names (the cut waits for the minute to close).
func TestContributorsAnyOrder(t *testing.T) {
	now := time.Date(2026, 12, 5, 12, 30, 5, 0, time.UTC)
	i := schema.Minute.Index(now)
	var sums []Summary
	for sec := range 60 {
		who := map[string][]string{}
		for k := range 700 {
			who[fmt.Sprintf("tail-%d", (sec*700+k)%1900)] = []string{fmt.Sprintf("u%d", sec)}
		}
		if sec >= 20 {
			who["surge"] = ids(fmt.Sprintf("s%d-", sec), 30)
		}
		sums = append(sums, summaryOf(t, i, who))
	}
	lists := make([][]string, 2)
	for n, order := range [][]int{ascending(len(sums)), descending(len(sums))} {
		clock := now
		s := newSketch(func() time.Time { return clock })
		for _, k := range order {
			s.Merge(sums[k])
		}
		clock = now.Add(openMinutes * time.Minute)
		s.Merge(Summary{})
		window := Span{G: schema.Minute, First: i, Last: i, From: schema.Minute.Start(i), To: schema.Minute.Start(i + 1)}
		rec, _, _ := s.crowds(window, Span{})
		if got := rec["surge"].distinct; got != 1200 {
			t.Errorf("order %d: surge has %d contributors, want 1,200", n, got)
		}
		for topic, c := range rec {
			lists[n] = append(lists[n], fmt.Sprintf("%s=%d", topic, c.distinct))
		}
		slices.Sort(lists[n])
	}
	if !slices.Equal(lists[0], lists[1]) {
		t.Errorf("two orders keep different sketches: %d and %d topics", len(lists[0]), len(lists[1]))
	}
}

func ascending(n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = i
	}
	return out
}

func descending(n int) []int {
	out := ascending(n)
	slices.Reverse(out)
	return out
}

// TestOneAccountIsOneContributor: one account mentioning a topic every
// minute for an hour is one distinct contributor, sketched minutes or
// not: it does not pass --trending-min-contributors.
func TestOneAccountIsOneContributor(t *testing.T) {
	start := time.Date(2026, 12, 5, 12, 0, 5, 0, time.UTC)
	clock := start
	s := newSketch(func() time.Time { return clock })
	first := schema.Minute.Index(start)
	for m := range int64(60) {
		clock = start.Add(time.Duration(m) * time.Minute)
		s.Merge(summaryOf(t, first+m, map[string][]string{"bot": {"the-bot"}}))
	}
	last := first + 59
	window := Span{G: schema.Minute, First: first, Last: last, From: schema.Minute.Start(first), To: clock}
	rec, _, _ := s.crowds(window, Span{})
	if got := rec["bot"]; got.distinct != 1 || got.perMinute != 60 {
		t.Errorf("bot over an hour: %+v, want 1 distinct and 60 per minute", got)
	}
	if got := s.candidates(window, Span{G: schema.Minute, First: first - 240, Last: first - 1, From: schema.Minute.Start(first - 240), To: schema.Minute.Start(first)}, 10, ByContributors, DefaultMinContributors, 0, nil); len(got) != 0 {
		t.Errorf("one account is a candidate by contributors: %v", got)
	}
}

// TestSteadyContributorsScoreZero: a topic with the same 100 contributors
// every minute scores about 0 by contributors whatever the minute, its
// baseline cut to the whole blocks the sketch keeps.
func TestSteadyContributorsScoreZero(t *testing.T) {
	start := time.Date(2026, 12, 5, 8, 0, 5, 0, time.UTC)
	clock := start
	s := newSketch(func() time.Time { return clock })
	first := schema.Minute.Index(start)
	crowd := ids("u", 100)
	cfg := Config{Minutes: true}
	for m := range int64(320) {
		clock = start.Add(time.Duration(m)*time.Minute + 50*time.Second)
		s.Merge(Summary{Minutes: map[int64]map[string]int64{first + m: {"steady": 100}}})
		s.Merge(summaryOf(t, first+m, map[string][]string{"steady": crowd}))
		if m < 300 {
			continue
		}
		for _, d := range []time.Duration{5 * time.Minute, 15 * time.Minute, time.Hour} {
			window, err := cfg.span(schema.Minute, d, clock)
			if err != nil {
				t.Fatal(err)
			}
			rec, old, cut := s.crowds(window, cfg.baseline(window))
			sc := Score(rec["steady"].perMinute, expect(old["steady"], cut, window))
			if math.Abs(sc) > 1 {
				t.Errorf("minute %d, window %s: steady scores %.1f (%d per minute against %d over %s)", m, d, sc, rec["steady"].perMinute, old["steady"], cut.To.Sub(cut.From))
			}
		}
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
		b.ReportMetric(float64(maxWhoBytes+collectBytes)/(1<<20), "bound-MiB")
		runtime.KeepAlive(s)
	}
}
