package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/hotcount/hotcount/internal/testtools/testenv"
)

func TestExitCodes(t *testing.T) {
	tests := []exitCase{
		{"no command", nil, nil, exitUsage, "no command"},
		{"unknown command", []string{"frobnicate"}, nil, exitUsage, `unknown command "frobnicate"`},
		{"help", []string{"help"}, nil, exitOK, ""},
		{"version", []string{"version"}, nil, exitOK, ""},
		{"valid config", []string{"check-config"}, nil, exitOK, ""},
		{"invalid setting", []string{"check-config", "--shards", "0"}, nil, exitUsage, "shards: 0 is outside 1..100"},
		{"unknown env", []string{"check-config"}, []string{"HOTCOUNT_SHARDZ=3"}, exitUsage, "HOTCOUNT_SHARDZ"},
		{"table without create", []string{"table"}, nil, exitUsage, "create"},
		{"stream with an unknown subcommand", []string{"stream", "show"}, nil, exitUsage, `"stream" takes a subcommand: create, status, rules, rewind (hotcount stream --help)`},
		{"run --help", []string{"run", "--help"}, nil, exitOK, ""},
		{"stream create, partitions for another mode", []string{"stream", "create", "--nats-mode", "jetstream", "--partitions", "4"}, nil, exitUsage, "--partitions 4 is for --nats-mode partitioned, not jetstream"},
		{"load bad zipf", []string{"load", "--zipf", "0.5"}, nil, exitUsage, "zipf"},
		// Refused before it connects: no NATS here.
		{"quarantine replay in a durable mode", []string{"quarantine", "replay", "--nats-mode", "jetstream", "--nats-url", "nats://127.0.0.1:1"}, nil, exitUsage, "nothing to replay by hand"},
	}
	checkExits(t, tests)
}

// TestShardsCommand: set a topic's count, lower it, and show that the read
// set kept its size (embedded store).
func TestShardsCommand(t *testing.T) {
	dir := t.TempDir()
	run := func(args ...string) string {
		t.Helper()
		var stdout, stderr bytes.Buffer
		err := dispatch(context.Background(), append(append([]string{"shards"}, args...), "--store", "bolt", "--data-dir", dir), nil, &stdout, &stderr)
		if err != nil {
			t.Fatalf("shards %v: %v\n%s", args, err, stderr.String())
		}
		return stdout.String()
	}
	if out := run("set", "golang", "8"); !strings.Contains(out, "golang: writes on 8 shards (was 1), reads 8") {
		t.Errorf("set 8: %q", out)
	}
	if out := run("set", "golang", "2"); !strings.Contains(out, "writes on 2 shards (was 8), reads 8") {
		t.Errorf("set 2: %q", out)
	}
	out := run("show", "golang", "quiet")
	for _, want := range []string{"golang: total 0; writes on 2 shards, reads 8 (recorded)", "  shard 7: 0", "quiet: total 0; writes on 1 shards, reads 1 (no metadata: one shard)"} {
		if !strings.Contains(out, want) {
			t.Errorf("show lacks %q:\n%s", want, out)
		}
	}
	var stderr bytes.Buffer
	if err := dispatch(context.Background(), []string{"shards", "set", "golang", "x", "--store", "bolt", "--data-dir", dir}, nil, io.Discard, &stderr); exitCode(err, &stderr) != exitUsage {
		t.Errorf("set with a bad count: %v", err)
	}
}

func TestCheckConfigPrintsEffectiveSettings(t *testing.T) {
	var stdout, stderr bytes.Buffer
	err := dispatch(context.Background(), []string{"check-config", "--shards", "9"}, []string{"HOTCOUNT_TABLE=trends"}, &stdout, &stderr)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`shards: "9"`, `table: "trends"`, `flush-interval: "1s"`} {
		if !strings.Contains(stdout.String(), want) {
			t.Errorf("output lacks %s:\n%s", want, stdout.String())
		}
	}
}

func freeAddr(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// TestDev runs `hotcount dev` as the README's first command does, publishes
// mentions, reads them back over HTTP, stops it, starts it again on the same

// startDev runs `hotcount dev` on these ports and folder until the returned
// stop, which checks that it exits cleanly and printed how to query. extra
// flags come last: they override the flush interval of 50 ms.
func startDev(t *testing.T, dataDir, natsPort, httpAddr, adminAddr string, extra ...string) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	var stdout, stderr bytes.Buffer
	args := append([]string{"dev", "--nats-port", natsPort, "--http", httpAddr, "--admin", adminAddr,
		"--data-dir", dataDir, "--flush-interval", "50ms", "--log-level", "warn"}, extra...)
	go func() {
		done <- dispatch(ctx, args, nil, &stdout, &stderr)
	}()
	testenv.Eventually(t, 20*time.Second, func() error {
		select {
		case err := <-done:
			t.Fatalf("dev exited: %v\n%s", err, stderr.String())
		default:
		}
		resp, err := http.Get("http://" + adminAddr + "/readyz")
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			return fmt.Errorf("readyz %d", resp.StatusCode)
		}
		return nil
	})
	testenv.Subscribed(t, adminAddr, 20*time.Second)
	return func() {
		cancel()
		if err := <-done; err != nil {
			t.Fatalf("dev: %v\n%s", err, stderr.String())
		}
		if !strings.Contains(stdout.String(), "curl http://"+httpAddr+"/v1/topics/golang") {
			t.Errorf("dev did not print how to query:\n%s", stdout.String())
		}
	}
}

