// Package lookup is the read path: a topic's total is the sum of its shards,
// gathered in one round trip and cached, so that a storm of reads of a hot
// topic costs the store at most one gather per topic per TTL, whatever the
// request rate. Once a topic is cached no reader waits on the store again:
// past the TTL the total is served at once (marked stale) while one
// background gather refreshes it. It serves the totals over HTTP to the
// application next to the sidecar.
//
// The cache is otter's: it shares a gather between every reader of a
// topic, single or batch, refreshes after the TTL, and evicts by
// frequency. Topics found with no count live in a bounded cache of their
// own, so that lookups of random names never push a real total out. A
// total never goes backwards: counts only grow, so a gather lower than the
// cached one is a stale read (a lagging replica, or a shard-count item
// read before a raise reached it), read again strongly, and never served.
package lookup

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/maypok86/otter/v2"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/hotcount/hotcount/internal/clockcache"
	"github.com/hotcount/hotcount/store"
)

// Defaults, used by the config package.
const (
	// DefaultCacheTTL is how long a gathered total is served as fresh.
	DefaultCacheTTL = time.Second
	// DefaultStaleFactor sets the default --cache-stale: 10 × the TTL.
	DefaultStaleFactor = 10
	// DefaultCacheSize is how many topics' totals the cache holds.
	DefaultCacheSize = 10_000
	// DefaultAddr is the lookup API's listen address: localhost, for the app
	// in the same pod.
	DefaultAddr = "127.0.0.1:8080"
	// MaxBatch is the most topics one batch lookup may name.
	MaxBatch = 100
)

// gatherTimeout bounds one gather. A gather is shared by every reader
// waiting on the topic, so it runs on its own deadline, not a reader's.
const gatherTimeout = 5 * time.Second

// refreshers bounds the background refreshes running at once: a storm
// over many stale topics queues them instead of starting one each.
const refreshers = 16

// Store is what the lookup reads from. Gather returns shards 0..n-1 of
// topic, in order, zeros for shards never written; GatherMany does it for
// several topics in as few round trips as the store allows. Both must be
// safe for concurrent use; the caller owns what they return.
type Store interface {
	Gather(ctx context.Context, topic string, n int, consistent bool) ([]store.Shard, error)
	GatherMany(ctx context.Context, topics []string, n int, consistent bool) (map[string][]store.Shard, error)
}

// Consistency is how fresh a lookup must be.
type Consistency int

const (
	// Cached (the default) serves from the cache: fresh within the TTL,
	// stale (and refreshing) up to --cache-stale. Costs N read units per
	// topic per TTL, whatever the request rate.
	Cached Consistency = iota
	// Eventual skips the cache and gathers now with eventually consistent
	// reads: N × 0.5 read units per lookup.
	Eventual
	// Strong skips the cache and gathers now with strongly consistent reads
	// of every shard: N read units per lookup. Each shard is then current,
	// but the N reads are still not one snapshot.
	Strong
)

// ParseConsistency reads the consistency query parameter.
func ParseConsistency(s string) (Consistency, error) {
	switch s {
	case "", "cached":
		return Cached, nil
	case "eventual":
		return Eventual, nil
	case "strong":
		return Strong, nil
	}
	return 0, fmt.Errorf("consistency %q is not cached, eventual or strong", s)
}

// Config is the lookup's part of the configuration.
type Config struct {
	Shards        int
	CacheTTL      time.Duration // fresh for this long
	CacheStale    time.Duration // then served stale, refreshing, up to this age
	CacheSize     int
	MaxTopicBytes int
	// Share jitters refreshes, for a fleet that shares totals (ShareWith).
	Share bool
}

// Total is a topic's total as served.
type Total struct {
	Topic string
	Count int64
	// Source is "cache" or "store".
	Source string
	// Stale says the total is older than the TTL: a refresh is under way,
	// or the last one failed.
	Stale bool
	// AgeMs is how long ago the total was gathered.
	AgeMs int64
	// Shards is how many shards were summed.
	Shards int
	// Saturated says the sum passed the int64 range and is capped.
	Saturated bool
	// Pending is this sidecar's not yet flushed delta, added to Count when
	// asked for (include=pending).
	Pending         int64
	PendingIncluded bool

	gatheredAt time.Time // when the gather behind Count ended
}

