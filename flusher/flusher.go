// Package flusher drains the aggregator's window on a jittered interval (or
// early, when the window is full) and writes one increment per topic to a
// random shard, in parallel with a bounded number of writes in flight.
// Deltas it cannot write go back into the aggregator: a store failure delays
// mentions, it never loses them.
package flusher

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"golang.org/x/sync/errgroup"

	"github.com/hotcount/hotcount/aggregator"
	"github.com/hotcount/hotcount/journal"
	"github.com/hotcount/hotcount/store"
)

// Defaults, used by the config package.
const (
	// DefaultInterval is how often the window is flushed (before jitter).
	DefaultInterval = time.Second
	// DefaultTimeout is how long a flush may go on starting writes; writes
	// not started by then wait for the next flush.
	DefaultTimeout = 5 * time.Second
	// DefaultConcurrency bounds the writes in flight at once. A flush runs
	// as many as it has topics, up to this: a long tail of new topics is
	// written at the store's pace, not at 16 round trips at a time. It
	// matches the HTTP client's idle connections per host.
	DefaultConcurrency = 256
	// EmbeddedConcurrency is the default against the embedded store,
	// where a write in flight is only a goroutine waiting for its group's
	// commit: the more there are, the more each fsync carries. At 256 a
	// long tail of 20,000 new topics a second fell behind as the file grew
	// (0.95× keep-up, 141,000 topics unwritten when the load stopped);
	// at 1,024 it kept pace with about a second of backlog
	// (BenchmarkLongTail).
	EmbeddedConcurrency = 1024
	// DefaultShards is the number of shards a new topic starts with: one
	// (no metadata item, one row), raised when its writes are throttled.
	DefaultShards = 1
)

// DefaultWriteTimeout bounds one write once started (--write-timeout). A
// started write is not cut off at the flush deadline; one that runs out of
// its own time is in doubt, and is sent again unchanged.
const DefaultWriteTimeout = 5 * time.Second

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
	// Merge puts a window back and takes it: the caller must not touch
	// it afterwards.
	Merge(aggregator.Window)
	// Full is signalled when the window reaches its topic bound.
	Full() <-chan struct{}
	// Pending is topic's delta in the current window.
	Pending(topic string) int64
}

// Reader is told of each write as it lands (lookup.Service raises its
// cached totals with it): topic's delta, in a write sent at sent that
// landed at landed. Wrote is called under the lock Read holds, and must
// not block.
type Reader interface {
	Wrote(topic string, delta int64, sent, landed time.Time)
}

// WithReader tells r of each write as it lands.
func WithReader(r Reader) Option {
	return func(f *Flusher) { f.reader = r }
}

