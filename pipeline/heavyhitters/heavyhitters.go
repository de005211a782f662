// Package heavyhitters finds this sidecar's hot topics: a Space-Saving heavy-hitters
// sketch (Metwally et al.) of the mentions the sidecar flushed, over
// rotating periods, so that the top topics by local rate are known in
// bounded memory however many topics there are. It is fed once per topic per
// flush, never per message.
package heavyhitters

import (
	"cmp"
	"container/heap"
	"slices"
	"sync"
	"time"

	"github.com/hotcount/hotcount/schema"
)

// Defaults.
const (
	// DefaultCapacity is how many topics the sketch tracks.
	DefaultCapacity = 256
	// DefaultPeriod is the period over which rates are measured.
	DefaultPeriod = 10 * time.Second
)

// Topic is one heavy hitter.
type Topic struct {
	Topic string `json:"topic"`
	// Count is the estimated mentions in the period: never below the true
	// count, above it by at most Error.
	Count int64 `json:"count"`
	// Error bounds the over-estimate (Space-Saving's guarantee).
	Error int64 `json:"error"`
	// Rate is Count over the period, mentions per second.
	Rate float64 `json:"rate"`
}

type counter struct {
	topic      string
	count, err int64
	i          int // index in the sketch's heap
}

// sketch is one period's Space-Saving summary: its counters in a map for
// lookup and in a min-heap by count, so that finding and replacing the
// least counted topic costs O(log k), not a scan of all k.
type sketch struct {
	k      int
	counts map[string]*counter
	heap   minHeap
}

func newSketch(k int) *sketch { return &sketch{k: k, counts: make(map[string]*counter, k)} }

// add counts delta mentions of topic. When the sketch is full, the topic
// takes the place of the least counted one and inherits its count as error.
func (s *sketch) add(topic string, delta int64) {
	if c, ok := s.counts[topic]; ok {
		c.count += delta
		heap.Fix(&s.heap, c.i)
		return
	}
	if len(s.counts) < s.k {
		c := &counter{topic: topic, count: delta}
		s.counts[topic] = c
		heap.Push(&s.heap, c)
		return
	}
	least := s.heap[0]
	delete(s.counts, least.topic)
	least.topic, least.err, least.count = topic, least.count, least.count+delta
	s.counts[topic] = least
	heap.Fix(&s.heap, 0)
}

// minHeap orders counters by count, least first (container/heap).
type minHeap []*counter

func (h minHeap) Len() int           { return len(h) }
func (h minHeap) Less(i, j int) bool { return h[i].count < h[j].count }
func (h minHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].i, h[j].i = i, j
}
func (h *minHeap) Push(x any) { c := x.(*counter); c.i = len(*h); *h = append(*h, c) }
func (h *minHeap) Pop() any {
	old := *h
	c := old[len(old)-1]
	*h = old[:len(old)-1]
	return c
}

// Tracker keeps the sketch of the current period and of the last complete
// one. It is safe for concurrent use.
type Tracker struct {
	period time.Duration
	k      int
	now    func() time.Time

	mu      sync.Mutex
	start   time.Time // of the current period
	cur     *sketch
	last    *sketch // the last complete period; nil before the first ends
	lastDur time.Duration
}

// New returns a tracker of k topics over periods of the given length.
func New(k int, period time.Duration, now func() time.Time) *Tracker {
	return &Tracker{period: period, k: k, now: now, start: now(), cur: newSketch(k)}
}

// rotate ends the current period if it is over; with mu held.
func (t *Tracker) rotate(now time.Time) {
	if el := now.Sub(t.start); el >= t.period {
		t.last, t.lastDur = t.cur, el
		t.cur, t.start = newSketch(t.k), now
	}
}

// Observe counts a flushed window: each topic's delta, once. Time bucket
// counters (schema.Counter.IsBucket) are left out: they repeat the topics'
// deltas.
func (t *Tracker) Observe(deltas map[schema.Counter]int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.rotate(t.now())
	for c, d := range deltas {
		if !c.IsBucket() {
			t.cur.add(c.Topic, d)
		}
	}
}

// Top returns up to limit topics with the highest counts in the last
// complete period (the current one until a period has ended), highest
// first.
func (t *Tracker) Top(limit int) []Topic {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := t.now()
	t.rotate(now)
	s, dur := t.last, t.lastDur
	if s == nil {
		s, dur = t.cur, now.Sub(t.start)
	}
	out := make([]Topic, 0, len(s.counts))
	for topic, c := range s.counts {
		rate := 0.0
		if dur > 0 {
			rate = float64(c.count) / dur.Seconds()
		}
		out = append(out, Topic{Topic: topic, Count: c.count, Error: c.err, Rate: rate})
	}
	slices.SortFunc(out, func(a, b Topic) int {
		if c := cmp.Compare(b.Count, a.Count); c != 0 {
			return c
		}
		return cmp.Compare(a.Topic, b.Topic)
	})
	return out[:min(limit, len(out))]
}
