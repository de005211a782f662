// Package shardcount decides how many shards each topic's count is spread
// over, and records it in the topic's metadata item (schema.Meta), so that
// every writer and reader agrees: quiet topics keep one row, hot topics grow
// their own shards, and changing the default never moves a topic's read
// set. Writers cache the metadata briefly: a stale cache can only delay a
// raise, never hide a count, because readers follow the metadata item
// itself.
package shardcount

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/maypok86/otter/v2"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"golang.org/x/sync/errgroup"

	"github.com/hotcount/hotcount/internal/clockcache"
	"github.com/hotcount/hotcount/pipeline/store"
	"github.com/hotcount/hotcount/schema"
)

// Defaults.
const (
	// DefaultMax is the most shards --adaptive raises a topic to.
	DefaultMax = 64
	// DefaultEvery is Config.Every's default (--shards-cache).
	DefaultEvery = 30 * time.Second
	// cacheSize bounds the cached topics.
	cacheSize = 200_000
	// recordConcurrency is how many new topics are recorded at once.
	recordConcurrency = 16
)

// Store is the metadata part of the store. Both stores satisfy it.
type Store interface {
	Metas(ctx context.Context, topics []string) (map[string]schema.Meta, error)
	SetMeta(ctx context.Context, topic string, old, m schema.Meta) error
}

// Config says how topics are sharded.
type Config struct {
	// Default is the shard count of a new topic (--shards). At one (the
	// default) a new topic has no metadata item and costs one row.
	Default int
	// Adaptive raises a topic's count, doubling up to Max, when its writes
	// are throttled.
	Adaptive bool
	Max      int
	// Every is how long a writer trusts its copy of a topic's metadata,
	// and the least time between two raises of a topic by one sidecar
	// (0: 30 s).
	Every time.Duration
}

// historyAge is how long a topic's raises are kept for people to look at.
const historyAge = time.Hour

// Book is the writers' view of the topics' shard counts. It is safe for
// concurrent use. Its caches expire entries by the clock it is given, as
// they are read and written: it starts no goroutine and has nothing to
// run or stop.
type Book struct {
	cfg       Config
	st        Store
	log       *zap.Logger
	now       func() time.Time
	cache     *otter.Cache[string, schema.Meta]
	raised    *otter.Cache[string, struct{}] // topics raised lately: one raise per cache period
	history   *otter.Cache[string, []Raise]  // raises this sidecar made or saw, by topic (the console shows them)
	raises    prometheus.Counter
	created   prometheus.Counter
	fallbacks prometheus.Counter
}

// New returns a book over st, its metrics registered with reg. now is its
// clock (time.Now, or a test's): it times the cache period and the raise
// history.
func New(cfg Config, st Store, log *zap.Logger, reg prometheus.Registerer, now func() time.Time) *Book {
	every := cmp.Or(cfg.Every, DefaultEvery)
	b := &Book{
		cfg:    cfg,
		st:     st,
		log:    log.Named("shards"),
		now:    now,
		cache:  clockcache.New[string, schema.Meta](cacheSize, every, now),
		raised: clockcache.New[string, struct{}](cacheSize, every, now),
		// An hour of raises per topic, for people to look at: raises are
		// rare, the map small.
		history: clockcache.New[string, []Raise](cacheSize, historyAge, now),
		raises: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "hotcount_shards_raised_total",
			Help: "Topics whose shard count this sidecar raised (--adaptive, on throttling).",
		}),
		created: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "hotcount_shards_recorded_total",
			Help: "Topics whose shard count this sidecar recorded first (a new topic written with more than one shard).",
		}),
	}
	b.fallbacks = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "hotcount_shards_fallbacks_total",
		Help: "Topics written to one shard for a flush because their shard count could not be looked up or recorded in time (always safe: shard 0 is in every read set).",
	})
	reg.MustRegister(b.raises, b.created, b.fallbacks)
	return b
}

// initial is the shard count a new topic starts with.
func (b *Book) initial() int { return max(b.cfg.Default, 1) }

