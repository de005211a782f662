package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/hotcount/hotcount/internal/testtools/testenv"
	"github.com/hotcount/hotcount/pipeline/moderation"
	"github.com/hotcount/hotcount/pipeline/trend"
)

// modFlush is the flush interval of the moderation tests' dev sidecar: a
// moderation change must show in /v1/trending within two of them.
const modFlush = time.Second

// trendingDev is a `hotcount dev` with a surge trending, as the README's
// demo makes one: seven minutes of history at once (--backfill), the
// topic "surge" in the last.
type trendingDev struct {
	nats, http string
}

func startTrendingDev(t *testing.T, extra ...string) trendingDev {
	t.Helper()
	_, natsPort, _ := net.SplitHostPort(freeAddr(t))
	httpAddr, adminAddr := freeAddr(t), freeAddr(t)
	stop := startDev(t, t.TempDir(), natsPort, httpAddr, adminAddr, append([]string{"--flush-interval", modFlush.String()}, extra...)...)
	t.Cleanup(stop)
	d := trendingDev{nats: "nats://127.0.0.1:" + natsPort, http: httpAddr}
	var stdout, stderr bytes.Buffer
	if err := dispatch(context.Background(), []string{"load", "--nats-url", d.nats, "--topics", "20", "--rate", "20", "--duration", "7m",
		"--surge", "surge", "--surge-rate", "50", "--surge-after", "6m", "--backfill", "--report", filepath.Join(t.TempDir(), "load.json")}, nil, &stdout, &stderr); err != nil {
		t.Fatalf("load: %v\n%s", err, stderr.String())
	}
	return d
}

// get reads a lookup API path into v, and returns its body.
func (d trendingDev) get(path string, v any) ([]byte, error) {
	resp, err := http.Get("http://" + d.http + path)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != 200 {
		return body, fmt.Errorf("GET %s: %d %s", path, resp.StatusCode, body)
	}
	return body, json.Unmarshal(body, v)
}

// trending is the dev sidecar's list over 5 minutes, its topics in order.
func (d trendingDev) trending() ([]string, []byte, error) {
	var tr trend.Trending
	body, err := d.get("/v1/trending?window=5m&limit=5", &tr)
	var topics []string
	for _, e := range tr.Topics {
		topics = append(topics, e.Topic)
	}
	return topics, body, err
}

// count is the topic's total, read through the store.
func (d trendingDev) count(topic string) (int64, error) {
	var c struct{ Count int64 }
	_, err := d.get("/v1/topics/"+topic+"?consistency=strong", &c)
	return c.Count, err
}