// persister is a Buffer that can keep its window on disk at shutdown
// (aggregator.Aggregator with a spill folder).
type persister interface {
	Persist() (mentions int64, err error)
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

// Observer is told, after each flush, what it wrote: per counter (a topic,
// or a time bucket: store.ParseCounter), the delta. It must not keep the
// map.
type Observer interface {
	Observe(written map[string]int64)
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

// Journal records a flush's writes durably before their messages are
// acknowledged (JetStream mode): the journal package's Journal. Record
// returns the entries it recorded; Settled retires one whose writes are all
// in the store.
type Journal interface {
	Record(ctx context.Context, writes []store.Write, seqs map[string][]int64) ([]journal.Recorded, error)
	// Confirm settles an entry Record returned unconfirmed: true once it
	// is surely recorded.
	Confirm(ctx context.Context, key string) (bool, error)
	// Rewrite gives a journaled write a new seq (after a store.FloorError).
	Rewrite(ctx context.Context, key, topic string, seq int64) error
	// MaybeReplayed says whether an entry recorded at t may have been
	// replayed by another sidecar (this writer's heartbeat lapsed since).
	MaybeReplayed(t time.Time) bool
	// Settled retires an entry whose writes are all in the store, or says
	// journal.ErrNotAcknowledged while its messages' acknowledgements are
	// not all recorded by the consumer (it is asked again next flush).
	Settled(ctx context.Context, key string) error
}

// WithJournal makes every write journaled first (see Flusher.record).
func WithJournal(j Journal) Option { return func(f *Flusher) { f.journal = j } }

// WithObserver has each of os told what each flush wrote (the hot-topic
// tracker, the trending summaries).
func WithObserver(os ...Observer) Option {
	return func(f *Flusher) { f.observer = observers(os) }
}

type observers []Observer

func (os observers) Observe(written map[string]int64) {
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
	// KeepAlive is how often the messages of a window being flushed get
	// InProgress (JetStream mode: a third of the ack wait; 0: never).
	KeepAlive time.Duration
	// Writer is this flusher's writer id (store.NewWriterID; empty: a new
	// one), the identity of its writes' marks.
	Writer string
	// Minutes and Hours say which time buckets a topic's minute counter
	// (store.Fresh, added by the aggregator) is written to besides its
	// total (--windows).
	Minutes, Hours bool
}

// Flusher owns the periodic flush. Run starts it; Final flushes what is left
// at shutdown. Flush, Final and Pending are safe to call concurrently with
// Run, but flushes never overlap: one holds flushMu.
type Flusher struct {
	cfg      Config
	buf      Buffer
	store    Store
	log      *zap.Logger
	metrics  *Metrics
	now      func() time.Time
	observer Observer // nil: none
	reader   Reader   // nil: none
	shards   Shards   // nil: Config.Shards for every topic
	journal  Journal  // nil: none (core mode)

	seq *store.Sequencer

	flushMu      sync.Mutex
	pending      map[string]*pending // by topic: writes in doubt or journaled; under flushMu
	entries      map[string]int      // journal entry -> its writes not yet in the store; under flushMu
	unretired    []string            // journal entries settled, not yet deleted; under flushMu
	lastProgress atomic.Int64        // ... and of the last that wrote something, or had nothing to write
	failing      atomic.Bool         // the last flush left deltas unwritten
	down         atomic.Bool         // ... and the store refused it all, throttles aside

	// inflight is the window a flush holds, topics leaving it as they are
	// written: with the buffer's window, what Pending sees. viewMu covers
	// it and every change to it, and makes each move between the buffer
	// and inflight one step for Pending.
	viewMu   sync.RWMutex
	inflight *aggregator.Deltas
	sent     map[string]sending // inflight topics whose write has started
	doubt    map[string]sending // writes in doubt or journaled, by topic
}

// sending is a write: when it was first sent, its delta, and whether it
// is on its way to the store (!landed) or not (it landed and the reader
// was told, or it is in doubt between two sends).
type sending struct {
	at     time.Time
	delta  int64
	landed bool
}

// Sending reports whether a write of topic is on its way to the store: sent
// and not landed, so a total read now may or may not include it.
func (f *Flusher) Sending(topic string) bool {
	f.viewMu.RLock()
	defer f.viewMu.RUnlock()
	s, ok := f.sent[topic]
	d, doubted := f.doubt[topic]
	return ok && !s.landed || doubted && !d.landed
}

// Read calls read, holding the flusher still, with a function that gives
// topic's mentions accepted by this sidecar and not in a total whose
// gather ended at gatheredAt: in the buffer, in the window a flush holds
// and has not sent, or in a write (in doubt included) first sent after
// gatheredAt and not landed: such a gather cannot have seen it. A write
// that has landed is the reader's (Reader.Wrote, under the same lock). A
// write sent before gatheredAt is left out, as are journaled writes and
// deltas spilled to disk: they may be in the store already, and counting
// them could count them twice.
func (f *Flusher) Read(topic string, read func(pending func(gatheredAt time.Time) int64)) {
	f.viewMu.RLock()
	defer f.viewMu.RUnlock()
	read(func(gatheredAt time.Time) int64 {
		p := f.buf.Pending(topic)
		q, _ := f.inflight.Get(topic) // 0 when not there
		if s, ok := f.sent[topic]; ok && (s.landed || !gatheredAt.Before(s.at)) {
			q = 0
		}
		if d, ok := f.doubt[topic]; ok && gatheredAt.Before(d.at) {
			q += d.delta // first sent after the gather: it cannot be in it
		}
		if p > 1<<63-1-q {
			return 1<<63 - 1
		}
		return p + q
	})
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
	f := &Flusher{cfg: cfg, buf: buf, store: st, log: log.Named("flusher"), metrics: m, now: now,
		seq: store.NewSequencer(now), pending: make(map[string]*pending), entries: make(map[string]int), doubt: make(map[string]sending)}
	for _, o := range opts {
		o(f)
	}
	f.lastProgress.Store(now().UnixNano())
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

// Flush drains the window once and writes every delta to a random shard,
// each write an idempotent store.Write with this writer's next seq. Then
// the messages (JetStream mode) of every topic written are acknowledged,
// in stream order.
//
// A write whose outcome is unknown (store.ErrAmbiguous) becomes the
// topic's pending write: each later flush sends it again, unchanged (same
// shard, delta and seq), until the store settles it; until then the
// topic's newer deltas wait in the buffer, so this writer never lands a
// newer seq on an item while an older one is in doubt. Writes refused for
// throughput move to another shard with a new seq (nothing was applied).
// Writes that fail, or that were not started before the flush deadline,
// are merged back into the buffer with their messages, whose redelivery
// timer is reset; the error says how many.
func (f *Flusher) Flush(ctx context.Context) error {
	f.flushMu.Lock()
	defer f.flushMu.Unlock()
	start := f.now()
	defer func() { f.metrics.duration.Observe(f.now().Sub(start).Seconds()) }()

	f.viewMu.Lock()
	window := f.buf.Drain()
	f.inflight, f.sent = window.Deltas, make(map[string]sending)
	// While the store refuses everything, a flush only probes it with a
	// few counters, and the rest goes back as it came: split, each topic's
	// minute would take three counters (total, minute, hour) of memory
	// through an outage of millions of topics. (Core mode: JetStream mode
	// stops fetching instead, and its messages stay with their counts.)
	untried := 0 // counters not tried, back in the buffer
	if f.down.Load() && len(window.Acks) == 0 {
		rest := aggregator.Window{Deltas: f.probe(&window)}
		f.inflight = window.Deltas
		untried = rest.Len()
		f.metrics.requeued.Add(float64(rest.Mentions()))
		f.buf.Merge(rest) // the buffer's now
	}
	f.split(window.Deltas)
	// Topics with a write in doubt wait for it to settle: all their
	// counters (total and time buckets) and their messages, so that a
	// message is acknowledged, or journaled, with every count it makes.
	waiting := f.waiting()
	held := aggregator.Window{Deltas: aggregator.NewDeltas(0)}
	for name, d := range window.Deltas.All() {
		if waiting[store.TopicOf(name)] {
			held.Deltas.Set(name, d)
			window.Deltas.Delete(name)
		}
	}
	var acks []aggregator.Message
	for _, m := range window.Acks {
		if waiting[m.Topic] {
			held.Acks = append(held.Acks, m)
		} else {
			acks = append(acks, m)
		}
	}
	window.Acks = acks
	heldTopics := held.Len()
	if heldTopics > 0 {
		f.keepAlive(held)
		f.metrics.requeued.Add(float64(held.Mentions()))
		f.buf.Merge(held)
	}
	f.viewMu.Unlock()
	// The drained messages leave the buffer the ingest keeps alive: keep
	// them alive here for as long as this flush holds them, so that a slow
	// flush (a cold start, a slow store) never lets the server hand them to
	// another sidecar while this one still counts them.
	defer f.keepAliveWhile(window.Acks)()

	counts, err := f.counts(ctx, window)
	if err != nil {
		// The counts are usable all the same (one shard for the topics it
		// could not look up): metadata never holds counts back.
		f.log.Warn("shard counts incomplete; those topics go to one shard this flush", zap.Error(err))
	}
	failed := aggregator.Window{Deltas: aggregator.NewDeltas(0)}
	if f.journal != nil {
		f.record(ctx, &window, counts, &failed)
	}
	deadline := start.Add(f.cfg.Timeout)
	var (
		mu       sync.Mutex
		doubt    = make(map[string]store.Write) // new writes in doubt
		settled  = make(map[string]int64)       // earlier writes in doubt, now settled
		firstErr error
		written  int64
	)
	fail := func(err error) {
		if firstErr == nil {
			firstErr = err
		}
	}
	g := new(errgroup.Group)
	g.SetLimit(f.cfg.Concurrency)
	// Writes in doubt first: they hold their topics back.
	if f.journal != nil {
		f.confirm(ctx)
		f.retire(ctx)
	}
	for topic, p := range f.pending {
		if f.now().After(deadline) {
			break // still pending: sent again next flush
		}
		if p.unconfirmed {
			continue
		}
		if p.entry != "" && f.journal.MaybeReplayed(p.recordedAt) {
			p.write.Replay = true // another sidecar may have applied it
		}
		f.viewMu.Lock()
		if d, ok := f.doubt[topic]; ok {
			d.landed = false // on its way again: see Sending
			f.doubt[topic] = d
		}
		f.viewMu.Unlock()
		g.Go(func() error {
			err := f.settle(ctx, p.write)
			f.viewMu.Lock()
			if d, ok := f.doubt[topic]; ok {
				d.landed = true
				f.doubt[topic] = d
			}
			f.viewMu.Unlock()
			// Only this goroutine touches p until Wait.
			if errors.Is(err, store.ErrAmbiguous) {
				p.write.Retry = true
			}
			var behind *store.FloorError
			if errors.As(err, &behind) && p.entry != "" {
				// Not applied; a journaled write keeps its seq unless its
				// entry is rewritten with the new one.
				if seq := f.seq.Next(); f.journal.Rewrite(ctx, p.entry, topic, seq) == nil {
					p.write.Seq = seq
				}
			}
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				fail(err)
				return nil
			}
			settled[topic] = p.write.Delta
			written += p.write.Delta
			if !store.IsBucket(topic) {
				f.metrics.flushed.Add(float64(p.write.Delta)) // as each lands, not at the flush's end
			}
			f.viewMu.Lock()
			if d, ok := f.doubt[topic]; ok {
				delete(f.doubt, topic)
				if f.reader != nil && !store.IsBucket(topic) {
					f.reader.Wrote(topic, d.delta, d.at, f.now())
				}
			}
			f.viewMu.Unlock()
			return nil
		})
	}
	// Topics not written stay in window.Deltas, which goes back to the
	// buffer as it is: during an outage a million-topic window is handed
	// back without a copy. Only the topics written leave it.
	topics := window.Len()
	var (
		wrote     []topicDelta // under mu
		refused   int          // definite failures but throttles, under mu
		throttled int          // under mu
	)
	for topic, delta := range window.Deltas.All() {
		mu.Lock()
		// A store that refused a whole round of writes and took none is
		// down: the rest of the window waits for the next flush instead of
		// costing a failed call each (a million topics during an outage).
		down := refused >= f.cfg.Concurrency && written == 0
		mu.Unlock()
		if down || f.now().After(deadline) || ctx.Err() != nil {
			continue // not started: no ambiguity, try next flush
		}
		sentAt := f.now()
		f.viewMu.Lock()
		f.sent[topic] = sending{at: sentAt}
		f.viewMu.Unlock()
		g.Go(func() error {
			w, err := f.write(ctx, topic, delta, counts[store.TopicOf(topic)])
			f.viewMu.Lock()
			switch {
			case err == nil:
				f.sent[topic] = sending{at: sentAt, landed: true}
				if f.reader != nil && !store.IsBucket(topic) {
					f.reader.Wrote(topic, delta, sentAt, f.now())
				}
			case errors.Is(err, store.ErrAmbiguous):
				f.sent[topic] = sending{at: sentAt, landed: true}
				f.doubt[topic] = sending{at: sentAt, delta: delta, landed: true} // not on its way until sent again
			default:
				delete(f.sent, topic) // refused: pending again
			}
			f.viewMu.Unlock()
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				written += delta
				if !store.IsBucket(topic) {
					f.metrics.flushed.Add(float64(delta)) // as each lands: a long flush shows its progress
				}
				wrote = append(wrote, topicDelta{topic, delta})
			case errors.Is(err, store.ErrAmbiguous):
				doubt[topic] = w
				fail(err)
			case errors.Is(err, store.ErrThrottled):
				throttled++ // the store is up: this topic is hot
				fail(err)
			default:
				refused++
				fail(err)
			}
			return nil
		})
	}
	_ = g.Wait() // the writes report through the maps, never through the group
	f.viewMu.Lock()
	for _, w := range wrote {
		window.Deltas.Delete(w.topic)
	}
	for topic := range doubt {
		window.Deltas.Delete(topic)
	}
	// What is left joins the topics the journal did not take.
	if window.Deltas.Len() > failed.Deltas.Len() {
		failed.Deltas, window.Deltas = window.Deltas, failed.Deltas
	}
	for topic, d := range window.Deltas.All() {
		failed.Deltas.Set(topic, d)
	}
	window.Deltas = nil                     // failed's now
	f.inflight, f.sent = failed.Deltas, nil // what is left was refused or not sent: pending again
	f.viewMu.Unlock()

	// Settled writes in doubt: their messages are done once their topic
	// has no other write in doubt.
	var done []aggregator.Message
	var retire []string
	for topic := range settled {
		p := f.pending[topic]
		done = append(done, p.msgs...)
		if p.entry != "" {
			if f.entries[p.entry]--; f.entries[p.entry] == 0 {
				delete(f.entries, p.entry)
				retire = append(retire, p.entry)
			}
		}
		delete(f.pending, topic)
	}
	f.ackAll(f.stillWaiting(done))
	f.unretired = append(f.unretired, retire...)
	if len(retire) > 0 {
		f.retire(ctx)
	}
	// Messages of topics written go now, in stream order; those of new
	// writes in doubt go with their pending write.
	// A message waits while any count of its topic is unwritten (back to
	// the buffer with it) or in doubt (with that write).
	bad, unsure := make(map[string]bool), make(map[string]string)
	for name := range failed.Deltas.All() {
		bad[store.TopicOf(name)] = true
	}
	for name := range doubt {
		unsure[store.TopicOf(name)] = name
	}
	kept := f.ack(window.Acks, func(topic string) bool { return bad[topic] || unsure[topic] != "" })
	for name, w := range doubt {
		f.pendingOf(name, w)
	}
	for _, m := range kept {
		if name := unsure[m.Topic]; name != "" && !bad[m.Topic] {
			p := f.pending[name]
			p.msgs = append(p.msgs, m)
		} else {
			failed.Acks = append(failed.Acks, m)
		}
	}
	if f.observer != nil && written > 0 {
		observed := make(map[string]int64, len(settled)+len(wrote))
		for _, w := range wrote {
			observed[w.topic] = w.delta
		}
		for topic, d := range settled {
			observed[topic] += d
		}
		f.observer.Observe(observed)
	}
	f.metrics.pending.Set(float64(len(f.pending)))
	for _, p := range f.pending {
		f.keepAlive(aggregator.Window{Acks: p.msgs})
	}

	// Progress is what health and backpressure follow: a flush that wrote
	// something (or had nothing to write) moved on, even if one poison
	// topic keeps failing; only a flush that wrote nothing of its work
	// means the store is not taking writes.
	attempted := topics > 0 || len(f.pending) > 0 || failed.Len() > 0 || len(settled) > 0
	progress := written > 0 || !attempted
	if progress {
		f.lastProgress.Store(f.now().UnixNano())
	}
	f.failing.Store(!progress)
	f.down.Store(!progress && refused > 0 && throttled == 0)
	if failed.Len() > 0 || len(f.pending) > 0 || heldTopics > 0 || untried > 0 && written == 0 {
		// Held-back deltas count as unwritten too: Final must flush again.
		f.keepAlive(failed)
		kept, failedTopics := failed.Mentions(), failed.Len()
		f.viewMu.Lock()
		f.buf.Merge(failed)
		f.inflight = nil
		f.viewMu.Unlock()
		f.metrics.requeued.Add(float64(kept))
		f.metrics.flushes.WithLabelValues("error").Inc()
		if firstErr == nil && heldTopics > 0 {
			firstErr = fmt.Errorf("%d counters waited behind writes in doubt", heldTopics)
		}
		if firstErr == nil && untried > 0 {
			firstErr = errors.New("the store refused the last flush")
		}
		if firstErr == nil {
			firstErr = errors.New("flush deadline passed")
		}
		return fmt.Errorf("flusher: %d of %d topics not written (%d mentions kept), %d writes pending (in doubt or journaled), %d topics held back, %d not tried (the store is down): %w",
			failedTopics, topics, kept, len(f.pending), heldTopics, untried, firstErr)
	}
	f.viewMu.Lock()
	f.inflight = nil
	f.viewMu.Unlock()
	if untried > 0 {
		// The probe went through: the store is back, and the next flush
		// takes the rest, which Final must not leave behind.
		f.metrics.flushes.WithLabelValues("error").Inc()
		return fmt.Errorf("flusher: the store refused the last flush; %d counters probed and written, %d left for the next flush", topics, untried)
	}
	f.metrics.flushes.WithLabelValues("ok").Inc()
	f.metrics.lastSuccess.Set(float64(f.now().UnixNano()) / 1e9)
	return nil
}

// maxLookups bounds the topics whose shard count one flush looks up.
const maxLookups = 4096

type topicDelta struct {
	topic string
	delta int64
}

// pending is a write sent again unchanged until it is in the store: a
// write in doubt, or (with a journal) any journaled write. msgs are the
// messages (JetStream mode, no journal) whose counts make up its delta;
// entry is its journal entry.
type pending struct {
	write       store.Write
	msgs        []aggregator.Message
	entry       string    // journal entry key; "" without a journal
	recordedAt  time.Time // when the entry was recorded
	unconfirmed bool      // the entry's put lost its answer: not sent yet
}

// record journals the window's writes (JetStream mode with a journal),
// acknowledges the messages of the topics recorded, in stream order, and
// makes each recorded write pending: from now on the journal carries those
// counts, and the write is sent until it is in the store, unchanged (a
// journaled write never moves to another shard; a replay after a crash
// sends it where the journal says). Topics not recorded go to failed, with
// their messages.
func (f *Flusher) record(ctx context.Context, window *aggregator.Window, counts map[string]int, failed *aggregator.Window) {
	if window.Len() == 0 {
		return
	}
	writes := make([]store.Write, 0, window.Len())
	for topic, delta := range window.Deltas.All() {
		n := counts[store.TopicOf(topic)]
		if n == 0 {
			n = f.cfg.Shards
		}
		writes = append(writes, store.Write{Topic: topic, Shard: rand.IntN(n), Delta: delta, Writer: f.cfg.Writer, Seq: f.seq.Next()})
	}
	// A topic's time buckets next to its total: the journal keeps them in
	// one entry, so a message's counts are journaled whole or not at all.
	slices.SortFunc(writes, func(a, b store.Write) int {
		return cmp.Or(cmp.Compare(store.TopicOf(a.Topic), store.TopicOf(b.Topic)), cmp.Compare(a.Topic, b.Topic))
	})
	seqs := make(map[string][]int64, window.Len())
	for _, m := range window.Acks {
		seqs[m.Topic] = append(seqs[m.Topic], m.Seq)
	}
	recs, err := f.journal.Record(ctx, writes, seqs)
	recorded := make(map[string]journal.Recorded, window.Len())
	for _, r := range recs {
		for _, t := range r.Topics {
			recorded[t] = r
		}
		f.entries[r.Key] = len(r.Topics)
	}
	if err != nil {
		f.log.Warn("journal incomplete; the rest waits for the next flush", zap.Int("recorded", len(recorded)), zap.Int("topics", window.Len()), zap.Error(err))
	}
	at := f.now()
	f.viewMu.Lock()
	for _, w := range writes {
		if r, ok := recorded[w.Topic]; ok {
			f.pending[w.Topic] = &pending{write: w, entry: r.Key, recordedAt: at, unconfirmed: r.Unconfirmed}
			// For Read, a journaled write is held like one in doubt: no
			// total gathered before it was journaled can hold it, and
			// when it lands the reader is told.
			f.doubt[w.Topic] = sending{at: at, delta: w.Delta, landed: r.Unconfirmed} // sent this flush unless unconfirmed
		} else {
			failed.Deltas.Set(w.Topic, w.Delta)
		}
		window.Deltas.Delete(w.Topic)
	}
	f.inflight = failed.Deltas
	f.viewMu.Unlock()
	// Acknowledge what is surely journaled; an unconfirmed entry's
	// messages wait with its pending writes, those of topics not recorded
	// go back with their deltas.
	kept := f.ack(window.Acks, func(topic string) bool { r, ok := recorded[topic]; return !ok || r.Unconfirmed })
	for _, m := range kept {
		if _, ok := recorded[m.Topic]; ok {
			p := f.pending[m.Topic]
			p.msgs = append(p.msgs, m)
		} else {
			failed.Acks = append(failed.Acks, m)
		}
	}
	window.Acks = nil
}

// confirm settles the unconfirmed journal entries (see journal.Recorded):
// once one is surely recorded, its messages are acknowledged and its writes
// may go.
func (f *Flusher) confirm(ctx context.Context) {
	byEntry := map[string][]*pending{}
	for _, p := range f.pending {
		if p.unconfirmed {
			byEntry[p.entry] = append(byEntry[p.entry], p)
		}
	}
	for key, ps := range byEntry {
		ok, err := f.journal.Confirm(ctx, key)
		if !ok {
			f.log.Warn("journal entry still unconfirmed; its topics wait", zap.String("key", key), zap.Error(err))
			continue
		}
		var msgs []aggregator.Message
		for _, p := range ps {
			msgs = append(msgs, p.msgs...)
			p.msgs, p.unconfirmed = nil, false
		}
		slices.SortFunc(msgs, func(a, b aggregator.Message) int { return cmp.Compare(a.Seq, b.Seq) })
		f.ackAll(msgs)
	}
}

// retireTimeout bounds the retirements of one flush.
const retireTimeout = 500 * time.Millisecond

// retire deletes the journal entries whose writes are all in the store;
// one that fails stays listed for the next flush (left in the journal, it
// would only be replayed, and refused by the marks, once this writer is
// gone).
func (f *Flusher) retire(ctx context.Context) {
	if len(f.unretired) == 0 {
		return
	}
	// Retiring waits for the consumer's ack floor, a request to NATS: a
	// slow JetStream (a cluster electing leaders) must not eat the flush's
	// time for writes. An entry left is only retired later.
	ctx, cancel := context.WithTimeout(ctx, retireTimeout)
	defer cancel()
	var left []string
	for _, key := range f.unretired {
		switch err := f.journal.Settled(ctx, key); {
		case errors.Is(err, journal.ErrNotAcknowledged):
			left = append(left, key) // the usual case for the latest entries
		case err != nil:
			f.log.Warn("journal entry not retired; trying again next flush", zap.Error(err))
			left = append(left, key)
		}
	}
	f.unretired = left
}

// waiting returns the topics with a write pending (in doubt or
// journaled), of their total or of a time bucket.
func (f *Flusher) waiting() map[string]bool {
	w := make(map[string]bool, len(f.pending))
	for name := range f.pending {
		w[store.TopicOf(name)] = true
	}
	return w
}

// stillWaiting returns the messages of ms whose topic has no write pending
// any more, and hands the others to one of their topic's pending writes:
// a message is done when all its counts are.
func (f *Flusher) stillWaiting(ms []aggregator.Message) (done []aggregator.Message) {
	if len(ms) == 0 {
		return nil
	}
	by := make(map[string]*pending, len(f.pending))
	for name, p := range f.pending {
		by[store.TopicOf(name)] = p
	}
	for _, m := range ms {
		if p := by[m.Topic]; p != nil {
			p.msgs = append(p.msgs, m)
		} else {
			done = append(done, m)
		}
	}
	return done
}

// pendingOf returns topic's pending write, made from w if there is none.
func (f *Flusher) pendingOf(topic string, w store.Write) *pending {
	p, ok := f.pending[topic]
	if !ok {
		w.Retry = true
		p = &pending{write: w}
		f.pending[topic] = p
	}
	return p
}

// settle sends a write in doubt again, unchanged. nil: it is in the store
// exactly once (store.ErrUnresolvable counts as that, and is logged).
func (f *Flusher) settle(ctx context.Context, w store.Write) error {
	wctx, cancel := context.WithTimeout(ctx, f.cfg.WriteTimeout)
	defer cancel()
	err := f.store.Add(wctx, w, f.now())
	if errors.Is(err, store.ErrThrottled) && f.shards != nil {
		f.shards.Throttled(ctx, store.TopicOf(w.Topic)) // may raise the topic for its next writes
	}
	var behind *store.FloorError
	if errors.As(err, &behind) {
		f.seq.Raise(behind.Floor)
	}
	if errors.Is(err, store.ErrUnresolvable) {
		f.log.Error("write in doubt too long to tell whether it was applied; counted as applied",
			zap.String("key", w.Key()), zap.Int64("delta", w.Delta), zap.Int64("seq", w.Seq))
		return nil
	}
	return err
}

// ack acknowledges, in order, the messages whose topic keep does not
// want, and returns the others. An ack that cannot be sent leaves its
// message to be redelivered and counted again (the at-least-once
// over-count); it is counted.
func (f *Flusher) ack(ms []aggregator.Message, keep func(topic string) bool) (kept []aggregator.Message) {
	var done []aggregator.Message
	for _, m := range ms {
		if keep(m.Topic) {
			kept = append(kept, m)
		} else {
			done = append(done, m)
		}
	}
	f.ackAll(done)
	return kept
}

func (f *Flusher) ackAll(ms []aggregator.Message) {
	for _, m := range ms {
		if err := m.Msg.Ack(); err != nil {
			f.metrics.ackErrors.Inc()
		}
	}
	f.metrics.acked.Add(float64(len(ms)))
}

// keepAliveWhile resets the redelivery timer of ms every Config.KeepAlive
// until the returned stop is called (which waits for the goroutine).
func (f *Flusher) keepAliveWhile(ms []aggregator.Message) (stop func()) {
	if f.cfg.KeepAlive <= 0 || len(ms) == 0 {
		return func() {}
	}
	held := make([]aggregator.Acker, len(ms))
	for i, m := range ms {
		held[i] = m.Msg
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(f.cfg.KeepAlive)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				for _, m := range held {
					m.InProgress() //nolint:errcheck // best effort; an acked message ignores it
				}
			}
		}
	})
	return func() { close(done); wg.Wait() }
}