// WriteCounts returns how many shards to write each topic to. Topics not in
// the cache are looked up in one batch. A topic without metadata gets the
// initial count; above one, its metadata is recorded first (conditionally:
// another writer's record wins), so that a later change of --shards cannot
// move the shards its counts are in.
//
// Metadata never stands in front of counts: a topic whose lookup or
// recording fails, or is not done when ctx ends, is written to one shard
// (shard 0 is in every topic's read set, so that is always safe) and looked
// up again next time. The error only reports such failures; the counts it
// returns are always usable.
func (b *Book) WriteCounts(ctx context.Context, topics []string) (map[string]int, error) {
	out, missing := b.fromCache(topics)
	if len(missing) == 0 {
		return out, nil
	}
	metas, err := b.st.Metas(ctx, missing)
	if err != nil {
		b.fallbacks.Add(float64(len(missing)))
		for _, t := range missing {
			out[t] = 1
		}
		return out, fmt.Errorf("shards: %d topics written to one shard this time: %w", len(missing), err)
	}
	err = b.settle(ctx, missing, metas, out)
	return out, err
}

// fromCache returns the write counts of the cached topics, and the topics
// missing from the cache.
func (b *Book) fromCache(topics []string) (out map[string]int, missing []string) {
	out = make(map[string]int, len(topics))
	for _, t := range topics {
		if m, ok := b.cache.GetIfPresent(t); ok {
			out[t] = m.Write()
		} else {
			missing = append(missing, t)
		}
	}
	return out, missing
}

// settle sets out's count for topics, whose metadata was just looked up
// (metas), and caches it. A new topic whose initial count is above one is
// recorded first; one that cannot be, in time, gets one shard, and the
// error says how many did.
func (b *Book) settle(ctx context.Context, topics []string, metas map[string]schema.Meta, out map[string]int) error {
	// Record new topics in parallel: a first flush can hold thousands.
	var (
		mu     sync.Mutex
		failed int
		first  error
	)
	var g errgroup.Group
	g.SetLimit(recordConcurrency)
	for _, t := range topics {
		m := metas[t]
		if m.Exists() || b.initial() == 1 {
			b.cache.Set(t, m)
			mu.Lock() // recordings started earlier write to out too
			out[t] = m.Write()
			mu.Unlock()
			continue
		}
		if ctx.Err() != nil {
			mu.Lock()
			out[t], failed = 1, failed+1
			mu.Unlock()
			continue
		}
		g.Go(func() error {
			n, err := b.record(ctx, t, m)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				out[t], failed = 1, failed+1
				if first == nil {
					first = err
				}
				return nil
			}
			out[t] = n
			return nil
		})
	}
	_ = g.Wait() // outcomes are per topic, in out
	if failed > 0 {
		b.fallbacks.Add(float64(failed))
		if first == nil {
			first = ctx.Err()
		}
		return fmt.Errorf("shards: %d new topics not recorded, written to one shard this time: %w", failed, first)
	}
	return nil
}

// record writes a new topic's initial count to its metadata (m: none
// yet), caches the value the store then holds (another sidecar's record
// wins) and returns its write count.
func (b *Book) record(ctx context.Context, topic string, m schema.Meta) (int, error) {
	m, recorded, err := b.change(ctx, topic, m, m.With(b.initial()))
	if err != nil {
		return 0, err
	}
	if recorded { // else another sidecar recorded it first
		b.created.Inc()
	}
	b.cache.Set(topic, m)
	return m.Write(), nil
}

// change sets topic's metadata from old to m; if another writer changed it
// first, its value is read back and kept: racing writers agree.
func (b *Book) change(ctx context.Context, topic string, old, m schema.Meta) (schema.Meta, bool, error) {
	err := b.st.SetMeta(ctx, topic, old, m)
	if errors.Is(err, store.ErrConflict) {
		metas, rerr := b.st.Metas(ctx, []string{topic})
		if rerr != nil {
			return schema.Meta{}, false, fmt.Errorf("shards: %w", rerr)
		}
		return metas[topic], false, nil
	}
	if err != nil {
		return schema.Meta{}, false, fmt.Errorf("shards: %w", err)
	}
	return m, true, nil
}

