package aggregator_test

import (
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap/zaptest"

	"github.com/hotcount/hotcount/internal/testtools/testenv"
	"github.com/hotcount/hotcount/pipeline/aggregator"
	"github.com/hotcount/hotcount/pipeline/spill"
)

// counted is a spill folder that counts the segments taken back.
type counted struct {
	*spill.Dir
	takes int
}

func (c *counted) Take() (map[string]int64, error) {
	c.takes++
	return c.Dir.Take()
}

// spilling returns an aggregator with a budget of about 100 topics and a
// real spill folder.
func spilling(t *testing.T, dir string) (*aggregator.Aggregator, *counted, *prometheus.Registry) {
	t.Helper()
	d, err := spill.Open(dir, 1<<30)
	if err != nil {
		t.Fatal(err)
	}
	sp := &counted{Dir: d}
	reg := prometheus.NewRegistry()
	a := aggregator.New(1_000_000, reg, aggregator.WithBudget(100*(aggregator.TopicOverhead+10), sp, zaptest.NewLogger(t)))
	return a, sp, reg
}

// TestSpillOutage: the store takes nothing while 5,000 topics arrive; the
// window stays near its budget (the rest goes to disk), the spill is left
// alone while the store keeps failing, and once the store takes writes
// the drains give back exactly what was added.
func TestSpillOutage(t *testing.T) {
	a, sp, reg := spilling(t, t.TempDir())
	want := map[string]int64{}
	for round := range 50 {
		for i := range 100 {
			topic := "topic-" + strconv.Itoa(round*100+i)
			a.Add(topic, int64(i+1))
			want[topic] += int64(i + 1)
		}
		w := a.Drain() // the flush fails: all of it comes back
		if w.Len() > 250 {
			t.Fatalf("round %d drained %d topics, far past a budget of about 100", round, w.Len())
		}
		a.Merge(w)
	}
	if bytes, segs := sp.Stats(); segs == 0 || bytes == 0 {
		t.Fatal("nothing spilled during the outage")
	}
	// Back-off: 50 failed rounds try the spill after 1, 2, 4, 8, 16 and 32
	// skipped drains at most.
	if sp.takes > 6 {
		t.Errorf("%d segments taken back over 50 failed rounds: the spill was read back too often", sp.takes)
	}
	got := map[string]int64{}
	for range 1000 { // the store takes everything now
		w := a.Drain()
		for topic, d := range w.Deltas.All() {
			got[topic] += d
		}
		if w.Len() == 0 && !a.Spilled() {
			break
		}
	}
	if !maps.Equal(got, want) {
		var g, w int64
		for _, d := range got {
			g += d
		}
		for _, d := range want {
			w += d
		}
		t.Fatalf("drained %d mentions over %d topics, added %d over %d", g, len(got), w, len(want))
	}
	if n := testenv.Metric(t, reg, "hotcount_aggregator_shed_mentions_total"); n != 0 {
		t.Errorf("%v mentions shed", n)
	}
}

// TestPersistSurvivesRestart: at the shutdown deadline the window goes to
// the folder, and a new aggregator on the folder drains it.
func TestPersistSurvivesRestart(t *testing.T) {
	dir := t.TempDir()
	a, _, _ := spilling(t, dir)
	a.Add("golang", 7)
	a.Add("rust", 3)
	if n, err := a.Persist(); err != nil || n != 10 {
		t.Fatalf("Persist = %d, %v; want 10", n, err)
	}
	if w := a.Drain(); w.Len() != 0 {
		t.Fatalf("after Persist the window still drains %v", w.Deltas.Map())
	}
	b, _, _ := spilling(t, dir)
	if w := b.Drain().Deltas.Map(); w["golang"] != 7 || w["rust"] != 3 || len(w) != 2 {
		t.Fatalf("new aggregator drained %v, want golang:7 rust:3", w)
	}
	if b.Spilled() {
		t.Fatal("segment still there after it was drained")
	}
}

