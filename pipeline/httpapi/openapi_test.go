package httpapi_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap/zaptest"

	"github.com/hotcount/hotcount/internal/testtools/apitest"
	"github.com/hotcount/hotcount/pipeline/heavyhitters"
	"github.com/hotcount/hotcount/pipeline/httpapi"
	"github.com/hotcount/hotcount/pipeline/lookup"
	"github.com/hotcount/hotcount/schema"
)

// TestOpenAPIDocument: pipeline/httpapi/openapi.yaml loads with kin-openapi as an
// OpenAPI 3.1 document and validates (every $ref resolved, every schema
// JSON Schema 2020-12, every example valid against its schema), names
// every operation, and is what the package embeds.
func TestOpenAPIDocument(t *testing.T) {
	file, err := os.ReadFile("openapi.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if string(file) != string(httpapi.OpenAPI) {
		t.Fatal("httpapi.OpenAPI is not openapi.yaml")
	}
	doc, err := apitest.Parse(context.Background(), httpapi.OpenAPI)
	if err != nil {
		t.Fatal(err)
	}
	if doc.OpenAPI != "3.1.0" {
		t.Errorf("openapi %q, want 3.1.0", doc.OpenAPI)
	}
	ids := map[string]string{}
	for path, item := range doc.Paths.Map() {
		for method, op := range item.Operations() {
			if method != http.MethodGet {
				t.Errorf("%s %s: every endpoint is a GET", method, path)
			}
			if op.OperationID == "" {
				t.Errorf("%s %s has no operationId", method, path)
			}
			if other, ok := ids[op.OperationID]; ok {
				t.Errorf("%s %s and %s share operationId %s", method, path, other, op.OperationID)
			}
			ids[op.OperationID] = path
			if len(item.Servers) == 0 && path != httpapi.OpenAPIPath && op.Responses.Status(http.StatusBadRequest) == nil {
				t.Errorf("%s %s: a lookup operation without its 400", method, path)
			}
			if len(item.Servers) == 0 && op.Responses.Status(http.StatusUnauthorized) == nil {
				t.Errorf("%s %s: a lookup operation without its 401", method, path)
			}
		}
	}
}

// TestOpenAPIBrokenDocuments: documents that are wrong as documents (not
// as descriptions of the answers: sidecar/openapi_test.go does those)
// fail to load.
func TestOpenAPIBrokenDocuments(t *testing.T) {
	for _, tt := range []struct{ name, old, new string }{
		{"OpenAPI 3.0", "openapi: 3.1.0", "openapi: 3.0.3"},
		{"a $ref to nothing", `$ref: "#/components/schemas/Total"`, `$ref: "#/components/schemas/Totals"`},
		{"an example its schema refuses", "{topic: golang, count: 1500,", "{topic: golang, count: many,"},
		{"a property example its schema refuses", "examples: [golang, eu.west.k8s]", "examples: [golang, 42]"},
		{"a pattern that is not a regular expression", `pattern: "^0*[1-9][0-9]*[mhd]$"`, `pattern: "^(0*[1-9][0-9]*[mhd]$"`},
		{"a default its schema refuses", "default: 24h", "default: 24 hours"},
		{"a path parameter that is not in the path", "name: topic\n      in: path", "name: topicName\n      in: path"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			doc := string(httpapi.OpenAPI)
			if !strings.Contains(doc, tt.old) {
				t.Fatalf("%q is not in the document", tt.old)
			}
			doc = strings.Replace(doc, tt.old, tt.new, 1)
			if _, err := apitest.Parse(context.Background(), []byte(doc)); err == nil {
				t.Error("the broken document loads")
			} else {
				t.Logf("refused: %.300s", err)
			}
		})
	}
}

