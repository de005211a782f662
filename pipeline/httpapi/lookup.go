package httpapi

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/hotcount/hotcount/pipeline/heavyhitters"
	"github.com/hotcount/hotcount/pipeline/lookup"
	"github.com/hotcount/hotcount/pipeline/trend"
	"github.com/hotcount/hotcount/schema"
)

// Lookups is what the lookup API reads the totals from: lookup.Service's
// cached read path. The handler calls nothing else of it.
type Lookups interface {
	// Lookup is one topic's total at consistency c.
	Lookup(ctx context.Context, topic string, c lookup.Consistency) (lookup.Total, error)
	// LookupMany is the totals of topics (at most lookup.MaxBatch), in
	// the order asked.
	LookupMany(ctx context.Context, topics []string, c lookup.Consistency) ([]lookup.Total, error)
	// Shards gathers topic's shards now, bypassing the cache.
	Shards(ctx context.Context, topic string, consistent bool) (lookup.Total, []schema.Shard, error)
	// WithPending adds this sidecar's mentions not yet in t to t
	// (include=pending).
	WithPending(ctx context.Context, t *lookup.Total)
	// Config is the lookup's configuration: the handler reads the shard
	// count, the cache TTL and the topic size limit from it, once.
	Config() lookup.Config
}

// Extras are the handler's optional sources, nil when absent.
type Extras struct {
	// Pending serves include=pending: this sidecar writes, and shows its
	// mentions not yet in a total in the view it reads
	// (lookup.Service.SeeWrites).
	Pending bool
	// Hot is this sidecar's top topics by recent rate.
	Hot func(limit int) []heavyhitters.Topic
	// ShardsOf is a topic's shard count as this sidecar writes it.
	ShardsOf func(topic string) int
	// Trend answers ?window=, /series and /v1/trending.
	Trend Trend
}

// Trend answers windowed reads from the time buckets and the fleet's
// trending list (trend.Service). Errors wrapping trend.ErrBadRequest are
// the caller's (400).
type Trend interface {
	Window(ctx context.Context, topic, window string) (trend.Count, error)
	SeriesOf(ctx context.Context, topic, window, step string) (trend.Series, error)
	Trending(ctx context.Context, window string, limit int) (trend.Trending, error)
}

// Lookup returns the lookup API, the lookup listener's handler, over svc:
//
//	GET /v1/topics/{topic}         one total
//	GET /v1/topics?topic=a&topic=b  up to lookup.MaxBatch totals
//	GET /v1/topics/{topic}/shards  every shard and the total, uncached
//	GET /v1/hot?limit=k            this sidecar's hottest topics (k ≤ 100, default 10)
//	GET /v1/topics/{topic}/series?window=24h&step=1h  counts step by step
//	GET /v1/trending?window=15m&limit=20  the fleet's trending topics
//	GET /openapi.yaml              the API's OpenAPI document (OpenAPIHandler)
//
// Query parameters: consistency=cached|eventual|strong (default cached),
// include=pending (add this sidecar's unflushed delta; needs pending),
// window=D (the count over the last D from the time buckets instead of the
// total; needs Trend).
// Errors are JSON, {"error": "..."}: 400 for a bad topic or parameter, 404
// for another path, 503 when the store fails.
func Lookup(svc Lookups, log *zap.Logger, x Extras) http.Handler {
	h := &handler{svc: svc, cfg: svc.Config(), log: log.Named("lookup"), pending: x.Pending, hot: x.Hot, shardsOf: x.ShardsOf, trend: x.Trend}
	// The Cache-Control values a total can get, made once: setting a
	// header allocates its value's slice, per request, on the hot path.
	for n := range min(int(h.cfg.CacheTTL/time.Second), maxAges) + 1 {
		h.maxAge = append(h.maxAge, []string{"max-age=" + strconv.Itoa(n)})
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/hot", h.hottest)
	mux.HandleFunc("GET /v1/trending", h.trending)
	mux.HandleFunc("GET /v1/topics/{topic}/series", h.series)
	mux.HandleFunc("GET /v1/topics/{topic}", h.one)
	mux.HandleFunc("GET /v1/topics", h.many)
	mux.HandleFunc("GET /v1/topics/{topic}/shards", h.shards)
	mux.Handle("GET "+OpenAPIPath, OpenAPIHandler())
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, "no such endpoint: "+r.Method+" "+r.URL.Path)
	})
	return mux
}

