package trend

import (
	"context"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/maypok86/otter/v2"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/hotcount/hotcount/api"
	"github.com/hotcount/hotcount/internal/clockcache"
	"github.com/hotcount/hotcount/schema"
)

// Limits of a read.
const (
	// DefaultMinuteSpan is the longest window read at minute resolution:
	// 181 minute buckets (the window's and the one now − 3h falls in),
	// two BatchGetItem calls for a one-shard topic.
	DefaultMinuteSpan = 3 * time.Hour
	// MaxSeriesPoints bounds a series' points: a day of minutes, and the
	// step now − window falls in.
	MaxSeriesPoints = 1441
	// maxReadBuckets bounds the buckets one windowed read sums (per
	// shard): 2,000 and the one now − window falls in. A 35-day window at
	// hour resolution is 841.
	maxReadBuckets = 2001
	// settleAfter is how long after its end a bucket counts as settled:
	// its mentions have been flushed (a flush interval, the JetStream
	// backlog of a healthy consumer).
	settleAfter = 2 * time.Minute
	// settledTTL is how long a settled bucket's count is reused: a
	// mention later than settleAfter shows within it.
	settledTTL = 5 * time.Minute
	// settledKeys bounds the settled buckets cached.
	settledKeys = 200_000
)

// Store is what windowed reads take from the store.
type Store interface {
	// Metas reads the topics' shard counts: a bucket is sharded like its
	// topic's total.
	Metas(ctx context.Context, topics []string) (map[string]schema.Meta, error)
	// Counts reads items' counts by key, 0 for those missing.
	Counts(ctx context.Context, keys []string, consistent bool) (map[string]int64, error)
	// HistoryStart and MarkHistory read and lower the time the fleet
	// first wrote buckets, where trending cuts its baselines.
	HistoryStart(ctx context.Context) (time.Time, error)
	MarkHistory(ctx context.Context, t time.Time) error
}

// Config is the trend stage's part of the configuration.
type Config struct {
	// Minutes and Hours are the buckets the flushers write (--windows).
	Minutes, Hours bool
	// Retention is how long buckets are kept; windows stay inside it.
	Retention schema.Retention
	// MinuteSpan is the longest window read at minute resolution (0:
	// DefaultMinuteSpan).
	MinuteSpan time.Duration
	// CacheTTL is how long a windowed count or series is served from the
	// cache; CacheSize how many are kept.
	CacheTTL  time.Duration
	CacheSize int
	// By is what trending ranks by (ByMentions when empty), and
	// MinContributors the least distinct contributors a topic needs in
	// the window to trend ByContributors (0: DefaultMinContributors).
	By              Ranking
	MinContributors int
}

// The answers' wire types (package api), named here for the service's
// code and its callers.
type (
	Count    = api.Count
	Served   = api.Served
	Point    = api.Point
	Series   = api.Series
	Entry    = api.Entry
	Trending = api.Trending
)

// Service answers windowed reads and the trending list. It is safe for
// concurrent use.
type Service struct {
	cfg Config
	st  Store
	now func() time.Time

	// The answers, each kept for CacheTTL by now's time; a load is
	// shared by every caller that asks for its key meanwhile (otter's Get).
	counts *otter.Cache[string, stamped[Count]]
	series *otter.Cache[string, stamped[Series]]
	trends *otter.Cache[string, stamped[Trending]]
	// settled caches buckets that ended over settleAfter ago: only a late
	// mention (a backfill, a redelivery, a flush retried) still changes
	// them, so a sliding window re-reads just its newest buckets. A count
	// is used only if it was read after the last late write to its bucket
	// that late knows of.
	settled *otter.Cache[string, settledCount]
	late    *lateBook
	m       metrics

	sketch *Sketch    // the fleet's summaries; nil: no trending
	mod    Moderation // screens the trending list; nil: none

	// marked is the earliest minute this process has recorded as the
	// fleet's history start (math.MaxInt64: none yet).
	marked  atomic.Int64
	histMu  sync.Mutex
	history time.Time // the fleet's history start, as last read
	histAt  time.Time // when it was read
}

// settledCount is a settled bucket's count and when it was read.
type settledCount struct {
	n    int64
	read time.Time
}

type metrics struct {
	reads     *prometheus.CounterVec
	batchGets prometheus.Counter
}