// entry is a cached total.
type entry struct {
	count     int64
	shards    int
	saturated bool
	started   time.Time // when the gather that made it began
	at        time.Time // when it ended (for a peer's total: when it came)
	peer      bool      // gathered by another sidecar (Offer)
}

func (e entry) total(topic, source string, now time.Time) Total {
	return Total{Topic: topic, Count: e.count, Source: source, Shards: e.shards, Saturated: e.saturated, AgeMs: now.Sub(e.at).Milliseconds(), gatheredAt: e.at}
}

func newEntry(shards []store.Shard, now time.Time) entry {
	sum, saturated := store.Sum(shards)
	return entry{count: sum, shards: len(shards), saturated: saturated, at: now}
}

// Service answers lookups. It is safe for concurrent use. Its background
// work (refreshes, the cache's clean-up) runs in Run; Close ends what is
// left of it.
type Service struct {
	cfg     Config
	store   Store
	metrics *metrics
	now     func() time.Time
	// cache holds topics with a count; absent, topics gathered with none
	// (unknown names), for a TTL, in a space of their own.
	cache  *otter.Cache[string, entry]
	absent *otter.Cache[string, entry]
	// floors holds, per topic, the highest totals served, plain and with
	// pending mentions, for --cache-stale from the first: the next is
	// never lower, whatever a lagging replica says meanwhile, and a total
	// that was wrong (too high) is not held longer than that.
	floors *otter.Cache[string, *floor]
	// writes counts Wrote calls, in stripes by topic: a gather that a
	// write of one of its topics raced may have missed it (see load).
	writes [64]atomic.Uint64
	seed   maphash.Seed
	// writer is this sidecar's writer, watched for writes on their way to
	// the store; nil: none. landed wakes the gathers waiting for one of
	// them (settle) as it lands (Wrote); unlanded is how often such a
	// gather looks again (see untilLanded).
	writer   Writer
	landed   landings
	unlanded time.Duration
	// share publishes gathered totals to the fleet; nil: not shared.
	share  Sharer
	pool   *pool
	bgCtx  context.Context
	stopBg context.CancelFunc
}

// New returns a lookup service over st, its metrics registered with reg.
// A total is fresh for CacheTTL; then the next read starts a background
// refresh and is served the old total, marked stale; an entry no refresh
// has renewed by CacheStale is gone. It starts nothing: see Run.
func New(cfg Config, st Store, reg prometheus.Registerer, now func() time.Time) *Service {
	m := newMetrics(reg)
	s := &Service{cfg: cfg, store: st, metrics: m, now: now, pool: newPool(), seed: maphash.MakeSeed(), unlanded: unlandedPoll}
	s.bgCtx, s.stopBg = context.WithCancel(context.Background())
	clk := clockcache.Clock{Now: now} // never ticks: Run cleans the caches up
	s.cache = otter.Must(&otter.Options[string, entry]{
		MaximumSize:       cfg.CacheSize,
		ExpiryCalculator:  lifetime{d: max(cfg.CacheStale, cfg.CacheTTL)},
		RefreshCalculator: lifetime{d: cfg.CacheTTL, jitter: cfg.Share},
		Executor:          s.pool.run,
		Clock:             clk,
		OnDeletion: func(e otter.DeletionEvent[string, entry]) {
			if e.WasEvicted() {
				m.evictions.Inc()
			}
		},
	})
	s.absent = otter.Must(&otter.Options[string, entry]{
		MaximumSize:      max(cfg.CacheSize/4, 100),
		ExpiryCalculator: lifetime{d: cfg.CacheTTL},
		Clock:            clk,
	})
	s.floors = otter.Must(&otter.Options[string, *floor]{
		MaximumSize:      cfg.CacheSize,
		ExpiryCalculator: otter.ExpiryWriting[string, *floor](max(cfg.CacheStale, cfg.CacheTTL)),
		Clock:            clk,
	})
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "hotcount_cache_entries",
		Help: "Totals in the cache, fresh or stale (topics with a count; unknown topics are in hotcount_cache_absent_entries).",
	}, func() float64 { return float64(s.cache.EstimatedSize()) }), prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "hotcount_cache_absent_entries",
		Help: "Topics found with no count, remembered for a TTL in a bounded space of their own (a quarter of --cache-size).",
	}, func() float64 { return float64(s.absent.EstimatedSize()) }))
	return s
}

