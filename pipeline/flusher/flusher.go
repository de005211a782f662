// Package flusher drains the aggregator's window on a jittered interval (or
// early, when the window is full) and writes one increment per topic to a
// random shard, in parallel with a bounded number of writes in flight.
// Deltas it cannot write go back into the aggregator: a store failure delays
// mentions, it never loses them.
package flusher

import (
	"context"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/hotcount/hotcount/pipeline/aggregator"
	"github.com/hotcount/hotcount/pipeline/ownwrites"
	"github.com/hotcount/hotcount/pipeline/store"
	"github.com/hotcount/hotcount/schema"
)

// DefaultWriteTimeout bounds one write once started (--write-timeout). A
// started write is not cut off at the flush deadline; one that runs out of
// its own time is in doubt, and is sent again unchanged.
const DefaultWriteTimeout = 5 * time.Second

// jitter is the fraction of the interval by which each wait varies, so that
// a fleet of sidecars started together does not flush in lockstep.
const jitter = 0.1

// Buffer is the aggregator as the flusher uses it.
type Buffer interface {
	// Drain takes the current window; the caller owns it.
	Drain() aggregator.Window
	// Merge puts a window back and takes it: the caller must not touch
	// it afterwards.
	Merge(aggregator.Window)
	// Full is signalled when the window reaches its topic bound.
	Full() <-chan struct{}
	// Pending is topic's delta in the current window.
	Pending(topic string) int64
}

// WithView shows the flusher's buffer and writes to the readers of v
// (lookup.Service.SeeWrites): it attaches the buffer to v, and tells v of
// each window a flush takes and each write it sends and is answered.
func WithView(v *ownwrites.View) Option {
	return func(f *Flusher) { f.view = v }
}

// persister is a Buffer that can keep its window on disk at shutdown
// (aggregator.Aggregator with a spill folder).
type persister interface {
	Persist() (mentions int64, err error)
	PersistBytes() int64 // what Persist would write now
	Spilled() bool
}

// Store is what the flusher writes to. Add must be safe for concurrent use
// and apply each store.Write at most once however often it is sent; it
// returns nil when the write is in the store (now or by an earlier
// attempt), an error wrapping store.ErrThrottled when it was refused for
// throughput (not applied), store.ErrAmbiguous when it may or may not have
// been applied, and any other error when it was not applied.
type Store interface {
	Add(ctx context.Context, w store.Write, now time.Time) error
}

// Observer is told, after each flush, what it wrote: per counter (a
// topic's total, or one of its time buckets), the delta. It must not keep
// the map.
type Observer interface {
	Observe(written map[schema.Counter]int64)
}

// Shards gives each topic's shard count (per-topic metadata) and is told
// when a topic's writes are throttled, which may raise it. Without it every
// topic has Config.Shards. WriteCounts returns a count for every topic even
// when it also returns an error (which only reports topics it had to put
// on one shard). Both are safe for concurrent use.
type Shards interface {
	WriteCounts(ctx context.Context, topics []string) (map[string]int, error)
	Throttled(ctx context.Context, topic string) int
}

// WithShards takes shard counts from s instead of Config.Shards.
func WithShards(s Shards) Option { return func(f *Flusher) { f.shards = s } }

// Option is an optional dependency of New.
type Option func(*Flusher)

// WithObserver has each of os told what each flush wrote (the hot-topic
// tracker, the trending summaries).
func WithObserver(os ...Observer) Option {
	return func(f *Flusher) { f.observer = observers(os) }
}

type observers []Observer

func (os observers) Observe(written map[schema.Counter]int64) {
	for _, o := range os {
		o.Observe(written)
	}
}

// Config is the flusher's part of the configuration.
type Config struct {
	// Shards is the shard count of a topic the Shards option does not know.
	Shards int
	// Interval is the time between flushes, before jitter.
	Interval time.Duration
	// Timeout is how long a flush may go on starting writes.
	Timeout time.Duration
	// Concurrency is the number of writes in flight at once.
	Concurrency int
	// WriteTimeout bounds one write, the SDK's retries included (0:
	// DefaultWriteTimeout).
	WriteTimeout time.Duration
	// Writer is this flusher's writer id (store.NewWriterID; empty: a new
	// one), the identity of its writes' marks.
	Writer string
	// Minutes and Hours say which time buckets a topic's minute counter
	// (schema.Fresh, added by the aggregator) is written to besides its
	// total (--windows).
	Minutes, Hours bool
	// QuarantineAfter is how long a counter's writes may be refused for
	// good before the write goes to the quarantine (WithQuarantine; 0:
	// DefaultQuarantineAfter).
	QuarantineAfter time.Duration
}