// Throttled is told that topic's writes were refused for throughput on
// several shards. With Adaptive, the topic's count doubles (up to Max), at
// most once per cache period per sidecar; the decision is logged and
// counted. It returns the count to write with now.
func (b *Book) Throttled(ctx context.Context, topic string) int {
	m, _ := b.cache.GetIfPresent(topic)
	if !b.cfg.Adaptive || m.Write() >= b.cfg.Max {
		return m.Write()
	}
	if _, first := b.raised.SetIfAbsent(topic, struct{}{}); !first {
		return m.Write() // raised (or tried) this cache period already
	}
	metas, err := b.st.Metas(ctx, []string{topic})
	if err != nil {
		b.log.Warn("raise: read metadata", zap.String("topic", topic), zap.Error(err))
		return m.Write()
	}
	cur := metas[topic]
	if cur.Write() > m.Write() { // raised by another sidecar since we looked
		b.cache.Set(topic, cur)
		b.remember(topic, Raise{At: b.now(), From: m.Write(), To: cur.Write(), Here: false})
		return cur.Write()
	}
	next, applied, err := b.change(ctx, topic, cur, cur.With(min(2*cur.Write(), b.cfg.Max)))
	if err != nil {
		b.log.Warn("raise", zap.String("topic", topic), zap.Error(err))
		return m.Write()
	}
	b.cache.Set(topic, next)
	if next.Write() > cur.Write() && !applied { // another sidecar's raise won the race
		b.remember(topic, Raise{At: b.now(), From: cur.Write(), To: next.Write(), Here: false})
	}
	if next.Write() > cur.Write() && applied {
		b.raises.Inc()
		b.remember(topic, Raise{At: b.now(), From: cur.Write(), To: next.Write(), Here: true})
		b.log.Info("raised shards", zap.String("topic", topic), zap.Int("from", cur.Write()), zap.Int("to", next.Write()))
	}
	return next.Write()
}

// Raise is a change of a topic's write shard count that this sidecar made
// (Here) or found made by another.
type Raise struct {
	At       time.Time
	From, To int
	Here     bool
}

// maxHistory bounds the raises kept per topic.
const maxHistory = 16

func (b *Book) remember(topic string, r Raise) {
	b.history.Compute(topic, func(h []Raise, _ bool) ([]Raise, otter.ComputeOp) {
		h = append(slices.Clip(h), r) // History's readers hold the old slice
		if len(h) > maxHistory {
			h = h[len(h)-maxHistory:]
		}
		return h, otter.WriteOp
	})
}

// History returns the raises of topic this sidecar made or saw in the last
// hour, oldest first.
func (b *Book) History(topic string) []Raise {
	e, ok := b.history.GetEntryQuietly(topic)
	if !ok {
		return nil
	}
	return slices.Clone(e.Value)
}

// Cached is the shard count this sidecar last used for topic, or the
// initial count.
func (b *Book) Cached(topic string) int {
	if e, ok := b.cache.GetEntryQuietly(topic); ok {
		return e.Value.Write()
	}
	return b.initial()
}

// Set sets topic's shard count to n for writers (an operator's decision);
// the read set never shrinks. It returns the metadata before and after.
func Set(ctx context.Context, st Store, topic string, n int) (before, after schema.Meta, err error) {
	if n < 1 || n > schema.MaxShards {
		return before, after, fmt.Errorf("shards: %d is outside 1..%d", n, schema.MaxShards)
	}
	for range 5 {
		metas, err := st.Metas(ctx, []string{topic})
		if err != nil {
			return before, after, fmt.Errorf("shards: %w", err)
		}
		before = metas[topic]
		after = before.With(n)
		err = st.SetMeta(ctx, topic, before, after)
		if !errors.Is(err, store.ErrConflict) {
			return before, after, err
		}
	}
	return before, after, fmt.Errorf("shards: %q keeps changing under us; try again", topic)
}
