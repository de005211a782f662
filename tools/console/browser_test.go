package console_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/hotcount/hotcount/config"
	"github.com/hotcount/hotcount/internal/embeddednats"
	"github.com/hotcount/hotcount/internal/testtools/testenv"
	"github.com/hotcount/hotcount/internal/testtools/testenv/sidecartest"
	"github.com/hotcount/hotcount/mention"
	"github.com/hotcount/hotcount/pipeline/ingest"
)

// TestConsoleInBrowser drives the console in headless Chromium against a
// sidecar with hotcount dev's settings (embedded NATS with JetStream, the
// embedded store): a topic opened by its link, one picked from the list,
// the total and every shard bar equal to a strong read of the store, live
// as more mentions land; then a race, whose direct writes stay under the
// ceiling while coalesced ones carry five times as many, without a write
// to the real store. It keeps a screenshot.
func TestConsoleInBrowser(t *testing.T) {
	chrome := chromium(t)
	dev := startDev(t)

	browser, cancel := chromedp.NewContext(context.Background(), chromedp.WithAllocatorOptions(
		chromedp.ExecPath(chrome), chromedp.WindowSize(1400, 1300),
		// Chromium refuses to run as root with its sandbox; the tests run
		// as root in CI's containers.
		chromedp.NoSandbox))
	defer cancel()
	if err := chromedp.Do(browser); err != nil {
		unavailable(t, "start Chromium (%s): %v", chrome, err)
	}
	ctx, cancelAll := context.WithTimeout(browser, 3*time.Minute)
	defer cancelAll()

	// A topic with a slash goes in the link escaped. Each batch is
	// stored before the next is sent, so that it gets a flush (and a
	// shard) of its own.
	other := "eu.west/k8s"
	dev.publish(t, other, 10, 7)
	dev.waitStored(t, other)
	for range 3 {
		dev.publish(t, "golang", 10, 0) // counts 1..10
		dev.waitStored(t, "golang")
	}

	// A shared link opens on its topic.
	if err := chromedp.Do(ctx, chromedp.Navigate(dev.console+"?topic="+url.QueryEscape(other))); err != nil {
		t.Fatal(err)
	}
	waitPage(t, ctx, dev, other)

	// The picker lists the hottest topics; choosing one puts it in the
	// address.
	if err := chromedp.Do(ctx, chromedp.Navigate(dev.console),
		chromedp.Click(chromedp.CSS(`#topics li[data-topic="golang"]`))); err != nil {
		t.Fatal(err)
	}
	if loc, err := chromedp.Run(ctx, chromedp.Location()); err != nil || !strings.HasSuffix(loc, "/console?topic=golang") {
		t.Errorf("after choosing golang the address is %q (%v)", loc, err)
	}
	waitPage(t, ctx, dev, "golang")

	// More mentions land: the same page follows, without a reload.
	for range 3 {
		dev.publish(t, "golang", 20, 50)
		dev.waitStored(t, "golang")
	}
	waitPage(t, ctx, dev, "golang")

	// The race, on its own store: the sidecar writes nothing meanwhile.
	writesBefore := dev.metric(t, "hotcount_store_writes_total")
	clicked := time.Now()
	if err := chromedp.Do(ctx, chromedp.Click(chromedp.ID("race-start"))); err != nil {
		t.Fatal(err)
	}
	var race raceView
	testenv.Eventually(t, 30*time.Second, func() error {
		v, err := chromedp.Run(ctx, chromedp.Evaluate[raceView](readRace))
		if err != nil {
			return err
		}
		race = v
		if !strings.HasPrefix(v.Status, "running") || time.Since(clicked) < 3*time.Second || v.Direct.Mentions == "–" {
			return fmt.Errorf("race %+v", v)
		}
		return nil
	})
	secs := time.Since(clicked).Seconds() // at least the race's time, shown a poll ago
	direct, coalesced := race.Direct.numbers(t), race.Coalesced.numbers(t)
	if limit := int64(100*secs) + 10; direct[0] > limit || direct[0] == 0 || direct[2] == 0 {
		t.Errorf("direct: %d mentions (%d throttled) in %.1fs: want some, under the ceiling's %d, and throttles", direct[0], direct[2], secs, limit)
	}
	if coalesced[0] < 5*direct[0] || coalesced[2] != 0 {
		t.Errorf("coalesced: %d mentions, %d throttled; want 5× direct's %d and none throttled", coalesced[0], coalesced[2], direct[0])
	}
	if n := dev.strongTotal(t, "race"); n != 0 {
		t.Errorf("the race wrote %d into the real store", n)
	}
	if after := dev.metric(t, "hotcount_store_writes_total"); after != writesBefore {
		t.Errorf("the sidecar's store took %v writes during the race", after-writesBefore)
	}
	shot, err := chromedp.Run(ctx, chromedp.CaptureScreenshot())
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(artifactDir(t), "console.png")
	if err := os.WriteFile(path, shot, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot: %s", path)
}

// pageView is what the page shows of its topic.
type pageView struct {
	Topic     string   `json:"topic"`
	Error     string   `json:"error"`
	Total     string   `json:"total"`
	Pending   string   `json:"pending"`
	Freshness string   `json:"freshness"`
	Shards    []string `json:"shards"`
	// Trending is the trending panel: whether it shows, and its rows or
	// its note.
	Trending     bool     `json:"trending"`
	TrendingRows []string `json:"trendingRows"`
	TrendingNote string   `json:"trendingNote"`
}

const readPage = `({
	topic: document.getElementById("topic-name").textContent,
	error: document.getElementById("topic-error").textContent,
	total: document.getElementById("total").textContent,
	pending: document.getElementById("pending").textContent,
	freshness: (document.getElementById("freshness") || {}).textContent || "",
	shards: [...document.querySelectorAll("#shards .shard-count")].map(e => e.textContent),
	trending: !document.getElementById("trending").hidden,
	trendingRows: [...document.querySelectorAll("#trending-rows tr")].map(e => e.textContent),
	trendingNote: document.getElementById("trending-note").textContent,
})`

// raceView is what the page shows of the race: mentions, writes and
// throttles, direct and coalesced.
type raceView struct {
	Status    string   `json:"status"`
	Direct    raceRows `json:"direct"`
	Coalesced raceRows `json:"coalesced"`
}

type raceRows struct{ Mentions, Writes, Throttled string }

func (r raceRows) numbers(t *testing.T) [3]int64 {
	t.Helper()
	return [3]int64{number(t, r.Mentions), number(t, r.Writes), number(t, r.Throttled)}
}

const readRace = `(() => {
	const row = (name) => ({
		Mentions: document.getElementById("race-" + name + "-mentions").textContent,
		Writes: document.getElementById("race-" + name + "-writes").textContent,
		Throttled: document.getElementById("race-" + name + "-throttled").textContent,
	});
	return {status: document.getElementById("race-status").textContent, direct: row("direct"), coalesced: row("coalesced")};
})()`

// waitPage waits until the page shows topic with the store's numbers, read
// strongly: the total, nothing pending, and each shard's count.
func waitPage(t *testing.T, ctx context.Context, dev *devSidecar, topic string) {
	t.Helper()
	want := dev.strongShards(t, topic)
	var sum int64
	wantShards := make([]string, len(want))
	for i, n := range want {
		sum += n
		wantShards[i] = strconv.FormatInt(n, 10)
	}
	testenv.Eventually(t, 30*time.Second, func() error {
		v, err := chromedp.Run(ctx, chromedp.Evaluate[pageView](readPage))
		if err != nil {
			return err
		}
		shown := make([]string, len(v.Shards))
		for i, s := range v.Shards {
			shown[i] = strings.ReplaceAll(s, ",", "")
		}
		switch {
		case v.Topic != topic || v.Error != "":
			return fmt.Errorf("the page shows topic %q (error %q), want %q", v.Topic, v.Error, topic)
		case strings.ReplaceAll(v.Total, ",", "") != strconv.FormatInt(sum, 10):
			return fmt.Errorf("%s: the page shows a total of %s, the store has %d", topic, v.Total, sum)
		case v.Pending != "0":
			return fmt.Errorf("%s: the page shows %s pending, the store has every mention", topic, v.Pending)
		case !slices.Equal(shown, wantShards):
			return fmt.Errorf("%s: the page shows shards %v, the store has %v", topic, shown, wantShards)
		case v.Freshness != "fresh" && v.Freshness != "stale":
			return fmt.Errorf("%s: the page does not say whether the total is fresh: %q", topic, v.Freshness)
		case !v.Trending || (len(v.TrendingRows) == 0 && v.TrendingNote == ""):
			// dev keeps minute buckets: the fleet's list shows, or why it is empty.
			return fmt.Errorf("the trending panel shows %v, rows %q, note %q", v.Trending, v.TrendingRows, v.TrendingNote)
		}
		return nil
	})
}

// devSidecar is a sidecar with hotcount dev's settings.
type devSidecar struct {
	js              jetstream.JetStream
	lookup, console string
	admin           string
	published       map[string]int64
}

func startDev(t *testing.T) *devSidecar {
	t.Helper()
	ns, err := embeddednats.Start(-1, t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ns.Shutdown()
		ns.WaitForShutdown()
	})
	cfg := config.Dev()
	cfg.NATSURL = ns.ClientURL()
	cfg.DataDir = t.TempDir()
	cfg.HTTPAddr, cfg.AdminAddr = "127.0.0.1:0", "127.0.0.1:0"
	cfg.Shards = 4
	cfg.FlushInterval = 100 * time.Millisecond
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	nc := testenv.Connect(t, cfg.NATSURL)
	if _, err := ingest.EnsureStream(context.Background(), nc, cfg.Stream, cfg.Subject, mention.DefaultDuplicateWindow); err != nil {
		t.Fatal(err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}

	sc := sidecartest.Run(t, cfg, nil)
	return &devSidecar{js: js, lookup: sc.URL(), admin: sc.AdminURL(),
		console: sc.AdminURL() + "/console", published: map[string]int64{}}
}

// publish publishes n mentions of topic, each of count (0: 1, 2, ... n),
// and waits for the stream's acknowledgements.
func (d *devSidecar) publish(t *testing.T, topic string, n int, count int64) {
	t.Helper()
	for i := 1; i <= n; i++ {
		c := count
		if c == 0 {
			c = int64(i)
		}
		if _, err := d.js.Publish(context.Background(), "mentions."+topic, fmt.Appendf(nil, `{"count":%d}`, c)); err != nil {
			t.Fatal(err)
		}
		d.published[topic] += c
	}
}

// waitStored waits until a strong read of topic finds every mention
// published.
func (d *devSidecar) waitStored(t *testing.T, topic string) {
	t.Helper()
	want := d.published[topic]
	testenv.Eventually(t, 30*time.Second, func() error {
		if n := d.strongTotal(t, topic); n != want {
			return fmt.Errorf("%s: %d in the store, want %d", topic, n, want)
		}
		return nil
	})
}

func (d *devSidecar) strongTotal(t *testing.T, topic string) int64 {
	t.Helper()
	var body struct{ Count int64 }
	getJSON(t, d.lookup+"/v1/topics/"+url.PathEscape(topic)+"?consistency=strong", &body)
	return body.Count
}

func (d *devSidecar) strongShards(t *testing.T, topic string) []int64 {
	t.Helper()
	var body struct{ Shards []struct{ Count int64 } }
	getJSON(t, d.lookup+"/v1/topics/"+url.PathEscape(topic)+"/shards?consistency=strong", &body)
	out := make([]int64, len(body.Shards))
	for i, s := range body.Shards {
		out[i] = s.Count
	}
	return out
}

// metric is the value of an unlabelled metric on the admin listener.
func (d *devSidecar) metric(t *testing.T, name string) float64 {
	t.Helper()
	resp, err := http.Get(d.admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), name+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatal(err)
			}
			return f
		}
	}
	t.Fatalf("no %s in /metrics", name)
	return 0
}

