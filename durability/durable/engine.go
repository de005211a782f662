// Package durable is the durable modes' engine: mentions read from
// JetStream partition streams and written to DynamoDB exactly once, by
// stream position.
//
// The guarantee lives in the items, not in the broker's state. A reader
// takes a partition stream in order, with no acknowledgements, from the
// partition's checkpoint; the window adds up, per counter, the mentions it
// read at stream sequences first..last; and a flush writes each counter as
// one UpdateItem that adds the delta and records last, on the condition
// that the item's recorded position for that stream is below first. A
// write sent twice (a lost answer), or by two readers of one partition (a
// frozen owner that woke up, a hand-over, a split network), is refused the
// second time; a write refused half-way (the item already holds part of
// the span) is counted again from the stream for the rest. The argument,
// and what it assumes, is in docs/SEMANTICS.md ("Exactly once by stream
// position").
//
// Ownership of partitions (fleet.Members) is for efficiency: one sidecar
// writes a hot topic once per interval. Correctness does not depend on it.
package durable

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/hotcount/hotcount/durability/rules"
	"github.com/hotcount/hotcount/internal/waits"
	"github.com/hotcount/hotcount/mention"
	"github.com/hotcount/hotcount/pipeline/ingest"
	"github.com/hotcount/hotcount/pipeline/ownwrites"
	"github.com/hotcount/hotcount/pipeline/store"
	"github.com/hotcount/hotcount/schema"
)

// Config is the engine's part of the configuration.
type Config struct {
	// Stream is --stream: the one stream, or the partition streams'
	// prefix (MENTIONS-<p>) when Partitions > 0.
	Stream string
	// Subject is --subject ("mentions.>").
	Subject    string
	Partitions int // 0: the one stream
	// Bucket is the checkpoints' key-value bucket, Replicas its
	// replication.
	Bucket   string
	Replicas int
	// Interval is the flush interval; WriteTimeout bounds one write;
	// Concurrency the writes in flight.
	Interval     time.Duration
	WriteTimeout time.Duration
	Concurrency  int
	// MaxCounters is how many counters the window may hold before the
	// readers pause (the stream keeps the rest).
	MaxCounters int
	// Minutes and Hours turn the time buckets on.
	Minutes, Hours bool
	// Limits, Minutes and Hours (above), Table, Region and Retention are
	// this sidecar's settings of the rules that decide a count. They are
	// recorded as a stream's first rules when it has none; after that
	// every message is judged by its stream's rules (package rules), and
	// a sidecar whose Table, Region or Retention differ from them does not
	// read the stream.
	Limits    mention.Limits
	Table     string
	Region    string
	Retention schema.Retention
	// DeadLetter is where rejected messages go.
	DeadLetter string
	// Contributors is told who each mention that names one came from
	// (trending's distinct contributors); nil: nobody.
	Contributors ingest.Contributors
	// QuarantineAfter is how long a counter's writes may be refused for
	// good (store.Denied) before its mentions are held in its stream's
	// checkpoint record, out of the window's way (0: never).
	QuarantineAfter time.Duration
}

// Store is what the engine writes to: store.Write with a Span, applied
// at most once whatever the number of times or readers that send it
// (store.ErrCovered, *store.OverlapError).
type Store interface {
	Add(ctx context.Context, w store.Write, now time.Time) error
}

// Owner says which partitions this sidecar reads (fleet.Members).
type Owner interface {
	Owned(n int) []int
	Changed() <-chan struct{}
	Settled() bool
}

// Observer is told what each flush applied (the trend sketch, the hot
// topics).
type Observer interface {
	Observe(written map[schema.Counter]int64)
}

