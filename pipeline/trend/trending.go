package trend

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"slices"
	"strconv"
	"time"

	"github.com/hotcount/hotcount/schema"
)

// Ranking is what trending ranks topics by.
type Ranking string

// Rankings.
const (
	// ByMentions scores a topic's mentions in the window against its
	// baseline's: the default.
	ByMentions Ranking = "mentions"
	// ByContributors scores its contributors per minute (one contributor's
	// mentions count once a minute) against its baseline's, and lists
	// only topics with at least Config.MinContributors distinct
	// contributors in the window: a few accounts flooding a topic cannot
	// put it on top.
	ByContributors Ranking = "contributors"
	// DefaultMinContributors is the least distinct contributors a topic
	// needs in the window to trend by contributors.
	DefaultMinContributors = 5
)

// maxTrendKeys bounds the bucket keys one trending read asks for (30
// BatchGetItem calls with one shard a topic): it sets how many candidates
// are read, whatever the window and limit.
const maxTrendKeys = 3000

// Score is a topic's trend score: how far its recent count stands above
// the count its baseline expects, in Poisson standard deviations,
// (recent − expected) / √(expected + 1). A steady topic scores about 0
// however large it is; a small topic's spike scores by its size against
// its noise, so 20 mentions where 1 was expected (13.4) do not beat 2,000
// where 100 were (189).
func Score(recent int64, expected float64) float64 {
	return (float64(recent) - expected) / math.Sqrt(expected+1)
}

// UseSketch gives the service the fleet's summaries: /v1/trending then
// answers, and late writes anywhere in the fleet (a backfill) refresh the
// settled buckets this service has cached.
func (s *Service) UseSketch(sk *Sketch) {
	sk.mu.Lock()
	sk.late = s.late
	sk.mu.Unlock()
	s.sketch = sk
}

// Moderation is the operators' say over the list (package moderation):
// it screens every answer, cached or not, so that a topic hidden since
// the answer was cached is gone from the next one. It must be safe for
// concurrent use.
type Moderation interface {
	// Screen returns the entries of ranked (highest first) that may be
	// listed, at most limit of them, in order, never nil; it may note
	// those held back for review. It neither changes nor keeps ranked,
	// which a cached answer shares.
	Screen(ranked []Entry, limit int) []Entry
	// Verdict says, before the candidates are read, whether topic is
	// hidden (never a candidate: hidden topics still count, and would
	// take every place a list has) or held for review (a candidate only
	// for Screen to note it as waiting).
	Verdict(topic string) (hidden, held bool)
}

// UseModeration has every trending answer screened by m.
func (s *Service) UseModeration(m Moderation) { s.mod = m }

// Trending ranks the fleet's topics by Score over the last window (whole
// minutes, up to MaxTrendWindow) against their baseline, the Baselines
// windows before it, and returns the best limit with a positive score.
// Candidates come from the sketch; their counts from the buckets.
//
// The baseline starts no earlier than the fleet's history: the first full
// minute (or hour) in which any candidate has a count, as the buckets
// show, the same for every sidecar. Until there is a whole bucket of it
// before the window, there is no baseline and the list is empty, with a
// note that says so.
func (s *Service) Trending(ctx context.Context, window string, limit int) (Trending, error) {
	d, err := ParseWindow(window)
	if err != nil {
		return Trending{}, err
	}
	switch {
	case s.sketch == nil || !s.cfg.Minutes:
		return Trending{}, badRequest("trending needs minute buckets (--windows with 1m) and the fleet's summaries")
	case d > MaxTrendWindow:
		return Trending{}, badRequest("window %s is longer than trending's %s", FormatWindow(d), FormatWindow(MaxTrendWindow))
	}
	t, err := cached(ctx, s, "trending", s.trends, FormatWindow(d)+"\x00"+strconv.Itoa(limit), func(t *Trending) *Served { return &t.Served }, func() (Trending, error) {
		return s.trending(ctx, d, limit)
	})
	t.Window = window // answered as asked, cached as canonical (see Window)
	if err == nil {
		// The cached list ranks every candidate with a positive score;
		// moderation may drop some, and the list is cut to limit after.
		if s.mod != nil {
			t.Topics = s.mod.Screen(t.Topics, limit)
		} else {
			t.Topics = t.Topics[:min(limit, len(t.Topics))]
		}
	}
	return t, err
}