func getJSON(t *testing.T, u string, v any) {
	t.Helper()
	resp, err := http.Get(u)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("GET %s: %s", u, resp.Status)
	}
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		t.Fatalf("GET %s: %v", u, err)
	}
}

func number(t *testing.T, s string) int64 {
	t.Helper()
	n, err := strconv.ParseInt(strings.ReplaceAll(s, ",", ""), 10, 64)
	if err != nil {
		t.Fatalf("the page shows %q, not a number", s)
	}
	return n
}

// chromium finds Chromium (Debian's chromium package, which .ci/run
// installs).
func chromium(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	unavailable(t, "no Chromium on PATH (Debian: apt-get install chromium)")
	return ""
}

// unavailable fails the test under CI=true, where Chromium must be there,
// and skips it elsewhere.
func unavailable(t *testing.T, format string, args ...any) {
	t.Helper()
	msg := fmt.Sprintf(format, args...)
	if os.Getenv("CI") == "true" {
		t.Fatalf("%s (CI=true: a browser that cannot start is a failure)", msg)
	}
	t.Skipf("%s; .ci/run installs it", msg)
}

// artifactDir is where the test keeps its screenshot: the test's artifact
// folder under go test -artifacts (-outputdir DIR puts it under DIR),
// else a folder of the system's temporary one that outlives the test.
func artifactDir(t *testing.T) string {
	t.Helper()
	if f := flag.Lookup("test.artifacts"); f != nil && f.Value.String() == "true" {
		return t.ArtifactDir()
	}
	dir := filepath.Join(os.TempDir(), "hotcount-test-artifacts", t.Name())
	if err := os.MkdirAll(dir, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		t.Fatal(err)
	}
	return dir
}
