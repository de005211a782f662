package lookup_test

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap/zaptest"

	"github.com/hotcount/hotcount/api"
	"github.com/hotcount/hotcount/heavyhitters"
	"github.com/hotcount/hotcount/internal/apitest"
	"github.com/hotcount/hotcount/lookup"
	"github.com/hotcount/hotcount/store"
)

// TestOpenAPILookupHandler holds every answer of the lookup handler, on
// its own (no hot topics, no time buckets, no pending: the 404s and 400s
// of what is not served here) and with hot topics and pending, to
// api/openapi.yaml; the sidecar's test does it for a whole sidecar
// (sidecar/openapi_test.go).
func TestOpenAPILookupHandler(t *testing.T) {
	st, b := newStore(t)
	add(t, b, "eu.west.k8s", 2, 42)
	add(t, b, "a/b", 0, 3)
	svc, _ := newService(t, st, time.Minute, time.Hour, nil)
	tracker := heavyhitters.New(16, time.Hour, time.Now)
	tracker.Observe(map[store.Counter]int64{store.TotalOf("eu.west.k8s"): 40, store.TotalOf("a/b"): 3})
	log := zaptest.NewLogger(t)
	bare := httptest.NewServer(svc.Handler(log, lookup.Extras{}))
	defer bare.Close()
	full := httptest.NewServer(svc.Handler(log, lookup.Extras{Pending: true, Hot: tracker.Top}))
	defer full.Close()
	const token = "0123456789abcdef-lookup"
	locked := httptest.NewServer(lookup.RequireToken(token, svc.Handler(log, lookup.Extras{})))
	defer locked.Close()

	ctx := context.Background()
	docs := map[string]*apitest.Doc{}
	for _, srv := range []*httptest.Server{bare, full, locked} {
		d, err := apitest.Load(ctx, api.OpenAPI, srv.URL, "http://127.0.0.1:1")
		if err != nil {
			t.Fatal(err)
		}
		docs[srv.URL] = d
	}
	bearer := http.Header{"Authorization": {"Bearer " + token}}
	tests := []struct {
		srv     *httptest.Server
		path    string
		header  http.Header
		status  int
		refused bool // the document refuses the request itself
	}{
		{full, "/v1/topics/eu.west.k8s", nil, 200, false},
		{full, "/v1/topics/eu.west.k8s", nil, 200, false}, // cached: max-age
		{full, "/v1/topics/nobody?consistency=eventual", nil, 200, false},
		{full, "/v1/topics/a%2Fb?consistency=strong", nil, 200, false},
		{full, "/v1/topics/eu.west.k8s?include=pending", nil, 200, false},
		{full, "/v1/topics?topic=eu.west.k8s&topic=nobody&include=pending", nil, 200, false},
		{full, "/v1/topics/eu.west.k8s/shards?consistency=strong", nil, 200, false},
		{full, "/v1/hot", nil, 200, false},
		{full, "/v1/hot?limit=1", nil, 200, false},
		{full, "/openapi.yaml", nil, 200, false},
		{full, "/v1/hot?limit=0", nil, 400, true},
		{full, "/v1/hot?limit=many", nil, 400, true},
		{full, "/v1/topics/x?consistency=linearizable", nil, 400, true},
		{full, "/v1/topics/x?include=everything", nil, 400, true},
		{full, "/v1/topics", nil, 400, true},
		{full, "/v1/topics?" + strings.Repeat("topic=a&", 101), nil, 400, true},
		{full, "/v1/topics?topic=ok&topic=", nil, 400, true},
		{full, "/v1/topics/x?window=0m", nil, 400, true},
		// What the document cannot say: a topic's length in bytes, its
		// control characters, parameters that exclude each other, unknown
		// parameters. The answer is still the documented 400.
		{full, "/v1/topics/" + strings.Repeat("x", 33), nil, 400, false},
		{full, "/v1/topics/a%01b", nil, 400, false},
		{full, "/v1/topics/x?cnsistency=strong", nil, 400, false},
		{full, "/v1/topics/x?topic=y", nil, 400, false},
		{full, "/v1/topics/x/shards?include=pending", nil, 400, false},
		{full, "/v1/topics/x/shards?window=5m", nil, 400, false}, // it reads no bucket: refused, not ignored
		// Not served by a bare handler.
		{bare, "/v1/hot", nil, 404, false},
		{bare, "/v1/trending", nil, 404, false},
		{bare, "/v1/topics/x/series", nil, 404, false},
		{bare, "/v1/topics/x?window=5m", nil, 400, false},
		{bare, "/v1/topics/x?include=pending", nil, 400, false},
		// Paths and methods it does not have.
		{bare, "/v2/whatever", nil, 404, true},
		{bare, "/v1/topics/a/b", nil, 404, true},
		// The token.
		{locked, "/v1/topics/eu.west.k8s", nil, 401, false},
		{locked, "/v1/topics/eu.west.k8s", http.Header{"Authorization": {"Basic eDp5"}}, 401, false},
		{locked, "/v1/topics/eu.west.k8s", http.Header{"Authorization": {"Bearer wrong"}}, 401, false},
		{locked, "/openapi.yaml", nil, 401, false},
		{locked, "/v1/topics/eu.west.k8s", bearer, 200, false},
		{locked, "/openapi.yaml", bearer, 200, false},
	}
	for _, tt := range tests {
		e, err := docs[tt.srv.URL].Get(ctx, http.DefaultClient, tt.srv.URL+tt.path, tt.header)
		if err != nil {
			t.Fatal(err)
		}
		checkExchange(t, e, tt.status, tt.refused)
	}
	// A method it does not have.
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, full.URL+"/v1/hot", nil)
	e, err := docs[full.URL].Do(http.DefaultClient, req)
	if err != nil {
		t.Fatal(err)
	}
	checkExchange(t, e, 404, true)

	// The store fails: 503.
	st.fail.Store(true)
	for _, path := range []string{"/v1/topics/uncached", "/v1/topics?topic=uncached2", "/v1/topics/x/shards"} {
		e, err := docs[full.URL].Get(ctx, http.DefaultClient, full.URL+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		checkExchange(t, e, 503, false)
	}
}