// Engine reads partition streams into its window and flushes it. Run owns
// its readers and its flush loop.
type Engine struct {
	cfg       Config
	js        jetstream.JetStream
	st        Store
	owner     Owner // nil: every partition
	check     *ingest.Checker
	prefix    string
	observers []Observer
	view      *ownwrites.View
	log       *zap.Logger
	sampled   *zap.Logger
	metrics   *Metrics
	now       func() time.Time

	win  *window
	ckpt *checkpoints
	book *rules.Book
	// hist is each stream's rules history as this sidecar knows it (by
	// name), for the recounts: a reading switches its own rules as it
	// meets each change, and adds it here.
	histMu  sync.Mutex
	hist    map[string]rules.History
	flushed broadcast

	flushMu  sync.Mutex
	doubt    map[key]job               // writes in doubt, sent again next flush (under flushMu)
	advanced map[string]store.Position // checkpoints stored, per stream (under flushMu)
	hw       map[string]highWater      // high-water marks stored, per stream (under flushMu)
	denied   map[key]time.Time         // since when each counter's writes are refused for good (under flushMu)
	replayed time.Time                 // the last replay of the held counters (under flushMu)
	held     heldSet
	// recounting bounds the recounts under way at once: after a restart
	// or a hand-over most busy counters overlap once, and hundreds of
	// ordered consumers made at once swamped a loaded server until each
	// timed out, and the next flush made them all again.
	recounting chan struct{}

	// gens is, per stream name, the highest record generation seen (a
	// rewind's); fences counts its raises, which restart every reading.
	genMu  sync.Mutex
	gens   map[string]uint64
	fences atomic.Uint64

	// refuse stops Run with its error: a stream's rules this sidecar
	// cannot follow (set by Run).
	refuse func(error)

	// inFlight is the publication (Unix ns) of the oldest mention taken
	// out of the window and not yet written (0: none).
	inFlight atomic.Int64

	// ckptFailed says a checkpoint write of the last flush failed
	// (ckptFailing, under flushMu, while it runs): the final flush is not
	// done until every one is stored.
	ckptFailed  atomic.Bool
	ckptFailing bool

	lastProgress atomic.Int64
	lastWrite    atomic.Int64 // lastProgress less the flushes refused for good only
	failing      atomic.Bool
	reading      atomic.Bool
	// For the retention gauges: per stream name, the publication (Unix
	// ns) of the last message read while more were pending (0: caught
	// up), and the stream's max age.
	unread sync.Map // string -> int64
	ages   sync.Map // string -> time.Duration
	// refusing is, per stream name, whether this sidecar does not read it
	// now for its rules (agree): hotcount_rules_differing_settings{kind="refused"}.
	refusing sync.Map // string -> bool
}

// New returns an engine reading through nc into st. Nothing starts until
// Run.
func New(cfg Config, nc *nats.Conn, st Store, owner Owner, log *zap.Logger, m *Metrics, im *ingest.Metrics, now func() time.Time, observers ...Observer) (*Engine, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	prefix, err := mention.Prefix(cfg.Subject)
	if err != nil {
		return nil, err
	}
	check, err := ingest.NewChecker(nc, ingest.Config{Subject: cfg.Subject, DeadLetterSubject: cfg.DeadLetter, Limits: cfg.Limits, Contributors: cfg.Contributors}, log, im)
	if err != nil {
		return nil, err
	}
	if cfg.Bucket == "" {
		cfg.Bucket = DefaultCheckpointBucket
	}
	if cfg.MaxCounters <= 0 {
		cfg.MaxCounters = 1 << 20
	}
	log = log.Named("durable")
	e := &Engine{cfg: cfg, js: js, st: st, owner: owner, check: check, prefix: prefix, observers: observers,
		log: log, metrics: m, now: now, win: newWindow(), hist: make(map[string]rules.History), gens: make(map[string]uint64), doubt: make(map[key]job), advanced: make(map[string]store.Position), hw: make(map[string]highWater),
		denied: make(map[key]time.Time), recounting: make(chan struct{}, maxRecounts), held: heldSet{keys: make(map[key]bool), per: make(map[string]int), gauge: m.held, most: m.heldMost},
		sampled: log.WithOptions(zap.WrapCore(func(c zapcore.Core) zapcore.Core {
			return zapcore.NewSamplerWithOptions(c, time.Second, 1, 0)
		}))}
	e.ShowWrites(ownwrites.New(ownwrites.Config{Keep: time.Second}, now)) // nobody reads it, unless ShowWrites
	age := e.unwrittenAge
	m.unwritten.Store(&age)
	e.lastProgress.Store(now().UnixNano())
	e.lastWrite.Store(now().UnixNano())
	return e, nil
}

// Run opens the checkpoints (waiting for JetStream as long as it takes,
// and saying so), then reads the partitions this sidecar owns and flushes
// every interval until ctx ends. It does not flush at the end: call Final.
//
// It returns an error, and the sidecar stops, when a stream's rules
// differ from this sidecar's settings in what decides which streams and
// items its counts go to (its --table, --region, ...): at the start, or
// when a reader meets such a change. The window it holds was read under
// the rules before the change, and the final flush writes it.
func (e *Engine) Run(ctx context.Context) error {
	if err := e.open(ctx); err != nil {
		return nil // ctx ended first
	}
	ctx, stop := context.WithCancelCause(ctx)
	defer stop(nil)
	e.refuse = func(err error) { stop(err) }
	if err := e.agreeAll(ctx); err != nil {
		return err
	}
	e.reading.Store(true)
	defer e.reading.Store(false)
	var wg sync.WaitGroup
	wg.Go(func() { e.flushLoop(ctx) })
	e.follow(ctx, &wg)
	wg.Wait()
	if err := context.Cause(ctx); errors.Is(err, errRefused) {
		return err
	}
	return nil
}