// TestShedWhenDiskFull: a spill that the folder cannot take is dropped,
// counted, and not kept in memory.
func TestShedWhenDiskFull(t *testing.T) {
	sp, err := spill.Open(t.TempDir(), 10) // room for nothing
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	a := aggregator.New(1_000_000, reg, aggregator.WithBudget(10*(aggregator.TopicOverhead+10), sp, zaptest.NewLogger(t)))
	for i := range 20 {
		a.Add("topic-"+strconv.Itoa(i), 2)
	}
	a.Merge(a.Drain())
	if n := testenv.Metric(t, reg, "hotcount_aggregator_shed_mentions_total"); n != 40 {
		t.Errorf("shed %v mentions, want 40", n)
	}
	if n, _ := a.Stats(); n != 0 {
		t.Errorf("%d topics still in memory after shedding", n)
	}
}

// TestTakenBackGoesBackOnFailure: a segment taken back for a flush that
// fails is on disk again as soon as the window comes back (a crash then
// loses nothing), even under the memory budget and with the folder full:
// its mentions had their room a moment ago, and nothing is shed.
func TestTakenBackGoesBackOnFailure(t *testing.T) {
	dir := t.TempDir()
	a, _, _ := spilling(t, dir)
	a.Add("golang", 7)
	if _, err := a.Persist(); err != nil { // an earlier process's shutdown
		t.Fatal(err)
	}
	d, err := spill.Open(dir, 1) // a folder already past its budget
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	b := aggregator.New(1_000_000, reg, aggregator.WithBudget(1<<20, d, zaptest.NewLogger(t)))
	w := b.Drain()
	if v, _ := w.Deltas.Get("golang"); v != 7 {
		t.Fatalf("drained %v, want the spilled golang:7", w.Deltas.Map())
	}
	if _, segs := d.Stats(); segs != 0 {
		t.Fatalf("%d segments while the window is out", segs)
	}
	b.Add("rust", 1) // new traffic meanwhile
	b.Merge(w)       // the flush failed
	if _, segs := d.Stats(); segs == 0 {
		t.Fatal("the failed window stayed in memory only: a crash now would lose golang's 7")
	}
	if n := testenv.Metric(t, reg, "hotcount_aggregator_shed_mentions_total"); n != 0 {
		t.Errorf("%v mentions shed", n)
	}
	got := map[string]int64{}
	for range 10 {
		for topic, n := range b.Drain().Deltas.All() {
			got[topic] += n
		}
	}
	if got["golang"] != 7 || got["rust"] != 1 {
		t.Errorf("drained %v, want golang:7 rust:1", got)
	}
}

// TestCorruptSegmentIsCounted: a segment damaged on disk is moved aside,
// counted in hotcount_aggregator_spill_corrupt_total, and the segments
// behind it still come back.
func TestCorruptSegmentIsCounted(t *testing.T) {
	dir := t.TempDir()
	a, _, _ := spilling(t, dir)
	a.Add("golang", 7)
	if _, err := a.Persist(); err != nil {
		t.Fatal(err)
	}
	a.Add("rust", 3)
	if _, err := a.Persist(); err != nil {
		t.Fatal(err)
	}
	segs, err := filepath.Glob(filepath.Join(dir, "*"))
	if err != nil || len(segs) != 2 {
		t.Fatalf("segments %v, %v; want 2", segs, err)
	}
	slices.Sort(segs)
	if err := os.WriteFile(segs[0], []byte{0xff, 0xff, 0xff}, 0o640); err != nil { // golang's
		t.Fatal(err)
	}
	b, _, reg := spilling(t, dir)
	var got map[string]int64
	for range 3 { // the damaged segment, then rust's
		if w := b.Drain(); w.Len() > 0 {
			got = w.Deltas.Map()
		}
	}
	if got["rust"] != 3 || len(got) != 1 {
		t.Errorf("drained %v, want rust:3 from the segment behind the damaged one", got)
	}
	if n := testenv.Metric(t, reg, "hotcount_aggregator_spill_corrupt_total"); n != 1 {
		t.Errorf("hotcount_aggregator_spill_corrupt_total = %v, want 1", n)
	}
	if bad, _ := filepath.Glob(filepath.Join(dir, "*.bad")); len(bad) != 1 {
		t.Errorf(".bad files %v, want the damaged segment", bad)
	}
}
