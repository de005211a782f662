package trend

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/hotcount/hotcount/schema"
)

// Sketch bounds.
const (
	// SummaryTopics is the most topics of one minute one flush's summary
	// names (the largest deltas): a million-topic flush stays one small
	// message per minute.
	SummaryTopics = 2000
	// sketchTopics is how many topics the sketch keeps per minute, and per
	// block of older minutes (the largest counts; it prunes back to this
	// at twice as many).
	sketchTopics = 1000
	// recentMinutes are kept minute by minute, the longest window's
	// (which reads the minute now − window falls in too); older ones are
	// merged into blocks of blockMinutes: the baseline of a long window
	// needs no finer grain, and the sketch stays within recentMinutes +
	// maxSkewMinutes minute maps and 26 blocks of at most 2,000 topics
	// each, however many topics the fleet has (about 178,000 entries of
	// a topic name and a count).
	recentMinutes = int64(MaxTrendWindow/time.Minute) + 1
	blockMinutes  = 10
	// MaxTrendWindow is the longest /v1/trending window.
	MaxTrendWindow = time.Hour
	// Baselines is how many windows before the recent one make a topic's
	// baseline.
	Baselines = 4
	// sketchMinutes is how far back the sketch keeps minutes: the longest
	// window and its baseline.
	sketchMinutes = recentMinutes * (1 + Baselines)
	// maxSkewMinutes is how far ahead of this sidecar's clock a summary's
	// minute may be: a writer whose clock is further ahead would otherwise
	// fill the sketch with minutes no window reads.
	maxSkewMinutes = 2
	// maxSummaryBytes keeps a summary message well under NATS's default
	// 1 MB payload.
	maxSummaryBytes = 256 << 10
)

// Summary is what one flush of one sidecar wrote to minute buckets: per
// minute (Unix minute), per topic, the delta; and who mentioned the
// topics since the flush before, per minute and topic a contributor
// sketch (hyperloglog's binary form) of the mentions that named one.
// Sidecars publish it on the trend subject after each flush.
type Summary struct {
	Writer       string                      `json:"writer"`
	Minutes      map[int64]map[string]int64  `json:"minutes"`
	Contributors map[int64]map[string][]byte `json:"contributors,omitempty"`
}

// Sketch merges every sidecar's summaries into per-minute counts of the
// fleet's busiest topics: the candidates of the trending list. It is safe
// for concurrent use.
type Sketch struct {
	nc      *nats.Conn
	subject string
	writer  string
	sub     *nats.Subscription // set by Listen, before Run
	log     *zap.Logger
	now     func() time.Time

	collect *Contributors // who this sidecar's mentions named (nil: none)

	mu       sync.Mutex
	mentions tally     // the fleet's counts
	people   people    // the fleet's contributors
	first    int64     // the earliest minute merged: where the fleet's history starts, as far as this sidecar knows
	late     *lateBook // told of summaries of settled minutes (nil: none)

	merged, published, dropped prometheus.Counter
}

// NewSketch returns the sketch of the fleet's summaries on subject: from
// Listen (or Run) on it merges the other sidecars', Observe merges this
// sidecar's and publishes them there. It starts nothing.
func NewSketch(nc *nats.Conn, subject, writer string, reg prometheus.Registerer, log *zap.Logger, now func() time.Time) *Sketch {
	s := newSketch(now)
	s.nc, s.subject, s.writer, s.log = nc, subject, writer, log
	reg.MustRegister(s.merged, s.published, s.dropped)
	return s
}

// Listen subscribes to the fleet's summaries and returns once the NATS
// server has the subscription: every summary published after it returns
// is merged. The sidecar listens before it serves, so that one started
// next to a running fleet hears the summaries of every flush after its
// start (a subscription made by Run, in a goroutine of its own, could come
// after the first of them). This sidecar's own are merged by Observe as
// it publishes them, so none is missed however the subscription and the
// first flush are ordered.
func (s *Sketch) Listen() error {
	sub, err := s.nc.Subscribe(s.subject, func(m *nats.Msg) {
		var sum Summary
		if err := json.Unmarshal(m.Data, &sum); err != nil {
			s.dropped.Inc()
			return
		}
		if sum.Writer == s.writer {
			return // merged when Observe published it
		}
		s.Merge(sum)
	})
	if err != nil {
		return fmt.Errorf("trend: subscribe to %s: %w", s.subject, err)
	}
	// A summary is merged in microseconds; a burst of them from a large
	// fleet waits in a buffer of its own, bounded well inside the pod's
	// memory: past it NATS drops summaries (slow consumer), and trending
	// misses their candidates for a flush.
	sub.SetPendingLimits(4096, 16<<20) //nolint:errcheck // only fails on a closed subscription
	if err := s.nc.Flush(); err != nil {
		sub.Unsubscribe() //nolint:errcheck // the connection failed already
		return fmt.Errorf("trend: subscribe to %s: %w", s.subject, err)
	}
	s.sub = sub
	return nil
}

