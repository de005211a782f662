package console

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"go.uber.org/zap"

	"github.com/hotcount/hotcount/internal/testtools/testenv"
)

// fakeAPI answers the lookup API's three endpoints the console calls, with
// fixed numbers, and counts the shard reads. Shard reads wait on release
// when it is set.
type fakeAPI struct {
	shardReads atomic.Int64
	release    chan struct{}
}

func (f *fakeAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/hot", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, `{"topics":[{"topic":"golang","count":50,"error":0,"rate":5,"shards":4}]}`)
	})
	mux.HandleFunc("GET /v1/trending", func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("window") != trendingWindow {
			http.Error(w, `{"error":"window"}`, http.StatusBadRequest)
			return
		}
		fmt.Fprint(w, `{"window":"5m","topics":[{"topic":"organic","count":800,"contributors":400,"baseline":0,"score":400}]}`)
	})
	mux.HandleFunc("GET /v1/topics/{topic}", func(w http.ResponseWriter, r *http.Request) {
		if r.PathValue("topic") == "bad" {
			w.WriteHeader(http.StatusBadRequest)
			fmt.Fprint(w, `{"error":"topic is bad"}`)
			return
		}
		if r.URL.Query().Get("include") != "pending" {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		fmt.Fprintf(w, `{"topic":%q,"count":1507,"source":"cache","stale":true,"ageMs":212,"shards":4,"pending":7,"includesPending":true}`, r.PathValue("topic"))
	})
	mux.HandleFunc("GET /v1/topics/{topic}/shards", func(w http.ResponseWriter, r *http.Request) {
		f.shardReads.Add(1)
		if f.release != nil {
			<-f.release
		}
		fmt.Fprint(w, `{"topic":"x","count":1500,"shards":[{"shard":0,"count":1000,"updatedAt":1},{"shard":1,"count":500,"updatedAt":2}]}`)
	})
	mux.ServeHTTP(w, r)
}

func newTestConsole(t *testing.T, api http.Handler, cfg Config) *Console {
	t.Helper()
	cfg.API = api
	if cfg.Metrics == nil {
		cfg.Metrics = prometheus.NewRegistry()
	}
	return New(cfg, zap.NewNop())
}

// get serves a GET of target from a loopback client and decodes the JSON
// answer into v (when not nil).
func get(t *testing.T, h http.Handler, target string, v any) *httptest.ResponseRecorder {
	t.Helper()
	req := httptest.NewRequest(http.MethodGet, target, nil)
	req.RemoteAddr, req.Host = "127.0.0.1:50000", "127.0.0.1:9091"
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if v != nil {
		if err := json.Unmarshal(rec.Body.Bytes(), v); err != nil {
			t.Fatalf("GET %s: %d %q: %v", target, rec.Code, rec.Body.String(), err)
		}
	}
	return rec
}

// TestStateIsTheAPIs: the state carries the lookup API's numbers: the
// gathered total apart from the pending mentions, the shards, the write
// count, the hottest topics; and the API's refusal of a bad topic.
func TestStateIsTheAPIs(t *testing.T) {
	c := newTestConsole(t, &fakeAPI{}, Config{WriteShards: func(string) int { return 2 }})
	var s state
	if rec := get(t, c, "/console/api/state?topic=golang", &s); rec.Code != 200 {
		t.Fatalf("%d %s", rec.Code, rec.Body)
	}
	if len(s.Topics) != 1 || s.Topics[0].Topic != "golang" || s.Topics[0].Shards != 4 {
		t.Errorf("topics %+v", s.Topics)
	}
	tt := s.Topic
	if tt == nil || tt.Total == nil || tt.Shards == nil {
		t.Fatalf("topic %+v", tt)
	}
	want := total{Gathered: 1500, Pending: 7, WithPending: 1507, Source: "cache", Stale: true, AgeMs: 212, Shards: 4}
	if *tt.Total != want {
		t.Errorf("total %+v, want %+v", *tt.Total, want)
	}
	if tt.Shards.Count != 1500 || len(tt.Shards.Shards) != 2 || tt.Shards.Shards[1].Count != 500 || tt.WriteShards != 2 {
		t.Errorf("shards %+v, write shards %d", tt.Shards, tt.WriteShards)
	}
	if s.Race != nil || s.RaceEnabled {
		t.Errorf("race %+v enabled %v, want none", s.Race, s.RaceEnabled)
	}
	if tr := s.Trending; tr == nil || len(tr.Topics) != 1 || tr.Topics[0].Topic != "organic" || tr.Topics[0].Contributors != 400 || tr.Topics[0].Count != 800 {
		t.Errorf("trending %+v, want the API's list with its contributors", tr)
	}

	var bad state
	if get(t, c, "/console/api/state?topic=bad", &bad); bad.Topic == nil || !strings.Contains(bad.Topic.Error, "topic is bad") || bad.Topic.Total != nil {
		t.Errorf("bad topic: %+v", bad.Topic)
	}
	var none state
	if get(t, c, "/console/api/state", &none); none.Topic != nil {
		t.Errorf("no topic asked, got %+v", none.Topic)
	}
}