// Sharer publishes a total this sidecar gathered to the rest of the fleet
// (fleet.Shares).
type Sharer interface {
	Share(topic string, count int64, shards int)
}

// ShareWith has every total this service gathers published with p. Call
// it before serving.
func (s *Service) ShareWith(p Sharer) { s.share = p }

// Offer takes a total another sidecar gathered, as a gather of this
// sidecar's own, for a topic it caches: unless it is lower than the cached
// total, it becomes the cached total, fresh, and this sidecar's refresh
// waits a TTL. It counts as gathered when it arrived (later than it was,
// so pending mentions are never counted in it twice). Sharing costs
// read-your-writes some precision: a write of this sidecar that lands
// after such a total came may or may not be in it, and the answer with
// pending mentions holds at its last value until the next total.
func (s *Service) Offer(topic string, count int64, shards int) {
	now := s.now()
	s.cache.ComputeIfPresent(topic, func(old entry) (entry, otter.ComputeOp) {
		if count < old.count {
			return old, otter.CancelOp
		}
		return entry{count: count, shards: max(shards, old.shards), at: now, peer: true}, otter.WriteOp
	})
}

// Writer is what the service asks of this sidecar's writer
// (flusher.Flusher). Sending reports whether a write of topic is on its
// way to the store, so that a total read now may or may not include it;
// it must be safe for concurrent use.
type Writer interface {
	Sending(topic string) bool
}

// WatchWrites has the service watch w's writes on their way: a gather that
// ran while one was can neither count it nor leave it out, so it waits for
// the write to land and reads again. The service must be w's reader (told
// of each write as it lands, through Wrote: flusher.WithReader), or such a
// gather waits unlandedPoll at each turn. Call it before serving.
func (s *Service) WatchWrites(w Writer) { s.writer = w }

// unlandedPoll is how often a gather waiting for a write on its way
// (untilLanded) asks the Writer again, for a write that stops being on its
// way without landing (in doubt, refused, quarantined): only a landing is
// told (Wrote), and wakes it at once.
const unlandedPoll = 10 * time.Millisecond

// landings are what gathers waiting for a topic's write to land wait on:
// a channel per topic, closed by Wrote as a write of the topic lands.
type landings struct {
	waited atomic.Int64 // topics with a channel: while none, Wrote takes no lock
	mu     sync.Mutex
	topics map[string]*landing
}

// landing is a topic's channel and how many gathers wait on it.
type landing struct {
	ch      chan struct{}
	waiters int
}

// wait returns a channel closed when a write of topic lands from now on,
// and the function that ends the wait.
func (l *landings) wait(topic string) (<-chan struct{}, func()) {
	l.mu.Lock()
	defer l.mu.Unlock()
	w, ok := l.topics[topic]
	if !ok {
		if l.topics == nil {
			l.topics = make(map[string]*landing)
		}
		w = &landing{ch: make(chan struct{})}
		l.topics[topic] = w
		l.waited.Add(1)
	}
	w.waiters++
	return w.ch, func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		if w.waiters--; w.waiters == 0 && l.topics[topic] == w {
			delete(l.topics, topic)
			l.waited.Add(-1)
		}
	}
}

