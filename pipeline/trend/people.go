package trend

import (
	"cmp"
	"slices"
	"sync"
	"time"

	"github.com/axiomhq/hyperloglog"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/hotcount/hotcount/pipeline/store"
)

// Distinct contributors: who mentioned a topic, as far as mentions say
// ("by"), estimated per topic and minute with HyperLogLog sketches
// (github.com/axiomhq/hyperloglog): a sketch of a handful of contributors
// is a few dozen bytes and counts them exactly (its sparse form), one of
// millions is 4 KiB, and the sketches of two sidecars merge into the
// sketch of both, so the fleet counts a contributor seen by two sidecars
// once. Every sidecar merges the same summaries, so every sidecar ranks
// with the same estimates.
const (
	// Precision is the sketches' precision: 2^12 registers, a relative
	// standard error of 1.04/√4096 ≈ 1.6% once a sketch is dense (past
	// about 3,000 contributors); below that the sparse form is exact but
	// for hash collisions (2^25 buckets).
	Precision = 12
	// StandardError is the sketches' relative standard error.
	StandardError = 0.0163
	// distinctMinutes is how many of the latest minutes keep their
	// sketches, so that a window within them counts a contributor once
	// however many of its minutes they mentioned the topic in. Older
	// minutes keep each topic's estimate only: a window longer than this
	// counts a contributor once per minute beyond it.
	distinctMinutes = 15
	// whoTopics is how many topics keep a sketch per minute, those with
	// the most contributors (pruned back to it at twice as many). With
	// distinctMinutes it bounds the sketches' memory: at most 15 × 512 ×
	// 4.2 KiB ≈ 32 MiB, however many contributors and topics there are
	// (BenchmarkContributorsMemory measures it).
	whoTopics = 256
	// collectKeys bounds the topic-minutes a sidecar collects between two
	// flushes; mentions of others in the meantime are counted (metric
	// hotcount_trend_contributors_untracked_total) and not sketched.
	collectKeys = 100_000
)

// Contributors collects, between two flushes, who mentioned each topic in
// each minute (ingest.Contributors): the sketch takes it at each flush
// into the summary it publishes. It is safe for concurrent use.
type Contributors struct {
	mu        sync.Mutex
	seen      map[minuteTopic]*seen
	untracked prometheus.Counter
}

// minuteTopic is a topic in a minute (Unix minute).
type minuteTopic struct {
	minute int64
	topic  string
}

// seen is who mentioned a topic in a minute, and in how many mentions.
type seen struct {
	who      *hyperloglog.Sketch
	mentions int64
}

// NewContributors returns an empty collector, its metric registered with
// reg.
func NewContributors(reg prometheus.Registerer) *Contributors {
	c := &Contributors{
		seen: make(map[minuteTopic]*seen),
		untracked: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "hotcount_trend_contributors_untracked_total",
			Help: "Mentions naming a contributor (\"by\") that the trending sketch did not take: over 100,000 topic-minutes named contributors between two flushes of this sidecar. Their counts are exact as always; their topics may miss contributors in trending.",
		}),
	}
	reg.MustRegister(c.untracked)
	return c
}

// Saw notes that by mentioned topic at at.
func (c *Contributors) Saw(topic string, at time.Time, by []byte) {
	k := minuteTopic{store.Minute.Index(at), topic}
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.seen[k]
	if s == nil {
		if len(c.seen) >= collectKeys {
			c.untracked.Inc()
			return
		}
		s = &seen{who: newWho()}
		c.seen[k] = s
	}
	s.who.Insert(by)
	s.mentions++
}

// take returns what was collected since the last take, per minute the
// busiest topics (most mentions naming a contributor) first, at most
// SummaryTopics of them.
func (c *Contributors) take() map[int64][]topicWho {
	c.mu.Lock()
	got := c.seen
	if len(got) > 0 {
		c.seen = make(map[minuteTopic]*seen)
	}
	c.mu.Unlock()
	per := make(map[int64][]topicWho)
	for k, s := range got {
		per[k.minute] = append(per[k.minute], topicWho{k.topic, s})
	}
	for i, tws := range per {
		slices.SortFunc(tws, func(a, b topicWho) int { return cmp.Compare(b.mentions, a.mentions) })
		per[i] = tws[:min(len(tws), SummaryTopics)]
	}
	return per
}

type topicWho struct {
	topic string
	*seen
}

// newWho returns an empty contributor sketch.
func newWho() *hyperloglog.Sketch {
	s, _ := hyperloglog.NewSketch(Precision, true) // fails only outside 4..18 (TestPrecision)
	return s
}

