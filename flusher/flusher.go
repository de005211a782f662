// Package flusher drains the aggregator's window on a jittered interval (or
// early, when the window is full) and writes one increment per topic to a
// random shard, in parallel with a bounded number of writes in flight.
// Deltas it cannot write go back into the aggregator: a store failure delays
// mentions, it never loses them.
package flusher

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"golang.org/x/sync/errgroup"

	"github.com/hotcount/hotcount/aggregator"
	"github.com/hotcount/hotcount/store"
)

// Defaults, used by the config package.
const (
	// DefaultInterval is how often the window is flushed (before jitter).
	DefaultInterval = time.Second
	// DefaultTimeout is how long a flush may go on starting writes; writes
	// not started by then wait for the next flush.
	DefaultTimeout = 5 * time.Second
	// DefaultConcurrency is the number of writes in flight at once.
	DefaultConcurrency = 16
	// DefaultShards is the number of shards a topic's count is spread over.
	DefaultShards = 4
)

// WriteTimeout bounds one write once started. A started write is not cut off
// at the flush deadline, because a write cancelled after it was sent may
// still have been applied, and putting its delta back would count it twice.
const WriteTimeout = 5 * time.Second

// maxReroutes is how many other shards a throttled write tries within one
// flush before its delta waits for the next flush.
const maxReroutes = 2

// jitter is the fraction of the interval by which each wait varies, so that
// a fleet of sidecars started together does not flush in lockstep.
const jitter = 0.1

// Buffer is the aggregator as the flusher uses it.
type Buffer interface {
	// Drain takes the current window; the caller owns it.
	Drain() aggregator.Window
	// Merge puts a window back.
	Merge(aggregator.Window)
	// Full is signalled when the window reaches its topic bound.
	Full() <-chan struct{}
}

// Store is what the flusher writes to. Add must be safe for concurrent use
// and return an error wrapping store.ErrThrottled when the write was refused
// for throughput (and so not applied).
type Store interface {
	Add(ctx context.Context, topic string, shard int, delta int64, now time.Time) error
}

// Observer is told, after each flush, what it wrote: per topic, the delta.
// It must not keep the map.
type Observer interface {
	Observe(written map[string]int64)
}

// Shards gives each topic's shard count (per-topic metadata) and is told
// when a topic's writes are throttled, which may raise it. Without it every
// topic has Config.Shards.
type Shards interface {
	WriteCounts(ctx context.Context, topics []string) (map[string]int, error)
	Throttled(ctx context.Context, topic string) int
}

// WithShards takes shard counts from s instead of Config.Shards.
func WithShards(s Shards) Option { return func(f *Flusher) { f.shards = s } }

// Option is an optional dependency of New.
type Option func(*Flusher)

// WithObserver has o told what each flush wrote (the hot-topic tracker).
func WithObserver(o Observer) Option { return func(f *Flusher) { f.observer = o } }

// Config is the flusher's part of the configuration.
type Config struct {
	Shards      int
	Interval    time.Duration
	Timeout     time.Duration
	Concurrency int
}

// Flusher owns the periodic flush. Run starts it; Final flushes what is left
// at shutdown. Flush, Final and LastSuccess are safe to call concurrently
// with Run, but flushes never overlap: one holds flushMu.
type Flusher struct {
	cfg      Config
	buf      Buffer
	store    Store
	log      *zap.Logger
	metrics  *Metrics
	now      func() time.Time
	observer Observer // nil: none
	shards   Shards   // nil: Config.Shards for every topic

	flushMu     sync.Mutex
	lastSuccess atomic.Int64 // Unix nanoseconds of the last flush that wrote everything
	failing     atomic.Bool  // the last flush left deltas unwritten
}

// New returns a flusher of buf into st. now is the clock (time.Now in
// production). Nothing starts until Run.
func New(cfg Config, buf Buffer, st Store, log *zap.Logger, m *Metrics, now func() time.Time, opts ...Option) *Flusher {
	f := &Flusher{cfg: cfg, buf: buf, store: st, log: log.Named("flusher"), metrics: m, now: now}
	for _, o := range opts {
		o(f)
	}
	f.lastSuccess.Store(now().UnixNano())
	return f
}

// Run flushes every interval (±10% jitter) and whenever the buffer signals
// that it is full, until ctx ends. A flush in progress when ctx ends runs to
// its own deadline. Run does not do the final flush: call Final after the
// ingest has stopped, so that nothing arrives behind it.
func (f *Flusher) Run(ctx context.Context) error {
	for {
		wait := time.Duration(float64(f.cfg.Interval) * (1 - jitter + 2*jitter*rand.Float64()))
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		case <-f.buf.Full():
			t.Stop()
			f.metrics.early.Inc()
		}
		if err := f.Flush(context.WithoutCancel(ctx)); err != nil {
			f.log.Warn("flush incomplete, deltas kept for the next flush", zap.Error(err))
		}
	}
}