// Run merges the other sidecars' summaries until ctx ends, then stops
// listening. It listens first if Listen was not called.
func (s *Sketch) Run(ctx context.Context) error {
	if s.sub == nil {
		if err := s.Listen(); err != nil {
			return err
		}
	}
	<-ctx.Done()
	s.sub.Unsubscribe() //nolint:errcheck // the connection may be closed already
	return nil
}

// newSketch returns an empty sketch on clock now, not subscribed.
func newSketch(now func() time.Time) *Sketch {
	return &Sketch{now: now, log: zap.NewNop(), mentions: newTally(), people: newPeople(), first: math.MaxInt64,
		merged: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "hotcount_trend_summaries_total",
			Help: "Flush summaries (this sidecar's and the fleet's) merged into the trending sketch.",
		}),
		published: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "hotcount_trend_summaries_published_total",
			Help: "Flush summaries this sidecar published to the fleet (it merged each before, and the others merge each they hear).",
		}),
		dropped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "hotcount_trend_summary_errors_total",
			Help: "Flush summaries that could not be published or read (the trending list then misses their candidates until the next flush).",
		}),
	}
}

// CountContributors has the sketch take what c collects into each
// summary this sidecar publishes.
func (s *Sketch) CountContributors(c *Contributors) { s.collect = c }

// Observe is told what a flush wrote (flusher.Observer): its minute bucket
// counters become this sidecar's summary, with the contributors collected
// since the last flush, merged here and published to the fleet.
func (s *Sketch) Observe(written map[schema.Counter]int64) {
	per := make(map[int64][]topicCount)
	for c, d := range written {
		if c.Kind == schema.MinuteBucket {
			per[c.Index] = append(per[c.Index], topicCount{c.Topic, d})
		}
	}
	var who map[int64][]topicWho
	if s.collect != nil {
		who = s.collect.take()
	}
	if len(per) == 0 && len(who) == 0 {
		return
	}
	b := summaryBuilder{s: s, sum: Summary{Writer: s.writer}}
	for i, tcs := range per {
		slices.SortFunc(tcs, func(a, b topicCount) int { return cmp.Compare(b.n, a.n) })
		for _, tc := range tcs[:min(len(tcs), SummaryTopics)] {
			b.count(i, tc.topic, tc.n)
		}
	}
	for i, tws := range who {
		for _, tw := range tws {
			if data, err := tw.who.MarshalBinary(); err == nil {
				b.who(i, tw.topic, data)
			}
		}
	}
	b.flush()
}

// summaryBuilder makes a flush's summaries, as many as keep each under
// maxSummaryBytes, and publishes them.
type summaryBuilder struct {
	s    *Sketch
	sum  Summary
	size int
}

func (b *summaryBuilder) count(i int64, topic string, n int64) {
	b.room(jsonLen(topic) + 24)
	if b.sum.Minutes == nil {
		b.sum.Minutes = make(map[int64]map[string]int64)
	}
	m := b.sum.Minutes[i]
	if m == nil {
		m = make(map[string]int64)
		b.sum.Minutes[i] = m
	}
	m[topic] = n
}

func (b *summaryBuilder) who(i int64, topic string, data []byte) {
	b.room(jsonLen(topic) + 4*len(data)/3 + 32) // base64 in JSON
	if b.sum.Contributors == nil {
		b.sum.Contributors = make(map[int64]map[string][]byte)
	}
	m := b.sum.Contributors[i]
	if m == nil {
		m = make(map[string][]byte)
		b.sum.Contributors[i] = m
	}
	m[topic] = data
}

