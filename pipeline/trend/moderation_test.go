package trend

import (
	"context"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/hotcount/hotcount/internal/testtools/testenv"
	"github.com/hotcount/hotcount/schema"
)

// hiding is a Moderation that hides a set of topics (package moderation's
// Watcher is the real one; it imports this package, so its own tests run
// it against a real Service).
type hiding struct {
	mu     sync.Mutex
	hidden map[string]bool
}

func (h *hiding) set(topic string, hidden bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.hidden[topic] = hidden
}

func (h *hiding) Verdict(topic string) (hidden, held bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.hidden[topic], false
}

func (h *hiding) Screen(ranked []Entry, limit int) []Entry {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := []Entry{}
	for _, e := range ranked {
		if len(out) < limit && !h.hidden[e.Topic] {
			out = append(out, e)
		}
	}
	return out
}

// TestHiddenTopicsLeaveAFullList: 40 new topics surge, each a little more
// than the one before. Hiding two of the first ten drops them from the
// next answer, though it comes from the cache, and the list still holds
// its limit: the next two candidates move up. Unhidden, they are back in
// their places.
func TestHiddenTopicsLeaveAFullList(t *testing.T) {
	ctx := context.Background()
	st := openBolt(t)
	now := time.Date(2026, 12, 3, 12, 0, 30, 0, time.UTC)
	clock := func() time.Time { return now }
	s := New(Config{Minutes: true, Hours: true, CacheTTL: time.Minute, CacheSize: 10}, st, prometheus.NewRegistry(), clock)
	sk := newSketch(clock)
	s.UseSketch(sk)
	mod := &hiding{hidden: make(map[string]bool)}
	s.UseModeration(mod)
	last := schema.Minute.Index(now)
	for m := last - 60; m <= last; m++ {
		sum := Summary{Minutes: map[int64]map[string]int64{m: {"steady": 100}}}
		if err := st.Add(ctx, testenv.Inc(schema.BucketOf("steady", schema.Minute, m), 0, 100), now); err != nil {
			t.Fatal(err)
		}
		if m > last-5 {
			for k := range 40 {
				topic := "new-" + strconv.Itoa(k)
				sum.Minutes[m][topic] = int64(10 + k)
				if err := st.Add(ctx, testenv.Inc(schema.BucketOf(topic, schema.Minute, m), 0, int64(10+k)), now); err != nil {
					t.Fatal(err)
				}
			}
		}
		sk.Merge(sum)
	}
	if err := st.MarkHistory(ctx, schema.Minute.Start(last-60)); err != nil {
		t.Fatal(err)
	}
	list := func(wantSource string) []string {
		t.Helper()
		tr, err := s.Trending(ctx, "5m", 10)
		if err != nil {
			t.Fatal(err)
		}
		if tr.Source != wantSource {
			t.Errorf("answer from %s, want from %s", tr.Source, wantSource)
		}
		var topics []string
		for _, e := range tr.Topics {
			topics = append(topics, e.Topic)
		}
		return topics
	}
	want := func(ks ...int) []string {
		var out []string
		for _, k := range ks {
			out = append(out, "new-"+strconv.Itoa(k))
		}
		return out
	}
	top := want(39, 38, 37, 36, 35, 34, 33, 32, 31, 30)
	if got := list("store"); !slices.Equal(got, top) {
		t.Fatalf("list %v, want %v", got, top)
	}

	mod.set("new-39", true)
	mod.set("new-35", true)
	if got, w := list("cache"), want(38, 37, 36, 34, 33, 32, 31, 30, 29, 28); !slices.Equal(got, w) {
		t.Errorf("with new-39 and new-35 hidden: %v, want %v", got, w)
	}
	mod.set("new-39", false)
	mod.set("new-35", false)
	if got := list("cache"); !slices.Equal(got, top) {
		t.Errorf("unhidden: %v, want %v", got, top)
	}

	// Half of them hidden: the list fills from the candidates ranked
	// beyond the limit (30 for a limit of 10).
	for k := range 40 {
		mod.set("new-"+strconv.Itoa(k), k%2 == 0)
	}
	if got, w := list("cache"), want(39, 37, 35, 33, 31, 29, 27, 25, 23, 21); !slices.Equal(got, w) {
		t.Errorf("half hidden: %v, want %v", got, w)
	}

	// The best 30 hidden, as many as the candidates: hidden topics take
	// no candidate's place, so once the cached answer has aged the list
	// holds the next 10, not nothing.
	for k := range 40 {
		mod.set("new-"+strconv.Itoa(k), k >= 10)
	}
	now = now.Add(2 * time.Minute)
	if got, w := list("store"), want(9, 8, 7, 6, 5, 4, 3, 2, 1, 0); !slices.Equal(got, w) {
		t.Errorf("the best 30 hidden: %v, want %v", got, w)
	}
}