// New returns a trend service reading st.
func New(cfg Config, st Store, reg prometheus.Registerer, now func() time.Time) *Service {
	size := max(cfg.CacheSize, 1)
	s := &Service{
		cfg:     cfg,
		st:      st,
		now:     now,
		counts:  clockcache.New[string, stamped[Count]](size, cfg.CacheTTL, now),
		series:  clockcache.New[string, stamped[Series]](size, cfg.CacheTTL, now),
		trends:  clockcache.New[string, stamped[Trending]](64, cfg.CacheTTL, now),
		settled: clockcache.New[string, settledCount](settledKeys, settledTTL, now),
		late:    newLateBook(),
		m: metrics{
			reads: prometheus.NewCounterVec(prometheus.CounterOpts{
				Name: "hotcount_trend_reads_total",
				Help: "Windowed reads, by kind (count, series, trending) and source: cache (answered from the cache), store (read from the store, once for all the callers that waited for it).",
			}, []string{"kind", "source"}),
			batchGets: prometheus.NewCounter(prometheus.CounterOpts{
				Name: "hotcount_trend_bucket_batches_total",
				Help: "Batches of up to 100 bucket keys read for windowed counts, series and trending (each a BatchGetItem call against DynamoDB, retries aside).",
			}),
		},
	}
	reg.MustRegister(s.m.reads, s.m.batchGets)
	s.marked.Store(math.MaxInt64)
	return s
}

// Window returns topic's count over the last window (ParseWindow's form).
func (s *Service) Window(ctx context.Context, topic, window string) (Count, error) {
	d, err := ParseWindow(window)
	if err != nil {
		return Count{}, err
	}
	// "24h" and "1d" share a cache entry (the canonical form), and each
	// caller is answered with the window it asked for.
	asked := window
	window = FormatWindow(d)
	c, err := cached(ctx, s, "count", s.counts, topic+"\x00"+window, func(c *Count) *Served { return &c.Served }, func() (Count, error) {
		now := s.now()
		sp, err := s.cfg.plan(d, now)
		if err != nil {
			return Count{}, err
		}
		sums, shards, err := s.read(ctx, topic, []Span{sp})
		if err != nil {
			return Count{}, err
		}
		c := Count{Topic: topic, Window: window, From: sp.From, To: sp.To, Resolution: sp.G.String(), Shards: shards}
		for _, n := range sums[0] {
			c.Count, c.Saturated = satAdd(c.Count, n, c.Saturated)
		}
		return c, nil
	})
	c.Window = asked
	return c, err
}

// stamped is a cached answer and when it was read from the store.
type stamped[T any] struct {
	v  T
	at time.Time
}

// cached answers from c, or loads the answer (one load per key at a
// time, shared by every caller that asks meanwhile) and caches it for the
// TTL. served is the answer's Served, which says where it came from and
// how old it is.
func cached[T any](ctx context.Context, s *Service, kind string, c *otter.Cache[string, stamped[T]], key string, served func(*T) *Served, load func() (T, error)) (T, error) {
	st, ok := c.GetIfPresent(key)
	source := "cache"
	if !ok {
		source = "store"
		var err error
		st, err = c.Get(ctx, key, otter.LoaderFunc[string, stamped[T]](func(context.Context, string) (stamped[T], error) {
			s.m.reads.WithLabelValues(kind, "store").Inc() // once per load, however many wait for it
			v, err := load()
			return stamped[T]{v: v, at: s.now()}, err
		}))
		if err != nil {
			return st.v, err
		}
	} else {
		s.m.reads.WithLabelValues(kind, "cache").Inc()
	}
	v := st.v
	sv := served(&v)
	sv.Source, sv.AgeMs = source, s.now().Sub(st.at).Milliseconds()
	return v, nil
}