// keepAlive resets the redelivery timer of the messages of a window that
// goes back to wait: they stay this sidecar's, and are not handed to
// another replica (which would count them twice) while this one holds them.
func (f *Flusher) keepAlive(w aggregator.Window) {
	for _, m := range w.Acks {
		m.Msg.InProgress() //nolint:errcheck // best effort: at worst a redelivery, counted twice
	}
}

// Failing reports whether the last flush had work and wrote none of it
// (the store is not taking writes). The JetStream ingest stops fetching
// while it does; one topic that keeps failing among others that are
// written does not stop it.
func (f *Flusher) Failing() bool { return f.failing.Load() }

// probe keeps in w the first Config.Concurrency counters of its window,
// the writes a flush tries before it takes the store for down, and returns
// the rest, untouched.
func (f *Flusher) probe(w *aggregator.Window) (rest *aggregator.Deltas) {
	p := aggregator.NewDeltas(f.cfg.Concurrency)
	for name, d := range w.Deltas.All() {
		if p.Len() >= f.cfg.Concurrency {
			break
		}
		p.Set(name, d)
		w.Deltas.Delete(name)
	}
	rest, w.Deltas = w.Deltas, p
	return rest
}

// split turns each minute counter (store.Fresh) of a drained window into
// the counters it is written to: its topic's total, and as --windows asks
// its minute and hour buckets. What a flush cannot write goes back under
// those names, never as Fresh, so a mention reaches each once.
func (f *Flusher) split(d *aggregator.Deltas) {
	var fresh []string
	for name := range d.All() {
		if _, g, _, ok := store.ParseCounter(name); ok && g == store.Fresh {
			fresh = append(fresh, name)
		}
	}
	for _, name := range fresh {
		delta, _ := d.Get(name)
		d.Delete(name)
		topic, minute, hour := store.SplitFresh(name)
		addTo(d, topic, delta)
		if f.cfg.Minutes {
			addTo(d, minute, delta)
		}
		if f.cfg.Hours {
			addTo(d, hour, delta)
		}
	}
}