// trending reads the list that Trending caches: the candidates' buckets
// over the window and the baseline, then their ranking.
func (s *Service) trending(ctx context.Context, d time.Duration, limit int) (Trending, error) {
	now := s.now()
	window, err := s.cfg.span(schema.Minute, d, now)
	if err != nil {
		return Trending{}, err
	}
	base := s.cfg.baseline(window)
	if keep := s.cfg.Retention.Of(base.G); !kept(base.G, base.First, keep, now) {
		return Trending{}, badRequest("window %s and its baseline reach back past the %s buckets' retention (%s)", FormatWindow(d), base.G, keep)
	}
	// Candidates whose buckets fit a budget of reads: the window's and
	// the baseline's buckets of each, maxTrendKeys in all.
	n := min(max(3*limit, 30), max(maxTrendKeys/(window.Buckets()+base.Buckets()), 1))
	by, least := s.cfg.ranking()
	var verdict func(string) (hidden, held bool)
	if s.mod != nil {
		verdict = s.mod.Verdict
	}
	cands := s.sketch.candidates(window, base, n, by, least, limit, verdict)
	t := Trending{Window: FormatWindow(d), From: window.From, To: now, Topics: []Entry{}}
	if len(cands) == 0 {
		t.Note = "no mentions in the window"
		if by == ByContributors {
			t.Note = fmt.Sprintf("no topic has %d distinct contributors in the window (--trending-min-contributors), as far as mentions name them (\"by\")", least)
		}
		return t, nil
	}
	sums, shards, err := s.readManyWithin(ctx, cands, []Span{window, base}, maxTrendKeys)
	if err != nil {
		return Trending{}, fmt.Errorf("trending: %w", err)
	}
	cands = slices.DeleteFunc(cands, func(c string) bool { _, ok := shards[c]; return !ok })
	// The fleet's history starts where the buckets do: no baseline
	// reaches before it.
	first, err := s.historyStart(ctx)
	if err != nil {
		return Trending{}, fmt.Errorf("trending: %w", err)
	}
	nominal := base // the baseline read, before the cut
	base = sinceHistory(base, first)
	switch {
	case first.IsZero():
		t.Note = "no history yet: no time bucket has been written"
	case base.First > base.Last:
		t.Note = fmt.Sprintf("not enough history yet: the fleet's buckets start at %s, and a baseline needs a whole %s bucket of them before the window", first.UTC().Format(time.RFC3339), base.G)
	default:
		t.BaselineFrom, t.BaselineTo = base.From, base.To
		crowds, old, cut := s.sketch.crowds(window, base)
		if by == ByContributors && !cut.To.After(cut.From) {
			// A sidecar started since the baseline's end: the buckets hold
			// counts, not contributors, and its sketch has none before.
			t.BaselineFrom, t.BaselineTo = time.Time{}, time.Time{}
			t.Note = "not enough contributor history on this sidecar yet: its sketch of the fleet's contributors has no whole minute before the window (it started since); other sidecars rank as usual"
		} else if by == ByContributors {
			t.BaselineFrom = cut.From
			t.Topics = rankContributors(cands, sums, crowds, old, window, cut, least)
		} else {
			t.Topics = rank(cands, sums, window, nominal, base)
			for i := range t.Topics {
				t.Topics[i].Contributors = crowds[t.Topics[i].Topic].distinct
			}
		}
	}
	return t, nil
}

// sinceHistory cuts base to start no earlier than the fleet's history,
// first. When history began inside the baseline (or later), the baseline
// starts at the next whole bucket, the first one counted in full; it may
// then be empty (First > Last).
func sinceHistory(base Span, first time.Time) Span {
	if first.After(base.From) {
		cut := max(base.First, base.G.Index(first)+1)
		base.First, base.From = cut, base.G.Start(cut)
	}
	return base
}

