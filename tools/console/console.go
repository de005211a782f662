// Package console serves a live web console on the admin listener, at
// /console: a topic's total and shards filling up as increments land, the
// sidecar's mentions in against writes out over the last minutes, and, where
// enabled, a race of direct against coalesced writes on an emulated per-key
// ceiling. The page is a few hand-written files embedded in the binary, so
// it needs no network and no build step; it polls one JSON endpoint once a
// second.
//
// What a viewer costs: totals come through the lookup API's cache (never a
// strong read), a topic's shards are read at most once per shardsTTL
// whatever the number of viewers, and the metrics are sampled once a second
// from the sidecar's own registry, only while someone watches.
package console

import (
	"bytes"
	"context"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/hotcount/hotcount/pipeline/httpapi"
)

// Path is where the console is mounted on the admin listener; its assets
// and data are under Path + "/".
const Path = "/console"

// pollInterval is how often the page asks for the state, and how often the
// metrics are sampled: once a second bounds a page's cost and matches the
// charts' resolution.
const pollInterval = time.Second

// shardsTTL is how long a topic's shards, once read, serve every viewer:
// the shards endpoint is uncached, and N viewers must cost one read.
const shardsTTL = time.Second

// apiTimeout bounds one in-process call of the lookup API.
const apiTimeout = 5 * time.Second

// maxTopics is how many of the hottest topics the picker lists (the lookup
// API's own bound on /v1/hot).
const maxTopics = 100

//go:embed static
var static embed.FS

// Config is what the console reads from and what it may do.
type Config struct {
	// API is the lookup API's handler without its token check. The console
	// calls it in-process, so it serves exactly what the API serves (the
	// cached total, pending mentions, the hottest topics, the shards), from
	// the same cache.
	API http.Handler
	// WriteShards is the shard count this sidecar writes a topic on.
	WriteShards func(topic string) int
	// Metrics is the sidecar's registry, sampled for the charts.
	Metrics prometheus.Gatherer
	// Race enables the race button (--console-race; on in hotcount dev).
	Race bool
	// Raises lists the shard-count raises of a topic this sidecar made or
	// saw lately (shardcount.Book.History). Nil: none shown.
	Raises func(topic string) []Raise
	// Known lists up to limit topics the lookup cache holds, with their
	// cached totals (lookup.Service.Known): the picker lists them after
	// the hottest, so that a topic stays there once its mentions stop.
	// Nil: the hottest only.
	Known func(limit int) []KnownTopic
	// CacheTTL is the lookup cache's --cache-ttl. The page polls about as
	// often, so it nearly always finds a total just past it, marked stale
	// while its refresh runs: the page calls a total stale only when it is
	// older than twice the TTL (its refresh is late, or failing).
	CacheTTL time.Duration
	// Open serves the console's data to any address. Otherwise only to
	// this machine (a browser on it, kubectl port-forward): the admin
	// listener is usually reachable by Prometheus, and topic names and
	// counts are the lookup API's to protect. The sidecar sets it for
	// --http-public without a token file: with a token, the console has
	// no way to ask for it, so it stays local.
	Open bool
}

// Console is the console's HTTP handler and the owner of its sampler and
// its race. ServeHTTP is safe for concurrent use; Run samples and runs
// races until its context ends.
type Console struct {
	cfg   Config
	log   *zap.Logger
	now   func() time.Time
	mux   *http.ServeMux
	race  raceParams
	ring  *ring
	cache *shardCache

	lastView atomic.Int64 // Unix nanoseconds of the last state request
	raceReq  chan chan error

	mu      sync.Mutex
	current *race // the running or last race; nil before the first
}