// addTo adds delta to name's delta in d, saturating like the aggregator.
func addTo(d *aggregator.Deltas, name string, delta int64) {
	v, _ := d.Ref(name)
	if *v > math.MaxInt64-delta {
		*v = math.MaxInt64
		return
	}
	*v += delta
}

// counts returns the shard count of each topic of w.
func (f *Flusher) counts(ctx context.Context, w aggregator.Window) (map[string]int, error) {
	// While the store refuses writes, it answers no lookups either: the
	// window goes to its default shards, which is always safe.
	if f.shards == nil || w.Len() == 0 || f.down.Load() {
		return nil, nil
	}
	var busy []topicDelta
	for t, d := range w.Deltas.All() {
		if store.IsBucket(t) {
			continue // written with its topic's shard count
		}
		// Topics start on one shard (the default): one mention in a
		// window is no hot key, so it goes to shard 0, always in the read
		// set, without a metadata read. A long tail of new topics then
		// costs one write each and nothing more; a topic another sidecar
		// raised still gets its writes spread once it is busy here too.
		if f.cfg.Shards == 1 && d < 2 {
			continue
		}
		busy = append(busy, topicDelta{t, d})
	}
	// Spreading matters for the hottest topics only: the busiest
	// maxLookups are looked up, the rest go to their default shards.
	if len(busy) > maxLookups {
		slices.SortFunc(busy, func(a, b topicDelta) int { return cmp.Compare(b.delta, a.delta) })
		busy = busy[:maxLookups]
	}
	topics := make([]string, len(busy))
	for i, b := range busy {
		topics[i] = b.topic
	}
	// A quarter of the flush's budget: the counts it cannot give by then
	// fall back to one shard, and the writes keep the rest of the budget
	// (metadata never stands in front of counts).
	ctx, cancel := context.WithTimeout(ctx, f.cfg.Timeout/4)
	defer cancel()
	return f.shards.WriteCounts(ctx, topics)
}