// data and finds the counts still there.
func TestDev(t *testing.T) {
	dataDir := t.TempDir()
	_, natsPort, _ := net.SplitHostPort(freeAddr(t))
	httpAddr, adminAddr := freeAddr(t), freeAddr(t)
	start := func() (stop func()) { return startDev(t, dataDir, natsPort, httpAddr, adminAddr) }
	total := func() int64 {
		resp, err := http.Get("http://" + httpAddr + "/v1/topics/golang")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var body struct{ Count int64 }
		if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
			t.Fatal(err)
		}
		return body.Count
	}

	stop := start()
	nc, err := nats.Connect("nats://127.0.0.1:" + natsPort)
	if err != nil {
		t.Fatal(err)
	}
	for range 10 {
		nc.Publish("mentions.golang", nil)                    //nolint:errcheck // flushed below
		nc.Publish("mentions.golang", []byte(`{"count": 5}`)) //nolint:errcheck // flushed below
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	nc.Close()
	testenv.Eventually(t, 10*time.Second, func() error {
		if n := total(); n != 60 {
			return fmt.Errorf("count %d, want 60", n)
		}
		return nil
	})
	stop()

	stop = start()
	defer stop()
	if n := total(); n != 60 {
		t.Errorf("after restart: count %d, want 60", n)
	}

	// The README's load step, as written (on this test's NATS port, in
	// this test's folder): its report must match the counts exactly, topic
	// by topic.
	// The trending demo's steps (with ?window= and --surge) are
	// TestTrendingDemo's.
	loads := without(readmeCommands(t, "go run ./cmd/hotcount load "), "--surge")
	if len(loads) != 1 {
		t.Fatalf("the README has %d load commands, want the one this test runs", len(loads))
	}
	curls := without(readmeCommands(t, "curl "), "window=")
	t.Chdir(t.TempDir())
	report := "sent.json"
	if !slices.Contains(loads[0], "--report") || !slices.Contains(loads[0], report) {
		t.Fatalf("the README's load command %q does not write %s", loads[0], report)
	}
	var stdout, stderr bytes.Buffer
	if err := dispatch(context.Background(), append(hotcountArgs(loads[0]), "--nats-url", "nats://127.0.0.1:"+natsPort), nil, &stdout, &stderr); err != nil {
		t.Fatalf("load: %v\n%s", err, stderr.String())
	}
	if !strings.Contains(stdout.String(), "acknowledged by the stream") {
		t.Errorf("load against dev did not publish with acknowledgements: %s", stdout.String())
	}
	raw, err := os.ReadFile(report)
	if err != nil {
		t.Fatal(err)
	}
	var sent struct {
		Mentions int64            `json:"mentions"`
		PerTopic map[string]int64 `json:"perTopic"`
	}
	if err := json.Unmarshal(raw, &sent); err != nil {
		t.Fatal(err)
	}
	if sent.Mentions == 0 {
		t.Fatal("the load stored nothing")
	}
	testenv.Eventually(t, 60*time.Second, func() error {
		q := url.Values{}
		for topic := range sent.PerTopic {
			q.Add("topic", topic)
		}
		resp, err := http.Get("http://" + httpAddr + "/v1/topics?consistency=strong&" + q.Encode())
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		var body struct {
			Topics []struct {
				Topic string
				Count int64
			}
		}
		if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
			return err
		}
		for _, got := range body.Topics {
			if got.Count != sent.PerTopic[got.Topic] {
				return fmt.Errorf("%s: %d in the store, %d in the report", got.Topic, got.Count, sent.PerTopic[got.Topic])
			}
		}
		return nil
	})
	t.Logf("%s", strings.TrimSpace(stdout.String()))

	// The README's queries, as written (on this test's ports): each answers
	// 200, and the counts it shows are the report's.
	for _, curl := range curls {
		u := strings.NewReplacer("localhost:8080", httpAddr, "localhost:9091", adminAddr).Replace(curl[len(curl)-1])
		resp, err := http.Get("http://" + u)
		if err != nil {
			t.Errorf("README %q: %v", curl, err)
			continue
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Errorf("README %q: %d %s", curl, resp.StatusCode, body)
		}
		var batch struct {
			Topics []struct {
				Topic string
				Count int64
			}
		}
		if json.Unmarshal(body, &batch) == nil {
			for _, got := range batch.Topics {
				if got.Count != sent.PerTopic[got.Topic] {
					t.Errorf("README %q: %s is %d, sent.json says %d", curl, got.Topic, got.Count, sent.PerTopic[got.Topic])
				}
			}
		}
	}
}

// exitCase is a command line with its environment, the code it must exit
// with and what its stderr must say.
type exitCase struct {
	name string
	args []string
	env  []string
	code int
	out  string
}

// checkExits runs each case through dispatch, as main does.
func checkExits(t *testing.T, cases []exitCase) {
	t.Helper()
	for _, tt := range cases {
		t.Run(tt.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			err := dispatch(context.Background(), tt.args, tt.env, &stdout, &stderr)
			if code := exitCode(err, &stderr); code != tt.code {
				t.Errorf("exit %d, want %d (%v)", code, tt.code, err)
			}
			if !strings.Contains(stderr.String(), tt.out) {
				t.Errorf("stderr %q does not say %q", stderr.String(), tt.out)
			}
		})
	}
}
