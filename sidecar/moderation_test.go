package sidecar_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/hotcount/hotcount/config"
	"github.com/hotcount/hotcount/internal/testtools/testenv"
	"github.com/hotcount/hotcount/internal/testtools/testenv/sidecartest"
	"github.com/hotcount/hotcount/pipeline/trend"
	"github.com/hotcount/hotcount/sidecar"
	"github.com/hotcount/hotcount/tools/loadgen"
)

// TestHiddenAcrossTheFleet: two sidecars on one NATS server and one table
// rank a surge first. An operator hides it (through OpenModeration, as
// `hotcount trending hide` does): within two flush intervals neither
// lists it, though both serve the list from a cache that lives ten
// times longer, and the list still holds its limit; its mentions are
// still counted. Unhidden, it is back on both as fast.
func TestHiddenAcrossTheFleet(t *testing.T) {
	const flush = 500 * time.Millisecond
	clk := testenv.NewClock(hoursAgo(2).Add(30 * time.Second))
	tune := func(c *config.Config) {
		c.FlushInterval = flush
		c.CacheTTL = 10 * time.Second
	}
	a := newFaultEnv(t, nil, tune, sidecar.WithClock(clk.Now))
	fleet := []*env{a, newEnvOn(t, a, func(c *config.Config) { c.DataDir = t.TempDir() })}
	nc := testenv.Connect(t, a.nats)

	// Ten minutes of 20 steady topics, 5 mentions each a minute; the
	// surge joins in the last three with 100 a minute.
	var published int64
	publishMinute := func(surge int) {
		t.Helper()
		for i := range 20 {
			for range 5 {
				if err := nc.Publish("mentions."+loadgen.Topic(i), nil); err != nil {
					t.Fatal(err)
				}
			}
		}
		for range surge {
			if err := nc.Publish("mentions.surge", nil); err != nil {
				t.Fatal(err)
			}
		}
		if err := nc.Flush(); err != nil {
			t.Fatal(err)
		}
		published += int64(100 + surge)
		flushedAll(t, fleet, published)
	}
	for m := range 10 {
		if m > 0 {
			clk.Add(time.Minute)
		}
		surge := 0
		if m >= 7 {
			surge = 100
		}
		publishMinute(surge)
	}
	mergedAll(t, fleet, 0, []float64{0, 0}) // the lists are cached on a clock that has stopped

	lists := func() [][]string {
		var out [][]string
		for _, e := range fleet {
			var tr trend.Trending
			getJSON(t, e, "/v1/trending?window=5m&limit=3", &tr)
			var topics []string
			for _, en := range tr.Topics {
				topics = append(topics, en.Topic)
			}
			out = append(out, topics)
		}
		return out
	}
	each := func(within time.Duration, what string, ok func([]string) bool) {
		t.Helper()
		testenv.Eventually(t, within, func() error {
			for i, l := range lists() {
				if !ok(l) {
					return fmt.Errorf("sidecar %d lists %v: want %s", i, l, what)
				}
			}
			return nil
		})
	}
	each(10*time.Second, "the surge first", func(l []string) bool { return len(l) == 3 && l[0] == "surge" })

	ctx := context.Background()
	b, err := sidecar.OpenModeration(ctx, a.cfg, nc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Hide(ctx, "surge", "tester", "bot-made", time.Now()); err != nil {
		t.Fatal(err)
	}
	each(2*flush, "the surge gone and three others", func(l []string) bool { return len(l) == 3 && !slices.Contains(l, "surge") })
	for i, e := range fleet {
		if n := testenv.MetricWith(t, e.sc.Registry(), "hotcount_trending_moderated", "state", "hidden"); n != 1 {
			t.Errorf("sidecar %d: hotcount_trending_moderated{state=hidden} %v, want 1", i, n)
		}
	}

	// Hidden, still counted.
	var before struct{ Count int64 }
	getJSON(t, a, "/v1/topics/surge?consistency=strong", &before)
	publishMinute(100)
	var after struct{ Count int64 }
	getJSON(t, fleet[1], "/v1/topics/surge?consistency=strong", &after)
	if after.Count != before.Count+100 {
		t.Errorf("hidden surge counts %d, was %d: want 100 more", after.Count, before.Count)
	}
	each(time.Second, "the surge still gone", func(l []string) bool { return !slices.Contains(l, "surge") })

	if _, changed, err := b.Unhide(ctx, "surge", "tester", "", time.Now()); err != nil || !changed {
		t.Fatalf("unhide: changed %v, %v", changed, err)
	}
	each(2*flush, "the surge back", func(l []string) bool { return slices.Contains(l, "surge") })
}

// TestModerationWithoutJetStream: a core-mode sidecar against a NATS
// server without JetStream says once that trending moderation is off and
// lists every topic; asked for review, which it cannot honour, it does
// not start, and says why.
func TestModerationWithoutJetStream(t *testing.T) {
	ns := testenv.NATSWithoutJetStream(t)
	cfg := config.Default()
	cfg.NATSURL = ns.ClientURL()
	cfg.Store = config.StoreBolt
	cfg.Windows = config.DevWindows
	cfg.HTTPAddr, cfg.AdminAddr = "127.0.0.1:0", "127.0.0.1:0"

	cfg.DataDir = t.TempDir()
	core, logs := observer.New(zap.WarnLevel)
	sc := sidecartest.Run(t, cfg, zap.New(core))
	if n := logs.FilterMessageSnippet("trending moderation is off").Len(); n != 1 {
		t.Errorf("the warning that moderation is off logged %d times, want once:\n%v", n, logs.All())
	}
	var tr trend.Trending
	getURL(t, sc.URL()+"/v1/trending?window=5m", &tr) // answers, unscreened
	if err := sc.Stop(); err != nil {
		t.Fatal(err)
	}

	cfg.DataDir = t.TempDir()
	cfg.TrendingReview = true
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	if _, err := sidecartest.Start(cfg, zap.NewNop()); err == nil || !strings.Contains(err.Error(), "--trending-review needs JetStream") {
		t.Errorf("start with review and no JetStream: %v, want a refusal that says why", err)
	}
}