// checkExchange fails t unless e answered status, the document describes
// the answer, and it refuses the request exactly when refused.
func checkExchange(t *testing.T, e *apitest.Exchange, status int, refused bool) {
	t.Helper()
	if e.Status != status {
		t.Errorf("%v: want %d", e, status)
	}
	if e.ResponseErr != nil {
		t.Errorf("%v: the document does not describe the answer: %v", e, e.ResponseErr)
	}
	switch {
	case refused && e.RequestErr == nil:
		t.Errorf("%v: the document allows the request; want it refused", e)
	case !refused && e.RequestErr != nil:
		t.Errorf("%v: the document refuses the request: %v", e, e.RequestErr)
	}
}

// TestOpenAPIServed: GET /openapi.yaml serves api/openapi.yaml as it is
// in the repository, as YAML.
func TestOpenAPIServed(t *testing.T) {
	svc := lookup.New(lookup.Config{Shards: 1, CacheTTL: time.Second, CacheStale: time.Second, CacheSize: 10, MaxTopicBytes: 32}, newBolt(t), prometheus.NewRegistry(), time.Now)
	defer svc.Close()
	srv := httptest.NewServer(svc.Handler(zaptest.NewLogger(t), lookup.Extras{}))
	defer srv.Close()
	resp, err := http.Get(srv.URL + "/openapi.yaml")
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	file, err := os.ReadFile(filepath.Join("..", "api", "openapi.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/yaml" || !bytes.Equal(body, file) {
		t.Errorf("GET /openapi.yaml: %s %q, %d bytes; want 200 application/yaml and api/openapi.yaml's %d bytes", resp.Status, resp.Header.Get("Content-Type"), len(body), len(file))
	}
}