// New returns a console over cfg. It starts nothing: Run does.
func New(cfg Config, log *zap.Logger) *Console {
	c := &Console{
		cfg:     cfg,
		log:     log.Named("console"),
		now:     time.Now,
		race:    defaultRace(),
		ring:    newRing(int(window / pollInterval)),
		cache:   newShardCache(shardsTTL, time.Now),
		raceReq: make(chan chan error),
	}
	assets, _ := fs.Sub(static, "static") // the folder is embedded above
	files := http.StripPrefix(Path+"/static/", http.FileServerFS(assets))
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+Path, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", "no-cache")
		// Never inside another site's frame: its race button would be
		// one click away from a visitor who did not mean it.
		w.Header().Set("X-Frame-Options", "DENY")
		w.Header().Set("Content-Security-Policy", "frame-ancestors 'none'")
		http.ServeFileFS(w, r, assets, "index.html")
	})
	mux.Handle("GET "+Path+"/{$}", http.RedirectHandler(Path, http.StatusMovedPermanently))
	mux.Handle("GET "+Path+"/static/", files)
	mux.Handle("GET "+Path+"/api/state", c.guard(http.HandlerFunc(c.state)))
	mux.Handle("POST "+Path+"/api/race", c.guard(http.HandlerFunc(c.startRace)))
	c.mux = mux
	return c
}

// ServeHTTP serves the page, its assets and its data under Path.
func (c *Console) ServeHTTP(w http.ResponseWriter, r *http.Request) { c.mux.ServeHTTP(w, r) }

// Run samples the metrics once a second while someone watches, and runs
// the races the page asks for, one at a time, until ctx ends; then it
// stops the race under way and waits for it.
func (c *Console) Run(ctx context.Context) error {
	tick := time.NewTicker(pollInterval)
	defer tick.Stop()
	var raceDone chan struct{} // nil while no race runs
	for {
		select {
		case <-ctx.Done():
			if raceDone != nil {
				<-raceDone
			}
			return nil
		case <-raceDone:
			raceDone = nil
		case <-tick.C:
			c.tick(c.now())
		case reply := <-c.raceReq:
			if raceDone != nil {
				reply <- errRaceBusy
				continue
			}
			r := newRace(c.race, time.Now()) // a race runs in real time
			c.mu.Lock()
			c.current = r
			c.mu.Unlock()
			raceDone = make(chan struct{})
			go func(done chan struct{}) {
				defer close(done)
				r.run(ctx)
			}(raceDone)
			reply <- nil
		}
	}
}

// tick samples the metrics if someone has watched within the window.
// Sampling gathers the whole registry, which pings the store for
// hotcount_dependency_up: nobody watching, no cost.
func (c *Console) tick(now time.Time) {
	if now.Sub(time.Unix(0, c.lastView.Load())) < window {
		c.sample(now)
	}
}

// guard serves h's data only to this machine (httpapi.LocalOnly) unless
// the console is Open.
func (c *Console) guard(h http.Handler) http.Handler {
	if c.cfg.Open {
		return h
	}
	return httpapi.LocalOnly(h, "", "the console's data is served to this machine only (a browser here at localhost or 127.0.0.1, or kubectl port-forward); --http-public without --http-token-file serves it to any address")
}

// state is everything the page shows, in one answer: the page polls it
// once a second.
type state struct {
	Now         int64       `json:"now"` // Unix ms
	RaceEnabled bool        `json:"raceEnabled"`
	Topics      []hotTopic  `json:"topics"`
	Topic       *topicState `json:"topic,omitempty"`
	Trending    *trending   `json:"trending,omitempty"`
	Series      series      `json:"series"`
	Race        *raceState  `json:"race"`
}

// trending is the fleet's trending list as /v1/trending answers it (absent
// where the sidecar keeps no minute buckets).
type trending struct {
	Window string `json:"window"`
	Note   string `json:"note,omitempty"`
	Topics []struct {
		Topic        string  `json:"topic"`
		Count        int64   `json:"count"`
		Contributors int64   `json:"contributors"`
		Score        float64 `json:"score"`
	} `json:"topics"`
}

// trendingWindow is the window of the console's trending list.
const trendingWindow = "5m"

// hotTopic is one entry of /v1/hot.
// Raise is a change of a topic's write shard count, as the page shows it.
type Raise struct {
	At   int64 `json:"at"` // Unix ms
	From int   `json:"from"`
	To   int   `json:"to"`
	Here bool  `json:"here"` // this sidecar raised it (else another did)
}

