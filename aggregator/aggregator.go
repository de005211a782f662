// Package aggregator coalesces mentions in memory: per topic, one running
// delta for the current window. The flusher drains the window and writes one
// increment per topic, which is how a million mentions a second become a few
// thousand store writes.
package aggregator

import (
	"math"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// DefaultMaxTopics is the default bound on distinct topics in one window.
const DefaultMaxTopics = 100_000

// Aggregator holds the current window of per-topic deltas. It is safe for
// concurrent use. Its lock is held only to add to the map or to swap it out:
// no I/O and no allocation-heavy work happens under it.
type Aggregator struct {
	maxTopics int
	full      chan struct{} // capacity 1: "the window reached maxTopics"
	saturated prometheus.Counter

	mu     sync.Mutex
	window map[string]int64
	total  int64 // sum of the window's deltas, for the buffered gauge
}

// New returns an empty aggregator. When a window reaches maxTopics distinct
// topics, Full is signalled so that the flusher drains early. The bound is
// soft: Add never refuses or drops a mention, so a window may overshoot by
// the topics that arrive before the drain, which follows at once.
func New(maxTopics int, reg prometheus.Registerer) *Aggregator {
	a := &Aggregator{
		maxTopics: maxTopics,
		full:      make(chan struct{}, 1),
		window:    make(map[string]int64),
	}
	a.saturated = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "hotcount_aggregator_saturated_total",
		Help: "Adds whose window total for a topic would have passed the int64 range and were capped (mentions lost to saturation; expected 0).",
	})
	reg.MustRegister(
		a.saturated,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "hotcount_aggregator_buffered_topics",
			Help: "Distinct topics in the current window, not yet flushed.",
		}, func() float64 { n, _ := a.Stats(); return float64(n) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "hotcount_aggregator_buffered_mentions",
			Help: "Mentions in the current window, not yet flushed.",
		}, func() float64 { _, n := a.Stats(); return float64(n) }),
	)
	return a
}

// Add adds delta (positive) to topic's count in the current window. It does
// not allocate for a topic already in the window. A delta that would take
// the topic's window total past math.MaxInt64 saturates, and the saturation
// is counted in hotcount_aggregator_saturated_total: with deltas bounded by
// --max-count this takes over 9 × 10^12 messages for one topic in one window,
// so it is a guard, not a path.
func (a *Aggregator) Add(topic string, delta int64) {
	a.mu.Lock()
	v, ok := a.window[topic]
	if v > math.MaxInt64-delta {
		a.saturated.Inc() // an atomic add: cheap enough under the lock
		delta = math.MaxInt64 - v
	}
	a.window[topic] = v + delta
	a.total = satAdd(a.total, delta)
	n := len(a.window)
	a.mu.Unlock()
	if !ok && n >= a.maxTopics {
		select {
		case a.full <- struct{}{}:
		default:
		}
	}
}

// satAdd adds two non-negative numbers, capping at math.MaxInt64.
func satAdd(x, y int64) int64 {
	if x > math.MaxInt64-y {
		return math.MaxInt64
	}
	return x + y
}

// Drain swaps the current window for a fresh one and returns the old one.
// The caller owns the returned map. It is nil when the window was empty.
func (a *Aggregator) Drain() map[string]int64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.window) == 0 {
		return nil
	}
	w := a.window
	// Size the next window like the last one: busy topics come back.
	a.window = make(map[string]int64, len(w))
	a.total = 0
	return w
}

// Merge adds deltas back into the current window: the flusher returns what
// it could not write, so a store failure delays mentions but never loses them.
func (a *Aggregator) Merge(deltas map[string]int64) {
	for topic, d := range deltas {
		a.Add(topic, d)
	}
}

// Pending returns topic's delta in the current window: accepted by this
// sidecar and not yet written to the store.
func (a *Aggregator) Pending(topic string) int64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.window[topic]
}

// Stats returns the number of topics and the sum of the deltas in the
// current window.
func (a *Aggregator) Stats() (topics int, mentions int64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.window), a.total
}

// Full is signalled (without blocking the sender) when the window reaches
// its topic bound. It has room for one signal: signals coalesce.
func (a *Aggregator) Full() <-chan struct{} { return a.full }
