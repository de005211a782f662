package trend

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"slices"
	"strconv"
	"time"

	"github.com/hotcount/hotcount/store"
)

// Entry is one trending topic: its count in the window, its baseline (the
// count expected in a window like it, from the Baselines windows before)
// and its score.
type Entry struct {
	Topic    string  `json:"topic"`
	Count    int64   `json:"count"`
	Baseline float64 `json:"baseline"`
	Score    float64 `json:"score"`
}

// Trending is the fleet's trending list for a window, highest score first.
type Trending struct {
	Window string    `json:"window"`
	From   time.Time `json:"from"`
	To     time.Time `json:"to"`
	Served
	Topics []Entry `json:"topics"`
}

// Score is a topic's trend score: how far its recent count stands above
// the count its baseline expects, in Poisson standard deviations,
// (recent − expected) / √(expected + 1). A steady topic scores about 0
// however large it is; a small topic's spike scores by its size against
// its noise, so 20 mentions where 1 was expected (19) do not beat 2,000
// where 100 were (188).
func Score(recent int64, expected float64) float64 {
	return (float64(recent) - expected) / math.Sqrt(expected+1)
}

// UseSketch gives the service the fleet's summaries: /v1/trending then
// answers.
func (s *Service) UseSketch(sk *Sketch) { s.sketch = sk }

// Trending ranks the fleet's topics by Score over the last window (whole
// minutes, up to MaxTrendWindow) against their baseline, the Baselines
// windows before it, and returns the best limit with a positive score.
// Candidates come from the sketch; their counts from the minute buckets.
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
	return cached(s, "trending", s.trends, FormatWindow(d)+"\x00"+strconv.Itoa(limit), func(t *Trending) *Served { return &t.Served }, func() (Trending, error) {
		now := s.now()
		window, err := s.cfg.span(store.Minute, d, now)
		if err != nil {
			return Trending{}, err
		}
		recent, base := scoring(window, s.sketch.First())
		if keep := s.cfg.Retention.Minute; keep > 0 && now.Sub(store.Minute.Start(base.First)) > keep {
			return Trending{}, badRequest("window %s and its baseline reach back past the minute buckets' retention (%s)", FormatWindow(d), keep)
		}
		cands := s.sketch.candidates(recent, base, max(3*limit, 30))
		// The baseline served is the count expected in the part of the
		// window the fleet's history covers, as the count is.
		covered := window
		covered.First = max(window.First, min(s.sketch.First(), window.Last))
		covered.From = store.Minute.Start(covered.First)
		t := Trending{Window: FormatWindow(d), From: window.From, To: now, Topics: []Entry{}}
		if len(cands) > 0 {
			// The window holds the scoring span: one read covers both.
			sums, _, err := s.readMany(ctx, cands, []Span{window, base})
			if err != nil {
				return Trending{}, fmt.Errorf("trending: %w", err)
			}
			for _, c := range cands {
				var count, rec, old int64
				for i, n := range sums[c][0] {
					count, _ = satAdd(count, n, false)
					if window.First+int64(i) >= recent.First {
						rec, _ = satAdd(rec, n, false)
					}
				}
				if base.Buckets() > 0 {
					for _, n := range sums[c][1] {
						old, _ = satAdd(old, n, false)
					}
				}
				if sc := Score(rec, expect(old, base, recent)); sc > 0 {
					t.Topics = append(t.Topics, Entry{Topic: c, Count: count, Baseline: round(expect(old, base, covered)), Score: round(sc)})
				}
			}
		}
		slices.SortFunc(t.Topics, func(a, b Entry) int {
			if c := cmp.Compare(b.Score, a.Score); c != 0 {
				return c
			}
			return cmp.Compare(a.Topic, b.Topic)
		})
		t.Topics = t.Topics[:min(limit, len(t.Topics))]
		t.at = s.now()
		return t, nil
	})
}

// scoring returns the spans a trend is scored on: recent, the window, and
// base, the Baselines windows before it. A fleet whose history (from its
// first minute, first) is shorter than that scores on what it has: base
// is cut at first, and when history does not reach before the window, the
// history is split, its last 1/(1+Baselines) being recent and the rest
// base. Base may then be empty (First > Last): nothing is expected.
func scoring(window Span, first int64) (recent, base Span) {
	k := int64(window.Buckets())
	recent = window
	base = Span{G: window.G, First: window.First - Baselines*k, Last: window.First - 1}
	if first > window.Last {
		first = window.Last // no history yet: all is recent
	}
	if first > base.First {
		base.First = first
	}
	if base.First > base.Last {
		// History starts inside the window: split what there is.
		hist := window.Last - first + 1
		ks := max(1, hist/(1+Baselines))
		recent = Span{G: window.G, First: window.Last - ks + 1, Last: window.Last}
		base = Span{G: window.G, First: first, Last: recent.First - 1}
	}
	recent.From, recent.To = window.G.Start(recent.First), window.To
	base.From, base.To = window.G.Start(base.First), window.G.Start(base.Last+1)
	return recent, base
}

// expect is the count span would expect at the rate of old over base: the
// rate times span's length, up to now for a span that ends in the current
// bucket (a window is read with its last bucket still filling, and a
// steady topic must not look like it is falling). 0 when base is empty.
func expect(old int64, base, span Span) float64 {
	if base.Buckets() <= 0 || !base.To.After(base.From) {
		return 0
	}
	length := max(span.To.Sub(span.From), time.Second)
	return float64(old) * float64(length) / float64(base.To.Sub(base.From))
}

// round keeps one decimal: the list reads the same on every sidecar.
func round(x float64) float64 { return math.Round(x*10) / 10 }
