// Package lookup is the read path: a topic's total is the sum of its shards,
// gathered in one round trip and cached in an LRU, so that a storm of reads
// of a hot topic costs the store at most one gather per topic per TTL,
// whatever the request rate. Once a topic is cached no reader waits on the
// store again: an expired total is served at once (marked stale) while one
// background gather refreshes it. It serves the totals over HTTP to the
// application next to the sidecar.
package lookup

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/hashicorp/golang-lru/v2/expirable"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/singleflight"

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
}

// entry is a cached total.
type entry struct {
	count     int64
	shards    int
	saturated bool
	at        time.Time
}

func (e entry) total(topic, source string, now time.Time) Total {
	return Total{Topic: topic, Count: e.count, Source: source, Shards: e.shards, Saturated: e.saturated, AgeMs: now.Sub(e.at).Milliseconds()}
}

func newEntry(shards []store.Shard, now time.Time) entry {
	sum, saturated := store.Sum(shards)
	return entry{count: sum, shards: len(shards), saturated: saturated, at: now}
}

// Service answers lookups. It is safe for concurrent use. Close stops its
// background refreshes.
type Service struct {
	cfg     Config
	store   Store
	metrics *metrics
	now     func() time.Time
	// The expirable LRU starts a goroutine of its own that expires entries
	// and never stops; one Service lives as long as the process, so that
	// costs one goroutine.
	cache *expirable.LRU[string, entry]
	group singleflight.Group

	mu         sync.Mutex
	refreshing map[string]struct{}
	closed     bool
	bg         sync.WaitGroup
	bgCtx      context.Context
	stopBg     context.CancelFunc
}

// New returns a lookup service over st, its metrics registered with reg.
// Entries live in the LRU until CacheStale; fresh or stale is decided by
// their age against CacheTTL.
func New(cfg Config, st Store, reg prometheus.Registerer, now func() time.Time) *Service {
	m := newMetrics(reg)
	s := &Service{cfg: cfg, store: st, metrics: m, now: now, refreshing: make(map[string]struct{})}
	s.bgCtx, s.stopBg = context.WithCancel(context.Background())
	s.cache = expirable.NewLRU[string, entry](cfg.CacheSize, func(string, entry) { m.evictions.Inc() }, max(cfg.CacheStale, cfg.CacheTTL))
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "hotcount_cache_entries",
		Help: "Totals in the cache, fresh or stale.",
	}, func() float64 { return float64(s.cache.Len()) }))
	return s
}

// Close stops background refreshes and waits for those under way.
func (s *Service) Close() {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	s.stopBg()
	s.bg.Wait()
}

// Lookup returns topic's total at consistency c. With Cached: a fresh
// entry is a hit; an expired one younger than CacheStale is served at once,
// marked stale, and one background gather refreshes it; a miss waits for a
// gather shared with every concurrent miss of the topic. An unknown topic has
// count 0 and is cached like any other.
func (s *Service) Lookup(ctx context.Context, topic string, c Consistency) (Total, error) {
	if c != Cached {
		m, err := s.gatherNow(ctx, []string{topic}, c == Strong)
		if err != nil {
			return Total{}, err
		}
		return m[topic], nil
	}
	now := s.now()
	if e, ok := s.cache.Get(topic); ok {
		t := e.total(topic, "cache", now)
		if now.Sub(e.at) < s.cfg.CacheTTL {
			s.metrics.hit.Inc()
			return t, nil
		}
		s.metrics.stale.Inc()
		s.refresh(topic)
		t.Stale = true
		return t, nil
	}
	s.metrics.miss.Inc()
	ch := s.group.DoChan(topic, func() (any, error) { return s.gather(topic) })
	select {
	case <-ctx.Done():
		return Total{}, ctx.Err()
	case r := <-ch:
		if r.Err != nil {
			return Total{}, fmt.Errorf("lookup: %w", r.Err)
		}
		return r.Val.(entry).total(topic, "store", s.now()), nil
	}
}

// gather reads topic from the store and caches it, unless the cache holds
// a fresh entry by now (another gather finished between a reader's look at
// the cache and this call): so a topic costs at most one gather per TTL.
// It runs on its own deadline: it is shared by readers that may leave.
func (s *Service) gather(topic string) (entry, error) {
	if e, ok := s.cache.Peek(topic); ok && s.now().Sub(e.at) < s.cfg.CacheTTL {
		return e, nil
	}
	ctx, cancel := context.WithTimeout(s.bgCtx, gatherTimeout)
	defer cancel()
	shards, err := s.store.Gather(ctx, topic, s.cfg.Shards, false)
	if err != nil {
		return entry{}, err
	}
	e := newEntry(shards, s.now())
	s.cache.Add(topic, e)
	return e, nil
}

// refresh starts one background gather of topic unless one is under way.
// If it fails, the stale entry keeps being served until it expires at
// CacheStale; then readers miss and see the error.
func (s *Service) refresh(topic string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, busy := s.refreshing[topic]; busy || s.closed {
		return
	}
	s.refreshing[topic] = struct{}{}
	s.bg.Go(func() {
		defer func() {
			s.mu.Lock()
			delete(s.refreshing, topic)
			s.mu.Unlock()
		}()
		// Through the group: a reader missing at the same moment shares it.
		ch := s.group.DoChan(topic, func() (any, error) { return s.gather(topic) })
		if r := <-ch; r.Err != nil {
			s.metrics.refreshErrors.Inc()
		}
	})
}

// LookupMany returns the totals of topics (at most MaxBatch, no repeats
// needed: a repeated topic is answered twice) in the order asked. With
// Cached, hits and stale entries come from the cache and all misses are
// gathered together, sharing BatchGetItem calls (100 keys each).
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
	now := s.now()
	out := make([]Total, len(topics))
	var misses []string
	missAt := make(map[string][]int)
	for i, topic := range topics {
		if e, ok := s.cache.Get(topic); ok {
			out[i] = e.total(topic, "cache", now)
			if now.Sub(e.at) < s.cfg.CacheTTL {
				s.metrics.hit.Inc()
			} else {
				s.metrics.stale.Inc()
				s.refresh(topic)
				out[i].Stale = true
			}
			continue
		}
		s.metrics.miss.Inc()
		if _, seen := missAt[topic]; !seen {
			misses = append(misses, topic)
		}
		missAt[topic] = append(missAt[topic], i)
	}
	if len(misses) == 0 {
		return out, nil
	}
	gathered, err := s.gatherNow(ctx, misses, false)
	if err != nil {
		return nil, err
	}
	for topic, idx := range missAt {
		for _, i := range idx {
			out[i] = gathered[topic]
		}
	}
	return out, nil
}

// gatherNow reads topics from the store in one GatherMany and caches the
// eventually consistent results (a strong read is fresher than anything
// cached, but is not cached: it was paid for by one caller).
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
		e := newEntry(shards, now)
		if !consistent {
			s.cache.Add(topic, e)
		}
		out[topic] = e.total(topic, "store", now)
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
	}
	reg.MustRegister(requests, m.evictions, m.refreshErrors)
	return m
}