// KnownTopic is a topic the lookup cache holds, and its cached total.
type KnownTopic struct {
	Topic string
	Count int64
}

type hotTopic struct {
	Topic  string  `json:"topic"`
	Count  int64   `json:"count"`
	Rate   float64 `json:"rate"`
	Shards int     `json:"shards"`
}

// topicState is the chosen topic.
type topicState struct {
	Name string `json:"name"`
	// Error is the lookup API's refusal (a bad topic) or failure.
	Error string `json:"error,omitempty"`
	// Total is the cached total, as /v1/topics/{topic}?include=pending
	// serves it.
	Total *total `json:"total,omitempty"`
	// Shards are the shards, as /v1/topics/{topic}/shards serves them,
	// read at most once per shardsTTL for every viewer.
	Shards *shardsRead `json:"shards,omitempty"`
	// WriteShards is N, the shards this sidecar writes the topic on;
	// Shards lists the read set, M ≥ N.
	WriteShards int `json:"writeShards"`
	// Raises is the write count's history: the raises this sidecar made or
	// saw in the last hour, oldest first.
	Raises []Raise `json:"raises,omitempty"`
}

// total is /v1/topics/{topic}?include=pending's answer, with the gathered
// total apart from this sidecar's pending mentions.
type total struct {
	Gathered    int64  `json:"gathered"`
	Pending     int64  `json:"pending"`
	WithPending int64  `json:"withPending"`
	Source      string `json:"source"`
	Stale       bool   `json:"stale"`
	AgeMs       int64  `json:"ageMs"`
	Shards      int    `json:"shards"`
}

func (c *Console) state(w http.ResponseWriter, r *http.Request) {
	now := c.now()
	c.lastView.Store(now.UnixNano())
	out := state{Now: now.UnixMilli(), RaceEnabled: c.cfg.Race, Series: c.ring.series()}
	ctx, cancel := context.WithTimeout(r.Context(), apiTimeout)
	defer cancel()

	var hot struct {
		Topics []hotTopic `json:"topics"`
	}
	if err := c.call(ctx, "/v1/hot?limit="+strconv.Itoa(maxTopics), &hot); err != nil {
		c.log.Debug("hot topics", zap.Error(err))
	}
	out.Topics = hot.Topics
	if c.cfg.Known != nil {
		listed := make(map[string]bool, len(out.Topics))
		for _, t := range out.Topics {
			listed[t.Topic] = true
		}
		for _, k := range c.cfg.Known(maxTopics) {
			if len(out.Topics) >= maxTopics {
				break
			}
			if !listed[k.Topic] {
				t := hotTopic{Topic: k.Topic, Count: k.Count}
				if c.cfg.WriteShards != nil {
					t.Shards = c.cfg.WriteShards(k.Topic)
				}
				out.Topics = append(out.Topics, t)
			}
		}
	}
	if name := r.URL.Query().Get("topic"); name != "" {
		out.Topic = c.topic(ctx, name)
	}
	var tr trending
	if err := c.call(ctx, "/v1/trending?window="+trendingWindow+"&limit=10", &tr); err == nil {
		out.Trending = &tr // cached by the trend service: a viewer costs no read
	} else {
		c.log.Debug("trending", zap.Error(err))
	}
	c.mu.Lock()
	if c.current != nil {
		out.Race = c.current.snapshot(time.Now())
	}
	c.mu.Unlock()
	w.Header().Set("Cache-Control", "no-store")
	writeJSON(w, http.StatusOK, out)
}