// open opens the checkpoint bucket, trying again until ctx ends: a new
// cluster may take a while to create it.
func (e *Engine) open(ctx context.Context) error {
	c, err := backoff.Retry(ctx, func() (*checkpoints, error) {
		octx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		return openCheckpoints(octx, e.js, e.cfg.Bucket, e.replicas(octx))
	}, backoff.WithBackOff(waits.Reconnect()), backoff.WithMaxElapsedTime(0), backoff.WithNotify(func(err error, _ time.Duration) {
		e.sampled.Warn("waiting for JetStream to open the checkpoint bucket", zap.Error(err))
	}))
	if err != nil {
		return err
	}
	e.ckpt = c
	e.book = rules.NewBook(e.js, c.kv)
	return nil
}

// Own are the rules this sidecar's settings give: recorded as a stream's
// first, and compared with the stream's.
func (e *Engine) Own() rules.Rules {
	r := rules.Rules{Mode: rules.ModeJetStream, Subject: e.cfg.Subject, Table: e.cfg.Table, Region: e.cfg.Region,
		MaxCount: e.cfg.Limits.MaxCount, MaxTopicBytes: e.cfg.Limits.MaxTopicBytes, MaxLateness: rules.Duration(e.cfg.Limits.MaxLateness),
		Minutes: e.cfg.Minutes, Hours: e.cfg.Hours,
		MinuteRetention: rules.Duration(e.cfg.Retention.Of(schema.Minute)), HourRetention: rules.Duration(e.cfg.Retention.Of(schema.Hour))}
	if e.cfg.Partitions > 0 {
		r.Mode, r.Partitions = rules.ModePartitioned, e.cfg.Partitions
	}
	return r
}

// replicas is the checkpoint bucket's replication: Config.Replicas, else
// as many as the first partition's stream has, so that the checkpoints
// live through the loss of any node the mentions live through (one
// replica while the stream is not there yet; a later start raises it).
func (e *Engine) replicas(ctx context.Context) int {
	if e.cfg.Replicas > 0 {
		return e.cfg.Replicas
	}
	if st, err := e.js.Stream(ctx, e.streamName(0)); err == nil {
		return st.CachedInfo().Config.Replicas
	}
	return 1
}

// follow runs a reader for each partition this sidecar owns, starting and
// stopping them as the owners change, until ctx ends.
func (e *Engine) follow(ctx context.Context, wg *sync.WaitGroup) {
	readers := make(map[int]context.CancelFunc)
	defer func() {
		for _, stop := range readers {
			stop()
		}
	}()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		want := make(map[int]bool)
		for _, p := range e.owned() {
			want[p] = true
		}
		for p, stop := range readers {
			if !want[p] {
				stop()
				delete(readers, p)
				e.log.Info("partition released", zap.Int("partition", p))
			}
		}
		for p := range want {
			if readers[p] == nil {
				rctx, stop := context.WithCancel(ctx)
				readers[p] = stop
				wg.Go(func() { e.read(rctx, p) })
				e.log.Info("partition claimed", zap.Int("partition", p), zap.String("stream", e.streamName(p)))
			}
		}
		e.check.Partitions(max(e.cfg.Partitions, 1), len(readers))
		var changed <-chan struct{}
		if e.owner != nil {
			changed = e.owner.Changed()
		}
		select {
		case <-ctx.Done():
			return
		case <-changed:
		case <-tick.C:
		}
	}
}

// owned are the partitions to read now.
func (e *Engine) owned() []int {
	n := max(e.cfg.Partitions, 1)
	if e.owner == nil {
		ps := make([]int, n)
		for i := range ps {
			ps[i] = i
		}
		return ps
	}
	if !e.owner.Settled() {
		return nil
	}
	return e.owner.Owned(n)
}

// flushLoop flushes every interval (±10%) until ctx ends.
func (e *Engine) flushLoop(ctx context.Context) {
	for {
		t := time.NewTimer(time.Duration(float64(e.cfg.Interval) * (0.9 + 0.2*rand.Float64())))
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		if err := e.Flush(context.WithoutCancel(ctx)); err != nil {
			e.sampled.Warn("flush incomplete; what was not written waits for the next", zap.Error(err))
		}
	}
}