// land wakes the gathers waiting for a write of topic.
func (l *landings) land(topic string) {
	if l.waited.Load() == 0 {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if w, ok := l.topics[topic]; ok {
		close(w.ch)
		delete(l.topics, topic)
		l.waited.Add(-1)
	}
}

// lifetime is the refresh (TTL) or expiry (CacheStale) time of an entry,
// counted from the gather that made it: a raise by this sidecar's own
// writes (Wrote) changes neither. With jitter (totals shared with peers)
// a refresh comes at 80-100% of the TTL, so that the sidecars of a fleet
// do not all refresh a topic at once: the first shares its total and the
// others take it instead of gathering.
type lifetime struct {
	d      time.Duration
	jitter bool
}

func (l lifetime) after() time.Duration {
	if !l.jitter {
		return l.d
	}
	return l.d - time.Duration(rand.Int64N(int64(l.d)/5+1))
}

func (l lifetime) RefreshAfterCreate(otter.Entry[string, entry]) time.Duration { return l.after() }
func (l lifetime) RefreshAfterUpdate(e otter.Entry[string, entry], old entry) time.Duration {
	return l.same(e, old, e.RefreshableAfter())
}
func (l lifetime) RefreshAfterReload(otter.Entry[string, entry], entry) time.Duration {
	return l.after()
}
func (l lifetime) RefreshAfterReloadFailure(otter.Entry[string, entry], error) time.Duration {
	return l.d
}
func (l lifetime) ExpireAfterCreate(otter.Entry[string, entry]) time.Duration { return l.d }
func (l lifetime) ExpireAfterUpdate(e otter.Entry[string, entry], old entry) time.Duration {
	return l.same(e, old, e.ExpiresAfter())
}
func (l lifetime) ExpireAfterRead(e otter.Entry[string, entry]) time.Duration {
	return e.ExpiresAfter()
}

// same keeps the time left when an update is a raise (same gather), and
// starts again for a new gather.
func (l lifetime) same(e otter.Entry[string, entry], old entry, left time.Duration) time.Duration {
	if e.Value.at.Equal(old.at) {
		return left
	}
	if e.Value.peer && l.jitter {
		// A peer's total: refresh a little after a TTL, so that the
		// sidecar that shared it (due at 80-100%) stays the one that
		// gathers, and the others take over only if it stops.
		return l.d + time.Duration(rand.Int64N(int64(l.d)/5+1))
	}
	return l.after()
}

// cleanUpEvery is how often Run drops expired totals (otter's own
// period), so that the cache's size and eviction metrics follow time even
// while nobody reads.
const cleanUpEvery = time.Second

// Run runs the service's background work until ctx ends: the refreshes of
// stale totals, at most 16 at once, and the clean-up of expired totals
// every second. Then it ends the gathers of refreshes under way or queued
// (a store that hangs does not hold it up), and returns once its workers
// have, with nil. Run once, for as long as the service answers: a gather
// started after Run fails at once, as after Close. Before Run, a
// refresh runs on a goroutine of its own, which Close waits for, and
// expired totals are dropped as the cache is read and written.
func (s *Service) Run(ctx context.Context) error {
	cleanUp := time.NewTicker(cleanUpEvery)
	defer cleanUp.Stop()
	var wg sync.WaitGroup
	wg.Go(func() { s.pool.serve(ctx, refreshers) })
	defer wg.Wait()
	for {
		select {
		case <-ctx.Done():
			s.stopBg() // the workers then run what is queued at once
			return nil
		case <-cleanUp.C:
			s.cache.CleanUp()
			s.absent.CleanUp()
			s.floors.CleanUp()
		}
	}
}

// pool runs otter's background tasks (refreshes, maintenance). While
// serve runs, a fixed number of workers run them; its queue never blocks
// the cache, as otter requires, and holds at most one refresh per cached
// topic. Otherwise each task runs on a goroutine of its own (otter must
// have every task run), which close waits for.
type pool struct {
	mu      sync.Mutex
	cond    *sync.Cond
	queue   []func()
	serving bool
	closed  bool
	loose   sync.WaitGroup // tasks run outside serve, until closed
}

func newPool() *pool {
	p := &pool{}
	p.cond = sync.NewCond(&p.mu)
	return p
}

func (p *pool) run(fn func()) {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case p.serving:
		p.queue = append(p.queue, fn)
		p.cond.Signal()
	case !p.closed:
		p.loose.Go(fn)
	default:
		go fn() // after Close: the gathers end at once
	}
}

// serve runs n workers until ctx ends; they then run what is queued, and
// serve returns once they have.
func (p *pool) serve(ctx context.Context, n int) {
	p.mu.Lock()
	p.serving = true
	p.mu.Unlock()
	stop := context.AfterFunc(ctx, func() {
		p.mu.Lock()
		p.serving = false
		p.cond.Broadcast()
		p.mu.Unlock()
	})
	defer stop()
	var wg sync.WaitGroup
	for range n {
		wg.Go(p.work)
	}
	wg.Wait()
}

func (p *pool) work() {
	for {
		p.mu.Lock()
		for len(p.queue) == 0 && p.serving {
			p.cond.Wait()
		}
		if len(p.queue) == 0 {
			p.mu.Unlock()
			return
		}
		fn := p.queue[0]
		p.queue[0] = nil
		p.queue = p.queue[1:]
		p.mu.Unlock()
		fn()
	}
}