// Flush drains the window once and writes every delta to a random shard.
// Then the messages (JetStream mode) of every topic written are
// acknowledged, in stream order. Writes that fail (after the SDK's retries;
// when throttled, after trying other shards) or that were not started
// before the flush deadline are merged back into the buffer with their
// messages, whose redelivery timer is reset; the error says how many.
func (f *Flusher) Flush(ctx context.Context) error {
	f.flushMu.Lock()
	defer f.flushMu.Unlock()
	start := f.now()
	defer func() { f.metrics.duration.Observe(f.now().Sub(start).Seconds()) }()

	window := f.buf.Drain()
	counts, err := f.counts(ctx, window)
	if err != nil {
		f.keepAlive(window)
		f.buf.Merge(window)
		f.metrics.requeued.Add(float64(window.Mentions()))
		f.metrics.flushes.WithLabelValues("error").Inc()
		f.failing.Store(true)
		return fmt.Errorf("flusher: shard counts of %d topics: %w", window.Len(), err)
	}
	deadline := start.Add(f.cfg.Timeout)
	var (
		mu       sync.Mutex
		failed   = aggregator.Window{Deltas: make(map[string]int64)}
		firstErr error
		written  int64
	)
	g := new(errgroup.Group)
	g.SetLimit(f.cfg.Concurrency)
	for topic, delta := range window.Deltas {
		if f.now().After(deadline) {
			// Not started: no ambiguity, try next flush. Writes started
			// earlier may still be running, hence the lock.
			mu.Lock()
			failed.Deltas[topic] = delta
			mu.Unlock()
			continue
		}
		g.Go(func() error {
			err := f.write(ctx, topic, delta, counts[topic])
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				failed.Deltas[topic] = delta
				if firstErr == nil {
					firstErr = err
				}
				return nil
			}
			written += delta
			return nil
		})
	}
	_ = g.Wait() // the writes report through failed, never through the group
	f.metrics.flushed.Add(float64(written))
	failed.Acks = f.ack(window.Acks, failed.Deltas)
	if f.observer != nil && written > 0 {
		done := make(map[string]int64, window.Len()-failed.Len())
		for topic, d := range window.Deltas {
			if _, bad := failed.Deltas[topic]; !bad {
				done[topic] = d
			}
		}
		f.observer.Observe(done)
	}

	if failed.Len() > 0 {
		f.keepAlive(failed)
		f.buf.Merge(failed)
		kept := failed.Mentions()
		f.metrics.requeued.Add(float64(kept))
		f.metrics.flushes.WithLabelValues("error").Inc()
		f.failing.Store(true)
		if firstErr == nil {
			firstErr = errors.New("flush deadline passed")
		}
		return fmt.Errorf("flusher: %d of %d topics not written (%d mentions kept): %w", failed.Len(), window.Len(), kept, firstErr)
	}
	f.metrics.flushes.WithLabelValues("ok").Inc()
	f.failing.Store(false)
	f.lastSuccess.Store(f.now().UnixNano())
	f.metrics.lastSuccess.Set(float64(f.now().UnixNano()) / 1e9)
	return nil
}

// ack acknowledges, in order, the messages whose topic is not in failed,
// and returns the others. An ack that cannot be sent leaves its message to
// be redelivered and counted again (the at-least-once over-count); it is
// counted.
func (f *Flusher) ack(ms []aggregator.Message, failed map[string]int64) (kept []aggregator.Message) {
	var acked int
	for _, m := range ms {
		if _, ok := failed[m.Topic]; ok {
			kept = append(kept, m)
			continue
		}
		if err := m.Msg.Ack(); err != nil {
			f.metrics.ackErrors.Inc()
		}
		acked++
	}
	f.metrics.acked.Add(float64(acked))
	return kept
}

// keepAlive resets the redelivery timer of the messages of a window that
// goes back to wait: they stay this sidecar's, and are not handed to
// another replica (which would count them twice) while this one holds them.
func (f *Flusher) keepAlive(w aggregator.Window) {
	for _, m := range w.Acks {
		m.Msg.InProgress() //nolint:errcheck // best effort: at worst a redelivery, counted twice
	}
}

// Failing reports whether the last flush left deltas unwritten. The
// JetStream ingest stops fetching while it does.
func (f *Flusher) Failing() bool { return f.failing.Load() }

// counts returns the shard count of each topic of w.
func (f *Flusher) counts(ctx context.Context, w aggregator.Window) (map[string]int, error) {
	if f.shards == nil || w.Len() == 0 {
		return nil, nil
	}
	topics := make([]string, 0, w.Len())
	for t := range w.Deltas {
		topics = append(topics, t)
	}
	return f.shards.WriteCounts(ctx, topics)
}