// Final flushes what the readers left, until everything is written or ctx
// ends. What it cannot write is not lost: the checkpoint stays below it,
// and the partition's next reader reads it again.
func (e *Engine) Final(ctx context.Context) error {
	for {
		err := e.Flush(ctx)
		if err == nil && e.win.size() == 0 && !e.ckptFailed.Load() {
			return nil
		}
		if err == nil && e.ckptFailed.Load() {
			err = errors.New("durable: checkpoint not stored (the next reader reads again what is past it)")
		}
		// A store that refuses at once is asked again at the flush
		// interval, not in a loop.
		select {
		case <-ctx.Done():
			return err
		case <-time.After(min(e.cfg.Interval, 200*time.Millisecond)):
		}
	}
}

// full says whether the window holds as many counters as it may.
func (e *Engine) full() bool { return e.win.size() >= e.cfg.MaxCounters }

// LastProgress is the time of the last flush that wrote something or had
// nothing to write.
func (e *Engine) LastProgress() time.Time { return time.Unix(0, e.lastProgress.Load()) }

// LastWrite is LastProgress less the flushes whose every write the store
// refused for good (see flusher.Flusher.LastWrite).
func (e *Engine) LastWrite() time.Time { return time.Unix(0, e.lastWrite.Load()) }

// Failing says whether the last flush had work and wrote none of it.
func (e *Engine) Failing() bool { return e.failing.Load() }

// Metrics counts what the engine does.
type Metrics struct {
	writes        *prometheus.CounterVec
	recounts      prometheus.Counter
	retentionLost prometheus.Counter
	backwards     prometheus.Counter
	ruleDiffs     *prometheus.GaugeVec
	ruleChanges   prometheus.Counter
	checkpoint    prometheus.Gauge
	held          prometheus.Gauge
	heldMost      prometheus.Gauge
	oldest        prometheus.GaugeFunc
	// unwritten is what oldest reports, set by the engine (New).
	unwritten atomic.Pointer[func() float64]
	maxAge    prometheus.Gauge
	// The write stage's metrics, under the names the flusher gives them
	// in core mode: dashboards and alerts (HotcountFlushStale,
	// HotcountWritesInDoubt) read one set whatever the mode.
	flushes     *prometheus.CounterVec
	duration    prometheus.Histogram
	flushed     prometheus.Counter
	requeued    prometheus.Counter
	lastSuccess prometheus.Gauge
	pending     prometheus.Gauge
	// The quarantine's, under the flusher's names too.
	quarantined         prometheus.Counter
	quarantinedMentions prometheus.Counter
}

