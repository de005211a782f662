package aggregator_test

import (
	"errors"
	"maps"
	"math/rand/v2"
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap/zaptest"

	"github.com/hotcount/hotcount/internal/testtools/testenv"
	"github.com/hotcount/hotcount/pipeline/aggregator"
	"github.com/hotcount/hotcount/pipeline/spill"
	"github.com/hotcount/hotcount/schema"
)

// keeper is a spill folder that keeps what it is given, fails on demand,
// and gives nothing back: the window then holds only what a test put in
// it, and what left for disk can be summed.
type keeper struct {
	fail bool
	kept map[string]int64 // by topic: the mentions written
}

func (s *keeper) Put(d spill.Deltas) error  { return s.keep(d) }
func (s *keeper) Keep(d spill.Deltas) error { return s.keep(d) }

func (s *keeper) keep(d spill.Deltas) error {
	if s.fail {
		return errors.New("disk full")
	}
	for name, v := range d.All() {
		if c, _ := schema.ParseName(name); c.CountsMentions() {
			s.kept[c.Topic] += v
		}
	}
	return nil
}

func (s *keeper) Take() (map[string]int64, error) { return nil, nil }
func (s *keeper) Next() (int64, int)              { return 0, 0 }
func (s *keeper) Stats() (int64, int)             { return 0, 0 }

// mentionsByTopic is what a window holds for each topic: its totals' and
// Fresh counters' deltas (its minute and hour buckets repeat them).
func mentionsByTopic(d *aggregator.Deltas) map[string]int64 {
	out := map[string]int64{}
	for name, v := range d.All() {
		if c, _ := schema.ParseName(name); c.CountsMentions() {
			out[c.Topic] += v
		}
	}
	return out
}

// splitBack is a window as a failed flush hands it back: each Fresh
// counter split into its topic's total and its minute and hour buckets.
func splitBack(w aggregator.Window) aggregator.Window {
	out := aggregator.NewDeltas(0)
	add := func(c schema.Counter, v int64) {
		p, _ := out.Ref(c.Name())
		*p += v
	}
	for name, v := range w.Deltas.All() {
		c, _ := schema.ParseName(name)
		if c.Kind != schema.Fresh {
			add(c, v)
			continue
		}
		total, minute, hour := c.Split()
		add(total, v)
		add(minute, v)
		add(hour, v)
	}
	return aggregator.Window{Deltas: out}
}

// TestPendingIsTheWindowsSum: through random Adds (the clock's minute),
// AddAts (any minute of the last day, so that the window spans far more
// minutes than Pending looks up by name), Drains, Merges of drained
// windows (unsplit, as an outage hands them back, or split, as a failed
// flush does), Persists (kept, or failing and coming back) and windows
// going to disk past the budget, Pending of every topic equals what the
// test added less what left the window, and what left is exactly what
// the drains and the disk got.
func TestPendingIsTheWindowsSum(t *testing.T) {
	clk := testenv.NewClock(time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC))
	disk := &keeper{kept: map[string]int64{}}
	// A budget of some 300 counters: a large window merged back goes to
	// disk now and then.
	a := aggregator.New(1_000_000, prometheus.NewRegistry(),
		aggregator.WithBuckets(clk.Now),
		aggregator.WithBudget(300*(aggregator.TopicOverhead+16), disk, zaptest.NewLogger(t)))
	topics := make([]string, 8)
	for i := range topics {
		topics[i] = "topic-" + strconv.Itoa(i)
	}
	r := rand.New(rand.NewPCG(1, 2))
	want := map[string]int64{} // the window's mentions by topic
	var out []aggregator.Window
	// left checks that what left the window (drained or kept on disk) is
	// what the window held, and empties the model.
	left := func(step int, what string, got map[string]int64) {
		t.Helper()
		for topic, v := range got {
			if v == 0 {
				delete(got, topic)
			}
		}
		if !maps.Equal(got, want) {
			t.Fatalf("step %d: %s took %v, the window held %v", step, what, got, want)
		}
		clear(want)
	}
	for step := range 20_000 {
		topic := topics[r.IntN(len(topics))]
		delta := r.Int64N(5) + 1
		switch op := r.IntN(100); {
		case op < 40:
			a.Add(topic, delta)
			want[topic] += delta
		case op < 75:
			a.AddAt(topic, delta, clk.Now().Add(-time.Duration(r.IntN(24*60))*time.Minute))
			want[topic] += delta
		case op < 80:
			clk.Add(time.Duration(r.IntN(90)) * time.Second)
		case op < 88:
			w := a.Drain()
			left(step, "Drain", mentionsByTopic(w.Deltas))
			out = append(out, w)
		case op < 96 && len(out) > 0:
			i := r.IntN(len(out))
			w := out[i]
			out = append(out[:i], out[i+1:]...)
			if r.IntN(2) == 0 {
				w = splitBack(w)
			}
			for topic, v := range mentionsByTopic(w.Deltas) {
				want[topic] += v
			}
			clear(disk.kept)
			a.Merge(w)
			if _, n := a.Stats(); n == 0 && len(disk.kept) > 0 { // past the budget: on disk
				left(step, "the spill after Merge", disk.kept)
			}
		case op < 100:
			clear(disk.kept)
			disk.fail = r.IntN(3) == 0 // the window comes back whole
			if _, err := a.Persist(); err == nil {
				left(step, "Persist", disk.kept)
			}
			disk.fail = false
		}
		var sum int64
		for _, topic := range append(topics, "never-added") {
			if p := a.Pending(topic); p != want[topic] {
				t.Fatalf("step %d: Pending(%s) = %d, want %d", step, topic, p, want[topic])
			}
			sum += want[topic]
		}
		if _, n := a.Stats(); n != sum {
			t.Fatalf("step %d: the window holds %d mentions, want %d", step, n, sum)
		}
	}
}