// who is the sketch's part for contributors: per minute and topic, the
// sketch of who mentioned it over the last distinctMinutes, and before
// them each one's estimate, in the tally shape of counts.
type people struct {
	who   map[int64]map[string]*estimated // by minute: the last distinctMinutes
	heads tally                           // estimates of the minutes before
}

// estimated is a contributor sketch and its estimate, computed when read
// after a merge.
type estimated struct {
	who   *hyperloglog.Sketch
	est   int64
	fresh bool
}

func (e *estimated) estimate() int64 {
	if !e.fresh {
		e.est, e.fresh = int64(e.who.Estimate()), true
	}
	return e.est
}

func newPeople() people {
	return people{who: make(map[int64]map[string]*estimated), heads: newTally()}
}

// merge adds the contributor sketches of minute i (now's minute is now).
// A minute older than distinctMinutes takes their estimates: a late
// summary's contributors are then counted again if they were already.
func (p *people) merge(i, now int64, topics map[string][]byte) (bad int) {
	var heads map[string]int64
	for topic, b := range topics {
		sk := newWho()
		if err := sk.UnmarshalBinary(b); err != nil {
			bad++
			continue
		}
		if i > now-distinctMinutes {
			m := p.who[i]
			if m == nil {
				m = make(map[string]*estimated)
				p.who[i] = m
			}
			e := m[topic]
			if e == nil {
				m[topic] = &estimated{who: sk}
				continue
			}
			if err := e.who.Merge(sk); err != nil {
				bad++ // another precision: not one of ours
			}
			e.fresh = false
			continue
		}
		if heads == nil {
			heads = make(map[string]int64)
		}
		heads[topic] += int64(sk.Estimate())
	}
	if heads != nil {
		p.heads.add(i, now, heads)
	}
	if m := p.who[i]; len(m) > 2*whoTopics {
		p.who[i] = pruneWho(m, whoTopics)
	}
	return bad
}

// roll moves minutes out of the distinct range into estimates, and ages
// the estimates like counts.
func (p *people) roll(now int64) {
	for i, m := range p.who {
		if i <= now-distinctMinutes {
			heads := make(map[string]int64, len(m))
			for t, e := range m {
				heads[t] = e.estimate()
			}
			p.heads.add(i, now, heads)
			delete(p.who, i)
		}
	}
	p.heads.roll(now)
}

// pruneWho keeps the n topics of m with the most contributors.
func pruneWho(m map[string]*estimated, n int) map[string]*estimated {
	ts := make([]string, 0, len(m))
	for t := range m {
		ts = append(ts, t)
	}
	slices.SortFunc(ts, func(a, b string) int {
		if c := cmp.Compare(m[b].estimate(), m[a].estimate()); c != 0 {
			return c
		}
		return cmp.Compare(a, b)
	})
	out := make(map[string]*estimated, n)
	for _, t := range ts[:n] {
		out[t] = m[t]
	}
	return out
}

// crowd is a topic's contributors over a window: distinct is who
// mentioned it (once each within the last distinctMinutes, once per
// minute before), perMinute the sum of each minute's distinct
// contributors, which the ranking scores.
type crowd struct {
	distinct, perMinute int64
}

// over sums each topic's contributors over recent (minutes) and its
// per-minute contributors over base, from from on.
func (p *people) over(recent, base Span) (rec map[string]crowd, old map[string]int64) {
	rec = make(map[string]crowd)
	union := make(map[string]*hyperloglog.Sketch)
	for i, m := range p.who {
		at := store.Minute.Start(i)
		switch {
		case i >= recent.First && i <= recent.Last:
			for t, e := range m {
				c := rec[t]
				c.perMinute += e.estimate()
				rec[t] = c
				if u := union[t]; u == nil {
					union[t] = e.who.Clone()
				} else {
					u.Merge(e.who) //nolint:errcheck // one precision: merge keeps them to it
				}
			}
		case !at.Before(base.From) && at.Before(base.To):
			for t, e := range m {
				if old == nil {
					old = make(map[string]int64)
				}
				old[t] += e.estimate()
			}
		}
	}
	for t, u := range union {
		c := rec[t]
		c.distinct += int64(u.Estimate())
		rec[t] = c
	}
	hrec, hold := p.heads.over(recent, base)
	for t, n := range hrec {
		c := rec[t]
		c.distinct += n
		c.perMinute += n
		rec[t] = c
	}
	if old == nil {
		old = hold
	} else {
		for t, n := range hold {
			old[t] += n
		}
	}
	return rec, old
}