// jsonLen is topic's length as encoding/json writes it: a topic is valid
// UTF-8 without control characters (schema.ValidateTopic), but <, > and &
// take 6 bytes each, and so do U+2028 and U+2029 (3 bytes in UTF-8).
func jsonLen(topic string) int {
	n := len(topic) + 2
	for _, r := range topic {
		switch r {
		case '<', '>', '&':
			n += 5
		case '\u2028', '\u2029':
			n += 3
		case '"', '\\':
			n++
		}
	}
	return n
}

// room publishes the summary so far if n more bytes would take it past
// maxSummaryBytes, and counts them in.
func (b *summaryBuilder) room(n int) {
	if b.size+n > maxSummaryBytes {
		b.flush()
	}
	b.size += n
}

// flush merges the summary so far here and publishes it.
func (b *summaryBuilder) flush() {
	if len(b.sum.Minutes) == 0 && len(b.sum.Contributors) == 0 {
		return
	}
	s := b.s
	s.Merge(b.sum) // this sidecar's own, at once: Run skips its echo
	data, err := json.Marshal(b.sum)
	if err == nil {
		err = s.nc.Publish(s.subject, data)
	}
	if err != nil {
		s.dropped.Inc()
		s.log.Warn("flush summary not published; trending misses it", zap.Error(err))
	} else {
		s.published.Inc()
	}
	b.sum = Summary{Writer: s.writer}
	b.size = 0
}

type topicCount struct {
	topic string
	n     int64
}

// Merge adds a summary to the sketch.
func (s *Sketch) Merge(sum Summary) {
	s.mu.Lock()
	defer s.mu.Unlock()
	// The clock is read under the lock: a merge that waited for it must
	// not roll the sketch back to an older minute.
	at := s.now()
	now := schema.Minute.Index(at)
	for i, topics := range sum.Minutes {
		if !inSketch(i, now) {
			continue
		}
		s.first = min(s.first, i)
		s.late.wroteMinute(i, at) // if settled: a backfill, a flush retried
		s.mentions.add(i, now, topics)
	}
	bad := 0
	for i, topics := range sum.Contributors {
		if inSketch(i, now) {
			bad += s.people.merge(i, now, topics)
		}
	}
	s.mentions.roll(now)
	s.people.roll(now)
	s.merged.Inc()
	if bad > 0 {
		s.dropped.Inc()
	}
}

// inSketch says whether minute i is one the sketch keeps: not too old to
// matter, nor from a clock far ahead.
func inSketch(i, now int64) bool {
	return i > now-sketchMinutes && i <= now+maxSkewMinutes
}

// tally is a number per topic and minute: the last recentMinutes minute
// by minute, older ones in blocks of blockMinutes back to sketchMinutes,
// each map pruned to its largest sketchTopics at twice as many.
type tally struct {
	minutes map[int64]map[string]int64 // by minute
	blocks  map[int64]map[string]int64 // by first minute of a block
}

func newTally() tally {
	return tally{minutes: make(map[int64]map[string]int64), blocks: make(map[int64]map[string]int64)}
}

// add adds topics' numbers to minute i (now's minute is now).
func (t *tally) add(i, now int64, topics map[string]int64) {
	if i <= now-recentMinutes {
		addAll(t.blocks, blockOf(i), topics) // a late summary
		return
	}
	addAll(t.minutes, i, topics)
}

// roll folds the minutes past recentMinutes into blocks and drops the
// blocks past sketchMinutes.
func (t *tally) roll(now int64) {
	for i, m := range t.minutes {
		if i <= now-recentMinutes {
			addAll(t.blocks, blockOf(i), m)
			delete(t.minutes, i)
		}
	}
	for b := range t.blocks {
		if b+blockMinutes-1 <= now-sketchMinutes {
			delete(t.blocks, b)
		}
	}
}

// over sums each topic's numbers over recent (a span of minutes) and over
// base. A block counts where its first minute falls: candidates need a
// fair ranking, the exact counts come from the buckets.
func (t *tally) over(recent, base Span) (rec, old map[string]int64) {
	rec, old = make(map[string]int64), make(map[string]int64)
	for _, maps := range []map[int64]map[string]int64{t.minutes, t.blocks} {
		for i, m := range maps {
			at := schema.Minute.Start(i)
			switch {
			case i >= recent.First && i <= recent.Last:
				for topic, c := range m {
					rec[topic] += c
				}
			case !at.Before(base.From) && at.Before(base.To):
				for topic, c := range m {
					old[topic] += c
				}
			}
		}
	}
	return rec, old
}