// write adds delta to a random one of topic's n shards (Config.Shards when
// n is 0) as a new store.Write; when the shard is throttled (nothing
// applied) it tries up to maxReroutes other shards with new seqs, since the
// throttle is per partition and the other shards are other partitions, and
// tells the shard counts, which may raise them. It returns the last write
// sent: in doubt (store.ErrAmbiguous), it is the one to send again.
func (f *Flusher) write(ctx context.Context, topic string, delta int64, n int) (store.Write, error) {
	if n == 0 {
		n = f.cfg.Shards
	}
	w := store.Write{Topic: topic, Shard: rand.IntN(n), Delta: delta, Writer: f.cfg.Writer}
	for attempt := 0; ; attempt++ {
		w.Seq = f.seq.Next()
		wctx, cancel := context.WithTimeout(ctx, f.cfg.WriteTimeout)
		err := f.store.Add(wctx, w, f.now())
		cancel()
		var behind *store.FloorError
		if errors.As(err, &behind) {
			f.seq.Raise(behind.Floor)
		}
		if errors.Is(err, store.ErrUnresolvable) {
			return w, nil // logged by the store's metric; see settle
		}
		if err == nil || !errors.Is(err, store.ErrThrottled) || attempt == maxReroutes {
			return w, err
		}
		if f.shards != nil && attempt == 0 {
			n = max(n, f.shards.Throttled(ctx, store.TopicOf(topic)))
		}
		if n == 1 {
			return w, err
		}
		f.metrics.rerouted.Inc()
		w.Shard = (w.Shard + 1 + rand.IntN(n-1)) % n
	}
}

