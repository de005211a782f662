package api_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/hotcount/hotcount/admin"
	"github.com/hotcount/hotcount/api"
	"github.com/hotcount/hotcount/internal/apitest"
)

// TestOpenAPIDocument: api/openapi.yaml loads with kin-openapi as an
// OpenAPI 3.1 document and validates (every $ref resolved, every schema
// JSON Schema 2020-12, every example valid against its schema), names
// every operation, and is what the package embeds.
func TestOpenAPIDocument(t *testing.T) {
	file, err := os.ReadFile("openapi.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if string(file) != string(api.OpenAPI) {
		t.Fatal("api.OpenAPI is not openapi.yaml")
	}
	doc, err := apitest.Parse(context.Background(), api.OpenAPI)
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
			if len(item.Servers) == 0 && path != api.Path && op.Responses.Status(http.StatusBadRequest) == nil {
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
			doc := string(api.OpenAPI)
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
	d, err := apitest.Load(context.Background(), api.OpenAPI, apitest.LookupServer, apitest.AdminServer)
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
		{"TrendingTopic", `{"topic":"a","count":3,"baseline":1,"score":0.5}`, true},
		{"TrendingTopic", `{"topic":"a","count":1,"baseline":1,"score":0}`, false}, // exclusiveMinimum
		{"Trending", `{"window":"5m","from":"2026-12-03T10:48:00Z","to":"2026-12-03T10:52:30Z","source":"store","ageMs":0,"topics":[],"note":"no mentions in the window"}`, true},
		{"Trending", `{"window":"5m","from":"2026-12-03T10:48:00Z","to":"2026-12-03T10:52:30Z","source":"store","ageMs":0,"topics":[{"topic":"a","count":3,"baseline":1,"score":1}],"note":"x"}`, false},                             // dependentSchemas
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
	srv := httptest.NewServer(admin.Handler(reg, check, check, deps, func() map[string]any {
		return map[string]any{"quarantine": map[string]any{"heldCounters": map[string]int{"MENTIONS-3": 2}, "limitPerStream": 1000}}
	}))
	defer srv.Close()
	ctx := context.Background()
	d, err := apitest.Load(ctx, api.OpenAPI, apitest.LookupServer, srv.URL)
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
	srv := httptest.NewServer(api.Handler())
	defer srv.Close()
	resp, err := http.Get(srv.URL + api.Path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != api.ContentType || string(body) != string(api.OpenAPI) {
		t.Errorf("%s %q %d bytes; want the document", resp.Status, resp.Header.Get("Content-Type"), len(body))
	}
}
