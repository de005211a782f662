package sidecar_test

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/hotcount/hotcount/config"
	"github.com/hotcount/hotcount/internal/testtools/testenv"
	"github.com/hotcount/hotcount/pipeline/trend"
	"github.com/hotcount/hotcount/schema"
	"github.com/hotcount/hotcount/sidecar"
	"github.com/hotcount/hotcount/tools/loadgen"
)

// hoursAgo is the start of the UTC hour n hours before now: a test's
// stepped clock starts there, at the same place in its hour every run,
// and within the buckets' retention, which reads measure with the real
// clock (a fixed date ran out of it two days later).
func hoursAgo(n int) time.Time {
	return time.Now().UTC().Truncate(time.Hour).Add(-time.Duration(n) * time.Hour)
}

// getJSON decodes a 200 answer of the lookup API into v.
func getJSON(t testing.TB, e *env, path string, v any) {
	t.Helper()
	getURL(t, "http://"+e.sc.HTTPAddr()+path, v)
}

// getURL decodes a 200 answer from url into v.
func getURL(t testing.TB, url string, v any) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		var body struct{ Error string }
		json.NewDecoder(resp.Body).Decode(&body) //nolint:errcheck // the status says it
		t.Fatalf("GET %s: %s: %s", url, resp.Status, body.Error)
	}
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
}

// flushedAll waits until the fleet has written n mentions.
func flushedAll(t testing.TB, fleet []*env, n int64) {
	t.Helper()
	testenv.Eventually(t, 20*time.Second, func() error {
		var got float64
		for _, e := range fleet {
			got += testenv.Metric(t, e.sc.Registry(), "hotcount_flusher_flushed_mentions_total")
		}
		if got != float64(n) {
			return fmt.Errorf("%v of %d mentions flushed", got, n)
		}
		return nil
	})
}

// quiet waits until no sidecar of fleet holds a mention or a write in
// doubt, and each has then flushed twice more: the flush that wrote its
// last mention has ended, and published its summary (a flush publishes
// it after its mentions count as flushed).
func quiet(t testing.TB, fleet []*env) {
	t.Helper()
	metric := func(e *env, name string) float64 { return testenv.Metric(t, e.sc.Registry(), name) }
	testenv.Eventually(t, 10*time.Second, func() error {
		for i, e := range fleet {
			if n := metric(e, "hotcount_aggregator_buffered_mentions") + metric(e, "hotcount_flusher_pending_writes"); n != 0 {
				return fmt.Errorf("sidecar %d holds %v mentions or writes in doubt", i, n)
			}
		}
		return nil
	})
	var since []float64
	for _, e := range fleet {
		since = append(since, metric(e, "hotcount_flusher_flushes_total"))
	}
	testenv.Eventually(t, 10*time.Second, func() error {
		for i, e := range fleet {
			if n := metric(e, "hotcount_flusher_flushes_total") - since[i]; n < 2 {
				return fmt.Errorf("sidecar %d flushed %v times since, want 2", i, n)
			}
		}
		return nil
	})
}

// summaries is how many summaries fleet published, and before them
// sidecars no longer in it (before). A summary that could not be
// published or read fails the test: a sidecar merges its own before it
// publishes it, and the counts would no longer match.
func summaries(t testing.TB, fleet []*env, before float64) float64 {
	t.Helper()
	n := before
	for i, e := range fleet {
		if bad := testenv.Metric(t, e.sc.Registry(), "hotcount_trend_summary_errors_total"); bad != 0 {
			t.Fatalf("sidecar %d: %v summaries not published or not read", i, bad)
		}
		n += testenv.Metric(t, e.sc.Registry(), "hotcount_trend_summaries_published_total")
	}
	return n
}

// mergedAll waits until the fleet is quiet and each of its sidecars has
// merged every summary published since it listened: unheard[i] is how
// many had been published then (summaries, with before as there). A trending
// list is cached until the clock moves, and a stepped clock that has
// stopped never does: a list read before the merges would rank from part
// of the fleet's summaries for good.
func mergedAll(t testing.TB, fleet []*env, before float64, unheard []float64) {
	t.Helper()
	quiet(t, fleet)
	testenv.Eventually(t, 10*time.Second, func() error {
		published := summaries(t, fleet, before)
		for i, e := range fleet {
			if n := testenv.Metric(t, e.sc.Registry(), "hotcount_trend_summaries_total"); n < published-unheard[i] {
				return fmt.Errorf("sidecar %d merged %v summaries, the fleet published %v since it listened", i, n, published-unheard[i])
			}
		}
		return nil
	})
}