// TestOpenAPISchemaKeywords: the JSON Schema 2020-12 keywords the
// document leans on (OpenAPI 3.1's) are enforced by kin-openapi, not just
// accepted: const, dependentRequired, dependentSchemas, if/then/else, a
// numeric exclusiveMinimum, additionalProperties false.
func TestOpenAPISchemaKeywords(t *testing.T) {
	d, err := apitest.Load(context.Background(), httpapi.OpenAPI, apitest.LookupServer, apitest.AdminServer)
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		schema, body string
		ok           bool
	}{
		{"Total", `{"topic":"a","count":1,"source":"cache","stale":false,"ageMs":0,"shards":1}`, true},
		{"Total", `{"topic":"a","count":1,"source":"cache","stale":false,"ageMs":0,"shards":1,"pending":2,"includesPending":true}`, true},
		{"Total", `{"topic":"a","count":1,"source":"cache","stale":false,"ageMs":0,"shards":1,"pending":2}`, false},                         // dependentRequired
		{"Total", `{"topic":"a","count":1,"source":"cache","stale":false,"ageMs":0,"shards":1,"pending":2,"includesPending":false}`, false}, // const
		{"Total", `{"topic":"a","count":1,"source":"cache","stale":false,"ageMs":0,"shards":1,"saturated":false}`, false},                   // const
		{"Total", `{"topic":"a","count":1,"source":"cache","stale":false,"ageMs":0,"shards":1,"extra":1}`, false},                           // additionalProperties
		{"Total", `{"topic":"a","count":-1,"source":"cache","stale":false,"ageMs":0,"shards":1}`, false},                                    // minimum
		{"Total", `{"topic":"a","count":1,"source":"peer","stale":false,"ageMs":0,"shards":1}`, false},                                      // enum
		{"TrendingTopic", `{"topic":"a","count":3,"contributors":2,"baseline":1,"score":0.5}`, true},
		{"TrendingTopic", `{"topic":"a","count":1,"contributors":0,"baseline":1,"score":0}`, false}, // exclusiveMinimum
		{"Trending", `{"window":"5m","from":"2026-12-03T10:48:00Z","to":"2026-12-03T10:52:30Z","source":"store","ageMs":0,"topics":[],"note":"no mentions in the window"}`, true},
		{"Trending", `{"window":"5m","from":"2026-12-03T10:48:00Z","to":"2026-12-03T10:52:30Z","source":"store","ageMs":0,"topics":[{"topic":"a","count":3,"contributors":0,"baseline":1,"score":1}],"note":"x"}`, false},            // dependentSchemas
		{"Trending", `{"window":"5m","from":"2026-12-03T10:48:00Z","to":"2026-12-03T10:52:30Z","baselineFrom":"2026-12-03T10:46:00Z","baselineTo":"2026-12-03T10:48:00Z","source":"store","ageMs":0,"topics":[],"note":"x"}`, false}, // dependentSchemas
		{"Trending", `{"window":"5m","from":"2026-12-03T10:48:00Z","to":"2026-12-03T10:52:30Z","baselineFrom":"2026-12-03T10:46:00Z","source":"store","ageMs":0,"topics":[]}`, false},                                                // dependentRequired
		{"Health", `{"status":"fail","dependencies":{"nats":"ok","store":"ok"}}`, false},                                                                                                                                             // if/then
		{"Health", `{"status":"ok","error":"x","dependencies":{"nats":"ok","store":"ok"}}`, false},                                                                                                                                   // else
		{"Ready", `{"status":"fail","error":"shutting down"}`, true},
		{"RegionPart", `{"region":"","count":0,"shards":1,"updatedAt":0}`, true},
		{"Shard", `{"shard":0,"region":"","count":0,"updatedAt":0}`, false}, // a shard's region is absent, not ""
	} {
		err := d.Schema(tt.schema, []byte(tt.body))
		if (err == nil) != tt.ok {
			t.Errorf("%s %s: %v, want ok %v", tt.schema, tt.body, err, tt.ok)
		}
	}
}

