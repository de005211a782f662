package trend

import (
	"cmp"
	"slices"
	"sync"
	"time"

	"github.com/axiomhq/hyperloglog"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/hotcount/hotcount/schema"
)

// Distinct contributors: who mentioned a topic, as far as mentions say
// ("by"), estimated per topic and minute with HyperLogLog sketches
// (github.com/axiomhq/hyperloglog): a sketch of a handful of contributors
// is a few dozen bytes and counts them exactly (its sparse form), one of
// millions is 4 KiB, and the sketches of two sidecars merge into the
// sketch of both, so the fleet counts a contributor seen by two sidecars
// once.
//
// Every sidecar must rank with the same estimates, so nothing kept may
// depend on the order summaries arrive in: a minute takes every topic's
// sketch while it is open (up to openTopics, far above what one sidecar's
// summaries name), and only once it has closed, when every summary of it
// is in, is it cut to the whoTopics with the most contributors.
const (
	// Precision is the sketches' precision: 2^12 registers, a relative
	// standard error of 1.04/√4096 ≈ 1.6% once a sketch is dense (past
	// about 1,500 contributors); below that the sparse form is exact but
	// for hash collisions (2^25 buckets).
	Precision = 12
	// StandardError is the sketches' relative standard error.
	StandardError = 0.0163
	// sketchBytes bounds one sketch's memory: dense, 4,096 registers and
	// the struct; a sparse one turns dense before it is larger (after a
	// merge, compact makes it so).
	sketchBytes = 4400
	// distinctMinutes is how many of the latest minutes keep their
	// sketches, so that a window within them counts a contributor once
	// however many of its minutes they mentioned the topic in: the
	// default 15m window reads 16 minutes (the one now − 15m falls in).
	// Older minutes keep each topic's estimate only.
	distinctMinutes = 16
	// openMinutes is how long after its end a minute still takes
	// summaries whole: a flush interval and the lag of a healthy reader.
	openMinutes = 3
	// openTopics bounds the topics an open minute takes sketches of;
	// past it a new topic's sketch is dropped (counted in
	// hotcount_trend_summary_errors_total). One sidecar names at most
	// SummaryTopics a minute.
	openTopics = 2048
	// whoTopics is how many topics keep a sketch once their minute has
	// closed: those with the most contributors.
	whoTopics = 256
	// The fleet's sketches take at most (openMinutes + maxSkewMinutes) ×
	// openTopics + (distinctMinutes − openMinutes) × whoTopics sketches of
	// sketchBytes, about 60 MiB, and the collector collectBytes: 76 MiB
	// however many contributors and topics, when every topic has over
	// 1,500 contributors a minute (BenchmarkContributorsMemory measures a
	// million a minute over 1,000 topics).
	maxWhoBytes = ((openMinutes+maxSkewMinutes)*openTopics + (distinctMinutes-openMinutes)*whoTopics) * sketchBytes

	// collectBytes bounds what a sidecar collects between two flushes, as
	// Saw counts it (about a million distinct contributors); mentions past
	// it are counted (metric hotcount_trend_contributors_untracked_total)
	// and not sketched.
	collectBytes = 16 << 20
	// keyBytes and insertBytes are what Saw charges a topic-minute and each
	// of its first mentions (an upper bound of the sparse form's growth),
	// up to sketchBytes a topic-minute.
	keyBytes    = 256
	insertBytes = 16
)

// Contributors collects, between two flushes, who mentioned each topic in
// each minute (ingest.Contributors): the sketch takes it at each flush
// into the summary it publishes. It is safe for concurrent use.
type Contributors struct {
	mu        sync.Mutex
	seen      map[minuteTopic]*seen
	bytes     int64 // what seen holds, as Saw counts it
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
			Help: "Mentions naming a contributor (\"by\") that the trending sketch did not take: between two flushes of this sidecar its collector reached its 16 MiB, or a minute named more topics than a summary carries. Their counts are exact as always; their topics may miss contributors in trending.",
		}),
	}
	reg.MustRegister(c.untracked)
	return c
}

// Saw notes that by mentioned topic at at.
func (c *Contributors) Saw(topic string, at time.Time, by []byte) {
	k := minuteTopic{schema.Minute.Index(at), topic}
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.seen[k]
	if s == nil {
		if c.bytes+keyBytes+int64(len(topic)) > collectBytes {
			c.untracked.Inc()
			return
		}
		s = &seen{who: newWho()}
		c.seen[k] = s
		c.bytes += keyBytes + int64(len(topic))
	}
	// A sketch grows by at most insertBytes a contributor until it is
	// dense: charged for its first mentions up to sketchBytes.
	growing := keyBytes+insertBytes*s.mentions < sketchBytes
	if growing && c.bytes+insertBytes > collectBytes {
		c.untracked.Inc()
		return
	}
	s.who.Insert(by)
	s.mentions++
	if growing {
		c.bytes += insertBytes
	}
}