// rank scores each candidate's count over window against its baseline.
// sums[c] holds c's buckets of window and of nominal, the baseline as
// read; only base, its part since the fleet's history began, counts. It
// returns every one with a positive score, highest first (then by topic,
// so that every sidecar lists the same): Trending cuts the list to its
// limit after moderation, which may drop some.
func rank(cands []string, sums map[string][][]int64, window, nominal, base Span) []Entry {
	topics := []Entry{}
	for _, c := range cands {
		var count, old int64
		for _, n := range sums[c][0] {
			count, _ = satAdd(count, n, false)
		}
		for i, n := range sums[c][1] {
			if nominal.First+int64(i) >= base.First {
				old, _ = satAdd(old, n, false)
			}
		}
		expected := expect(old, base, window)
		if sc := Score(count, expected); sc > 0 {
			topics = append(topics, Entry{Topic: c, Count: count, Baseline: round(expected), Score: round(sc)})
		}
	}
	return best(topics)
}

// rankContributors scores each candidate's contributors per minute over
// window (crowds) against its baseline's (old, over cut, the part of the
// baseline the sketch has seen), with its count from sums as rank reads
// it. A candidate with fewer than least distinct contributors is left
// out. It returns every one with a positive score, in rank's order.
func rankContributors(cands []string, sums map[string][][]int64, crowds map[string]crowd, old map[string]int64, window, cut Span, least int64) []Entry {
	topics := []Entry{}
	for _, c := range cands {
		who := crowds[c]
		if who.distinct < least {
			continue
		}
		var count int64
		for _, n := range sums[c][0] {
			count, _ = satAdd(count, n, false)
		}
		expected := expect(old[c], cut, window)
		if sc := Score(who.perMinute, expected); sc > 0 {
			topics = append(topics, Entry{Topic: c, Count: count, Contributors: who.distinct, Baseline: round(expected), Score: round(sc)})
		}
	}
	return best(topics)
}

// best sorts topics by score, highest first (then by topic, so that every
// sidecar lists the same).
func best(topics []Entry) []Entry {
	slices.SortFunc(topics, func(a, b Entry) int {
		if c := cmp.Compare(b.Score, a.Score); c != 0 {
			return c
		}
		return cmp.Compare(a.Topic, b.Topic)
	})
	return topics
}

// ranking is the configured ranking and the least distinct contributors
// it lists a topic with (0 by mentions).
func (c Config) ranking() (Ranking, int64) {
	if c.By != ByContributors {
		return ByMentions, 0
	}
	if c.MinContributors <= 0 {
		return ByContributors, DefaultMinContributors
	}
	return ByContributors, int64(c.MinContributors)
}

// baseline is the span a window is scored against: the Baselines windows
// before it, in minute buckets, or for a window of half an hour or more
// in the whole hours before the window's first hour (as many as Baselines
// windows take), which costs a few keys instead of hundreds. A window of k
// minutes reads k + 1 buckets (span): its length is one less.
func (c Config) baseline(window Span) Span {
	k := int64(window.Buckets()) - 1
	b := Span{G: schema.Minute, First: window.First - Baselines*k, Last: window.First - 1}
	if c.Hours && k >= 30 {
		h := schema.Hour.Index(window.From)
		b = Span{G: schema.Hour, First: h - (Baselines*k+59)/60, Last: h - 1}
	}
	b.From, b.To = b.G.Start(b.First), b.G.Start(b.Last+1)
	return b
}

// expect is the count span would expect at the rate of old over base: the
// rate times span's length up to now (a window is read with its last
// bucket still filling, and a steady topic must not look like it is
// falling). 0 when base is empty.
func expect(old int64, base, span Span) float64 {
	if base.Buckets() <= 0 || !base.To.After(base.From) {
		return 0
	}
	length := max(span.To.Sub(span.From), time.Second)
	return float64(old) * float64(length) / float64(base.To.Sub(base.From))
}

// round keeps one decimal: the list reads the same on every sidecar.
func round(x float64) float64 { return math.Round(x*10) / 10 }