// NewMetrics registers the engine's metrics with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		writes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "hotcount_durable_writes_total",
			Help: "Positional writes by outcome: applied; covered (the item already held every position: another reader, or an earlier attempt, wrote them); overlap (the item held part of the span: the rest is recounted from the stream); in_doubt (a lost answer: sent again unchanged); failed (not applied: back to the window)."},
			[]string{"outcome"}),
		recounts: prometheus.NewCounter(prometheus.CounterOpts{Name: "hotcount_durable_recounts_total",
			Help: "Counters counted again from the stream after an overlapping write (two readers of one partition)."}),
		retentionLost: prometheus.NewCounter(prometheus.CounterOpts{Name: "hotcount_durable_retention_lost_total",
			Help: "Stream messages dropped before any reader counted them (by the stream's limits, or with the stream, deleted while a recount of them was due): lost. Expected 0."}),
		backwards: prometheus.NewCounter(prometheus.CounterOpts{Name: "hotcount_durable_backwards_total",
			Help: "Readings refused because a stream's sequences went back below its checkpoint in the same epoch (a stream restored from a backup keeps its creation time): its new mentions would read as counted. Expected 0; see the log."}),
		ruleDiffs: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "hotcount_rules_differing_settings",
			Help: "followed: this sidecar's settings that differ from the stream's rules, which it judges by instead (--max-count, --max-topic-bytes, --max-lateness, --windows); refused: the streams it does not read now because their rules differ there in what decides which items its counts go to (--table, --region, the retentions). See hotcount stream rules show."},
			[]string{"kind"}),
		ruleChanges: prometheus.NewCounter(prometheus.CounterOpts{Name: "hotcount_rules_changes_total",
			Help: "Changes of a stream's rules met while reading it (hotcount stream rules set): the reading judges by the new rules from the next message on."}),
		held: prometheus.NewGauge(prometheus.GaugeOpts{Name: "hotcount_durable_held_counters",
			Help: "Counters held now in the checkpoint records of the streams this sidecar reads (the store refuses their writes for good; at most 1,000 a stream): written, and no longer held, once the store takes them."}),
		heldMost: prometheus.NewGauge(prometheus.GaugeOpts{Name: "hotcount_durable_held_counters_fullest_stream",
			Help: "The held counters of the stream whose checkpoint record holds the most: at 1,000 it is full, and a counter refused then holds back its stream's checkpoint (and retention) until the store takes it."}),
		checkpoint: prometheus.NewGauge(prometheus.GaugeOpts{Name: "hotcount_durable_checkpoint_sequence",
			Help: "The last checkpoint this sidecar stored (a stream sequence)."}),

		maxAge: prometheus.NewGauge(prometheus.GaugeOpts{Name: "hotcount_durable_stream_max_age_seconds",
			Help: "The shortest max age of the streams this sidecar reads (0: none): what hotcount_durable_oldest_unwritten_seconds must stay well under."}),
		flushes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "hotcount_flusher_flushes_total",
			Help: "Flushes, by result: ok (everything written) or error (some deltas kept for the next flush)."}, []string{"result"}),
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "hotcount_flusher_flush_seconds",
			Help: "Time one flush took.", Buckets: prometheus.ExponentialBuckets(0.001, 4, 8)}),
		flushed: prometheus.NewCounter(prometheus.CounterOpts{Name: "hotcount_flusher_flushed_mentions_total",
			Help: "Mentions written to the store: the deltas of the topic totals this sidecar applied."}),
		requeued: prometheus.NewCounter(prometheus.CounterOpts{Name: "hotcount_flusher_requeued_mentions_total",
			Help: "Mentions whose write failed and went back to the window."}),
		lastSuccess: prometheus.NewGauge(prometheus.GaugeOpts{Name: "hotcount_flusher_last_success_timestamp_seconds",
			Help: "Time of the last flush that wrote everything it had."}),
		pending: prometheus.NewGauge(prometheus.GaugeOpts{Name: "hotcount_flusher_pending_writes",
			Help: "Writes in doubt (no answer), sent again unchanged each flush; their counters' newer deltas wait."}),
	}
	for _, o := range []string{"applied", "covered", "overlap", "in_doubt", "failed"} {
		m.writes.WithLabelValues(o)
	}
	m.quarantined = prometheus.NewCounter(prometheus.CounterOpts{Name: "hotcount_flusher_quarantined_writes_total",
		Help: "Counters whose writes the store refused for good for --quarantine-after, held in their stream's checkpoint record until it takes them."})
	m.quarantinedMentions = prometheus.NewCounter(prometheus.CounterOpts{Name: "hotcount_flusher_quarantined_mentions_total",
		Help: "Mentions of topic totals held so (a bucket's repeat its total's): missing from the table until the store takes them."})
	m.flushes.WithLabelValues("ok")
	m.flushes.WithLabelValues("error")
	m.oldest = prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "hotcount_durable_oldest_unwritten_seconds",
		Help: "Age of the oldest mention this sidecar has read and not yet written (in its window, being written, or in doubt), or not yet read while it is behind its streams (0: none), as of the scrape: once it passes the streams' max age, the stream drops mentions before they are counted; at a backup's time, what a restore must read again."},
		func() float64 {
			if f := m.unwritten.Load(); f != nil {
				return (*f)()
			}
			return 0
		})
	reg.MustRegister(m.writes, m.recounts, m.retentionLost, m.backwards, m.ruleDiffs, m.ruleChanges, m.held, m.heldMost, m.checkpoint, m.oldest, m.maxAge,
		m.flushes, m.duration, m.flushed, m.requeued, m.lastSuccess, m.pending, m.quarantined, m.quarantinedMentions)
	return m
}

// ShowWrites shows the engine's window and writes to the readers of v
// (lookup.Service.SeeWrites): the window's pending mentions, the totals
// a flush holds, and each write of a total as it is sent and answered.
// Call it before Run.
func (e *Engine) ShowWrites(v *ownwrites.View) {
	e.view = v
	v.Attach(func(topic string) int64 { return e.win.pending(topic, schema.Minute.Index(e.now())) })
}

// Ready says whether the engine reads its partitions.
func (e *Engine) Ready() error {
	if !e.reading.Load() {
		return errors.New("durable: not reading yet (waiting for JetStream)")
	}
	return nil
}

// EndBy is the shutdown's deadline for the final flush: the engine needs
// none (what it does not write, the next reader reads again).
func (e *Engine) EndBy(time.Time) {}

// Writer names this writer in logs: the engine writes as no one in
// particular (the items' positions, not a writer id, make writes
// idempotent).
func (e *Engine) Writer() string { return "positions" }
