// Package lookup is the read path: a topic's total is the sum of its shards,
// gathered in one round trip and cached, so that a storm of reads of a hot
// topic costs the store at most one gather per topic per TTL, whatever the
// request rate. Once a topic is cached no reader waits on the store again:
// past the TTL the total is served at once (marked stale) while one
// background gather refreshes it. It serves no HTTP: package httpapi
// serves its totals to the application next to the sidecar.
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
	"math/rand/v2"
	"sync"
	"time"

	"github.com/maypok86/otter/v2"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/hotcount/hotcount/api"
	"github.com/hotcount/hotcount/internal/clockcache"
	"github.com/hotcount/hotcount/pipeline/ownwrites"
	"github.com/hotcount/hotcount/schema"
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
	Gather(ctx context.Context, topic string, n int, consistent bool) ([]schema.Shard, error)
	GatherMany(ctx context.Context, topics []string, n int, consistent bool) (map[string][]schema.Shard, error)
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

// MaxBatch is the most topics one batch lookup may name (api.MaxBatch).
const MaxBatch = api.MaxBatch

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

	// base is Count as gathered and raised by this sidecar's landed
	// writes, before the floor; gather is what gathered it.
	base   int64
	gather ownwrites.Gather
	// consistency is what it was read at (Cached, the zero value, on
	// every cached path): WithPending reads a raced total again at it.
	consistency Consistency
}

// entry is a cached total.
type entry struct {
	count     int64
	shards    int
	saturated bool
	started   time.Time // when the gather that made it began
	at        time.Time // when it ended (for a peer's total: when it came)
	peer      bool      // gathered by another sidecar (Offer)
	// mark is how far count holds this sidecar's landed writes: those
	// the view counted by the gather's start, and those raised since.
	mark ownwrites.Mark
}

func (e entry) gather() ownwrites.Gather {
	return ownwrites.Gather{Mark: e.mark, Started: e.started, At: e.at, Peer: e.peer}
}

func (e entry) total(topic, source string, now time.Time) Total {
	return Total{Topic: topic, Count: e.count, base: e.count, Source: source, Shards: e.shards, Saturated: e.saturated, AgeMs: now.Sub(e.at).Milliseconds(), gather: e.gather()}
}

func newEntry(shards []schema.Shard, now time.Time) entry {
	sum, saturated := schema.Sum(shards)
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
	// view is what this sidecar's writer shows of its writes: the
	// landings a cached total is raised by, the writes on their way a
	// gather waits for, the mentions not yet written (include=pending),
	// and the floors, the highest totals served.
	view *ownwrites.View
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
	s := &Service{cfg: cfg, store: st, metrics: m, now: now, pool: newPool(), view: ownwrites.New(ViewConfig(cfg), now)}
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
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "hotcount_cache_entries",
		Help: "Totals in the cache, fresh or stale (topics with a count; unknown topics are in hotcount_cache_absent_entries).",
	}, func() float64 { return float64(s.cache.EstimatedSize()) }), prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "hotcount_cache_absent_entries",
		Help: "Topics found with no count, remembered for a TTL in a bounded space of their own (a quarter of --cache-size).",
	}, func() float64 { return float64(s.absent.EstimatedSize()) }))
	return s
}

// Config is the configuration s was made with (New).
func (s *Service) Config() Config { return s.cfg }

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
		return entry{count: count, shards: max(shards, old.shards), at: now, peer: true, mark: s.view.Mark(topic)}, otter.WriteOp
	})
}

// ViewConfig is the view of this sidecar's writes that a lookup with
// cfg needs: landings and floors for as long as it may serve a total, of
// as many topics as it caches.
func ViewConfig(cfg Config) ownwrites.Config {
	return ownwrites.Config{Keep: max(cfg.CacheStale, cfg.CacheTTL), Topics: cfg.CacheSize}
}