// TestViewersShareAShardRead: N viewers polling a topic at once cost one
// read of its shards, and the next second one more.
func TestViewersShareAShardRead(t *testing.T) {
	api := &fakeAPI{release: make(chan struct{})}
	c := newTestConsole(t, api, Config{})
	clock := testenv.NewClock(time.Unix(1_800_000_000, 0))
	c.cache = newShardCache(shardsTTL, clock.Now)

	const viewers = 20
	var wg sync.WaitGroup
	counts := make([]int64, viewers)
	for i := range viewers {
		wg.Go(func() {
			var s state
			get(t, c, "/console/api/state?topic=golang", &s)
			if s.Topic != nil && s.Topic.Shards != nil {
				counts[i] = s.Topic.Shards.Count
			}
		})
	}
	// The first read is held until released: viewers that come meanwhile
	// wait on it, and those that come after (the clock stands still) are
	// served what it read.
	testenv.Eventually(t, 5*time.Second, func() error {
		if api.shardReads.Load() == 0 {
			return fmt.Errorf("no shard read yet")
		}
		return nil
	})
	close(api.release)
	wg.Wait()
	if n := api.shardReads.Load(); n != 1 {
		t.Errorf("%d viewers caused %d shard reads, want 1", viewers, n)
	}
	for i, n := range counts {
		if n != 1500 {
			t.Errorf("viewer %d saw %d, want 1500", i, n)
		}
	}
	get(t, c, "/console/api/state?topic=golang", nil)
	if n := api.shardReads.Load(); n != 1 {
		t.Errorf("within the TTL: %d shard reads, want 1", n)
	}
	clock.Add(shardsTTL)
	get(t, c, "/console/api/state?topic=golang", nil)
	if n := api.shardReads.Load(); n != 2 {
		t.Errorf("after the TTL: %d shard reads, want 2", n)
	}
}

// TestDataIsForThisMachine: the page is served to anyone; its data and
// the race only to loopback clients, unless the console is open.
func TestDataIsForThisMachine(t *testing.T) {
	for _, tt := range []struct {
		name         string
		open         bool
		remote, host string
		want         int
	}{
		{"loopback", false, "127.0.0.1:4000", "127.0.0.1:9091", 200},
		{"loopback v6", false, "[::1]:4000", "[::1]:9091", 200},
		{"port-forward", false, "127.0.0.1:4000", "localhost:9091", 200},
		{"remote", false, "10.1.2.3:4000", "10.1.2.9:9091", 403},
		{"a mesh proxy forwarding from loopback", false, "127.0.0.6:4000", "hotcount.trends.svc:9091", 403},
		{"a page rebinding its name to loopback", false, "127.0.0.1:4000", "evil.example:9091", 403},
		{"remote, open", true, "10.1.2.3:4000", "hotcount.trends.svc:9091", 200},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c := newTestConsole(t, &fakeAPI{}, Config{Open: tt.open})
			for _, target := range []string{"/console", "/console/static/console.js", "/console/api/state"} {
				req := httptest.NewRequest(http.MethodGet, target, nil)
				req.RemoteAddr, req.Host = tt.remote, tt.host
				rec := httptest.NewRecorder()
				c.ServeHTTP(rec, req)
				want := tt.want
				if !strings.Contains(target, "/api/") {
					want = 200
				}
				if rec.Code != want {
					t.Errorf("%s: %d, want %d", target, rec.Code, want)
				}
			}
		})
	}
}

// TestPageAndAssets: the page and its assets come from the binary, and
// the page loads only them (no CDN).
func TestPageAndAssets(t *testing.T) {
	c := newTestConsole(t, &fakeAPI{}, Config{})
	page := get(t, c, "/console", nil)
	if page.Code != 200 || !strings.HasPrefix(page.Header().Get("Content-Type"), "text/html") {
		t.Fatalf("page: %d %s", page.Code, page.Header().Get("Content-Type"))
	}
	body := page.Body.String()
	for _, want := range []string{`src="/console/static/console.js"`, `href="/console/static/console.css"`} {
		if !strings.Contains(body, want) {
			t.Errorf("page does not load %s", want)
		}
	}
	for _, s := range []string{"http://", "https://", "//cdn"} {
		if i := strings.Index(strings.ReplaceAll(body, "http://www.w3.org", ""), s); i >= 0 {
			t.Errorf("page refers outside: %q", body[max(0, i-40):i+40])
		}
	}
	for file, typ := range map[string]string{"console.js": "text/javascript", "console.css": "text/css"} {
		rec := get(t, c, "/console/static/"+file, nil)
		if rec.Code != 200 || !strings.HasPrefix(rec.Header().Get("Content-Type"), typ) || rec.Body.Len() < 1000 {
			t.Errorf("%s: %d %s, %d bytes", file, rec.Code, rec.Header().Get("Content-Type"), rec.Body.Len())
		}
	}
	if rec := get(t, c, "/console/", nil); rec.Code != http.StatusMovedPermanently || rec.Header().Get("Location") != "/console" {
		t.Errorf("/console/: %d to %q", rec.Code, rec.Header().Get("Location"))
	}
}