// write adds delta to a random one of topic's n shards (Config.Shards when
// n is 0); when the shard is throttled it tries up to maxReroutes other
// shards, since the throttle is per partition and the other shards are
// other partitions, and tells the shard counts, which may raise them.
func (f *Flusher) write(ctx context.Context, topic string, delta int64, n int) error {
	if n == 0 {
		n = f.cfg.Shards
	}
	shard := rand.IntN(n)
	for attempt := 0; ; attempt++ {
		wctx, cancel := context.WithTimeout(ctx, WriteTimeout)
		err := f.store.Add(wctx, topic, shard, delta, f.now())
		cancel()
		if err == nil || !errors.Is(err, store.ErrThrottled) || attempt == maxReroutes {
			return err
		}
		if f.shards != nil && attempt == 0 {
			n = max(n, f.shards.Throttled(ctx, topic))
		}
		if n == 1 {
			return err
		}
		f.metrics.rerouted.Inc()
		shard = (shard + 1 + rand.IntN(n-1)) % n
	}
}

// Final flushes until the buffer is empty or ctx ends, for shutdown, after
// ingest has stopped. What is still buffered when ctx ends is taken out of
// the buffer, counted in hotcount_flusher_unflushed_total and reported in
// the error. In core NATS mode those mentions are lost; in JetStream mode
// their messages are handed back (Nak) for redelivery, so nothing is lost.
func (f *Flusher) Final(ctx context.Context) error {
	backoff := 50 * time.Millisecond
	for {
		err := f.Flush(ctx)
		if err == nil {
			return nil
		}
		f.log.Warn("final flush incomplete, retrying", zap.Error(err))
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			w := f.buf.Drain()
			var handedBack int
			for _, m := range w.Acks {
				if m.Msg.Nak() == nil {
					handedBack++
				}
			}
			f.metrics.unflushed.Add(float64(w.Mentions()))
			return fmt.Errorf("flusher: shutdown deadline passed with %d mentions over %d topics unwritten (%d messages handed back for redelivery): %w",
				w.Mentions(), w.Len(), handedBack, err)
		case <-t.C:
		}
		backoff = min(2*backoff, time.Second)
	}
}

// LastSuccess is the time of the last flush that wrote everything it
// drained (an empty flush counts), or of New when none has yet.
func (f *Flusher) LastSuccess() time.Time {
	return time.Unix(0, f.lastSuccess.Load())
}

// Metrics are the flusher's metrics.
type Metrics struct {
	flushes     *prometheus.CounterVec
	duration    prometheus.Histogram
	flushed     prometheus.Counter
	requeued    prometheus.Counter
	rerouted    prometheus.Counter
	early       prometheus.Counter
	unflushed   prometheus.Counter
	lastSuccess prometheus.Gauge
	acked       prometheus.Counter
	ackErrors   prometheus.Counter
}

// NewMetrics registers the flusher's metrics with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		flushes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hotcount_flusher_flushes_total",
			Help: "Flushes, by result: ok (everything written) or error (some deltas kept for the next flush).",
		}, []string{"result"}),
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "hotcount_flusher_flush_seconds",
			Help:    "Time one flush took.",
			Buckets: prometheus.ExponentialBuckets(0.001, 4, 8),
		}),
		flushed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "hotcount_flusher_flushed_mentions_total",
			Help: "Mentions written to the store (the sum of the deltas of successful writes).",
		}),
		requeued: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "hotcount_flusher_requeued_mentions_total",
			Help: "Mentions whose write failed or was not started in time and went back into the buffer.",
		}),
		rerouted: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "hotcount_flusher_rerouted_total",
			Help: "Throttled writes retried on another shard.",
		}),
		early: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "hotcount_flusher_early_total",
			Help: "Flushes started before the interval because the window reached --max-topics.",
		}),
		unflushed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "hotcount_flusher_unflushed_total",
			Help: "Mentions still buffered when the shutdown deadline passed (lost in core NATS mode; handed back for redelivery in JetStream mode).",
		}),
		acked: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "hotcount_flusher_acked_total",
			Help: "JetStream messages acknowledged after their delta was written.",
		}),
		ackErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "hotcount_flusher_ack_errors_total",
			Help: "JetStream acknowledgements that could not be sent; those messages will be redelivered and counted again.",
		}),
		lastSuccess: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "hotcount_flusher_last_success_timestamp_seconds",
			Help: "Unix time of the last flush that wrote everything it drained.",
		}),
	}
	reg.MustRegister(m.flushes, m.duration, m.flushed, m.requeued, m.rerouted, m.early, m.unflushed, m.lastSuccess, m.acked, m.ackErrors)
	m.flushes.WithLabelValues("ok")
	m.flushes.WithLabelValues("error")
	return m
}