// SeeWrites has the service read this sidecar's writes in v, which the
// writer tells of them (flusher.WithView, durable.Engine.ShowWrites). A
// cached total then counts each write as it lands, and a gather that ran
// while one was on its way waits for it to land and reads again. Call it
// before serving; without it the service sees no writes.
func (s *Service) SeeWrites(v *ownwrites.View) { s.view = v }

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
			s.view.CleanUp()
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
	for try := 0; ; try++ {
		last := try == raceTries-1
		if t, ok := s.unknown(topic, last); ok {
			return t, nil
		}
		source := s.classify(topic, try)
		e, err := s.cache.Get(ctx, topic, loader{s})
		if errors.Is(err, otter.ErrNotFound) {
			if t, ok := s.notFound(topic, last); ok {
				return t, nil
			}
			continue
		}
		if err != nil {
			return Total{}, fmt.Errorf("lookup: %w", err)
		}
		if e, ok := s.raised(s.cache, topic, e); ok || last {
			return s.served(topic, e, source), nil
		}
	}
}

// raceTries bounds the reads of one gather of a topic whose writes by
// this sidecar race it (sent before a read ended and landed after it
// began: the read may or may not hold the write), and the lookups of a
// read whose cached total a write raced. Each read after the first is
// strong and waits for the write on its way, so another race needs a
// write sent during its few milliseconds; past the last the total is
// served as gathered, with the landings it certainly does not hold
// (WithPending).
const raceTries = 3

// raised returns e with this sidecar's writes that landed since its
// gather, and keeps the raise in c for the next reader. false: e may or
// may not hold one of them, and is dropped from c, to be gathered again.
func (s *Service) raised(c *otter.Cache[string, entry], topic string, e entry) (entry, bool) {
	add, mark, ok := s.view.Landed(e.gather())
	if ok && mark == e.mark {
		return e, true
	}
	if !ok {
		replaceIn(c, topic, e.mark, e.at, nil)
		return e, false
	}
	was := e.mark
	var sat bool
	e.count, sat = schema.SatAdd(e.count, add)
	e.saturated = e.saturated || sat
	e.mark = mark
	replaceIn(c, topic, was, e.at, &e)
	return e, true
}

// replaceIn makes next topic's entry in c (nil: drops it) if the entry
// is still the one of the gather that ended at at with mark, as raised so
// far: another reader may have raised it, or gathered again, meanwhile.
// A raise keeps the gather's refresh and expiry (lifetime.same).
func replaceIn(c *otter.Cache[string, entry], topic string, mark ownwrites.Mark, at time.Time, next *entry) {
	c.ComputeIfPresent(topic, func(cur entry) (entry, otter.ComputeOp) {
		switch {
		case cur.mark != mark || !cur.at.Equal(at):
			return cur, otter.CancelOp
		case next == nil:
			return cur, otter.InvalidateOp
		}
		return *next, otter.WriteOp
	})
}

// unknown answers a topic gathered with no count within the TTL (raised
// since by this sidecar's writes, if any); false: not known absent, or
// (unless last) a write raced its gather.
func (s *Service) unknown(topic string, last bool) (Total, bool) {
	e, ok := s.absent.GetIfPresent(topic)
	if !ok {
		return Total{}, false
	}
	if e, ok = s.raised(s.absent, topic, e); !ok && !last {
		return Total{}, false
	}
	s.metrics.hit.Inc()
	return s.floored(e.total(topic, "cache", s.now())), true
}

// notFound answers a topic its load found with no count; false: a write
// raced the gather (unless last).
func (s *Service) notFound(topic string, last bool) (Total, bool) {
	if e, ok := s.absent.GetIfPresent(topic); ok {
		if e, ok = s.raised(s.absent, topic, e); !ok && !last {
			return Total{}, false
		}
		return s.floored(e.total(topic, "store", s.now())), true
	}
	now := s.now()
	return s.floored(entry{shards: s.cfg.Shards, at: now, started: now, mark: s.view.Mark(topic)}.total(topic, "store", now)), true
}

