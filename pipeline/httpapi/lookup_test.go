package httpapi_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap/zaptest"

	"github.com/hotcount/hotcount/internal/testtools/testenv"
	"github.com/hotcount/hotcount/pipeline/heavyhitters"
	"github.com/hotcount/hotcount/pipeline/httpapi"
	"github.com/hotcount/hotcount/pipeline/lookup"
	"github.com/hotcount/hotcount/pipeline/ownwrites"
	"github.com/hotcount/hotcount/pipeline/store"
	"github.com/hotcount/hotcount/schema"
)

// failing is the embedded store, counting the topics gathered, that fails
// every gather while fail is set.
type failing struct {
	*store.Bolt
	fail    atomic.Bool
	gathers atomic.Int64
}

func (f *failing) Gather(ctx context.Context, topic string, n int, consistent bool) ([]schema.Shard, error) {
	f.gathers.Add(1)
	if f.fail.Load() {
		return nil, errors.New("injected: store down")
	}
	return f.Bolt.Gather(ctx, topic, n, consistent)
}

func (f *failing) GatherMany(ctx context.Context, topics []string, n int, consistent bool) (map[string][]schema.Shard, error) {
	f.gathers.Add(int64(len(topics)))
	if f.fail.Load() {
		return nil, errors.New("injected: store down")
	}
	return f.Bolt.GatherMany(ctx, topics, n, consistent)
}