// Final flushes until the buffer is empty and no write is in doubt, or ctx
// ends (or is too close for another try), for shutdown, after ingest has
// stopped. What is still buffered then goes to the spill folder in core mode
// (lost only without one: counted in hotcount_flusher_unflushed_total), and
// in JetStream mode its messages are handed back (Nak) for redelivery, so
// nothing is lost; the error says where every mention is. Writes still in
// doubt are reported too: each may or may not be in the store.
//
// A retry the deadline would cut off in flight leaves its writes in doubt;
// one never started leaves its mentions whole, for the spill folder (core
// mode) or NATS (JetStream mode). So a retry starts only with time left for it (retryRoom), and
// Final gives up before the deadline when there is none.
func (f *Flusher) Final(ctx context.Context) error {
	backoff := 50 * time.Millisecond
	for {
		start := time.Now()
		err := f.Flush(ctx)
		room := retryRoom(time.Since(start), f.cfg.WriteTimeout)
		wait := backoff
		if err == nil {
			p, ok := f.buf.(persister)
			if !ok || !p.Spilled() {
				return nil
			}
			// The store takes writes and the spill comes back window by
			// window: go on at once.
			err, wait = errors.New("spilled mentions left"), 0
		} else {
			f.log.Warn("final flush incomplete", zap.Error(err))
			backoff = min(2*backoff, time.Second)
		}
		if dl, ok := ctx.Deadline(); ok && time.Until(dl) < wait+room {
			return f.abandon(err)
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return f.abandon(err)
		case <-t.C:
		}
	}
}