// TestTrendingAcrossTheFleet plays a known script into three sidecars on
// one NATS server and one table, 16 minutes of it on a stepped clock: a
// steady Zipf background over 200 topics, 1,000 mentions a minute, and
// one topic, "surge", at 10 a minute that jumps to 200 (20x) for the last
// two minutes. Every sidecar ranks the surge first in a 2-minute window
// (the three minutes that cover it, against the 8 minutes before) with
// the steady heavy hitters out of the top 5; the two that ran throughout give the same list, and one restarted
// eight minutes before the end puts the surge first too; the windowed
// counts and series equal the script's, minute by minute and hour by hour
// (the script crosses an hour), on every sidecar.
func TestTrendingAcrossTheFleet(t *testing.T) {
	// Stepped a minute at a time, a second before each minute's end: each
	// minute's mentions are published at once, so the window, read up to
	// now, holds its last minute nearly whole, as its baseline expects.
	clk := testenv.NewClock(hoursAgo(3).Add(45*time.Minute + 59*time.Second))
	tune := func(c *config.Config) {
		c.FlushInterval = 50 * time.Millisecond
		c.CacheTTL = time.Millisecond
	}
	a := newFaultEnv(t, nil, tune, sidecar.WithClock(clk.Now))
	fleet := []*env{a}
	for range 2 {
		fleet = append(fleet, newEnvOn(t, a, func(c *config.Config) { c.DataDir = t.TempDir() }))
	}

	nc := testenv.Connect(t, a.nats)
	truth := make(map[string]map[int64]int64) // topic -> minute -> mentions
	count := func(topic string, minute int64) {
		if truth[topic] == nil {
			truth[topic] = make(map[int64]int64)
		}
		truth[topic][minute]++
	}
	// 200 topics: each minute writes about 150 of them, three counters each.
	z := rand.NewZipf(rand.New(rand.NewPCG(1, 2)), 1.1, 1, 199)
	var published, flushedBefore int64     // flushedBefore: by the sidecar restarted
	var summariesBefore float64            // published by the sidecar restarted
	unheard := make([]float64, len(fleet)) // summaries published before each listened
	const minutes = 16                     // the window (3 buckets) and its baseline (8), and the restart's 8 before the end
	for m := range minutes {
		if m > 0 {
			clk.Add(time.Minute)
		}
		minute := schema.Minute.Index(clk.Now())
		for range 1000 {
			topic := loadgen.Topic(int(z.Uint64()))
			if err := nc.Publish("mentions."+topic, nil); err != nil {
				t.Fatal(err)
			}
			count(topic, minute)
		}
		surge := 10
		if m >= minutes-2 {
			surge = 200
		}
		for range surge {
			if err := nc.Publish("mentions.surge", nil); err != nil {
				t.Fatal(err)
			}
			count("surge", minute)
		}
		if err := nc.Flush(); err != nil {
			t.Fatal(err)
		}
		published += int64(1000 + surge)
		// The minute is written before the clock moves on: each mention's
		// bucket is the minute it was published in.
		flushedAll(t, fleet, published-flushedBefore)
		if m == minutes-8 {
			// A sidecar restarts (a rolling deploy): it has lost its sketch
			// and knows only the summaries from now on.
			if err := fleet[2].stop(); err != nil {
				t.Fatal(err)
			}
			flushedBefore += int64(testenv.Metric(t, fleet[2].sc.Registry(), "hotcount_flusher_flushed_mentions_total"))
			summariesBefore += testenv.Metric(t, fleet[2].sc.Registry(), "hotcount_trend_summaries_published_total")
			fleet[2] = newEnvOn(t, a, func(c *config.Config) { c.DataDir = t.TempDir() })
			quiet(t, fleet)
			unheard[2] = summaries(t, fleet, summariesBefore) // it listened before it was ready
		}
	}
	last := schema.Minute.Index(clk.Now())
	sumOf := func(topic string, from, to int64) (n int64) {
		for i := from; i <= to; i++ {
			n += truth[topic][i]
		}
		return n
	}

	mergedAll(t, fleet, summariesBefore, unheard)

	// The list, the same on every sidecar that merged every summary; the
	// one restarted eight minutes ago has the surge first too (its
	// baseline comes from the buckets, not from its own memory).
	var lists [][]trend.Entry
	for _, e := range fleet {
		var tr trend.Trending
		getJSON(t, e, "/v1/trending?window=2m&limit=10", &tr)
		lists = append(lists, tr.Topics)
	}
	if !slices.Equal(lists[0], lists[1]) {
		t.Errorf("sidecar 0 ranks %v, sidecar 1 %v", lists[0], lists[1])
	}
	if len(lists[2]) == 0 || lists[2][0] != lists[0][0] {
		t.Errorf("the restarted sidecar ranks %v, the others %v", lists[2], lists[0])
	}
	top := lists[0]
	t.Logf("trending, 2m: %+v", top)
	if len(top) == 0 || top[0].Topic != "surge" {
		t.Fatalf("the surge is not first: %+v", top)
	}
	// The window covers the last 2 minutes: from the start of the
	// minute now − 2m falls in (10 of the surge's) up to now, 59 s into
	// its last bucket: 2 min 59 s at the 10 a minute before.
	if top[0].Count != sumOf("surge", last-2, last) || top[0].Baseline != 29.8 {
		t.Errorf("surge: count %d, baseline %v; the script has %d and 10 a minute before (29.8 in 2 min 59 s)", top[0].Count, top[0].Baseline, sumOf("surge", last-2, last))
	}
	for _, e := range top[:min(5, len(top))] {
		for i := range 5 {
			if e.Topic == loadgen.Topic(i) {
				t.Errorf("steady heavy hitter %s is in the top 5: %+v", e.Topic, top)
			}
		}
	}

	// Windowed counts and series against the script, on each sidecar.
	for _, e := range fleet {
		for _, topic := range []string{"surge", loadgen.Topic(0), loadgen.Topic(7), loadgen.Topic(150)} {
			var c trend.Count
			getJSON(t, e, "/v1/topics/"+topic+"?window=15m", &c)
			if want := sumOf(topic, last-15, last); c.Count != want || c.Resolution != "1m" || !c.From.Equal(schema.Minute.Start(last-15)) {
				t.Errorf("%s over 15m: %+v; the script has %d from %v", topic, c, want, schema.Minute.Start(last-15))
			}
			getJSON(t, e, "/v1/topics/"+topic+"?window=24h", &c)
			if want := sumOf(topic, last-minutes, last); c.Count != want || c.Resolution != "1h" {
				t.Errorf("%s over 24h (hours): %+v; the script has %d", topic, c, want)
			}
			var sr trend.Series
			getJSON(t, e, "/v1/topics/"+topic+"/series?window=30m&step=1m", &sr)
			if len(sr.Points) != 31 || !sr.From.Equal(schema.Minute.Start(last-30)) {
				t.Fatalf("%s series: %d points from %v, want 31 from %v (the minute now − 30m falls in)", topic, len(sr.Points), sr.From, schema.Minute.Start(last-30))
			}
			for _, p := range sr.Points {
				if want := truth[topic][schema.Minute.Index(p.From)]; p.Count != want {
					t.Errorf("%s at %v: %d, the script has %d", topic, p.From, p.Count, want)
				}
			}
			getJSON(t, e, "/v1/topics/"+topic+"/series?window=2h&step=1h", &sr)
			for _, p := range sr.Points {
				h := schema.Hour.Index(p.From)
				want := sumOf(topic, h*60, h*60+59)
				if p.Count != want {
					t.Errorf("%s in the hour from %v: %d, the script has %d", topic, p.From, p.Count, want)
				}
			}
		}
	}
}