// close waits for the tasks run outside serve; later ones are not waited
// for.
func (p *pool) close() {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	p.loose.Wait()
}

// Close ends the gathers under way and waits for the refreshes that ran
// outside Run. Call it once Run has returned, or was never called.
func (s *Service) Close() {
	s.stopBg()
	s.pool.close()
}

// Known returns up to limit topics the cache holds a total of, those it
// is most likely to keep first, with their totals as cached (no gather,
// no refresh): what the console's picker lists besides the hottest ones.
func (s *Service) Known(limit int) []Total {
	now := s.now()
	var out []Total
	for e := range s.cache.Hottest() {
		if len(out) == limit {
			break
		}
		out = append(out, e.Value.total(e.Key, "cache", now))
	}
	return out
}

// Lookup returns topic's total at consistency c. With Cached: a fresh
// entry is a hit; an older one (up to CacheStale) is served at once,
// marked stale, while one background gather refreshes it; a miss waits
// for a gather shared with every concurrent lookup of the topic, batches
// included. An unknown topic has count 0.
func (s *Service) Lookup(ctx context.Context, topic string, c Consistency) (Total, error) {
	if c != Cached {
		m, err := s.gatherNow(ctx, []string{topic}, c == Strong)
		if err != nil {
			return Total{}, err
		}
		return m[topic], nil
	}
	if t, ok := s.unknown(topic); ok {
		return t, nil
	}
	source := s.classify(topic)
	e, err := s.cache.Get(ctx, topic, loader{s})
	if errors.Is(err, otter.ErrNotFound) {
		return s.notFound(topic), nil
	}
	if err != nil {
		return Total{}, fmt.Errorf("lookup: %w", err)
	}
	return s.served(topic, e, source), nil
}

// unknown answers a topic gathered with no count within the TTL (raised
// since by this sidecar's writes, if any).
func (s *Service) unknown(topic string) (Total, bool) {
	e, ok := s.absent.GetIfPresent(topic)
	if !ok {
		return Total{}, false
	}
	s.metrics.hit.Inc()
	t := e.total(topic, "cache", s.now())
	t.Count = s.hold(topic, t.Count, false)
	return t, true
}

// notFound answers a topic its load found with no count.
func (s *Service) notFound(topic string) Total {
	if e, ok := s.absent.GetIfPresent(topic); ok {
		t := e.total(topic, "store", s.now())
		t.Count = s.hold(topic, t.Count, false)
		return t
	}
	t := s.zero(topic, s.now())
	t.Count = s.hold(topic, 0, false)
	return t
}

func (s *Service) zero(topic string, at time.Time) Total {
	return Total{Topic: topic, Source: "store", Shards: s.cfg.Shards, AgeMs: s.now().Sub(at).Milliseconds(), gatheredAt: at}
}

// classify counts a cached lookup as a hit, stale or miss, and says where
// its answer comes from.
func (s *Service) classify(topic string) (source string) {
	e, ok := s.cache.GetEntryQuietly(topic)
	switch {
	case !ok:
		s.metrics.miss.Inc()
		return "store"
	case s.now().Sub(e.Value.at) < s.cfg.CacheTTL:
		s.metrics.hit.Inc()
	default:
		s.metrics.stale.Inc()
	}
	return "cache"
}

func (s *Service) served(topic string, e entry, source string) Total {
	now := s.now()
	t := e.total(topic, source, now)
	t.Count = s.hold(topic, t.Count, false)
	t.Stale = now.Sub(e.at) >= s.cfg.CacheTTL
	t.gatheredAt = e.at
	return t
}