// retryRoom is the time a final flush's retry needs before the deadline:
// four times the last attempt (a loaded machine's attempts vary), at least
// 50 ms, at most a write's timeout.
func retryRoom(last, writeTimeout time.Duration) time.Duration {
	return min(writeTimeout, max(4*last, 50*time.Millisecond))
}

// abandon ends Final at (or just before) the deadline: what is buffered
// goes to the spill folder (core mode) or back to NATS (JetStream mode),
// and the error says where every mention is.
func (f *Flusher) abandon(err error) error {
	var spilled int64
	if p, ok := f.buf.(persister); ok {
		// Core mode with a spill folder: what is left waits there
		// for the next process on the folder, instead of being lost.
		var err error
		if spilled, err = p.Persist(); err != nil {
			f.log.Error("unwritten mentions could not be spilled at shutdown", zap.Error(err))
		}
	}
	w := f.buf.Drain()
	var handedBack int
	for _, m := range w.Acks {
		if m.Msg.Nak() == nil {
			handedBack++
		}
	}
	f.metrics.unflushed.Add(float64(w.Mentions()))
	f.flushMu.Lock()
	var doubt, journaled int64
	for name, p := range f.pending {
		switch {
		case store.IsBucket(name):
			// A time bucket's write: its mentions are counted
			// with their topic's.
		case p.entry != "":
			journaled += p.write.Delta // another sidecar replays it
		default:
			doubt += p.write.Delta
		}
		for _, m := range p.msgs {
			if m.Msg.Nak() == nil {
				handedBack++
			}
		}
	}
	f.flushMu.Unlock()
	f.metrics.doubtAtExit.Add(float64(doubt))
	var bucketed int64 // time buckets' increments left unwritten (their mentions are in a total)
	for name, d := range w.Deltas.All() {
		if !store.CountsMentions(name) {
			bucketed += d
		}
	}
	return fmt.Errorf("flusher: shutdown deadline passed (or too close for another try) with %d mentions over %d topics unwritten (and %d increments of time buckets), %d in writes in doubt, %d left in the journal for replay (%d messages handed back for redelivery) and %d kept in the spill folder for the next start: %w",
		w.Mentions(), w.Len(), bucketed, doubt, journaled, handedBack, spilled, err)
}