// TestBucketsSplitAcrossBoundaries: one window holds mentions of three
// minutes across an hour boundary (nothing flushes before SIGTERM), and
// the final flush splits it: each minute bucket and each hour bucket holds
// exactly its mentions, the totals all of them, each item written once.
func TestBucketsSplitAcrossBoundaries(t *testing.T) {
	clk := testenv.NewClock(hoursAgo(3).Add(58*time.Minute + 20*time.Second))
	e := newFaultEnv(t, nil, func(c *config.Config) { c.FlushInterval = time.Hour }, sidecar.WithClock(clk.Now))
	nc := testenv.Connect(t, e.nats)
	want := map[testenv.Bucket]int64{}
	var sent int64
	for step, n := range []int{100, 50, 30} {
		if step > 0 {
			clk.Add(time.Minute)
		}
		for i := range n {
			topic := []string{"golang", "rust"}[i%2]
			if err := nc.Publish("mentions."+topic, nil); err != nil {
				t.Fatal(err)
			}
			want[testenv.Bucket{Topic: topic, G: schema.Minute, Index: schema.Minute.Index(clk.Now())}]++
			want[testenv.Bucket{Topic: topic, G: schema.Hour, Index: schema.Hour.Index(clk.Now())}]++
		}
		sent += int64(n)
		// Counted (in the window) before the clock moves on.
		testenv.Eventually(t, 5*time.Second, func() error {
			if got := testenv.Metric(t, e.sc.Registry(), "hotcount_ingest_events_total"); got != float64(sent) {
				return fmt.Errorf("%v of %d taken", got, sent)
			}
			return nil
		})
	}
	if w := testenv.Metric(t, e.sc.Registry(), "hotcount_store_writes_total"); w != 0 {
		t.Fatalf("%v writes before SIGTERM; the test needs one window", w)
	}
	if err := e.stop(); err != nil {
		t.Fatal(err)
	}
	got, items := e.dyn.Buckets(t, e.cfg.Table)
	if len(got) != len(want) || len(want) != 10 {
		t.Errorf("buckets %v, want %v", got, want)
	}
	for b, n := range want {
		if got[b] != n {
			t.Errorf("%s %s at %v: %d, published %d", b.Topic, b.G, b.G.Start(b.Index), got[b], n)
		}
	}
	totals, totalItems := e.dyn.Counts(t, e.cfg.Table)
	if totals["golang"] != 90 || totals["rust"] != 90 {
		t.Errorf("totals %v, want 90 each", totals)
	}
	if w := testenv.Metric(t, e.sc.Registry(), "hotcount_store_writes_total"); w != float64(items+totalItems) {
		t.Errorf("%v writes for %d items: want one each", w, items+totalItems)
	}
}