// floored holds t's count at the highest total served of its topic
// without pending mentions: a cached or eventual read may lag it.
func (s *Service) floored(t Total) Total {
	t.Count = s.view.Floor(t.Topic, t.Count, false)
	return t
}

// classify counts a cached lookup as a hit, stale or miss (on its first
// try only), and says where its answer comes from.
func (s *Service) classify(topic string, try int) (source string) {
	e, ok := s.cache.GetEntryQuietly(topic)
	switch {
	case try > 0 && !ok:
		return "store"
	case try > 0:
		return "cache"
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
	t := s.floored(e.total(topic, source, now))
	t.Stale = now.Sub(e.at) >= s.cfg.CacheTTL
	return t
}

// LookupMany returns the totals of topics (at most MaxBatch; a repeated
// topic is answered twice) in the order asked. With Cached, hits and stale
// entries come from the cache, and all misses are gathered together,
// sharing BatchGetItem calls (100 keys each) and any gather of the same
// topics already under way. A topic a write of this sidecar raced is
// read again on its own, as Lookup would.
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
		if t, ok := s.unknown(topic, true); ok {
			out[i], known[i] = t, true
			continue
		}
		if _, seen := source[topic]; !seen {
			source[topic] = s.classify(topic, 0)
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
	raced := make(map[string]bool)
	for i, topic := range topics {
		if known[i] {
			continue
		}
		var ok bool
		if e, found := got[topic]; found {
			if e, ok = s.raised(s.cache, topic, e); ok {
				out[i] = s.served(topic, e, source[topic])
			}
		} else {
			out[i], ok = s.notFound(topic, false)
		}
		if !ok {
			raced[topic] = true
		}
	}
	for i, topic := range topics {
		if raced[topic] {
			if out[i], err = s.Lookup(ctx, topic, Cached); err != nil {
				return nil, err
			}
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
	m, err := s.gather(ctx, topics, false)
	if err != nil {
		return nil, err
	}
	out := make(map[string]entry, len(topics))
	var behind []string
	for i, topic := range topics {
		e := m[topic].entry()
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
	if len(behind) > 0 {
		s.metrics.regressions.Add(float64(len(behind)))
		if strong, err := s.gather(ctx, behind, true); err == nil {
			// The strong read is the store's word. Lower than the cached
			// total, it means that total was too high (a wrong shared
			// total): it is replaced, and the floors hold what was served
			// for --cache-stale at most.
			for topic, r := range strong {
				out[topic] = r.entry()
			}
		}
	}
	if olds == nil {
		for topic, e := range out {
			if e.count == 0 {
				s.absent.Set(topic, e)
				delete(out, topic)
			}
		}
	}
	if s.share != nil {
		for topic, e := range out {
			s.share.Share(topic, e.count, e.shards)
		}
	}
	return out, nil
}

// marks returns topics' marks in the view, taken before gathering them.
func (s *Service) marks(topics []string) []ownwrites.Mark {
	marks := make([]ownwrites.Mark, len(topics))
	for i, t := range topics {
		marks[i] = s.view.Mark(t)
	}
	return marks
}

// read is a gather's shards of one topic: its mark in the view, taken
// before the read, and when the read began and ended.
type read struct {
	shards      []schema.Shard
	mark        ownwrites.Mark
	started, at time.Time
}

func (r read) entry() entry {
	e := newEntry(r.shards, r.at)
	e.started, e.mark = r.started, r.mark
	return e
}

// gather reads topics, and again, strongly, those a write of this
// sidecar raced, up to raceTries reads in all. A read raced a write
// sent before it ended that landed after it began (Landed): it may or
// may not hold it. A write still on its way as the read ends is waited
// for first, for as long as the writer's --write-timeout lets it be on
// its way, and ctx (a gather's 5 s) allows. Each read's end is taken before
// asking what is on its way, and a write is shown on its way with the
// time it was sent (ownwrites.View.Sent): a write the question misses
// was sent after the read ended, and is pending for it. Past the last
// read, or if ctx ends while waiting, a topic keeps the read it has: its
// readers gather again (Lookup, WithPending).
func (s *Service) gather(ctx context.Context, topics []string, consistent bool) (map[string]read, error) {
	out := make(map[string]read, len(topics))
	for try := 0; len(topics) > 0; try++ {
		marks := s.marks(topics)
		started := s.now()
		m, err := s.store.GatherMany(ctx, topics, s.cfg.Shards, consistent)
		if err != nil {
			if try == 0 {
				return nil, err
			}
			return out, nil // the first read stands
		}
		at := s.now()
		for i, t := range topics {
			out[t] = read{shards: m[t], mark: marks[i], started: started, at: at}
		}
		if try == raceTries-1 {
			break
		}
		var racing []string
		for _, t := range topics {
			if s.view.OnItsWay(t) {
				if !s.view.UntilLanded(ctx, t) {
					return out, nil
				}
				racing = append(racing, t)
				continue
			}
			r := out[t]
			if _, _, ok := s.view.Landed(ownwrites.Gather{Mark: r.mark, Started: r.started, At: r.at}); !ok {
				racing = append(racing, t)
			}
		}
		topics, consistent = racing, true
	}
	return out, nil
}

// gatherNow reads topics from the store, bypassing the cache (eventual or
// strong, paid for by one caller): one GatherMany, and up to two more of
// the topics a write of this sidecar raced (gather).
func (s *Service) gatherNow(ctx context.Context, topics []string, consistent bool) (map[string]Total, error) {
	ctx, cancel := context.WithTimeout(ctx, gatherTimeout)
	defer cancel()
	m, err := s.gather(ctx, topics, consistent)
	if err != nil {
		return nil, fmt.Errorf("lookup: %w", err)
	}
	now := s.now()
	out := make(map[string]Total, len(m))
	for _, topic := range topics {
		t := m[topic].entry().total(topic, "store", now)
		if consistent {
			t.consistency = Strong // the store's word: served as it is
		} else {
			// An eventual read may lag what was served: hold it.
			t = s.floored(t)
			t.consistency = Eventual
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

// WithPending adds to t this sidecar's mentions of its topic that t's
// gather cannot hold, and its writes landed since, read in one step from
// the view (what it counts in the writer, it counts once), and holds the
// sum at the highest such total served. A total a write of this sidecar
// raced (it may or may not hold it) is read again at its consistency, as
// its lookup would, up to raceTries lookups in all; ctx bounds them. Past
// them it counts what the view knows is not in it.
func (s *Service) WithPending(ctx context.Context, t *Total) {
	landed, pending, ok := s.view.Read(t.Topic, t.gather)
	for try := 1; !ok && try < raceTries; try++ {
		if t.consistency == Cached {
			replaceIn(s.cache, t.Topic, t.gather.Mark, t.gather.At, nil)
			replaceIn(s.absent, t.Topic, t.gather.Mark, t.gather.At, nil) // a topic known absent
		}
		again, err := s.Lookup(ctx, t.Topic, t.consistency)
		if err != nil {
			break
		}
		*t = again
		landed, pending, ok = s.view.Read(t.Topic, t.gather)
	}
	count, sat := schema.SatAdd(t.base, landed)
	t.Saturated = t.Saturated || sat
	t.Pending = pending
	t.PendingIncluded = true
	count, sat = schema.SatAdd(count, pending)
	t.Saturated = t.Saturated || sat
	t.Count = s.view.Floor(t.Topic, count, true)
}

// Shards gathers topic's shards now, bypassing the cache: the scatter and
// the gather side by side.
func (s *Service) Shards(ctx context.Context, topic string, consistent bool) (Total, []schema.Shard, error) {
	shards, err := s.store.Gather(ctx, topic, s.cfg.Shards, consistent)
	if err != nil {
		return Total{}, nil, fmt.Errorf("lookup: %w", err)
	}
	return newEntry(shards, s.now()).total(topic, "store", s.now()), shards, nil
}

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