// LookupMany returns the totals of topics (at most MaxBatch; a repeated
// topic is answered twice) in the order asked. With Cached, hits and stale
// entries come from the cache, and all misses are gathered together,
// sharing BatchGetItem calls (100 keys each) and any gather of the same
// topics already under way.
func (s *Service) LookupMany(ctx context.Context, topics []string, c Consistency) ([]Total, error) {
	if c != Cached {
		m, err := s.gatherNow(ctx, unique(topics), c == Strong)
		if err != nil {
			return nil, err
		}
		out := make([]Total, len(topics))
		for i, t := range topics {
			out[i] = m[t]
		}
		return out, nil
	}
	out := make([]Total, len(topics))
	known := make([]bool, len(topics))
	var ask []string
	source := make(map[string]string, len(topics))
	for i, topic := range topics {
		if t, ok := s.unknown(topic); ok {
			out[i], known[i] = t, true
			continue
		}
		if _, seen := source[topic]; !seen {
			source[topic] = s.classify(topic)
			ask = append(ask, topic)
		}
	}
	if len(ask) == 0 {
		return out, nil
	}
	got, err := s.cache.BulkGet(ctx, ask, loader{s})
	if err != nil && !errors.Is(err, otter.ErrNotFound) {
		return nil, fmt.Errorf("lookup: %w", err)
	}
	for i, topic := range topics {
		if known[i] {
			continue
		}
		if e, ok := got[topic]; ok {
			out[i] = s.served(topic, e, source[topic])
		} else {
			out[i] = s.notFound(topic)
		}
	}
	return out, nil
}

// loader gathers for the cache, one topic or many: a miss loads, a stale
// entry reloads.
type loader struct{ s *Service }

func (l loader) Load(ctx context.Context, topic string) (entry, error) {
	m, err := l.s.load(ctx, []string{topic}, nil)
	if err != nil {
		return entry{}, err
	}
	if e, ok := m[topic]; ok {
		return e, nil
	}
	return entry{}, otter.ErrNotFound
}

func (l loader) Reload(ctx context.Context, topic string, old entry) (entry, error) {
	m, err := l.s.load(ctx, []string{topic}, []entry{old})
	if err != nil {
		l.s.metrics.refreshErrors.Inc()
		return entry{}, err
	}
	return m[topic], nil
}

func (l loader) BulkLoad(ctx context.Context, topics []string) (map[string]entry, error) {
	return l.s.load(ctx, topics, nil)
}

func (l loader) BulkReload(ctx context.Context, topics []string, olds []entry) (map[string]entry, error) {
	m, err := l.s.load(ctx, topics, olds)
	if err != nil {
		l.s.metrics.refreshErrors.Inc()
	}
	return m, err
}

// load gathers topics; olds, when refreshing, are their cached entries in
// the same order. A topic gathered with no count and none before goes to
// the absent cache and is left out. A total lower than the cached one is
// a stale read, counted in hotcount_cache_regressions_total and gathered
// again with strongly consistent reads (the shard-count item too); what
// is served is never lower than before. It runs on its own deadline:
// readers that leave do not cancel a gather others share.
func (s *Service) load(ctx context.Context, topics []string, olds []entry) (map[string]entry, error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), gatherTimeout)
	defer cancel()
	stop := context.AfterFunc(s.bgCtx, cancel)
	defer stop()
	gen := s.written(topics)
	out, absent, err := s.loadOnce(ctx, topics, olds, false)
	if err == nil && s.written(topics) != gen {
		out = s.again(ctx, topics, olds, out, absent)
	}
	if err == nil && s.share != nil {
		for topic, e := range out {
			s.share.Share(topic, e.count, e.shards)
		}
	}
	return out, err
}

func (s *Service) stripe(topic string) *atomic.Uint64 {
	return &s.writes[maphash.String(s.seed, topic)%uint64(len(s.writes))]
}

// written sums the write counts of topics' stripes.
func (s *Service) written(topics []string) uint64 {
	var n uint64
	for _, t := range topics {
		n += s.stripe(t).Load()
	}
	return n
}

// again reads topics again, strongly, after a write of this sidecar landed
// while load ran: the gather may or may not have seen it, and Wrote found
// nothing cached yet to raise.
func (s *Service) again(ctx context.Context, topics []string, olds []entry, out map[string]entry, absent []string) map[string]entry {
	for _, topic := range absent {
		s.absent.Invalidate(topic)
	}
	if again, _, err := s.loadOnce(ctx, topics, olds, true); err == nil {
		return again
	}
	return out
}