// take returns what was collected since the last take, per minute the
// topics with the most contributors first, at most SummaryTopics of them
// (the rest are counted as untracked).
func (c *Contributors) take() map[int64][]topicWho {
	c.mu.Lock()
	got := c.seen
	if len(got) > 0 {
		c.seen, c.bytes = make(map[minuteTopic]*seen), 0
	}
	c.mu.Unlock()
	per := make(map[int64][]topicWho)
	for k, s := range got {
		per[k.minute] = append(per[k.minute], topicWho{k.topic, s.who, int64(s.who.Estimate()), s.mentions})
	}
	for i, tws := range per {
		slices.SortFunc(tws, func(a, b topicWho) int {
			if c := cmp.Compare(b.est, a.est); c != 0 {
				return c
			}
			return cmp.Compare(a.topic, b.topic)
		})
		for _, tw := range tws[min(len(tws), SummaryTopics):] {
			c.untracked.Add(float64(tw.mentions))
		}
		per[i] = tws[:min(len(tws), SummaryTopics)]
	}
	return per
}

type topicWho struct {
	topic    string
	who      *hyperloglog.Sketch
	est      int64
	mentions int64
}

// newWho returns an empty contributor sketch.
func newWho() *hyperloglog.Sketch {
	s, _ := hyperloglog.NewSketch(Precision, true) // fails only outside 4..18 (TestPrecision)
	return s
}

// people is the sketch's part for contributors: per minute and topic, the
// sketch of who mentioned it over the last distinctMinutes, and before
// them each one's estimate, in the tally shape of counts.
type people struct {
	who   map[int64]map[string]*estimated // by minute: the last distinctMinutes
	heads tally                           // estimates of the minutes before
	cut   map[int64]bool                  // the minutes of who cut to whoTopics
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
	return people{who: make(map[int64]map[string]*estimated), heads: newTally(), cut: make(map[int64]bool)}
}

// merge adds the contributor sketches of minute i (now's minute is now)
// and returns how many it could not take: not sketches; past openTopics;
// late: of a topic new to a minute that closed (its cut is made), or of a
// minute past distinctMinutes (its estimates are kept, and a sketch added
// to them would count its contributors again). A late sketch of a topic
// the cut kept merges as any other: a merge counts a contributor once.
func (p *people) merge(i, now int64, topics map[string][]byte) (bad int) {
	if i <= now-distinctMinutes {
		return len(topics)
	}
	closed := p.cut[i] || i <= now-openMinutes
	m := p.who[i]
	if m == nil {
		m = make(map[string]*estimated)
		p.who[i] = m
	}
	for topic, b := range topics {
		sk := newWho()
		if err := sk.UnmarshalBinary(b); err != nil {
			bad++
			continue
		}
		e := m[topic]
		if e == nil {
			if closed || len(m) >= openTopics {
				bad++
				continue
			}
			m[topic] = &estimated{who: sk}
			continue
		}
		if err := e.who.Merge(sk); err != nil {
			bad++ // another precision: not one of ours
			continue
		}
		e.who, e.fresh = compact(e.who), false
	}
	return bad
}

// compact returns s in its smallest form: a merge of two sparse sketches
// leaves the library's scratch set as large as the other sketch was
// (about 23 KB after merging 1,400 contributors), which a copy through
// the binary form drops.
func compact(s *hyperloglog.Sketch) *hyperloglog.Sketch {
	b, err := s.MarshalBinary()
	if err != nil {
		return s
	}
	c := newWho()
	if c.UnmarshalBinary(b) != nil {
		return s
	}
	return c
}

// roll cuts the minutes that closed to their whoTopics with the most
// contributors (every summary of them is in: every sidecar keeps the
// same), moves minutes out of the distinct range into estimates, and ages
// the estimates like counts.
func (p *people) roll(now int64) {
	for i, m := range p.who {
		switch {
		case i <= now-distinctMinutes:
			heads := make(map[string]int64, len(m))
			for t, e := range m {
				heads[t] = e.estimate()
			}
			p.heads.add(i, now, heads)
			delete(p.who, i)
			delete(p.cut, i)
		case i <= now-openMinutes && !p.cut[i]:
			if len(m) > whoTopics {
				p.who[i] = pruneWho(m, whoTopics)
			}
			p.cut[i] = true
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
// mentioned it, estimated from below (the union of its sketched minutes,
// or the most of any older minute's), perMinute the sum of each minute's
// distinct contributors, which the ranking scores.
type crowd struct {
	distinct, perMinute int64
}

// over sums each topic's contributors over recent (minutes) and its
// per-minute contributors over base.
func (p *people) over(recent, base Span) (rec map[string]crowd, old map[string]int64) {
	rec = make(map[string]crowd)
	old = make(map[string]int64)
	union := make(map[string]*hyperloglog.Sketch)
	for i, m := range p.who {
		at := schema.Minute.Start(i)
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
				old[t] += e.estimate()
			}
		}
	}
	for t, u := range union {
		c := rec[t]
		c.distinct = int64(u.Estimate())
		rec[t] = c
	}
	// Older minutes hold estimates only: each minute's adds to the sum,
	// and distinct is at least the largest of them (a contributor who
	// mentioned the topic in every minute is still one).
	for _, maps := range []map[int64]map[string]int64{p.heads.minutes, p.heads.blocks} {
		for i, m := range maps {
			at := schema.Minute.Start(i)
			switch {
			case i >= recent.First && i <= recent.Last:
				for t, n := range m {
					c := rec[t]
					c.perMinute += n
					c.distinct = max(c.distinct, n)
					rec[t] = c
				}
			case !at.Before(base.From) && at.Before(base.To):
				for t, n := range m {
					old[t] += n
				}
			}
		}
	}
	return rec, old
}