// Writer is the flusher's writer id.
func (f *Flusher) Writer() string { return f.cfg.Writer }

// LastProgress is the time of the last flush that wrote something or had
// nothing to write, or of New when none has yet: what liveness follows, so
// that one topic the store keeps refusing does not restart the sidecar.
func (f *Flusher) LastProgress() time.Time {
	return time.Unix(0, f.lastProgress.Load())
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
	doubtAtExit prometheus.Counter
	lastSuccess prometheus.Gauge
	acked       prometheus.Counter
	ackErrors   prometheus.Counter
	pending     prometheus.Gauge
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
		doubtAtExit: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "hotcount_flusher_doubt_at_shutdown_total",
			Help: "Mentions in writes still in doubt (no answer) when the shutdown deadline passed, in core mode: each may or may not be in the store.",
		}),
		acked: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "hotcount_flusher_acked_total",
			Help: "JetStream messages acknowledged after their delta was written.",
		}),
		ackErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "hotcount_flusher_ack_errors_total",
			Help: "JetStream acknowledgements that could not be sent; those messages will be redelivered and counted again.",
		}),
		pending: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "hotcount_flusher_pending_writes",
			Help: "Writes in doubt (outcome unknown) waiting to be sent again unchanged; their topics' newer deltas wait behind them.",
		}),
		lastSuccess: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "hotcount_flusher_last_success_timestamp_seconds",
			Help: "Unix time of the last flush that wrote everything it drained.",
		}),
	}
	reg.MustRegister(m.flushes, m.duration, m.flushed, m.requeued, m.rerouted, m.early, m.unflushed, m.lastSuccess, m.acked, m.ackErrors, m.pending, m.doubtAtExit)
	m.flushes.WithLabelValues("ok")
	m.flushes.WithLabelValues("error")
	return m
}