// newStore opens an embedded store in a folder of the test's.
func newStore(t testing.TB) *failing {
	b, err := store.OpenBolt(t.TempDir(), store.NewMetrics(prometheus.NewRegistry()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return &failing{Bolt: b}
}

// add adds n to shard of topic's total in st.
func add(t testing.TB, st *failing, topic string, shard int, n int64) {
	t.Helper()
	if err := st.Add(context.Background(), testenv.W(topic, shard, n), time.UnixMilli(1796198815543)); err != nil {
		t.Fatal(err)
	}
}

// newService is a lookup over st with 4 shards, topics of at most 32
// bytes, and the cache's TTL and stale bound, closed when the test ends.
func newService(t testing.TB, st lookup.Store, ttl, stale time.Duration) *lookup.Service {
	svc := lookup.New(lookup.Config{Shards: 4, CacheTTL: ttl, CacheStale: stale, CacheSize: 100, MaxTopicBytes: 32}, st, prometheus.NewRegistry(), time.Now)
	t.Cleanup(svc.Close)
	return svc
}

func get(t *testing.T, url string) (int, http.Header, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp.StatusCode, resp.Header, string(body)
}

func TestHTTP(t *testing.T) {
	st := newStore(t)
	add(t, st, "eu.west.k8s", 2, 42)
	add(t, st, "a/b", 0, 3) // NATS subjects may hold slashes: so may topics
	svc := newService(t, st, time.Minute, time.Hour)
	pending := map[string]int64{"eu.west.k8s": 8}
	tracker := heavyhitters.New(16, time.Hour, time.Now)
	tracker.Observe(map[schema.Counter]int64{schema.TotalOf("eu.west.k8s"): 40, schema.TotalOf("a/b"): 3, schema.TotalOf("quiet"): 1})
	v := ownwrites.New(ownwrites.Config{Keep: time.Hour, Topics: 100}, time.Now)
	v.Attach(func(topic string) int64 { return pending[topic] })
	svc.SeeWrites(v)
	srv := httptest.NewServer(httpapi.Lookup(svc, zaptest.NewLogger(t), httpapi.Extras{Pending: true, Hot: tracker.Top}))
	defer srv.Close()

	tests := []struct {
		name   string
		path   string
		status int
		want   string // a fragment of the body
	}{
		{"total", "/v1/topics/eu.west.k8s", 200, `"count":42,"source":"store","stale":false,"ageMs":`},
		{"cached", "/v1/topics/eu.west.k8s", 200, `"source":"cache"`},
		{"unknown is zero", "/v1/topics/nobody", 200, `"count":0`},
		{"escaped", "/v1/topics/caf%C3%A9", 200, `"topic":"café"`},
		{"quote", "/v1/topics/a%22b", 200, `"topic":"a\"b"`},
		{"escaped slash", "/v1/topics/a%2Fb", 200, `"topic":"a/b","count":3`},
		{"pending", "/v1/topics/eu.west.k8s?include=pending", 200, `"count":50,"source":"cache","stale":false,`},
		{"pending fields", "/v1/topics/eu.west.k8s?include=pending", 200, `"shards":4,"pending":8,"includesPending":true}`},
		{"strong", "/v1/topics/eu.west.k8s?consistency=strong", 200, `"count":42,"source":"store"`},
		{"batch", "/v1/topics?topic=eu.west.k8s&topic=nobody", 200, `{"topics":[{"topic":"eu.west.k8s","count":42,"source":"cache"`},
		{"shards", "/v1/topics/eu.west.k8s/shards", 200, `"shards":[{"shard":0,"count":0,"updatedAt":0},{"shard":1,"count":0,"updatedAt":0},{"shard":2,"count":42,"updatedAt":1796198815543},{"shard":3,"count":0,"updatedAt":0}]`},
		{"invalid utf8", "/v1/topics/a%FFb", 400, `"error":"topic is not valid UTF-8"`},
		{"control character", "/v1/topics/a%01b", 400, `"error":"topic contains control character U+0001"`},
		{"too long", "/v1/topics/" + strings.Repeat("x", 33), 400, `longer than 32`},
		{"bad consistency", "/v1/topics/x?consistency=linearizable", 400, `consistency \"linearizable\" is not cached, eventual or strong`},
		{"bad include", "/v1/topics/x?include=everything", 400, `is not pending`},
		{"unknown parameter", "/v1/topics/x?cnsistency=strong", 400, `unknown parameter`},
		{"batch without topics", "/v1/topics", 400, `name at least one topic`},
		{"batch too large", "/v1/topics?" + strings.Repeat("topic=a&", 101), 400, `at most 100 topics`},
		{"batch bad topic", "/v1/topics?topic=ok&topic=", 400, `topic 1: topic is empty`},
		{"no such path", "/v2/whatever", 404, `"error":"no such endpoint`},
		{"hot", "/v1/hot?limit=2", 200, `{"topics":[{"topic":"eu.west.k8s","count":40,"error":0,"rate":`},
		{"hot limit", "/v1/hot?limit=2", 200, `"shards":4},{"topic":"a/b","count":3,`},
		{"hot bad limit", "/v1/hot?limit=0", 400, `limit \"0\" is not a whole number in 1..100`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			status, hdr, body := get(t, srv.URL+tt.path)
			if status != tt.status || !strings.Contains(body, tt.want) {
				t.Errorf("GET %s = %d %s, want %d containing %s", tt.path, status, body, tt.status, tt.want)
			}
			if ct := hdr.Get("Content-Type"); ct != "application/json" {
				t.Errorf("Content-Type = %q", ct)
			}
			if !json.Valid([]byte(body)) {
				t.Errorf("body is not JSON: %s", body)
			}
			var compact bytes.Buffer
			if err := json.Compact(&compact, []byte(body)); err == nil && compact.String()+"\n" != body {
				t.Errorf("body is not one line of compact JSON and a newline: %q", body)
			}
		})
	}

	if _, hdr, _ := get(t, srv.URL+"/v1/topics/eu.west.k8s"); hdr.Get("Cache-Control") != "max-age=59" && hdr.Get("Cache-Control") != "max-age=60" {
		t.Errorf("Cache-Control = %q, want max-age of the TTL left", hdr.Get("Cache-Control"))
	}
	st.fail.Store(true)
	status, _, body := get(t, srv.URL+"/v1/topics/uncached")
	if status != 503 || !strings.Contains(body, "injected: store down") {
		t.Errorf("store failure: %d %s, want 503 with the reason", status, body)
	}
}

// FuzzTopicPath: no path makes the handler panic or answer 5xx, and every
// answer but the mux's redirect of an unclean path (like "..") is JSON.
func FuzzTopicPath(f *testing.F) {
	for _, s := range []string{"golang", "a%FFb", "%00", "a/b", "..", "%2F", strings.Repeat("x", 40), "x?consistency=strong", "?topic=a&topic=%FF"} {
		f.Add(s)
	}
	svc := lookup.New(lookup.Config{Shards: 2, CacheTTL: time.Second, CacheStale: time.Second, CacheSize: 10, MaxTopicBytes: 32}, newStore(f), prometheus.NewRegistry(), time.Now)
	defer svc.Close()
	h := httpapi.Lookup(svc, zaptest.NewLogger(f), httpapi.Extras{Pending: true})
	f.Fuzz(func(t *testing.T, topic string) {
		req, err := http.NewRequest("GET", "http://x/v1/topics/"+topic, nil)
		if err != nil {
			return // not a URL at all: never reaches a handler
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		redirect := w.Code >= 300 && w.Code < 400
		if w.Code >= 500 || (!redirect && !json.Valid(w.Body.Bytes())) {
			t.Fatalf("GET /v1/topics/%q = %d %s", topic, w.Code, w.Body.Bytes())
		}
	})
}