type handler struct {
	svc      Lookups
	cfg      lookup.Config
	log      *zap.Logger
	pending  bool
	hot      func(int) []heavyhitters.Topic
	shardsOf func(string) int
	trend    Trend
	maxAge   [][]string // Cache-Control: max-age=n, by n
}

// maxAges bounds the max-age values made ahead (an hour of TTL); a longer
// one is made per answer.
const maxAges = 3600

// noCache is Cache-Control: no-cache, a header value shared by answers.
var noCache = []string{"no-cache"}

// hottest answers /v1/hot: the heavy hitters of the mentions this sidecar
// flushed, by rate, with the shards each is spread over.
func (h *handler) hottest(w http.ResponseWriter, r *http.Request) {
	if h.hot == nil {
		writeError(w, http.StatusNotFound, "hot-topic tracking is not available here")
		return
	}
	limit := 10
	if v := r.URL.Query().Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > lookup.MaxBatch {
			writeError(w, http.StatusBadRequest, "limit "+strconv.Quote(v)+" is not a whole number in 1..100")
			return
		}
		limit = n
	}
	type entry struct {
		heavyhitters.Topic
		Shards int `json:"shards"`
	}
	top := h.hot(limit)
	out := struct {
		Topics []entry `json:"topics"`
	}{Topics: make([]entry, len(top))}
	for i, t := range top {
		n := h.cfg.Shards
		if h.shardsOf != nil {
			n = h.shardsOf(t.Topic)
		}
		out.Topics[i] = entry{t, n}
	}
	body, err := json.Marshal(out)
	if err != nil {
		writeError(w, http.StatusInternalServerError, err.Error())
		return
	}
	w.Header().Set("Cache-Control", "no-store")
	writeBody(w, http.StatusOK, append(body, '\n'))
}

// options are a request's query parameters.
type options struct {
	consistency lookup.Consistency
	pending     bool
	topics      []string // batch only
	window      string   // a windowed count, not the total
}

// parse reads the query. It parses nothing when there is no query: the
// hot path (a plain cached lookup) allocates no query map.
func (h *handler) parse(r *http.Request) (options, error) {
	var o options
	if r.URL.RawQuery == "" {
		return o, nil
	}
	q, err := url.ParseQuery(r.URL.RawQuery)
	if err != nil {
		return o, err
	}
	for k := range q {
		if k != "consistency" && k != "include" && k != "topic" && k != "window" {
			return o, errors.New("unknown parameter " + strconv.Quote(k) + ": use consistency, include, window or topic")
		}
	}
	if q.Has("window") {
		switch {
		case h.trend == nil:
			return o, errors.New("window is not available here")
		case q.Has("consistency") || q.Has("include"):
			return o, errors.New("window reads the time buckets, cached like totals: it takes neither consistency nor include")
		}
		if o.window = q.Get("window"); o.window == "" {
			return o, errors.New("window is empty: give a whole number of minutes, hours or days (15m, 1h, 7d)")
		}
	}
	if o.consistency, err = lookup.ParseConsistency(q.Get("consistency")); err != nil {
		return o, err
	}
	switch q.Get("include") {
	case "":
	case "pending":
		if !h.pending {
			return o, errors.New("include=pending is not available here")
		}
		o.pending = true
	default:
		return o, errors.New("include " + strconv.Quote(q.Get("include")) + " is not pending")
	}
	o.topics = q["topic"]
	return o, nil
}

func (h *handler) topic(topic string) error {
	return schema.ValidateTopic(topic, h.cfg.MaxTopicBytes)
}

