package sidecar_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hotcount/hotcount/config"
	"github.com/hotcount/hotcount/internal/testtools/testenv"
)

// TestOpenAPITypeScriptClient is the client of another language than Go
// generated from pipeline/httpapi/openapi.yaml: openapi-typescript generates its
// types, tsc compiles test/openapi-client/client.ts against them (strict: a type
// error, in the client's use of the types or in the types themselves,
// fails the test), and node runs it, through openapi-fetch, against a
// sidecar with a lookup token. Its totals, windowed count, batch, shards,
// trending and errors (a 400 and a 401, their bodies typed) agree with the
// mentions published. Everything runs from test/openapi-client's
// node_modules (make deps installs them from its lock file): no network.
func TestOpenAPITypeScriptClient(t *testing.T) {
	node, dir := buildTypeScriptClient(t)

	e := newEnv(t, func(c *config.Config) {
		c.FlushInterval = 50 * time.Millisecond
		c.HTTPTokenFile = tokenFile(t)
	})
	nc := testenv.Connect(t, e.nats)
	published := map[string]int64{"a/b": 7, "golang": 30}
	var total int64
	for topic, n := range published {
		for range n {
			if err := nc.Publish("mentions."+topic, nil); err != nil {
				t.Fatal(err)
			}
		}
		total += n
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	flushedAll(t, []*env{e}, total)

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, filepath.Join(dir, "dist", "client.js"), "a/b", "golang")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "HOTCOUNT_URL="+e.sc.URL(), "HOTCOUNT_TOKEN="+openapiToken)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("the TypeScript client: %v\n%s", err, stderr.String())
	}
	t.Logf("the TypeScript client got %s", out)

	type count struct {
		Topic string
		Count int64
	}
	var got struct {
		Total struct {
			Topic        string
			Count        int64
			Source       string
			Shards       int
			CacheControl *string
		}
		Window struct {
			Topic, Window, Resolution string
			Count                     int64
		}
		Batch  []count
		Shards struct {
			Topic      string
			Count, Sum int64
			Shards     int
		}
		Trending struct {
			Window string
			Topics int
			Note   *string
		}
		BadRequest struct {
			Status int
			Error  string
		}
		Unauthorized *struct {
			Status int
			Error  string
		}
	}
	dec := json.NewDecoder(bytes.NewReader(out))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&got); err != nil {
		t.Fatalf("the client's summary: %v: %s", err, out)
	}

	if got.Total.Topic != "a/b" || got.Total.Count != published["a/b"] || got.Total.Shards < 1 || (got.Total.Source != "cache" && got.Total.Source != "store") {
		t.Errorf("total %+v, want a/b's %d", got.Total, published["a/b"])
	}
	if cc := got.Total.CacheControl; cc == nil {
		t.Errorf("the total came without Cache-Control")
	} else if !regexp.MustCompile(`^(max-age=[0-9]+|no-cache)$`).MatchString(*cc) {
		t.Errorf("the total's Cache-Control is %q, want max-age=N or no-cache", *cc)
	}
	if got.Window.Topic != "a/b" || got.Window.Count != published["a/b"] || got.Window.Window != "15m" || got.Window.Resolution != "1m" {
		t.Errorf("window %+v, want a/b's %d over 15m in minutes", got.Window, published["a/b"])
	}
	if want := []count{{"a/b", published["a/b"]}, {"golang", published["golang"]}}; !slices.Equal(got.Batch, want) {
		t.Errorf("batch %+v, want %+v", got.Batch, want)
	}
	if got.Shards.Topic != "a/b" || got.Shards.Count != published["a/b"] || got.Shards.Sum != published["a/b"] || got.Shards.Shards < 1 {
		t.Errorf("shards %+v, want a/b's %d, the sum of its shards", got.Shards, published["a/b"])
	}
	if got.Trending.Window != "15m" {
		t.Errorf("trending %+v, want the 15m default", got.Trending)
	}
	if got.BadRequest.Status != 400 || !strings.Contains(got.BadRequest.Error, "takes neither consistency nor include") {
		t.Errorf("bad request %+v, want 400 saying a window takes no consistency", got.BadRequest)
	}
	if got.Unauthorized == nil || got.Unauthorized.Status != 401 || got.Unauthorized.Error == "" {
		t.Errorf("unauthorized %+v, want 401 with its reason", got.Unauthorized)
	}
}

// buildTypeScriptClient generates the TypeScript types of pipeline/httpapi/openapi.yaml
// with openapi-typescript and compiles test/openapi-client/client.ts
// against them with tsc, in a folder of the test's, with the tools of
// test/openapi-client/node_modules. It returns node and the folder, whose
// dist/client.js is the client. Under CI=true a missing node or
// node_modules fails the test; elsewhere it skips it.
func buildTypeScriptClient(t *testing.T) (node, dir string) {
	t.Helper()
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("the module root: %v", err)
	}
	src := filepath.Join(root, "test", "openapi-client")
	modules := filepath.Join(src, "node_modules")
	missing := func(format string, args ...any) {
		t.Helper()
		msg := fmt.Sprintf(format, args...)
		if os.Getenv("CI") == "true" {
			t.Fatalf("%s (CI=true: a missing tool is a failure)", msg)
		}
		t.Skipf("%s; run `make deps`, which installs it", msg)
	}
	node, err = exec.LookPath("node")
	if err != nil {
		missing("no node to run the TypeScript client: %v", err)
	}
	for _, p := range []string{".bin/openapi-typescript", ".bin/tsc", "openapi-fetch/package.json", "@types/node/package.json"} {
		if _, err := os.Stat(filepath.Join(modules, p)); err != nil {
			missing("test/openapi-client is not installed: %v", err)
		}
	}

	dir = t.TempDir()
	for _, name := range []string{"client.ts", "tsconfig.json", "package.json"} {
		data, err := os.ReadFile(filepath.Join(src, name))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// tsc and node find openapi-fetch and the types from dir, as they
	// would in test/openapi-client.
	if err := os.Symlink(modules, filepath.Join(dir, "node_modules")); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	run := func(what string, args ...string) {
		t.Helper()
		cmd := exec.CommandContext(ctx, node, args...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "NO_COLOR=1")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("%s: %v\n%s", what, err, out)
		}
	}
	run("openapi-typescript", filepath.Join(modules, ".bin", "openapi-typescript"), filepath.Join(root, "pipeline", "httpapi", "openapi.yaml"), "-o", filepath.Join(dir, "schema.d.ts"))
	// tsconfig.json's strict options, the generated schema.d.ts checked
	// too (no skipLibCheck), and nothing emitted on an error.
	run("tsc (the client does not type-check against the generated types)", filepath.Join(modules, ".bin", "tsc"), "-p", filepath.Join(dir, "tsconfig.json"))
	if _, err := os.Stat(filepath.Join(dir, "dist", "client.js")); err != nil {
		t.Fatalf("tsc wrote no client: %v", err)
	}
	return node, dir
}