// settle handles the topics of a gather that this sidecar was writing as
// it ran: it waits for those writes to land (they are bounded by
// --write-timeout) and gathers the topics again, strongly, returning the
// new shards and when that read began.
func (s *Service) settle(ctx context.Context, topics []string) (map[string][]store.Shard, time.Time, bool) {
	var racing []string
	for _, t := range topics {
		if s.writer.Sending(t) {
			racing = append(racing, t)
		}
	}
	if len(racing) == 0 {
		return nil, time.Time{}, false
	}
	for _, t := range racing {
		if !s.untilLanded(ctx, t) {
			return nil, time.Time{}, false
		}
	}
	begun := s.now()
	m, err := s.store.GatherMany(ctx, racing, s.cfg.Shards, true)
	if err != nil {
		return nil, time.Time{}, false
	}
	return m, begun, true
}

// untilLanded waits until no write of topic is on its way (Writer.Sending),
// or ctx ends (false). A write that lands wakes it at once (Wrote, which
// the flusher calls as the write stops being on its way, under the lock
// Sending takes); one that stops being on its way without landing is seen
// within s.unlanded.
func (s *Service) untilLanded(ctx context.Context, topic string) bool {
	poll := time.NewTimer(s.unlanded)
	defer poll.Stop()
	for {
		// Waiting before asking: a landing in between is not missed.
		landed, done := s.landed.wait(topic)
		if !s.writer.Sending(topic) {
			done()
			return true
		}
		select {
		case <-ctx.Done():
			done()
			return false
		case <-landed:
		case <-poll.C:
		}
		done()
		poll.Reset(s.unlanded)
	}
}

// loadOnce is one gather of load; it returns the topics it found absent.
func (s *Service) loadOnce(ctx context.Context, topics []string, olds []entry, consistent bool) (map[string]entry, []string, error) {
	begun := s.now()
	m, err := s.store.GatherMany(ctx, topics, s.cfg.Shards, consistent)
	if err != nil {
		return nil, nil, err
	}
	if s.writer != nil && !consistent {
		if again, at, ok := s.settle(ctx, topics); ok {
			for topic, shards := range again {
				m[topic] = shards
			}
			begun = at
		}
	}
	now := s.now()
	out := make(map[string]entry, len(topics))
	var behind []string
	for i, topic := range topics {
		e := newEntry(m[topic], now)
		e.started = begun
		if olds != nil {
			old := olds[i]
			if e.count < old.count || e.shards < old.shards {
				behind = append(behind, topic)
				// Until a strong read says more, the old total stands.
				e.count, e.shards, e.saturated = old.count, old.shards, old.saturated
			}
		}
		out[topic] = e
	}
	if len(behind) > 0 && !consistent {
		s.metrics.regressions.Add(float64(len(behind)))
		again := s.now()
		if strong, err := s.store.GatherMany(ctx, behind, s.cfg.Shards, true); err == nil {
			// The strong read is the store's word. Lower than the cached
			// total, it means that total was too high (a wrong shared
			// total): it is replaced, and the floors hold what was served
			// for --cache-stale at most.
			for topic, shards := range strong {
				e := newEntry(shards, s.now())
				e.started = again
				out[topic] = e
			}
		}
	}
	var absent []string
	if olds == nil {
		for topic, e := range out {
			if e.count == 0 {
				s.absent.Set(topic, e)
				absent = append(absent, topic)
				delete(out, topic)
			}
		}
	}
	return out, absent, nil
}

// Wrote tells the cache that this sidecar's write of delta to topic,
// sent at sent, landed at landed, so that the application next to it
// reads its own mentions as soon as they are in the store, not a TTL
// later. A cached total whose gather ended before sent cannot have seen
// the write: it is raised by delta. One whose gather began after landed
// has seen it. One whose gather overlapped the write may or may not have:
// it is dropped, and the next reader gathers again. A raise moves neither
// the entry's refresh nor its expiry.
func (s *Service) Wrote(topic string, delta int64, sent, landed time.Time) {
	s.stripe(topic).Add(1)
	defer s.landed.land(topic) // once the cache knows
	update := func(old entry) (entry, otter.ComputeOp) {
		switch {
		case old.started.After(landed):
			return old, otter.CancelOp
		case !old.at.Before(sent) && old.peer:
			// Another sidecar's gather may or may not have seen it;
			// gathering again would undo the sharing, so the answer
			// holds (include=pending's floor) until the next total.
			return old, otter.CancelOp
		case !old.at.Before(sent):
			return old, otter.InvalidateOp
		}
		e := old
		var sat bool
		e.count, sat = store.SatAdd(e.count, delta)
		e.saturated = e.saturated || sat
		return e, otter.WriteOp
	}
	s.cache.ComputeIfPresent(topic, update)
	s.absent.ComputeIfPresent(topic, update)
}