// Flusher owns the periodic flush, made of parts with one job each: a
// plan of what to write (plan.go), a writer that sends it (writer.go), the
// ledger of what this writer still owes (ledger.go), and tells the
// readers' view (ownwrites.View) where its counts are; Flush (flush.go)
// only runs them in order. Run starts it; Final (final.go) flushes what
// is left at shutdown. Flush and Final are safe to call concurrently with
// Run, but flushes never overlap.
type Flusher struct {
	cfg      Config
	buf      Buffer
	log      *zap.Logger
	metrics  *Metrics
	now      func() time.Time
	observer Observer // nil: none
	shards   Shards   // nil: Config.Shards for every topic
	// quarantine takes writes refused for good (nil: none, they are
	// tried forever); denied follows the runs of such refusals, by
	// counter (the flush's goroutine's, under flushMu).
	quarantine Quarantine
	denied     map[schema.Counter]denial
	poisoned   map[string]bool // topics quarantined, none of whose writes has landed since
	seq        *store.Sequencer
	planning   planning
	writer     *writer
	view       *ownwrites.View

	// flushMu is held by each flush, start to end, so that flushes never
	// overlap (one write per topic per flush, never two to one item in
	// flight); it guards the ledger.
	flushMu sync.Mutex
	ledger  *ledger

	lastProgress atomic.Int64 // UnixNano of the last flush that wrote something, or had nothing to write
	lastWrite    atomic.Int64 // the same, less the flushes refused for good only
	down         atomic.Bool  // the last flush had work, wrote none of it, and the store refused it all, throttles aside
	endBy        atomic.Int64 // UnixNano of EndBy's time; 0: none
}

// New returns a flusher of buf into st. now is the clock (time.Now in
// production). Nothing starts until Run.
func New(cfg Config, buf Buffer, st Store, log *zap.Logger, m *Metrics, now func() time.Time, opts ...Option) *Flusher {
	if cfg.Writer == "" {
		cfg.Writer = store.NewWriterID()
	}
	if cfg.WriteTimeout <= 0 {
		cfg.WriteTimeout = DefaultWriteTimeout
	}
	if cfg.QuarantineAfter <= 0 {
		cfg.QuarantineAfter = DefaultQuarantineAfter
	}
	f := &Flusher{cfg: cfg, buf: buf, log: log.Named("flusher"), metrics: m, now: now, seq: store.NewSequencer(now),
		denied: make(map[schema.Counter]denial), poisoned: make(map[string]bool)}
	for _, o := range opts {
		o(f)
	}
	f.planning = planning{probe: cfg.Concurrency, minutes: cfg.Minutes, hours: cfg.Hours}
	f.writer = &writer{store: st, shards: f.shards, seq: f.seq, timeout: cfg.WriteTimeout, limit: max(cfg.Concurrency, 1),
		log: f.log, rerouted: m.rerouted, now: now}
	if f.view == nil {
		f.view = ownwrites.New(ownwrites.Config{Keep: time.Second}, now) // nobody reads it
	}
	f.view.Attach(buf.Pending)
	f.ledger = newLedger(m)
	f.lastProgress.Store(now().UnixNano())
	f.lastWrite.Store(now().UnixNano())
	return f
}

// Run flushes every interval (±10% jitter) and whenever the buffer signals
// that it is full, until ctx ends. A flush in progress when ctx ends runs to
// its own deadline. Run does not do the final flush: call Final after the
// ingest has stopped, so that nothing arrives behind it.
func (f *Flusher) Run(ctx context.Context) error {
	return f.RunWithin(ctx, context.WithoutCancel(ctx))
}

// RunWithin is Run whose flushes run on limit rather than past ctx: a
// flush in progress when ctx ends finishes, unless limit ends first (the
// shutdown's deadline for the final flush), when it stops starting writes
// and hands back what it did not write.
func (f *Flusher) RunWithin(ctx, limit context.Context) error {
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
		if err := f.Flush(limit); err != nil {
			f.log.Warn("flush incomplete, deltas kept for the next flush", zap.Error(err))
		}
	}
}

// EndBy makes every flush, the one in progress included, start no write
// that could outlast t less the time Persist needs for what is buffered
// now (at most half the time left, as in Final): the shutdown calls it
// with the final flush's deadline, where it cuts off the flush loop's
// flush (RunWithin's limit), so that the writes in flight then finish
// rather than end in doubt, and the spill write at the end of Final has
// its time. The zero time sets none.
func (f *Flusher) EndBy(t time.Time) {
	var end int64
	if !t.IsZero() {
		end = t.Add(-min(f.persistRoom(), time.Until(t)/2)).UnixNano()
	}
	f.endBy.Store(end)
}

// tooLate says whether a write started now could outlast ctx's deadline,
// or EndBy's.
func (f *Flusher) tooLate(ctx context.Context) bool {
	if ctx.Err() != nil {
		return true
	}
	room := f.writer.room()
	if d, ok := ctx.Deadline(); ok && time.Until(d) < room {
		return true
	}
	end := f.endBy.Load()
	return end != 0 && time.Until(time.Unix(0, end)) < room
}

// Writer is the flusher's writer id.
func (f *Flusher) Writer() string { return f.cfg.Writer }

// LastProgress is the time of the last flush that wrote something or had
// nothing to write, or of New when none has yet: what liveness follows, so
// that one topic the store keeps refusing does not restart the sidecar.
func (f *Flusher) LastProgress() time.Time {
	return time.Unix(0, f.lastProgress.Load())
}

// LastWrite is LastProgress less the flushes whose every write the store
// refused for good: a store that refuses every write (a policy that lost
// dynamodb:UpdateItem) keeps liveness, since a restart mends nothing,
// and stops this, which alerts follow.
func (f *Flusher) LastWrite() time.Time {
	return time.Unix(0, f.lastWrite.Load())
}
