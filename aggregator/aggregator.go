// Package aggregator coalesces mentions in memory: per topic, one running
// delta for the current window. The flusher drains the window and writes one
// increment per topic, which is how a million mentions a second become a few
// thousand store writes.
//
// In JetStream mode a window also holds, per topic, the messages whose counts
// make up the topic's delta, so that each message is acknowledged exactly
// when its topic's write has succeeded, and not before.
package aggregator

import (
	"math"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// DefaultMaxTopics is the default bound on distinct topics in one window.
const DefaultMaxTopics = 100_000

// Acker is a durable message waiting for its delta to be stored. A
// jetstream.Msg is one.
type Acker interface {
	// Ack tells the server the message is done with.
	Ack() error
	// Nak asks the server to redeliver the message now.
	Nak() error
	// InProgress resets the server's redelivery timer.
	InProgress() error
}

// Message is a held durable message, the topic its count went to, and its
// stream sequence (which the journal records).
type Message struct {
	Topic string
	Msg   Acker
	Seq   int64
}

// Window is a drained window: the per-topic deltas and, in JetStream mode,
// the messages behind them in the order they arrived, which is the stream's
// order: acknowledging in that order lets the server's ack floor move
// forward in one piece instead of tracking a scatter of acknowledged
// messages. The receiver owns both.
type Window struct {
	Deltas map[string]int64
	Acks   []Message
}

// Len is the number of topics in w.
func (w Window) Len() int { return len(w.Deltas) }

// Mentions is the sum of w's deltas.
func (w Window) Mentions() int64 {
	var n int64
	for _, d := range w.Deltas {
		n = satAdd(n, d)
	}
	return n
}

// Aggregator holds the current window. It is safe for concurrent use. Its
// lock is held only to add to the window or to swap it out: no I/O and no
// allocation-heavy work happens under it.
type Aggregator struct {
	maxTopics int
	full      chan struct{} // capacity 1: "the window reached maxTopics"
	saturated prometheus.Counter

	mu    sync.Mutex
	cur   Window
	total int64 // sum of the window's deltas, for the buffered gauge
}

// New returns an empty aggregator. When a window reaches maxTopics distinct
// topics, Full is signalled so that the flusher drains early. The bound is
// soft: Add never refuses or drops a mention, so a window may overshoot by
// the topics that arrive before the drain, which follows at once.
func New(maxTopics int, reg prometheus.Registerer) *Aggregator {
	a := &Aggregator{
		maxTopics: maxTopics,
		full:      make(chan struct{}, 1),
		cur:       Window{Deltas: make(map[string]int64)},
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
		}, func() float64 { n, _, _ := a.Stats(); return float64(n) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "hotcount_aggregator_buffered_mentions",
			Help: "Mentions in the current window, not yet flushed.",
		}, func() float64 { _, n, _ := a.Stats(); return float64(n) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "hotcount_aggregator_held_messages",
			Help: "JetStream messages held unacknowledged in the current window.",
		}, func() float64 { _, _, n := a.Stats(); return float64(n) }),
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
	isNew := a.add(topic, delta)
	n := len(a.cur.Deltas)
	a.mu.Unlock()
	a.signalIfFull(isNew, n)
}

// AddAcked is Add for a durable message: m is acknowledged by the flusher
// once topic's delta, m's count included, is in the store.
func (a *Aggregator) AddAcked(topic string, delta int64, m Acker, seq int64) {
	a.mu.Lock()
	isNew := a.add(topic, delta)
	a.cur.Acks = append(a.cur.Acks, Message{Topic: topic, Msg: m, Seq: seq})
	n := len(a.cur.Deltas)
	a.mu.Unlock()
	a.signalIfFull(isNew, n)
}

// add must be called with mu held.
func (a *Aggregator) add(topic string, delta int64) (isNew bool) {
	v, ok := a.cur.Deltas[topic]
	if v > math.MaxInt64-delta {
		a.saturated.Inc() // an atomic add: cheap enough under the lock
		delta = math.MaxInt64 - v
	}
	a.cur.Deltas[topic] = v + delta
	a.total = satAdd(a.total, delta)
	return !ok
}

func (a *Aggregator) signalIfFull(isNew bool, n int) {
	if isNew && n >= a.maxTopics {
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

// Drain swaps the current window for a fresh one and returns the old one,
// which the caller owns. An empty window has Len 0.
func (a *Aggregator) Drain() Window {
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.cur.Deltas) == 0 {
		return Window{}
	}
	w := a.cur
	// Size the next window like the last one: busy topics come back.
	a.cur = Window{Deltas: make(map[string]int64, len(w.Deltas))}
	if len(w.Acks) > 0 {
		a.cur.Acks = make([]Message, 0, len(w.Acks))
	}
	a.total = 0
	return w
}

// Merge adds a window back into the current one: the flusher returns what
// it could not write, so a store failure delays mentions but never loses
// them, and their messages stay unacknowledged.
func (a *Aggregator) Merge(w Window) {
	a.mu.Lock()
	for topic, d := range w.Deltas {
		a.add(topic, d)
	}
	// The merged-back messages are older than those that arrived since:
	// they go first, to keep the window in stream order.
	if len(w.Acks) > 0 {
		a.cur.Acks = append(w.Acks, a.cur.Acks...)
	}
	// No Full signal here: a window that failed to flush must wait for the
	// next interval, not be retried at once against a failing store.
	a.mu.Unlock()
}

// Held returns the messages held in the current window (a copy), for the
// ingest to keep them from being redelivered while they wait.
func (a *Aggregator) Held() []Acker {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make([]Acker, len(a.cur.Acks))
	for i, m := range a.cur.Acks {
		out[i] = m.Msg
	}
	return out
}

// Pending returns topic's delta in the current window: accepted by this
// sidecar and not yet written to the store.
func (a *Aggregator) Pending(topic string) int64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.cur.Deltas[topic]
}

// Stats returns the number of topics, the sum of the deltas and the number
// of held messages in the current window.
func (a *Aggregator) Stats() (topics int, mentions int64, held int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.cur.Deltas), a.total, len(a.cur.Acks)
}

// Full is signalled (without blocking the sender) when the window reaches
// its topic bound. It has room for one signal: signals coalesce.
func (a *Aggregator) Full() <-chan struct{} { return a.full }