// topic reads topic's total and shards through the lookup API.
func (c *Console) topic(ctx context.Context, name string) *topicState {
	t := &topicState{Name: name}
	path := "/v1/topics/" + url.PathEscape(name)
	var got struct {
		Count   int64  `json:"count"`
		Source  string `json:"source"`
		Stale   bool   `json:"stale"`
		AgeMs   int64  `json:"ageMs"`
		Shards  int    `json:"shards"`
		Pending int64  `json:"pending"`
	}
	if err := c.call(ctx, path+"?include=pending", &got); err != nil {
		t.Error = err.Error()
		return t
	}
	late := got.Stale && time.Duration(got.AgeMs)*time.Millisecond > 2*c.cfg.CacheTTL
	t.Total = &total{Gathered: got.Count - got.Pending, Pending: got.Pending, WithPending: got.Count,
		Source: got.Source, Stale: late, AgeMs: got.AgeMs, Shards: got.Shards}
	if c.cfg.WriteShards != nil {
		t.WriteShards = c.cfg.WriteShards(name)
	}
	if c.cfg.Raises != nil {
		t.Raises = c.cfg.Raises(name)
	}
	// The read is shared by every viewer of the topic: it must not end
	// when the viewer who started it leaves.
	shared := context.WithoutCancel(ctx)
	sh, err := c.cache.get(name, func() (shardsRead, error) {
		ctx, cancel := context.WithTimeout(shared, apiTimeout)
		defer cancel()
		var s shardsRead
		err := c.call(ctx, path+"/shards", &s)
		return s, err
	})
	if err != nil {
		t.Error = err.Error()
		return t
	}
	t.Shards = &sh
	return t
}

// call GETs path from the lookup API in-process and decodes its JSON into
// v; an answer other than 200 is an error carrying the API's message.
func (c *Console) call(ctx context.Context, path string, v any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, path, nil)
	if err != nil {
		return fmt.Errorf("console: %w", err)
	}
	rec := &recorder{header: make(http.Header)}
	c.cfg.API.ServeHTTP(rec, req)
	if rec.status != 0 && rec.status != http.StatusOK {
		var e errorBody
		if json.Unmarshal(rec.body.Bytes(), &e) != nil || e.Error == "" {
			e.Error = http.StatusText(rec.status)
		}
		return fmt.Errorf("%s (%d)", e.Error, rec.status)
	}
	if err := json.Unmarshal(rec.body.Bytes(), v); err != nil {
		return fmt.Errorf("console: decode %s: %w", path, err)
	}
	return nil
}

// recorder is the response of an in-process call.
type recorder struct {
	header http.Header
	status int
	body   bytes.Buffer
}

func (r *recorder) Header() http.Header { return r.header }

func (r *recorder) WriteHeader(status int) {
	if r.status == 0 {
		r.status = status
	}
}

func (r *recorder) Write(b []byte) (int, error) {
	r.WriteHeader(http.StatusOK)
	return r.body.Write(b)
}

var (
	errRaceBusy = errors.New("a race is running: one at a time")
	errRaceOff  = errors.New("the race is off here: --console-race turns it on (it is on in hotcount dev)")
)

// startRace asks Run for a race. The page sends a header of its own: a
// form on another site cannot, so it cannot start races in a browser
// that has the console open.
func (c *Console) startRace(w http.ResponseWriter, r *http.Request) {
	switch {
	case !c.cfg.Race:
		writeJSON(w, http.StatusForbidden, errorBody{errRaceOff.Error()})
		return
	case r.Header.Get("X-Hotcount-Console") == "":
		writeJSON(w, http.StatusForbidden, errorBody{"missing X-Hotcount-Console header: races start from the console page"})
		return
	}
	reply := make(chan error, 1)
	select {
	case c.raceReq <- reply:
	case <-r.Context().Done():
		return
	case <-time.After(apiTimeout):
		writeJSON(w, http.StatusServiceUnavailable, errorBody{"the console is not running (shutting down?)"})
		return
	}
	if err := <-reply; err != nil {
		writeJSON(w, http.StatusConflict, errorBody{err.Error()})
		return
	}
	writeJSON(w, http.StatusAccepted, struct {
		Started bool `json:"started"`
	}{true})
}

type errorBody struct {
	Error string `json:"error"`
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	body, err := json.Marshal(v)
	if err != nil {
		status, body = http.StatusInternalServerError, []byte(`{"error":"encoding the answer failed"}`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(append(body, '\n')) //nolint:errcheck // nothing to do about a client that left
}