// SeriesOf returns topic's counts over the last window, step by step
// (each a whole number of the resolution's buckets, aligned on the Unix
// epoch).
func (s *Service) SeriesOf(ctx context.Context, topic, window, step string) (Series, error) {
	d, err := ParseWindow(window)
	if err != nil {
		return Series{}, err
	}
	st, err := ParseWindow(step)
	if err != nil {
		return Series{}, err
	}
	asked, askedStep := window, step // answered as asked, cached as canonical (see Window)
	window, step = FormatWindow(d), FormatWindow(st)
	sr, err := cached(ctx, s, "series", s.series, topic+"\x00"+window+"\x00"+step, func(sr *Series) *Served { return &sr.Served }, func() (Series, error) {
		var g schema.Granularity
		switch {
		case s.cfg.Hours && st%time.Hour == 0 && (d > s.cfg.minuteSpan() || !s.cfg.Minutes):
			g = schema.Hour
		case s.cfg.Minutes && st%time.Minute == 0:
			g = schema.Minute
		case s.cfg.Hours && st%time.Hour == 0:
			g = schema.Hour
		case !s.cfg.Minutes && !s.cfg.Hours:
			return Series{}, badRequest("time buckets are off here (--windows none): no series")
		default:
			return Series{}, badRequest("step %s is not a whole number of the buckets kept here (--windows %s)", step, windowsOf(s.cfg))
		}
		if st > d {
			return Series{}, badRequest("step %s is longer than the window %s", step, window)
		}
		// The steps that cover [now − window, now]: the first holds
		// now − window, the last now.
		// The first step may be partial: the buckets read start at the
		// one now − window falls in, as a windowed count's do, not at
		// its step's start (which may be past the buckets' retention).
		now := s.now()
		per := int64(st / g.Duration()) // buckets per step
		sp := Span{G: g, First: g.Index(now.Add(-d)), Last: g.Index(now), To: now}
		sp.From = g.Start(sp.First)
		lastStep, firstStep := floorDiv(sp.Last, per), floorDiv(sp.First, per)
		points := lastStep - firstStep + 1
		if points > MaxSeriesPoints {
			return Series{}, badRequest("window %s in steps of %s is %d points, more than %d", window, step, points, MaxSeriesPoints)
		}
		if keep := s.cfg.Retention.Of(g); !kept(g, sp.First, keep, now) {
			return Series{}, badRequest("window %s reaches back past the %s buckets' retention (%s): choose a shorter window", window, g, keep)
		}
		if sp.Buckets() > maxReadBuckets {
			return Series{}, badRequest("window %s at %s resolution is %d buckets, more than %d: choose a coarser step", window, g, sp.Buckets(), maxReadBuckets)
		}
		sums, shards, err := s.read(ctx, topic, []Span{sp})
		if err != nil {
			return Series{}, err
		}
		sr := Series{Topic: topic, Window: window, Step: step, Resolution: g.String(), From: sp.From, To: now, Shards: shards, Points: make([]Point, points)}
		for p := range sr.Points {
			sr.Points[p].From = g.Start((firstStep + int64(p)) * per)
		}
		sr.Points[0].From = sp.From // the first step from its first bucket read
		for i, n := range sums[0] {
			p := (sp.First + int64(i) - firstStep*per) / per
			sr.Points[p].Count, _ = satAdd(sr.Points[p].Count, n, false)
		}
		return sr, nil
	})
	sr.Window, sr.Step = asked, askedStep
	return sr, err
}

// read sums topic's buckets of each span over its shards: out[k][i] is
// bucket First+i of spans[k]. It costs one metadata read and one
// BatchGetItem call per 100 bucket keys.
func (s *Service) read(ctx context.Context, topic string, spans []Span) (out [][]int64, shards int, err error) {
	many, shardsOf, err := s.readMany(ctx, []string{topic}, spans)
	if err != nil {
		return nil, 0, err
	}
	return many[topic], shardsOf[topic], nil
}

// readMany is read for several topics at once, their keys sharing batches.
func (s *Service) readMany(ctx context.Context, topics []string, spans []Span) (map[string][][]int64, map[string]int, error) {
	return s.readManyWithin(ctx, topics, spans, 0)
}

// readManyWithin is readMany within a budget of keys (0: none): the topics
// that would pass it, shards counted, are left out of the answer.
func (s *Service) readManyWithin(ctx context.Context, topics []string, spans []Span, budget int) (map[string][][]int64, map[string]int, error) {
	metas, err := s.st.Metas(ctx, topics)
	if err != nil {
		return nil, nil, err
	}
	if budget > 0 {
		topics = withinBudget(topics, metas, spans, budget)
	}
	shards := make(map[string]int, len(topics))
	for _, t := range topics {
		shards[t] = metas[t].Read()
	}
	counts, err := s.bucketCounts(ctx, topics, shards, spans)
	if err != nil {
		return nil, nil, err
	}
	return sumShards(topics, shards, spans, counts), shards, nil
}

// withinBudget keeps topics, in order, while their buckets over spans,
// shards counted, fit budget keys; the first is kept whatever its cost.
func withinBudget(topics []string, metas map[string]schema.Meta, spans []Span, budget int) []string {
	per := 0
	for _, sp := range spans {
		per += max(0, sp.Buckets())
	}
	used, kept := 0, topics[:0:0]
	for _, t := range topics {
		if used+per*metas[t].Read() > budget && len(kept) > 0 {
			break
		}
		used += per * metas[t].Read()
		kept = append(kept, t)
	}
	return kept
}

// bucketCounts returns the count of each bucket key of topics over spans:
// a settled bucket's from the cache while it is good, the others from the
// store, in one Counts call. The settled ones read are cached.
func (s *Service) bucketCounts(ctx context.Context, topics []string, shards map[string]int, spans []Span) (map[string]int64, error) {
	now := s.now() // before the read: a late write after it makes the read stale
	counts, keys, fresh := s.cachedCounts(topics, shards, spans, now)
	if len(keys) == 0 {
		return counts, nil
	}
	s.m.batchGets.Add(float64((len(keys) + 99) / 100))
	read, err := s.st.Counts(ctx, keys, false)
	if err != nil {
		return nil, err
	}
	for k, c := range read {
		counts[k] = c
		if fresh[k] {
			s.settled.Set(k, settledCount{c, now})
		}
	}
	return counts, nil
}