// TestWindowIsTheLastD: window=1m read at any second of a minute counts
// every written mention of the last 60 s and none older than 2 minutes
// (issue 52: 100 mentions 50 s past a minute, read 20 s later, read 0),
// and a series of 2m in steps of 1m holds them too. Four minutes of
// mentions dated by "at", 7 every 10 s, then read at seconds 0 to 59 of
// the next minute.
func TestWindowIsTheLastD(t *testing.T) {
	start := hoursAgo(2).Add(10 * time.Minute)
	clk := testenv.NewClock(start.Add(4 * time.Minute))
	e := newFaultEnv(t, nil, func(c *config.Config) { c.CacheTTL = time.Millisecond }, sidecar.WithClock(clk.Now))
	nc := testenv.Connect(t, e.nats)
	var dated []time.Time
	for step := range 24 {
		at := start.Add(time.Duration(step) * 10 * time.Second)
		for range 7 {
			if err := nc.Publish("mentions.w", fmt.Appendf(nil, `{"count":1,"at":%d}`, at.UnixMilli())); err != nil {
				t.Fatal(err)
			}
			dated = append(dated, at)
		}
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	flushedAll(t, []*env{e}, int64(len(dated)))
	within := func(from, to time.Time) (n int64) {
		for _, at := range dated {
			if !at.Before(from) && !at.After(to) {
				n++
			}
		}
		return n
	}
	for _, sec := range []int{0, 1, 10, 20, 30, 50, 59} {
		now := start.Add(4*time.Minute + time.Duration(sec)*time.Second)
		clk.Add(now.Sub(clk.Now()))
		var c trend.Count
		getJSON(t, e, "/v1/topics/w?window=1m", &c)
		last60, last120 := within(now.Add(-time.Minute), now), within(now.Add(-2*time.Minute), now)
		exact := within(now.Add(-time.Minute).Truncate(time.Minute), now)
		if c.Count < last60 || c.Count > last120 || c.Count != exact || c.From.After(now.Add(-time.Minute)) || now.Add(-time.Minute).Sub(c.From) >= time.Minute {
			t.Errorf("window=1m at second %d: %d from %v; the last 60 s hold %d, the last 2 minutes %d, the buckets since %v %d",
				sec, c.Count, c.From, last60, last120, now.Add(-time.Minute).Truncate(time.Minute), exact)
		}
		var sr trend.Series
		getJSON(t, e, "/v1/topics/w/series?window=2m&step=1m", &sr)
		var sum int64
		for _, p := range sr.Points {
			sum += p.Count
		}
		if from := now.Add(-2 * time.Minute).Truncate(time.Minute); len(sr.Points) != 3 || !sr.From.Equal(from) || sum != within(from, now) {
			t.Errorf("series 2m at second %d: %d points from %v summing %d; want 3 from %v summing %d", sec, len(sr.Points), sr.From, sum, from, within(from, now))
		}
	}
}
