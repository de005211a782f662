package sidecar_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/oapi-codegen/oapi-codegen/v2/pkg/codegen"
	// The generated client's runtime: imported here so that go.mod pins
	// it and make deps downloads it, and the client builds offline.
	_ "github.com/oapi-codegen/runtime"

	"github.com/hotcount/hotcount/config"
	"github.com/hotcount/hotcount/internal/testtools/apitest"
	"github.com/hotcount/hotcount/internal/testtools/ddbfault"
	"github.com/hotcount/hotcount/internal/testtools/testenv"
	"github.com/hotcount/hotcount/pipeline/httpapi"
	"github.com/hotcount/hotcount/sidecar"
)

// openapiToken is the lookup token of the tests' token-protected sidecars.
const openapiToken = "openapi-test-token-0123456789"

// tokenFile writes openapiToken to a file for --http-token-file.
func tokenFile(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(path, []byte(openapiToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// probe is one request of the scenario and what it must get.
type probe struct {
	path   string
	status int  // 0: any status the document describes
	token  bool // send the bearer token
	// refused says the document itself refuses the request (a path it
	// does not have, a parameter out of its schema); a request it cannot
	// tell is wrong (parameters that exclude each other, a window past
	// retention) is not refused, and its 400 is still documented.
	refused bool
}

// TestOpenAPIAnswers holds every answer of two running sidecars to
// pipeline/httpapi/openapi.yaml, errors included: one plain, one with a lookup
// token and Region-owned shards (a global table's: each shard names its Region, and
// the shards answer has regions). Eight minutes of mentions on a stepped
// clock give the windows, series and trending history; a store outage
// gives 503s. Then each deliberately wrong copy of the
// document (a property's type changed, a required field added or dropped,
// a status, header or media type changed) fails on the same answers.
func TestOpenAPIAnswers(t *testing.T) {
	// A stepped clock in the recent past: reads take a bucket past its
	// retention (48h for minutes, by the real clock) as gone.
	clk := testenv.NewClock(time.Now().UTC().Truncate(time.Minute).Add(-15*time.Minute + 30*time.Second))
	tune := func(c *config.Config) {
		c.FlushInterval = 50 * time.Millisecond
		c.CacheTTL = time.Millisecond
	}
	a := newFaultEnv(t, &ddbfault.Config{}, tune, sidecar.WithClock(clk.Now))
	b := newEnvOn(t, a, func(c *config.Config) {
		c.DataDir = t.TempDir()
		c.Region, c.Regions = "us-east-1", "us-east-1,eu-west-1"
		c.HTTPTokenFile = tokenFile(t)
	})
	fleet := []*env{a, b}
	ctx := context.Background()
	docA, err := apitest.Load(ctx, httpapi.OpenAPI, a.sc.URL(), a.sc.AdminURL())
	if err != nil {
		t.Fatal(err)
	}
	docB, err := apitest.Load(ctx, httpapi.OpenAPI, b.sc.URL(), b.sc.AdminURL())
	if err != nil {
		t.Fatal(err)
	}
	var seen []*apitest.Exchange // every exchange, for the wrong documents
	run := func(e *env, doc *apitest.Doc, probes []probe) {
		t.Helper()
		for _, p := range probes {
			var header http.Header
			if p.token {
				header = http.Header{"Authorization": {"Bearer " + openapiToken}}
			}
			base := e.sc.URL()
			if isAdmin(p.path) {
				base = e.sc.AdminURL()
			}
			x, err := doc.Get(ctx, http.DefaultClient, base+p.path, header)
			if err != nil {
				t.Fatal(err)
			}
			holdExchange(t, x, p)
			seen = append(seen, x)
		}
	}

	// Before any mention: nothing trends, and the note says why.
	run(a, docA, []probe{{path: "/v1/trending?window=5m", status: 200}})

	// Eight minutes of mentions, a surge in the last.
	nc := testenv.Connect(t, a.nats)
	var published int64
	for m := range 8 {
		if m > 0 {
			clk.Add(time.Minute)
		}
		mentions := map[string]int{"steady": 20, "a/b": 3, "eu.west.k8s": 5, "surge": 1}
		if m == 7 {
			mentions["surge"] = 60
		}
		for topic, n := range mentions {
			for range n {
				if err := nc.Publish("mentions."+topic, nil); err != nil {
					t.Fatal(err)
				}
				published++
			}
		}
		if err := nc.Flush(); err != nil {
			t.Fatal(err)
		}
		flushedAll(t, fleet, published)
	}
	testenv.Eventually(t, 10*time.Second, func() error {
		var tr struct{ Topics []struct{ Topic string } }
		getJSON(t, a, "/v1/trending?window=1m&limit=5", &tr)
		if len(tr.Topics) == 0 || tr.Topics[0].Topic != "surge" {
			return fmt.Errorf("trending %+v, want the surge first", tr.Topics)
		}
		return nil
	})

	common := []probe{
		{path: "/v1/hot", status: 200},
		{path: "/v1/hot?limit=2", status: 200},
		{path: "/v1/topics/steady", status: 200},
		{path: "/v1/topics/a%2Fb?consistency=strong", status: 200},
		{path: "/v1/topics/eu.west.k8s?consistency=eventual&include=pending", status: 200},
		{path: "/v1/topics/nobody", status: 200},
		{path: "/v1/topics/surge?window=5m", status: 200},
		{path: "/v1/topics/surge?window=24h", status: 200},
		{path: "/v1/topics?topic=steady&topic=a%2Fb&topic=nobody", status: 200},
		{path: "/v1/topics?topic=steady&topic=surge&include=pending&consistency=strong", status: 200},
		{path: "/v1/topics?topic=steady&topic=surge&window=15m", status: 200},
		{path: "/v1/topics/steady/shards", status: 200},
		{path: "/v1/topics/a%2Fb/shards?consistency=strong", status: 200},
		{path: "/v1/topics/nobody/shards", status: 200},
		{path: "/v1/topics/surge/series", status: 200},
		{path: "/v1/topics/surge/series?window=10m&step=1m", status: 200},
		{path: "/v1/topics/surge/series?window=2h&step=1h", status: 200},
		{path: "/v1/trending", status: 200},
		{path: "/v1/trending?window=1m&limit=5", status: 200},
		{path: "/v1/trending?window=5m", status: 200},
		{path: "/openapi.yaml", status: 200},

		// Errors the document itself refuses.
		{path: "/v1/hot?limit=0", status: 400, refused: true},
		{path: "/v1/hot?limit=101", status: 400, refused: true},
		{path: "/v1/topics/steady?consistency=linearizable", status: 400, refused: true},
		{path: "/v1/topics/steady?include=everything", status: 400, refused: true},
		{path: "/v1/topics/steady?window=15", status: 400, refused: true},
		{path: "/v1/topics/steady?window=0m", status: 400, refused: true},
		{path: "/v1/topics", status: 400, refused: true},
		{path: "/v1/topics?" + strings.Repeat("topic=a&", 101), status: 400, refused: true},
		{path: "/v1/topics?topic=a&topic=", status: 400, refused: true},
		{path: "/v1/topics/steady/shards?consistency=bogus", status: 400, refused: true},
		{path: "/v1/topics/steady/series?window=1w", status: 400, refused: true},
		{path: "/v1/topics/steady/series?step=-1m", status: 400, refused: true},
		{path: "/v1/trending?limit=many", status: 400, refused: true},
		{path: "/v1/trending?window=1s", status: 400, refused: true},
		{path: "/v2/topics/steady", status: 404, refused: true},
		{path: "/v1/topics/a/b", status: 404, refused: true},
		{path: "/v1/topics/steady/other", status: 404, refused: true},
		// Errors it cannot tell from the request: the answer is still
		// its documented 400.
		{path: "/v1/topics/" + strings.Repeat("x", 300), status: 400},
		{path: "/v1/topics/a%01b", status: 400},
		{path: "/v1/topics/a%FFb", status: 400},
		{path: "/v1/topics/steady?cnsistency=strong", status: 400},
		{path: "/v1/topics/steady?topic=other", status: 400},
		{path: "/v1/topics/steady?window=5m&consistency=strong", status: 400},
		{path: "/v1/topics/steady?window=401d", status: 400},
		{path: "/v1/topics?topic=a&window=5m&include=pending", status: 400},
		{path: "/v1/topics/steady/shards?include=pending", status: 400},
		{path: "/v1/topics/steady/series?window=1h&step=2h", status: 400},
		{path: "/v1/topics/steady/series?window=2d&step=1m", status: 400},
		{path: "/v1/topics/steady/series?limit=3", status: 400},
		{path: "/v1/trending?window=2h", status: 400},
		{path: "/v1/trending?topic=steady", status: 400},
	}
	admin := []probe{
		{path: "/healthz"}, // 200, or 503 if a flush was slow: both documented
		{path: "/readyz", status: 200},
		{path: "/metrics", status: 200},
		{path: "/console", status: 200},
	}
	run(a, docA, common)
	run(a, docA, admin)
	withToken := make([]probe, 0, len(common))
	for _, p := range common {
		p.token = true
		withToken = append(withToken, p)
	}
	run(b, docB, withToken)
	run(b, docB, admin)
	run(b, docB, []probe{
		{path: "/v1/topics/steady", status: 401},
		{path: "/v1/hot", status: 401},
		{path: "/openapi.yaml", status: 401},
		{path: "/v2/anything", status: 401, refused: true}, // the token is checked first
	})
	// A wrong token, and not a bearer token.
	for _, auth := range []string{"Bearer wrong", "Basic b3BlbmFwaTp0ZXN0"} {
		x, err := docB.Get(ctx, http.DefaultClient, b.sc.URL()+"/v1/topics/steady", http.Header{"Authorization": {auth}})
		if err != nil {
			t.Fatal(err)
		}
		holdExchange(t, x, probe{status: 401})
		seen = append(seen, x)
	}
	// A method it does not have.
	req, _ := http.NewRequestWithContext(ctx, http.MethodDelete, a.sc.URL()+"/v1/topics/steady", nil)
	x, err := docA.Do(http.DefaultClient, req)
	if err != nil {
		t.Fatal(err)
	}
	holdExchange(t, x, probe{status: 404, refused: true})
	seen = append(seen, x)

	// What the answers hold that the scenario needs them to.
	needs := map[string]bool{}
	for _, x := range seen {
		if x.Status != 200 {
			continue
		}
		for _, want := range []string{`"regions":[`, `"region":"us-east-1"`, `"includesPending":true`, `"note":"`, `"baselineFrom":"`, `"resolution":"1h"`, `"score":`, `"rate":`} {
			if bytes.Contains(x.Body, []byte(want)) {
				needs[want] = true
			}
		}
	}
	for _, want := range []string{`"regions":[`, `"region":"us-east-1"`, `"includesPending":true`, `"note":"`, `"baselineFrom":"`, `"resolution":"1h"`, `"score":`} {
		if !needs[want] {
			t.Errorf("no answer holds %s: the scenario misses a case of the document", want)
		}
	}

	// The store fails: the lookups that must read it answer 503.
	a.fault.SetOutage(time.Minute)
	run(a, docA, []probe{
		{path: "/v1/topics/never?consistency=strong", status: 503},
		{path: "/v1/topics?topic=never&topic=never2&consistency=eventual", status: 503},
		{path: "/v1/topics/never/shards", status: 503},
		{path: "/healthz"},
	})
	a.fault.EndOutage()

	// Every operation of the document answered.
	answered := map[string]bool{}
	for _, x := range seen {
		answered[x.Operation] = true
	}
	for path, item := range docA.T.Paths.Map() {
		for method, op := range item.Operations() {
			if !answered[op.OperationID] {
				t.Errorf("%s %s (%s) was never asked", method, path, op.OperationID)
			}
		}
	}

	// Each wrong document fails on these answers.
	for _, w := range wrongDocuments {
		t.Run("wrong/"+w.name, func(t *testing.T) {
			data := w.apply(t, string(httpapi.OpenAPI))
			wrongA, err := apitest.Load(ctx, []byte(data), a.sc.URL(), a.sc.AdminURL())
			if err != nil {
				t.Fatalf("the wrong document does not load: %v; it must load and fail on the answers", err)
			}
			wrongB, err := apitest.Load(ctx, []byte(data), b.sc.URL(), b.sc.AdminURL())
			if err != nil {
				t.Fatal(err)
			}
			failed := 0
			for _, x := range seen {
				d := wrongA
				if x.Request.URL.Host == b.sc.HTTPAddr() || x.Request.URL.Host == b.sc.AdminAddr() {
					d = wrongB
				}
				if _, err := d.Check(x.Request, x.Status, x.Header, x.Body); err != nil {
					failed++
				}
			}
			if failed == 0 {
				t.Errorf("every one of %d answers passes the wrong document", len(seen))
			}
			t.Logf("%d of %d answers fail", failed, len(seen))
		})
	}
}

// isAdmin says whether path is the admin listener's.
func isAdmin(path string) bool {
	for _, p := range []string{"/healthz", "/readyz", "/metrics", "/console"} {
		if path == p || strings.HasPrefix(path, p+"?") {
			return true
		}
	}
	return false
}

// holdExchange fails t unless x got p's status, the document describes its
// answer, and it refuses the request exactly when p says.
func holdExchange(t *testing.T, x *apitest.Exchange, p probe) {
	t.Helper()
	if p.status != 0 && x.Status != p.status {
		t.Errorf("%v: want %d", x, p.status)
	}
	if x.ResponseErr != nil {
		t.Errorf("%v: the document does not describe the answer: %v", x, x.ResponseErr)
	}
	switch {
	case p.refused && x.RequestErr == nil:
		t.Errorf("%v: the document allows the request; want it refused", x)
	case !p.refused && x.RequestErr != nil:
		t.Errorf("%v: the document refuses the request: %v", x, x.RequestErr)
	}
}

// wrongDocument is a deliberate mistake in a copy of the document.
type wrongDocument struct {
	name string
	// after is a unique text the change is made after ("" for the start);
	// old, once after it, becomes new.
	after, old, new string
}

func (w wrongDocument) apply(t *testing.T, doc string) string {
	t.Helper()
	i := 0
	if w.after != "" {
		if strings.Count(doc, w.after) != 1 {
			t.Fatalf("%q is not once in the document", w.after)
		}
		i = strings.Index(doc, w.after) + len(w.after)
	}
	j := strings.Index(doc[i:], w.old)
	if j < 0 {
		t.Fatalf("%q is not in the document after %q", w.old, w.after)
	}
	return doc[:i+j] + w.new + doc[i+j+len(w.old):]
}

// wrongDocuments each change what an answer has.
var wrongDocuments = []wrongDocument{
	{name: "a hot topic's error is a string", after: "Bounds the over-estimate.", old: "type: integer", new: "type: string"},
	{name: "pending is a string", after: "With `include=pending`, this sidecar's mentions", old: "type: integer", new: "type: string"},
	{name: "a shard's updatedAt is a string", after: "Unix milliseconds of the shard's last increment", old: "type: integer", new: "type: string"},
	{name: "hour resolution dropped", after: "\n    Resolution:\n", old: "enum: [1m, 1h]", new: "enum: [1m]"},
	{name: "a required field the answers lack", after: "\n    HotTopic:\n", old: "required: [topic, count, error, rate, shards]", new: "required: [topic, count, error, rate, shards, period]"},
	{name: "the shards answer without regions", after: "\n    Shards:\n", old: "        regions:\n", new: "        regionz:\n"},
	{name: "errors say message", after: "\n    Error:\n", old: "required: [error]", new: "required: [message]"},
	{name: "no 400 for a single lookup", after: "operationId: getTopic\n", old: "        \"400\":\n          $ref: \"#/components/responses/BadRequest\"\n", new: ""},
	{name: "shards cacheable", after: "operationId: getTopicShards\n", old: "const: no-store", new: "const: no-cache"},
	{name: "another realm", after: "WWW-Authenticate:", old: `const: Bearer realm="hotcount"`, new: `const: Bearer realm="counts"`},
	{name: "the note is a number", after: "Why the list is empty", old: "type: string", new: "type: integer"},
	{name: "health names a journal", after: "\n    Health:\n", old: "required: [nats, store]", new: "required: [nats, store, journal]"},
	{name: "the document as JSON", after: "operationId: getOpenAPI\n", old: "application/yaml:", new: "application/json:"},
	{name: "metrics as JSON", after: "operationId: getMetrics\n", old: "text/plain:", new: "application/json:"},
}

// TestOpenAPIGeneratedClient generates a Go client from pipeline/httpapi/openapi.yaml
// with oapi-codegen, builds it (offline: the module cache and this
// module's go.sum, through a workspace), and runs it against a sidecar
// with a lookup token: its totals, windows, shards, series, trending, hot
// topics, errors (400, 401) and the admin probes decode into the generated
// types and agree with the mentions published.
func TestOpenAPIGeneratedClient(t *testing.T) {
	e := newEnv(t, func(c *config.Config) {
		c.FlushInterval = 50 * time.Millisecond
		c.HTTPTokenFile = tokenFile(t)
	})
	nc := testenv.Connect(t, e.nats)
	for topic, n := range map[string]int{"a/b": 7, "golang": 30} {
		for range n {
			if err := nc.Publish("mentions."+topic, nil); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	flushedAll(t, []*env{e}, 37)

	bin := buildGeneratedClient(t)
	cmd := exec.Command(bin, e.sc.URL(), e.sc.AdminURL(), openapiToken)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("the generated client: %v\n%s", err, stderr.String())
	}
	var got struct {
		Total struct {
			Topic string
			Count int64
		}
		Window struct {
			Count      int64
			Resolution string
		}
		Batch struct {
			Topics []struct {
				Topic   string
				Count   int64
				Pending *int64
			}
		}
		Shards struct {
			Count  int64
			Shards []struct{ Count int64 }
		}
		Series       struct{ Points []struct{ Count int64 } }
		Trending     struct{ Window string }
		Hot          struct{ Topics []struct{ Topic string } }
		BadRequest   struct{ Error string }
		Unauthorized struct{ Error string }
		Health       struct {
			Status       string
			Dependencies struct{ Nats, Store string }
		}
		OpenAPI string
	}
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	t.Logf("the generated client got %s", out)
	var series int64
	for _, p := range got.Series.Points {
		series += p.Count
	}
	var shards int64
	for _, s := range got.Shards.Shards {
		shards += s.Count
	}
	switch {
	case got.Total.Topic != "a/b" || got.Total.Count != 7:
		t.Errorf("total %+v, want a/b's 7", got.Total)
	case got.Window.Count != 7 || got.Window.Resolution != "1m":
		t.Errorf("window %+v, want 7 in minutes", got.Window)
	case len(got.Batch.Topics) != 2 || got.Batch.Topics[0].Count != 30 || got.Batch.Topics[1].Count != 7 || got.Batch.Topics[0].Pending == nil:
		t.Errorf("batch %+v, want golang's 30 and a/b's 7 with pending", got.Batch)
	case got.Shards.Count != 30 || shards != 30:
		t.Errorf("shards %+v, want golang's 30", got.Shards)
	case series != 30:
		t.Errorf("series %+v, want golang's 30 in its points", got.Series)
	case got.Trending.Window != "15m":
		t.Errorf("trending %+v, want the 15m default", got.Trending)
	case !strings.Contains(got.BadRequest.Error, "bogus"):
		t.Errorf("400 %+v, want the bad consistency named", got.BadRequest)
	case got.Unauthorized.Error == "":
		t.Errorf("401 %+v, want its reason", got.Unauthorized)
	case got.Health.Dependencies.Nats == "" || got.Health.Dependencies.Store == "":
		t.Errorf("health %+v, want each dependency's state", got.Health)
	case got.OpenAPI != "3.1.0":
		t.Errorf("the served document says openapi %q", got.OpenAPI)
	}
}

// clientMain drives the generated client (package hotcountapi) against a
// sidecar: os.Args are the lookup URL, the admin URL and the token. It
// prints what each call decoded, as JSON.
const clientMain = `package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"

	"hotcountclient/hotcountapi"
)

func main() {
	if err := run(os.Args[1], os.Args[2], os.Args[3]); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

func run(lookupURL, adminURL, token string) error {
	ctx := context.Background()
	bearer := hotcountapi.WithRequestEditorFn(func(_ context.Context, req *http.Request) error {
		req.Header.Set("Authorization", "Bearer "+token)
		return nil
	})
	c, err := hotcountapi.NewClientWithResponses(lookupURL, bearer)
	if err != nil {
		return err
	}
	out := map[string]any{}
	want := func(name string, status int, res interface{ StatusCode() int }, err error) error {
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		if res.StatusCode() != status {
			return fmt.Errorf("%s: status %d, want %d", name, res.StatusCode(), status)
		}
		return nil
	}

	one, err := c.GetTopicWithResponse(ctx, "a/b", nil)
	if err := want("total", 200, one, err); err != nil {
		return err
	}
	if out["total"], err = one.JSON200.AsTotal(); err != nil {
		return err
	}
	window := hotcountapi.Window("15m")
	win, err := c.GetTopicWithResponse(ctx, "a/b", &hotcountapi.GetTopicParams{Window: &window})
	if err := want("window", 200, win, err); err != nil {
		return err
	}
	if out["window"], err = win.JSON200.AsWindowCount(); err != nil {
		return err
	}
	pending := hotcountapi.GetTopicsParamsInclude("pending")
	batch, err := c.GetTopicsWithResponse(ctx, &hotcountapi.GetTopicsParams{Topic: []string{"golang", "a/b"}, Include: &pending})
	if err := want("batch", 200, batch, err); err != nil {
		return err
	}
	if out["batch"], err = batch.JSON200.AsTotalList(); err != nil {
		return err
	}
	strong := hotcountapi.GetTopicShardsParamsConsistency("strong")
	shards, err := c.GetTopicShardsWithResponse(ctx, "golang", &hotcountapi.GetTopicShardsParams{Consistency: &strong})
	if err := want("shards", 200, shards, err); err != nil {
		return err
	}
	out["shards"] = shards.JSON200
	hour, minute := hotcountapi.Duration("1h"), hotcountapi.Duration("1m")
	series, err := c.GetTopicSeriesWithResponse(ctx, "golang", &hotcountapi.GetTopicSeriesParams{Window: &hour, Step: &minute})
	if err := want("series", 200, series, err); err != nil {
		return err
	}
	out["series"] = series.JSON200
	trending, err := c.GetTrendingWithResponse(ctx, nil)
	if err := want("trending", 200, trending, err); err != nil {
		return err
	}
	out["trending"] = trending.JSON200
	hot, err := c.GetHotWithResponse(ctx, nil)
	if err := want("hot", 200, hot, err); err != nil {
		return err
	}
	out["hot"] = hot.JSON200
	doc, err := c.GetOpenAPIWithResponse(ctx)
	if err := want("openapi", 200, doc, err); err != nil {
		return err
	}
	out["openapi"] = doc.YAML200.Openapi

	bogus := hotcountapi.GetTopicParamsConsistency("bogus")
	bad, err := c.GetTopicWithResponse(ctx, "a/b", &hotcountapi.GetTopicParams{Consistency: &bogus})
	if err := want("bad request", 400, bad, err); err != nil {
		return err
	}
	out["badRequest"] = bad.JSON400
	anonymous, err := hotcountapi.NewClientWithResponses(lookupURL)
	if err != nil {
		return err
	}
	denied, err := anonymous.GetHotWithResponse(ctx, nil)
	if err := want("unauthorized", 401, denied, err); err != nil {
		return err
	}
	out["unauthorized"] = denied.JSON401

	admin, err := hotcountapi.NewClientWithResponses(adminURL)
	if err != nil {
		return err
	}
	health, err := admin.GetHealthWithResponse(ctx)
	if err != nil {
		return err
	}
	switch {
	case health.JSON200 != nil:
		out["health"] = health.JSON200
	case health.JSON503 != nil:
		out["health"] = health.JSON503
	default:
		return fmt.Errorf("health: status %d", health.StatusCode())
	}
	return json.NewEncoder(os.Stdout).Encode(out)
}
`

// buildGeneratedClient generates the client from pipeline/httpapi/openapi.yaml and
// builds clientMain with it, returning the binary. The client's module
// is in a workspace with this one, so that it builds with this module's
// go.sum and the versions it pins (github.com/oapi-codegen/runtime among
// them), from the module cache alone (GOPROXY=off).
func buildGeneratedClient(t *testing.T) string {
	t.Helper()
	doc, err := apitest.Parse(context.Background(), httpapi.OpenAPI)
	if err != nil {
		t.Fatal(err)
	}
	code, err := codegen.Generate(doc, codegen.Configuration{
		PackageName: "hotcountapi",
		Generate:    codegen.GenerateOptions{Client: true, Models: true},
	})
	if err != nil {
		t.Fatalf("oapi-codegen: %v", err)
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("no go command to build the generated client: %v (CI=true: a missing tool is a failure)", err)
		}
		t.Skipf("no go command to build the generated client: %v", err)
	}
	gomod, err := exec.Command(goBin, "env", "GOMOD").Output()
	if err != nil {
		t.Fatal(err)
	}
	root := filepath.Dir(strings.TrimSpace(string(gomod)))
	// The workspace's go line is the module's own: a newer one here would
	// ask for a toolchain, an older one would refuse the module.
	mod, err := os.ReadFile(strings.TrimSpace(string(gomod)))
	if err != nil {
		t.Fatal(err)
	}
	goLine := regexp.MustCompile(`(?m)^go \S+$`).FindString(string(mod))
	if goLine == "" {
		t.Fatal("go.mod has no go line")
	}
	dir := t.TempDir()
	files := map[string]string{
		"go.work":                               goLine + "\n\nuse (\n\t./client\n\t" + root + "\n)\n",
		"client/go.mod":                         "module hotcountclient\n\n" + goLine + "\n",
		"client/main.go":                        clientMain,
		"client/hotcountapi/hotcountapi.gen.go": code,
	}
	for name, body := range files {
		path := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	bin := filepath.Join(dir, "hotcountclient")
	// Built as this test binary was, so that only the client's own
	// packages compile (testenv.GoBuild).
	args, env := testenv.GoBuild()
	build := exec.Command(goBin, append(append([]string{"build"}, args...), "-o", bin, ".")...)
	build.Dir = filepath.Join(dir, "client")
	build.Env = append(env, "GOWORK="+filepath.Join(dir, "go.work"), "GOFLAGS=-mod=readonly -buildvcs=false", "GOPROXY=off")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building the generated client: %v\n%s", err, out)
	}
	return bin
}