// cachedCounts looks up the bucket keys of topics over spans in the cache
// of settled buckets. It returns the counts found, the keys to read from
// the store, and which of those are settled (to cache once read).
func (s *Service) cachedCounts(topics []string, shards map[string]int, spans []Span, now time.Time) (counts map[string]int64, keys []string, fresh map[string]bool) {
	counts, fresh = make(map[string]int64), make(map[string]bool)
	states := s.bucketStates(spans, now)
	for _, t := range topics {
		for _, sp := range spans {
			for i := sp.First; i <= sp.Last; i++ {
				st := states[bucketID{sp.G, i}]
				for sh := range shards[t] {
					k := schema.BucketKey(t, sp.G, i, sh)
					if c, ok := s.settled.GetIfPresent(k); ok && st.settled && c.read.After(st.late) {
						counts[k] = c.n
						continue
					}
					keys = append(keys, k)
					if st.settled {
						fresh[k] = true
					}
				}
			}
		}
	}
	return counts, keys, fresh
}

// bucketState says whether a bucket's cached count may be used.
type bucketState struct {
	settled bool      // the bucket ended over settleAfter ago
	late    time.Time // the last late write to it: a count read before is stale
}

// bucketStates is the state of each bucket of spans, now.
func (s *Service) bucketStates(spans []Span, now time.Time) map[bucketID]bucketState {
	states := make(map[bucketID]bucketState)
	for _, sp := range spans {
		for i := sp.First; i <= sp.Last; i++ {
			states[bucketID{sp.G, i}] = bucketState{settled(sp.G, i, now), s.late.since(sp.G, i)}
		}
	}
	return states
}

// sumShards adds up each topic's shards bucket by bucket: out[t][k][i] is
// bucket First+i of spans[k].
func sumShards(topics []string, shards map[string]int, spans []Span, counts map[string]int64) map[string][][]int64 {
	out := make(map[string][][]int64, len(topics))
	for _, t := range topics {
		sums := make([][]int64, len(spans))
		for k, sp := range spans {
			sums[k] = make([]int64, max(0, sp.Buckets()))
			for i := sp.First; i <= sp.Last; i++ {
				for sh := range shards[t] {
					sums[k][i-sp.First], _ = satAdd(sums[k][i-sp.First], counts[schema.BucketKey(t, sp.G, i, sh)], false)
				}
			}
		}
		out[t] = sums
	}
	return out
}

// satAdd is schema.SatAdd, keeping an earlier saturation.
func satAdd(x, y int64, sat bool) (int64, bool) {
	sum, capped := schema.SatAdd(x, y)
	return sum, sat || capped
}

func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && (a < 0) != (b < 0) {
		q--
	}
	return q
}

func windowsOf(c Config) string {
	switch {
	case c.Minutes && c.Hours:
		return "1m,1h"
	case c.Minutes:
		return "1m"
	case c.Hours:
		return "1h"
	}
	return "none"
}

// Observe is told what each flush wrote (flusher.Observer). A minute
// bucket earlier than any this process has written lowers the fleet's
// history start to its minute: the first flush's, and a backfill's (a
// mention's "at" may be hours old). Writes to settled buckets are noted as
// late, so that their cached counts are read again. Then the sketch
// publishes the summary.
func (s *Service) Observe(written map[schema.Counter]int64) {
	now := s.now()
	first := int64(math.MaxInt64)
	for c := range written {
		g, ok := c.Granularity()
		if !ok {
			continue
		}
		s.late.wrote(g, c.Index, now)
		if g == schema.Minute {
			first = min(first, c.Index)
		}
	}
	if first < s.marked.Load() {
		// Short: the final flush calls this too, inside the shutdown's
		// budget; a mark that fails is tried again by the next flush.
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		if s.st.MarkHistory(ctx, schema.Minute.Start(first)) == nil {
			s.marked.Store(first) // else: the next flush tries again
			s.histMu.Lock()
			if h := schema.Minute.Start(first); s.history.IsZero() || h.Before(s.history) {
				s.history = h // as the store now has it, without waiting for the next read
			}
			s.histMu.Unlock()
		}
		cancel()
	}
	if s.sketch != nil {
		s.sketch.Observe(written)
	}
}

// historyStart is the fleet's history start, read at most once a minute
// (while it is unset, at most once per cache TTL).
func (s *Service) historyStart(ctx context.Context) (time.Time, error) {
	s.histMu.Lock()
	defer s.histMu.Unlock()
	now := s.now()
	if !s.histAt.IsZero() && now.Sub(s.histAt) < time.Minute && (!s.history.IsZero() || now.Sub(s.histAt) < s.cfg.CacheTTL) {
		return s.history, nil
	}
	h, err := s.st.HistoryStart(ctx)
	if err != nil {
		return time.Time{}, err
	}
	s.history, s.histAt = h, now
	return h, nil
}
