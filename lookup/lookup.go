// Package lookup is the read path: a topic's total is the sum of its shards,
// gathered in one round trip and cached briefly in an LRU, so that a storm of
// reads for a hot topic costs the store at most one gather per topic per TTL.
// It serves the totals over HTTP to the application next to the sidecar.
package lookup

import (
	"context"
	"fmt"
	"time"

	"github.com/hashicorp/golang-lru/v2/expirable"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/singleflight"

	"github.com/hotcount/hotcount/store"
)

// Defaults, used by the config package.
const (
	// DefaultCacheTTL is how long a gathered total is served from the cache.
	DefaultCacheTTL = time.Second
	// DefaultCacheSize is how many topics' totals the cache holds.
	DefaultCacheSize = 10_000
	// DefaultAddr is the lookup API's listen address: localhost, for the app
	// in the same pod.
	DefaultAddr = "127.0.0.1:8080"
)

// gatherTimeout bounds one gather. A gather is shared by every reader
// waiting on the topic, so it runs on its own deadline, not a reader's.
const gatherTimeout = 5 * time.Second

// Store is what the lookup reads from: Gather returns shards 0..n-1 of
// topic, in order, zeros for shards never written. It must be safe for
// concurrent use.
type Store interface {
	Gather(ctx context.Context, topic string, n int, consistent bool) ([]store.Shard, error)
}

// Config is the lookup's part of the configuration.
type Config struct {
	Shards        int
	CacheTTL      time.Duration
	CacheSize     int
	MaxTopicBytes int
}

// Total is a topic's total as served.
type Total struct {
	Topic string `json:"topic"`
	Count int64  `json:"count"`
	// Source is "cache" or "store".
	Source string `json:"source"`
	// AgeMs is how long ago the total was gathered.
	AgeMs int64 `json:"ageMs"`
	// Shards is how many shards were summed.
	Shards int `json:"shards"`
	// Saturated says the sum passed the int64 range and is capped.
	Saturated bool `json:"saturated,omitempty"`

	gatheredAt time.Time
}

// Service answers lookups. It is safe for concurrent use.
type Service struct {
	cfg     Config
	store   Store
	metrics *metrics
	now     func() time.Time
	// The expirable LRU starts a goroutine of its own that expires entries
	// and never stops; one Service lives as long as the process, so that
	// costs one goroutine.
	cache *expirable.LRU[string, Total]
	group singleflight.Group
}

// New returns a lookup service over st, its metrics registered with reg.
func New(cfg Config, st Store, reg prometheus.Registerer, now func() time.Time) *Service {
	m := newMetrics(reg)
	s := &Service{cfg: cfg, store: st, metrics: m, now: now}
	s.cache = expirable.NewLRU[string, Total](cfg.CacheSize, func(string, Total) { m.evictions.Inc() }, cfg.CacheTTL)
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "hotcount_cache_entries",
		Help: "Totals in the cache.",
	}, func() float64 { return float64(s.cache.Len()) }))
	return s
}

// Total returns topic's total from the cache, or gathers it. Concurrent
// misses on one topic share one gather. An unknown topic has count 0 and is
// cached like any other, so lookups of random names cost one gather per
// name per TTL, and the cache's size bound keeps memory fixed.
func (s *Service) Total(ctx context.Context, topic string) (Total, error) {
	if t, ok := s.cache.Get(topic); ok {
		s.metrics.requests.WithLabelValues("hit").Inc()
		t.Source = "cache"
		t.AgeMs = s.now().Sub(t.gatheredAt).Milliseconds()
		return t, nil
	}
	s.metrics.requests.WithLabelValues("miss").Inc()
	ch := s.group.DoChan(topic, func() (any, error) {
		// Another gather may have filled the entry between our Get and Do.
		if t, ok := s.cache.Get(topic); ok {
			return t, nil
		}
		gctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), gatherTimeout)
		defer cancel()
		shards, err := s.store.Gather(gctx, topic, s.cfg.Shards, false)
		if err != nil {
			return Total{}, err
		}
		t := newTotal(topic, shards, s.now())
		s.cache.Add(topic, t)
		return t, nil
	})
	select {
	case <-ctx.Done():
		return Total{}, ctx.Err()
	case r := <-ch:
		if r.Err != nil {
			return Total{}, fmt.Errorf("lookup: %w", r.Err)
		}
		t := r.Val.(Total)
		t.Source = "store"
		t.AgeMs = s.now().Sub(t.gatheredAt).Milliseconds()
		return t, nil
	}
}

// Shards gathers topic's shards now, bypassing the cache: the scatter and
// the gather side by side.
func (s *Service) Shards(ctx context.Context, topic string) (Total, []store.Shard, error) {
	shards, err := s.store.Gather(ctx, topic, s.cfg.Shards, false)
	if err != nil {
		return Total{}, nil, fmt.Errorf("lookup: %w", err)
	}
	t := newTotal(topic, shards, s.now())
	t.Source = "store"
	return t, shards, nil
}

func newTotal(topic string, shards []store.Shard, now time.Time) Total {
	sum, saturated := store.Sum(shards)
	return Total{Topic: topic, Count: sum, Shards: len(shards), Saturated: saturated, gatheredAt: now}
}

type metrics struct {
	requests  *prometheus.CounterVec
	evictions prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hotcount_cache_requests_total",
			Help: "Cached total lookups, by result: hit or miss (a miss waits for a gather, shared with concurrent misses).",
		}, []string{"result"}),
		evictions: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "hotcount_cache_evictions_total",
			Help: "Totals removed from the cache, expired or pushed out by the size bound.",
		}),
	}
	reg.MustRegister(m.requests, m.evictions)
	m.requests.WithLabelValues("hit")
	m.requests.WithLabelValues("miss")
	return m
}