func (h *handler) one(w http.ResponseWriter, r *http.Request) {
	topic := r.PathValue("topic")
	if err := h.topic(topic); err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	o, err := h.parse(r)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	if len(o.topics) > 0 {
		writeError(w, http.StatusBadRequest, "topic is in the path; ?topic= is for /v1/topics")
		return
	}
	if o.window != "" {
		c, err := h.trend.Window(r.Context(), topic, o.window)
		h.answer(w, r, c, err)
		return
	}
	t, err := h.svc.Lookup(r.Context(), topic, o.consistency)
	if err != nil {
		h.storeError(w, r, err)
		return
	}
	if o.pending {
		p := t // only a total with pending mentions goes to the heap
		h.addPending(r.Context(), &p)
		t = p
	}
	w.Header()["Cache-Control"] = h.cacheControl(t, o)
	buf := getBuf()
	*buf = append(appendTotal(*buf, t), '\n')
	writeBody(w, http.StatusOK, *buf)
	putBuf(buf)
}

func (h *handler) many(w http.ResponseWriter, r *http.Request) {
	o, err := h.parse(r)
	switch {
	case err != nil:
	case len(o.topics) == 0:
		err = errNoTopics
	case len(o.topics) > lookup.MaxBatch:
		err = errors.New("at most " + strconv.Itoa(lookup.MaxBatch) + " topics in one lookup, got " + strconv.Itoa(len(o.topics)))
	}
	for i := 0; err == nil && i < len(o.topics); i++ {
		if terr := h.topic(o.topics[i]); terr != nil {
			err = errors.New("topic " + strconv.Itoa(i) + ": " + terr.Error())
		}
	}
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	if o.window != "" {
		out := struct {
			Topics []trend.Count `json:"topics"`
		}{make([]trend.Count, 0, len(o.topics))}
		for _, t := range o.topics {
			c, err := h.trend.Window(r.Context(), t, o.window)
			if err != nil {
				h.answer(w, r, nil, err)
				return
			}
			out.Topics = append(out.Topics, c)
		}
		h.answer(w, r, out, nil)
		return
	}
	ts, err := h.svc.LookupMany(r.Context(), o.topics, o.consistency)
	if err != nil {
		h.storeError(w, r, err)
		return
	}
	w.Header().Set("Cache-Control", "no-cache")
	buf := getBuf()
	b := append(*buf, `{"topics":[`...)
	for i := range ts {
		if o.pending {
			h.addPending(r.Context(), &ts[i])
		}
		if i > 0 {
			b = append(b, ',')
		}
		b = appendTotal(b, ts[i])
	}
	*buf = append(b, "]}\n"...)
	writeBody(w, http.StatusOK, *buf)
	putBuf(buf)
}

// series answers /v1/topics/{topic}/series?window=D&step=S.
func (h *handler) series(w http.ResponseWriter, r *http.Request) {
	topic := r.PathValue("topic")
	if err := h.topic(topic); err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	if h.trend == nil {
		writeError(w, http.StatusNotFound, "time buckets are not available here")
		return
	}
	q, err := url.ParseQuery(r.URL.RawQuery)
	if err == nil {
		err = only(q, "window", "step")
	}
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	window, step := q.Get("window"), q.Get("step")
	if window == "" {
		window = "24h"
	}
	if step == "" {
		step = "1h"
	}
	sr, err := h.trend.SeriesOf(r.Context(), topic, window, step)
	h.answer(w, r, sr, err)
}

// trending answers /v1/trending?window=D&limit=k.
func (h *handler) trending(w http.ResponseWriter, r *http.Request) {
	if h.trend == nil {
		writeError(w, http.StatusNotFound, "trending is not available here")
		return
	}
	q, err := url.ParseQuery(r.URL.RawQuery)
	if err == nil {
		err = only(q, "window", "limit")
	}
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	window, limit := q.Get("window"), 20
	if window == "" {
		window = "15m"
	}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > lookup.MaxBatch {
			writeError(w, http.StatusBadRequest, "limit "+strconv.Quote(v)+" is not a whole number in 1..100")
			return
		}
		limit = n
	}
	t, err := h.trend.Trending(r.Context(), window, limit)
	h.answer(w, r, t, err)
}