// blockOf is the first minute of minute i's block.
func blockOf(i int64) int64 { return i - ((i%blockMinutes)+blockMinutes)%blockMinutes }

// addAll adds topics to maps[k], pruning it past twice sketchTopics.
func addAll(maps map[int64]map[string]int64, k int64, topics map[string]int64) {
	m := maps[k]
	if m == nil {
		m = make(map[string]int64, len(topics))
		maps[k] = m
	}
	for t, n := range topics {
		m[t] += n
	}
	if len(m) > 2*sketchTopics {
		maps[k] = prune(m, sketchTopics)
	}
}

// prune keeps the n largest counts of m.
func prune(m map[string]int64, n int) map[string]int64 {
	tcs := make([]topicCount, 0, len(m))
	for t, c := range m {
		tcs = append(tcs, topicCount{t, c})
	}
	slices.SortFunc(tcs, func(a, b topicCount) int { return cmp.Compare(b.n, a.n) })
	out := make(map[string]int64, n)
	for _, tc := range tcs[:n] {
		out[tc.topic] = tc.n
	}
	return out
}

// candidates ranks the sketch's topics by trend score over recent (a span
// of minutes) against base (of minutes or hours) and returns the best n:
// by their mentions, or with Ranking ByContributors by their contributors
// per minute, among those with at least least distinct contributors in
// recent. With moderation's verdicts (nil: none), hidden topics are no
// candidates, and of those held for review at most held are, besides the
// n others. A sidecar's sketch knows only what it merged since it
// started: until it holds a baseline, it ranks by the window's count.
func (s *Sketch) candidates(recent, base Span, n int, by Ranking, least int64, held int, verdict func(string) (hidden, held bool)) []string {
	var rec, old map[string]int64
	if by == ByContributors {
		crowds, o, cut := s.crowds(recent, base)
		rec, old, base = make(map[string]int64, len(crowds)), o, cut
		for t, c := range crowds {
			if c.distinct >= least {
				rec[t] = c.perMinute
			}
		}
	} else {
		s.mu.Lock()
		base = s.cut(base)
		rec, old = s.mentions.over(recent, base)
		s.mu.Unlock()
	}
	type scored struct {
		topic string
		score float64
	}
	out := make([]scored, 0, len(rec))
	for t, c := range rec {
		out = append(out, scored{t, Score(c, expect(old[t], base, recent))})
	}
	slices.SortFunc(out, func(a, b scored) int {
		if c := cmp.Compare(b.score, a.score); c != 0 {
			return c
		}
		return cmp.Compare(a.topic, b.topic)
	})
	topics := make([]string, 0, min(n, len(out)))
	taken, holding := 0, 0
	for _, sc := range out {
		if taken == n {
			break
		}
		var hidden, h bool
		if verdict != nil {
			hidden, h = verdict(sc.topic)
		}
		switch {
		case hidden:
		case h && holding < held:
			topics = append(topics, sc.topic)
			holding++
		case !h:
			topics = append(topics, sc.topic)
			taken++
		}
	}
	return topics
}

// crowds returns each topic's contributors over recent, their per-minute
// contributors over base as this sketch knows it, and that part of base.
func (s *Sketch) crowds(recent, base Span) (rec map[string]crowd, old map[string]int64, cut Span) {
	s.mu.Lock()
	defer s.mu.Unlock()
	cut = s.cut(base)
	// The estimates cover minutes from now − sketchMinutes on, and past
	// recentMinutes by whole blocks (a block counts where its first minute
	// falls): the baseline starts at a whole block within them, so that
	// its length and its sum cover the same minutes.
	now := schema.Minute.Index(s.now())
	if f := schema.Minute.Index(cut.From); f <= now-recentMinutes {
		first := blockOf(now - sketchMinutes + blockMinutes) // the oldest block kept whole
		if b := blockOf(f); b != f {
			f = b + blockMinutes
		}
		cut.From = schema.Minute.Start(max(f, first))
	}
	rec, old = s.people.over(recent, cut)
	return rec, old, cut
}

// cut is base from the first whole minute this sketch has on, as Trending
// cuts it at the fleet's history in the buckets. s.mu is held.
func (s *Sketch) cut(base Span) Span {
	if s.first != math.MaxInt64 {
		if from := schema.Minute.Start(s.first + 1); from.After(base.From) {
			base.From = from
		}
	}
	return base
}