// cli runs `hotcount trending ...` against the dev sidecar's NATS, as
// operator "tester", and returns what it printed.
func (d trendingDev) cli(t *testing.T, args ...string) string {
	t.Helper()
	var stdout, stderr bytes.Buffer
	if err := dispatch(context.Background(), append(append([]string{"trending"}, args...), "--nats-url", d.nats), []string{"USER=tester"}, &stdout, &stderr); err != nil {
		t.Fatalf("hotcount trending %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return stdout.String()
}

// list is `hotcount trending list --json`.
func (d trendingDev) list(t *testing.T) moderation.List {
	t.Helper()
	var l moderation.List
	if err := json.Unmarshal([]byte(d.cli(t, "list", "--json")), &l); err != nil {
		t.Fatal(err)
	}
	return l
}

// TestTrendingHide: the surge trends on a `hotcount dev`; `hotcount
// trending hide surge` takes it off /v1/trending within two flush
// intervals, while its count goes on growing; `unhide` brings it back
// as fast.
func TestTrendingHide(t *testing.T) {
	d := startTrendingDev(t)
	testenv.Eventually(t, 30*time.Second, func() error {
		topics, _, err := d.trending()
		if err != nil {
			return err
		}
		if len(topics) == 0 || topics[0] != "surge" {
			return fmt.Errorf("the surge is not first: %v", topics)
		}
		return nil
	})
	before, err := d.count("surge")
	if err != nil {
		t.Fatal(err)
	}

	out := d.cli(t, "hide", "surge", "--reason", "bot-made")
	if !strings.Contains(out, `hidden "surge"`) || !strings.Contains(out, "by tester") || !strings.Contains(out, `reason "bot-made"`) {
		t.Errorf("hide printed %q, want what it did, by whom and why", out)
	}
	hidden := time.Now()
	testenv.Eventually(t, 2*modFlush, func() error {
		topics, _, err := d.trending()
		if err != nil {
			return err
		}
		if slices.Contains(topics, "surge") {
			return fmt.Errorf("surge is still listed: %v", topics)
		}
		if len(topics) == 0 {
			return errors.New("the list is empty: the other topics should still be ranked")
		}
		return nil
	})
	t.Logf("surge left the list %s after hide returned", time.Since(hidden).Round(time.Millisecond))

	// Hidden, it is counted as before.
	nc := testenv.Connect(t, d.nats)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(context.Background(), "mentions.surge", []byte(`{"count":100}`)); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, func() error {
		topics, _, err := d.trending()
		if err != nil {
			return err
		}
		if slices.Contains(topics, "surge") {
			t.Fatalf("surge is listed again while hidden: %v", topics)
		}
		n, err := d.count("surge")
		if err != nil {
			return err
		}
		if n < before+100 {
			return fmt.Errorf("surge counts %d, want %d and more: hidden topics are still counted", n, before+100)
		}
		return nil
	})

	l := d.list(t)
	if len(l.Decisions) != 1 || l.Decisions[0].Topic != "surge" || l.Decisions[0].State != moderation.Hidden || l.Decisions[0].By != "tester" || l.Decisions[0].Reason != "bot-made" {
		t.Errorf("list: %+v, want surge hidden by tester for bot-made", l.Decisions)
	}
	if table := d.cli(t, "list"); !regexp.MustCompile(`(?m)^surge\s+hidden\s+tester\s+\S+\s+bot-made$`).MatchString(table) {
		t.Errorf("list's table:\n%s", table)
	}

	if out := d.cli(t, "unhide", "surge"); !strings.Contains(out, `unhidden "surge"`) {
		t.Errorf("unhide printed %q", out)
	}
	testenv.Eventually(t, 2*modFlush, func() error {
		topics, _, err := d.trending()
		if err != nil {
			return err
		}
		if !slices.Contains(topics, "surge") {
			return fmt.Errorf("surge is not back: %v", topics)
		}
		return nil
	})
	if out := d.cli(t, "unhide", "surge"); !strings.Contains(out, "nothing to do") {
		t.Errorf("a second unhide printed %q, want nothing done", out)
	}
}

// TestTrendingReview: with --trending-review nothing trends until allowed.
// The surge, which would have led the list, is listed by `hotcount
// trending list` as waiting (and /v1/trending says nothing of it); once
// `allow`ed it is listed within two flush intervals and waits no more.
func TestTrendingReview(t *testing.T) {
	d := startTrendingDev(t, "--trending-review")
	testenv.Eventually(t, 30*time.Second, func() error {
		topics, body, err := d.trending()
		if err != nil {
			return err
		}
		if len(topics) > 0 || bytes.Contains(body, []byte("surge")) {
			t.Fatalf("under review, nothing allowed, /v1/trending says: %s", body)
		}
		for _, w := range d.list(t).Waiting {
			if w.Topic == "surge" && w.Count > 0 && w.Score > 0 {
				return nil
			}
		}
		return errors.New("the surge is not waiting for review yet")
	})
	if table := d.cli(t, "list"); !strings.Contains(table, "waiting for review") || !regexp.MustCompile(`(?m)^surge\s+\S+\s+\d+\s+[\d.]+$`).MatchString(table) {
		t.Errorf("list's table does not show the surge waiting:\n%s", table)
	}

	if out := d.cli(t, "allow", "surge", "--by", "editor"); !strings.Contains(out, `allowed "surge"`) || !strings.Contains(out, "by editor") {
		t.Errorf("allow printed %q", out)
	}
	testenv.Eventually(t, 2*modFlush, func() error {
		topics, _, err := d.trending()
		if err != nil {
			return err
		}
		if !slices.Equal(topics, []string{"surge"}) {
			return fmt.Errorf("listed %v, want the allowed surge alone", topics)
		}
		return nil
	})
	l := d.list(t)
	if len(l.Decisions) != 1 || l.Decisions[0].State != moderation.Allowed || l.Decisions[0].By != "editor" {
		t.Errorf("decisions %+v, want surge allowed by editor", l.Decisions)
	}
	for _, w := range l.Waiting {
		if w.Topic == "surge" {
			t.Errorf("surge still waits once allowed: %+v", l.Waiting)
		}
	}
}

// TestTrendingUsage: bad input is a usage error (exit 2) that says what
// is wrong, before any connection; a NATS server without JetStream is a
// failure (exit 1) that says why.
func TestTrendingUsage(t *testing.T) {
	user := []string{"USER=tester"}
	checkExits(t, []exitCase{
		{"no subcommand", []string{"trending"}, user, exitUsage, `"trending" takes a subcommand: hide, unhide, allow, list`},
		{"unknown subcommand", []string{"trending", "ban", "x"}, user, exitUsage, `"trending" takes a subcommand`},
		{"no topic", []string{"trending", "hide"}, user, exitUsage, "trending hide takes one TOPIC (got 0 arguments"},
		{"two topics", []string{"trending", "allow", "a", "b"}, user, exitUsage, "trending allow takes one TOPIC (got 2 arguments"},
		{"empty topic", []string{"trending", "hide", ""}, user, exitUsage, "topic is empty"},
		{"control character", []string{"trending", "unhide", "a\tb"}, user, exitUsage, "control character"},
		{"too long", []string{"trending", "hide", strings.Repeat("x", 300)}, user, exitUsage, "longer than 256"},
		{"nobody", []string{"trending", "hide", "x"}, nil, exitUsage, "--by: say who decides"},
		{"list takes no topic", []string{"trending", "list", "x"}, nil, exitUsage, "trending list takes no topic"},
		{"unknown flag", []string{"trending", "list", "--reason", "x"}, nil, exitUsage, "unknown flag: --reason"},
	})

	ns := testenv.NATSWithoutJetStream(t)
	checkExits(t, []exitCase{
		{"no JetStream", []string{"trending", "hide", "x", "--nats-url", ns.ClientURL()}, user, exitError, "no JetStream"},
	})
	// A server no sidecar made the bucket on (a wrong --nats-url or
	// --trending-bucket): the command makes none, and says so.
	js := testenv.NATS(t)
	checkExits(t, []exitCase{
		{"no bucket", []string{"trending", "hide", "x", "--nats-url", js.ClientURL()}, user, exitError, "no bucket hotcount_trending on this server"},
	})
}