// only refuses query parameters other than names.
func only(q url.Values, names ...string) error {
	for k := range q {
		if !slices.Contains(names, k) {
			return errors.New("unknown parameter " + strconv.Quote(k) + ": use " + strings.Join(names, " or "))
		}
	}
	return nil
}

// answer writes v as JSON, or err: 400 for the caller's mistakes, 503 for
// the store's.
func (h *handler) answer(w http.ResponseWriter, r *http.Request, v any, err error) {
	switch {
	case errors.Is(err, trend.ErrBadRequest):
		writeError(w, http.StatusBadRequest, strings.TrimPrefix(err.Error(), trend.ErrBadRequest.Error()+": "))
		return
	case err != nil:
		h.storeError(w, r, err)
		return
	}
	body, err := json.Marshal(v)
	if err != nil {
		writeError(w, http.StatusInternalServerError, err.Error())
		return
	}
	w.Header().Set("Cache-Control", "no-cache")
	writeBody(w, http.StatusOK, append(body, '\n'))
}

// addPending adds this sidecar's mentions not yet in t to t
// (lookup.Service.WithPending). The sum is held at the highest one served
// for the topic: counts only grow, and a sum can still fall for a moment
// where a write of this sidecar may or may not be in a total (in doubt,
// or racing every read of the gathers it allows, see docs/API.md); each
// sum served is a count the topic reached.
func (h *handler) addPending(ctx context.Context, t *lookup.Total) { h.svc.WithPending(ctx, t) }

// cacheControl lets an HTTP cache keep a fresh cached total for what is
// left of its TTL, and nothing else.
func (h *handler) cacheControl(t lookup.Total, o options) []string {
	if t.Stale || o.pending || o.consistency != lookup.Cached {
		return noCache
	}
	left := h.cfg.CacheTTL - time.Duration(t.AgeMs)*time.Millisecond
	if left < time.Second {
		return noCache
	}
	if n := int(left / time.Second); n < len(h.maxAge) {
		return h.maxAge[n]
	}
	return []string{"max-age=" + strconv.Itoa(int(left/time.Second))}
}

func (h *handler) shards(w http.ResponseWriter, r *http.Request) {
	topic := r.PathValue("topic")
	if err := h.topic(topic); err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	o, err := h.parse(r)
	if err == nil && (o.pending || len(o.topics) > 0 || o.window != "") {
		err = errors.New("the shards endpoint takes only consistency")
	}
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	t, shards, err := h.svc.Shards(r.Context(), topic, o.consistency == lookup.Strong)
	if err != nil {
		h.storeError(w, r, err)
		return
	}
	w.Header().Set("Cache-Control", "no-store")
	body, err := json.Marshal(struct {
		Topic     string         `json:"topic"`
		Count     int64          `json:"count"`
		Saturated bool           `json:"saturated,omitempty"`
		Shards    []schema.Shard `json:"shards"`
		// Regions, on a global table: each Region's part of the count
		// as this Region's replica holds it, and its latest write.
		Regions []schema.RegionPart `json:"regions,omitempty"`
	}{t.Topic, t.Count, t.Saturated, shards, schema.ByRegion(shards)})
	if err != nil {
		writeError(w, http.StatusInternalServerError, err.Error())
		return
	}
	writeBody(w, http.StatusOK, append(body, '\n'))
}

// errNoTopics is a batch lookup without topics.
var errNoTopics = errors.New("name at least one topic: /v1/topics?topic=a&topic=b")

func (h *handler) storeError(w http.ResponseWriter, r *http.Request, err error) {
	if errors.Is(err, context.Canceled) && r.Context().Err() != nil {
		return // the client went away; nobody to answer
	}
	h.log.Warn("lookup failed", zap.String("path", r.URL.Path), zap.Error(err))
	writeError(w, http.StatusServiceUnavailable, err.Error())
}
