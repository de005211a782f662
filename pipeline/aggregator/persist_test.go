package aggregator_test

import (
	"strconv"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/hotcount/hotcount/pipeline/aggregator"
	"github.com/hotcount/hotcount/pipeline/spill"
)

// TestPersistBytes: what the final flush leaves Persist time for is the
// window's bytes with a spill folder, nothing without one, and, while
// segments are on disk, what the next Drain may take back of them.
func TestPersistBytes(t *testing.T) {
	bare := aggregator.New(100, prometheus.NewRegistry())
	bare.Add("golang", 1)
	if n := bare.PersistBytes(); n != 0 {
		t.Errorf("without a spill folder PersistBytes = %d, want 0", n)
	}
	a, _, _ := spilling(t, t.TempDir())
	a.Add("golang", 7)
	a.Add("rust", 3)
	if n, want := a.PersistBytes(), int64(len("golang")+len("rust")+2*aggregator.TopicOverhead); n != want {
		t.Errorf("PersistBytes = %d, want %d", n, want)
	}
	if _, err := a.Persist(); err != nil {
		t.Fatal(err)
	}
	if n := a.PersistBytes(); n == 0 {
		t.Errorf("after Persist PersistBytes = 0, want what the next Drain may take back of the segment")
	}

	// A failed flush's window over the budget goes to disk: the next
	// flush takes it back, and if it cannot write it, Persist must.
	b, _, _ := spilling(t, t.TempDir())
	for i := range 300 {
		b.Add("topic-"+strconv.Itoa(i), 1)
	}
	b.Merge(b.Drain())
	if !b.Spilled() {
		t.Fatal("the window did not go to disk: the test needs a spilled segment")
	}
	if n, most := b.PersistBytes(), int64(100*(aggregator.TopicOverhead+10)); n == 0 || n > most {
		t.Errorf("with a segment on disk PersistBytes = %d, want some, at most the budget %d", n, most)
	}
}

// BenchmarkPersist is the spill write at shutdown: a window of a million
// topics of 27-byte names (about 56 MiB as the budget counts it) to the
// spill folder, synced. The flusher assumes a quarter of a development
// machine's rate (flusher.persistRate) when it leaves Persist its time.
func BenchmarkPersist(b *testing.B) {
	const topics = 1_000_000
	names := make([]string, topics)
	var bytes int64
	for i := range names {
		names[i] = "some-trending-topic-" + strconv.Itoa(1_000_000+i)
		bytes += int64(len(names[i])) + aggregator.TopicOverhead
	}
	b.SetBytes(bytes)
	for b.Loop() {
		b.StopTimer()
		d, err := spill.Open(b.TempDir(), 1<<34)
		if err != nil {
			b.Fatal(err)
		}
		a := aggregator.New(2*topics, prometheus.NewRegistry(), aggregator.WithBudget(1<<32, d, zap.NewNop()))
		for _, n := range names {
			a.Add(n, 1)
		}
		b.StartTimer()
		if n, err := a.Persist(); err != nil || n != topics {
			b.Fatalf("Persist = %d, %v; want %d", n, err, topics)
		}
	}
}