// TestSeries: samples of the registry become per-second rates over up to
// five seconds, the mean flush time, and nulls where sampling stopped or
// a counter was reset.
func TestSeries(t *testing.T) {
	reg := prometheus.NewRegistry()
	in := prometheus.NewCounter(prometheus.CounterOpts{Name: metricMentionsIn})
	out := prometheus.NewCounter(prometheus.CounterOpts{Name: metricWritesOut})
	throttled := prometheus.NewCounterVec(prometheus.CounterOpts{Name: metricThrottled}, []string{"op"})
	flush := prometheus.NewHistogram(prometheus.HistogramOpts{Name: metricFlush})
	reg.MustRegister(in, out, throttled, flush)
	c := newTestConsole(t, &fakeAPI{}, Config{Metrics: reg})

	t0 := time.Unix(1_800_000_000, 0)
	c.sample(t0)
	for i := 1; i <= 6; i++ {
		in.Add(1000)
		out.Add(10)
		throttled.WithLabelValues("a").Add(1)
		throttled.WithLabelValues("b").Add(2)
		flush.Observe(0.010 * float64(i))
		c.sample(t0.Add(time.Duration(i) * time.Second))
	}
	// Nobody watched for a minute.
	in.Add(1e6)
	c.sample(t0.Add(time.Minute))
	s := c.ring.series()
	if len(s.T) != 7 {
		t.Fatalf("%d points, want 7: %+v", len(s.T), s)
	}
	for i := range 6 {
		if s.MentionsIn[i] != 1000 || s.WritesOut[i] != 10 || s.Throttled[i] != 3 {
			t.Errorf("point %d: in %v out %v throttled %v, want 1000, 10, 3", i, s.MentionsIn[i], s.WritesOut[i], s.Throttled[i])
		}
	}
	// The last point's span is the 5 samples before it: flushes 2..6 at
	// 20..60 ms, a mean of 40 ms.
	if got := float64(s.FlushMs[5]); math.Abs(got-40) > 1e-6 {
		t.Errorf("flush ms %v, want 40", got)
	}
	if !math.IsNaN(float64(s.MentionsIn[6])) || !math.IsNaN(float64(s.FlushMs[6])) {
		t.Errorf("after a gap: in %v, flush %v, want no data", s.MentionsIn[6], s.FlushMs[6])
	}
	raw, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(raw), `"mentionsIn":[1000,1000,1000,1000,1000,1000,null]`) {
		t.Errorf("JSON %s", raw)
	}
}

// TestSamplesOnlyWhileWatched: the sampler gathers the registry only
// within the window after a view.
func TestSamplesOnlyWhileWatched(t *testing.T) {
	var gathers atomic.Int64
	g := prometheus.GathererFunc(func() ([]*dto.MetricFamily, error) {
		gathers.Add(1)
		return nil, nil
	})
	c := newTestConsole(t, &fakeAPI{}, Config{Metrics: g})
	clock := testenv.NewClock(time.Unix(1_800_000_000, 0))
	c.now = clock.Now

	c.tick(clock.Now())
	if n := gathers.Load(); n != 0 {
		t.Errorf("%d gathers before anyone watched", n)
	}
	get(t, c, "/console/api/state", nil)
	for range 3 {
		clock.Add(time.Second)
		c.tick(clock.Now())
	}
	if n := gathers.Load(); n != 3 {
		t.Errorf("%d gathers in 3 ticks after a view, want 3", n)
	}
	clock.Add(window)
	c.tick(clock.Now())
	if n := gathers.Load(); n != 3 {
		t.Errorf("%d gathers a window after the last view, want still 3", n)
	}
}