// TestOpenAPIAdminProbes holds the admin listener's probes to the
// document as they answer when all is well and when the checks fail (a
// sidecar's /healthz fails after --health-flush-age without flush
// progress, its /readyz once shutdown begins), and its metrics.
func TestOpenAPIAdminProbes(t *testing.T) {
	fail := errors.New("no flush has written anything for 1m0s, more than 500ms")
	var failing bool
	check := func(context.Context) error {
		if failing {
			return fail
		}
		return nil
	}
	deps := func(context.Context) map[string]string {
		if failing {
			return map[string]string{"nats": "nats: not connected", "store": "store: describe table hotcount: timeout"}
		}
		return map[string]string{"nats": "ok", "store": "ok"}
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(prometheus.NewGauge(prometheus.GaugeOpts{Name: "hotcount_test", Help: "A gauge."}))
	srv := httptest.NewServer(httpapi.Admin(reg, check, check, deps, func() map[string]any {
		return map[string]any{"quarantine": map[string]any{"heldCounters": map[string]int{"MENTIONS-3": 2}, "limitPerStream": 1000}}
	}))
	defer srv.Close()
	ctx := context.Background()
	d, err := apitest.Load(ctx, httpapi.OpenAPI, apitest.LookupServer, srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	for _, failing = range []bool{false, true} {
		want := http.StatusOK
		if failing {
			want = http.StatusServiceUnavailable
		}
		for _, path := range []string{"/healthz", "/readyz"} {
			x, err := d.Get(ctx, http.DefaultClient, srv.URL+path, nil)
			if err != nil {
				t.Fatal(err)
			}
			if x.Status != want || x.RequestErr != nil || x.ResponseErr != nil {
				t.Errorf("%v: want %d and an answer the document describes: %v, %v", x, want, x.RequestErr, x.ResponseErr)
			}
		}
	}
	x, err := d.Get(ctx, http.DefaultClient, srv.URL+"/metrics", nil)
	if err != nil {
		t.Fatal(err)
	}
	if x.Status != 200 || x.ResponseErr != nil || !strings.Contains(string(x.Body), "hotcount_test 0") {
		t.Errorf("%v: %v", x, x.ResponseErr)
	}
}

// TestOpenAPIHandler: the handler serves the document as YAML.
func TestOpenAPIHandler(t *testing.T) {
	srv := httptest.NewServer(httpapi.OpenAPIHandler())
	defer srv.Close()
	resp, err := http.Get(srv.URL + httpapi.OpenAPIPath)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != httpapi.OpenAPIContentType || string(body) != string(httpapi.OpenAPI) {
		t.Errorf("%s %q %d bytes; want the document", resp.Status, resp.Header.Get("Content-Type"), len(body))
	}
}

// TestOpenAPILookupHandler holds every answer of the lookup handler, on
// its own (no hot topics, no time buckets, no pending: the 404s and 400s
// of what is not served here) and with hot topics and pending, to
// openapi.yaml; the sidecar's test does it for a whole sidecar
// (sidecar/openapi_test.go).
func TestOpenAPILookupHandler(t *testing.T) {
	st := newStore(t)
	add(t, st, "eu.west.k8s", 2, 42)
	add(t, st, "a/b", 0, 3)
	svc := newService(t, st, time.Minute, time.Hour)
	tracker := heavyhitters.New(16, time.Hour, time.Now)
	tracker.Observe(map[schema.Counter]int64{schema.TotalOf("eu.west.k8s"): 40, schema.TotalOf("a/b"): 3})
	log := zaptest.NewLogger(t)
	bare := httptest.NewServer(httpapi.Lookup(svc, log, httpapi.Extras{}))
	defer bare.Close()
	full := httptest.NewServer(httpapi.Lookup(svc, log, httpapi.Extras{Pending: true, Hot: tracker.Top}))
	defer full.Close()
	const token = "0123456789abcdef-lookup"
	locked := httptest.NewServer(httpapi.RequireToken(token, httpapi.Lookup(svc, log, httpapi.Extras{})))
	defer locked.Close()

	ctx := context.Background()
	docs := map[string]*apitest.Doc{}
	for _, srv := range []*httptest.Server{bare, full, locked} {
		d, err := apitest.Load(ctx, httpapi.OpenAPI, srv.URL, "http://127.0.0.1:1")
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

// TestOpenAPIServed: the lookup handler's GET /openapi.yaml serves
// openapi.yaml as it is in the repository, as YAML.
func TestOpenAPIServed(t *testing.T) {
	svc := lookup.New(lookup.Config{Shards: 1, CacheTTL: time.Second, CacheStale: time.Second, CacheSize: 10, MaxTopicBytes: 32}, newStore(t), prometheus.NewRegistry(), time.Now)
	defer svc.Close()
	srv := httptest.NewServer(httpapi.Lookup(svc, zaptest.NewLogger(t), httpapi.Extras{}))
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
	file, err := os.ReadFile("openapi.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/yaml" || !bytes.Equal(body, file) {
		t.Errorf("GET /openapi.yaml: %s %q, %d bytes; want 200 application/yaml and openapi.yaml's %d bytes", resp.Status, resp.Header.Get("Content-Type"), len(body), len(file))
	}
}