// Current returns topic's cached total as it is now (raised by Wrote
// since t was read, if t's gather is the cached one), for a reader that
// adds pending mentions under the flusher's lock: the two then agree.
func (s *Service) Current(t Total) Total {
	for _, c := range []*otter.Cache[string, entry]{s.cache, s.absent} {
		if e, ok := c.GetIfPresent(t.Topic); ok && e.at.Equal(t.gatheredAt) {
			t.Count, t.Saturated = e.count, e.saturated
			return t
		}
	}
	return t
}

// gatherNow reads topics from the store in one GatherMany, bypassing the
// cache (eventual or strong, paid for by one caller).
func (s *Service) gatherNow(ctx context.Context, topics []string, consistent bool) (map[string]Total, error) {
	ctx, cancel := context.WithTimeout(ctx, gatherTimeout)
	defer cancel()
	m, err := s.store.GatherMany(ctx, topics, s.cfg.Shards, consistent)
	if err != nil {
		return nil, fmt.Errorf("lookup: %w", err)
	}
	now := s.now()
	out := make(map[string]Total, len(m))
	for topic, shards := range m {
		t := newEntry(shards, now).total(topic, "store", now)
		if !consistent {
			// An eventual read may lag what was served: hold it. A strong
			// read is the store's word and is served as it is.
			t.Count = s.hold(topic, t.Count, false)
		}
		out[topic] = t
	}
	return out, nil
}

func unique(topics []string) []string {
	seen := make(map[string]struct{}, len(topics))
	out := topics[:0:0]
	for _, t := range topics {
		if _, ok := seen[t]; !ok {
			seen[t] = struct{}{}
			out = append(out, t)
		}
	}
	return out
}

// floor is a topic's highest totals served: plain, and with pending
// mentions.
type floor struct{ plain, pending atomic.Int64 }

// hold returns count, or the highest total served for topic before if
// that is higher, and remembers it.
func (s *Service) hold(topic string, count int64, pending bool) int64 {
	f, _ := s.floors.ComputeIfAbsent(topic, func() (*floor, bool) { return new(floor), false })
	v := &f.plain
	if pending {
		v = &f.pending
	}
	for {
		seen := v.Load()
		if count <= seen {
			return seen
		}
		if v.CompareAndSwap(seen, count) {
			return count
		}
	}
}

// Shards gathers topic's shards now, bypassing the cache: the scatter and
// the gather side by side.
func (s *Service) Shards(ctx context.Context, topic string, consistent bool) (Total, []store.Shard, error) {
	shards, err := s.store.Gather(ctx, topic, s.cfg.Shards, consistent)
	if err != nil {
		return Total{}, nil, fmt.Errorf("lookup: %w", err)
	}
	return newEntry(shards, s.now()).total(topic, "store", s.now()), shards, nil
}

// errNoTopics is a batch lookup without topics.
var errNoTopics = errors.New("name at least one topic: /v1/topics?topic=a&topic=b")

type metrics struct {
	hit, miss, stale prometheus.Counter
	evictions        prometheus.Counter
	refreshErrors    prometheus.Counter
	regressions      prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) *metrics {
	requests := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "hotcount_cache_requests_total",
		Help: "Cached lookups (consistency=cached), by result: hit (fresh), stale (expired, served while one refresh runs), miss (waited for a gather shared with concurrent misses).",
	}, []string{"result"})
	m := &metrics{
		hit:   requests.WithLabelValues("hit"),
		miss:  requests.WithLabelValues("miss"),
		stale: requests.WithLabelValues("stale"),
		evictions: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "hotcount_cache_evictions_total",
			Help: "Totals removed from the cache, past --cache-stale or pushed out by --cache-size.",
		}),
		refreshErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "hotcount_cache_refresh_errors_total",
			Help: "Background refreshes of stale totals that failed (the stale total keeps being served up to --cache-stale).",
		}),
		regressions: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "hotcount_cache_regressions_total",
			Help: "Gathers that read a total lower than the one cached (a stale replica or shard-count item): read again strongly; the lower total is never served.",
		}),
	}
	reg.MustRegister(requests, m.evictions, m.refreshErrors, m.regressions)
	return m
}