// TestRace: one race at a time, only from the page, only where enabled;
// direct writes are held at the ceiling and throttled, coalesced ones
// carry every mention offered.
func TestRace(t *testing.T) {
	post := func(c *Console, header bool) *httptest.ResponseRecorder {
		req := httptest.NewRequest(http.MethodPost, "/console/api/race", nil)
		req.RemoteAddr, req.Host = "127.0.0.1:4000", "localhost:9091"
		if header {
			req.Header.Set("X-Hotcount-Console", "1")
		}
		rec := httptest.NewRecorder()
		c.ServeHTTP(rec, req)
		return rec
	}
	if rec := post(newTestConsole(t, &fakeAPI{}, Config{}), true); rec.Code != http.StatusForbidden || !strings.Contains(rec.Body.String(), "--console-race") {
		t.Errorf("race off: %d %s", rec.Code, rec.Body)
	}

	c := newTestConsole(t, &fakeAPI{}, Config{Race: true})
	c.race = raceParams{Shards: 1, Ceiling: 50, Burst: 5, Writers: 4, Offered: 1000, FlushInterval: 50 * time.Millisecond, Duration: 2 * time.Second}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()

	if rec := post(c, false); rec.Code != http.StatusForbidden {
		t.Errorf("without the page's header: %d %s", rec.Code, rec.Body)
	}
	if rec := post(c, true); rec.Code != http.StatusAccepted {
		t.Fatalf("start: %d %s", rec.Code, rec.Body)
	}
	if rec := post(c, true); rec.Code != http.StatusConflict {
		t.Errorf("a second race while one runs: %d %s", rec.Code, rec.Body)
	}
	var r *raceState
	testenv.Eventually(t, 20*time.Second, func() error {
		var s state
		get(t, c, "/console/api/state", &s)
		if r = s.Race; r == nil || r.Running {
			return fmt.Errorf("race %+v", r)
		}
		return nil
	})
	secs := float64(r.ElapsedMs) / 1000
	if limit := 50*secs + 5; float64(r.Direct.Mentions) > limit || r.Direct.Mentions != r.Direct.Writes {
		t.Errorf("direct: %+v in %.1fs; want at most the ceiling's %.0f, one write each", r.Direct, secs, limit)
	}
	if r.Direct.Throttled == 0 {
		t.Errorf("direct: nothing throttled: %+v", r.Direct)
	}
	if r.Coalesced.Throttled != 0 || r.Coalesced.Mentions < 5*r.Direct.Mentions || r.Coalesced.Writes > r.Coalesced.Mentions/10 {
		t.Errorf("coalesced %+v, direct %+v: want none throttled, 5× the mentions in few writes", r.Coalesced, r.Direct)
	}
	if len(r.Points) < 2 {
		t.Errorf("%d points over %.1fs", len(r.Points), secs)
	}
	// The race is over: another may start, and Run's end stops it.
	c.race.Duration = time.Hour
	if rec := post(c, true); rec.Code != http.StatusAccepted {
		t.Fatalf("restart: %d %s", rec.Code, rec.Body)
	}
	cancel()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not stop the race and return")
	}
	var s state
	if get(t, c, "/console/api/state", &s); s.Race == nil || s.Race.Running {
		t.Errorf("after Run: race %+v, want stopped", s.Race)
	}
}

// TestPickerKeepsCachedTopics: the picker lists the hottest topics, then
// those the lookup cache holds, so a topic stays listed after its mentions
// stop (and /v1/hot forgets it).
func TestPickerKeepsCachedTopics(t *testing.T) {
	c := newTestConsole(t, &fakeAPI{}, Config{Known: func(limit int) []KnownTopic {
		return []KnownTopic{{Topic: "golang", Count: 1500}, {Topic: "quiet", Count: 9}}
	}})
	var s state
	if rec := get(t, c, "/console/api/state", &s); rec.Code != 200 {
		t.Fatalf("%d %s", rec.Code, rec.Body)
	}
	var names []string
	for _, tp := range s.Topics {
		names = append(names, tp.Topic)
	}
	if len(names) != 2 || names[0] != "golang" || names[1] != "quiet" || s.Topics[1].Count != 9 {
		t.Errorf("picker lists %v (%+v), want the hot golang once, then the cached quiet", names, s.Topics)
	}
}

// TestStateShowsRaises: the chosen topic's shard-count history comes with
// its state.
func TestStateShowsRaises(t *testing.T) {
	c := newTestConsole(t, &fakeAPI{}, Config{Raises: func(topic string) []Raise {
		if topic != "golang" {
			return nil
		}
		return []Raise{{At: 1000, From: 1, To: 2, Here: true}, {At: 2000, From: 2, To: 4}}
	}})
	var s state
	if rec := get(t, c, "/console/api/state?topic=golang", &s); rec.Code != 200 {
		t.Fatalf("%d %s", rec.Code, rec.Body)
	}
	if s.Topic == nil || len(s.Topic.Raises) != 2 || s.Topic.Raises[1].To != 4 || !s.Topic.Raises[0].Here {
		t.Errorf("raises %+v, want 1→2 here then 2→4", s.Topic)
	}
}
