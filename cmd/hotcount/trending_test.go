package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hotcount/hotcount/internal/testtools/testenv"
	"github.com/hotcount/hotcount/pipeline/trend"
)

// without drops the commands that hold a word containing s.
func without(cmds [][]string, s string) [][]string {
	return slices.DeleteFunc(cmds, func(words []string) bool {
		return slices.ContainsFunc(words, func(w string) bool { return strings.Contains(w, s) })
	})
}

// only keeps the commands that hold a word containing s.
func only(cmds [][]string, s string) [][]string {
	return slices.DeleteFunc(cmds, func(words []string) bool {
		return !slices.ContainsFunc(words, func(w string) bool { return strings.Contains(w, s) })
	})
}

// TestTrendingDemo runs the README's "What is trending" steps as written,
// against a fresh `hotcount dev`: the load with its surge, seven minutes
// of history published at once (--backfill: each mention stamped with its
// "at"), then the curls and `top`. The surge is first in the list and in
// top's table, and its count over the window is what the load's report
// says was published.
func TestTrendingDemo(t *testing.T) {
	_, natsPort, _ := net.SplitHostPort(freeAddr(t))
	httpAddr, adminAddr := freeAddr(t), freeAddr(t)
	stop := startDev(t, t.TempDir(), natsPort, httpAddr, adminAddr)
	defer stop()

	loads := only(readmeCommands(t, "go run ./cmd/hotcount load "), "--surge")
	curls := only(readmeCommands(t, "curl "), "window=")
	tops := readmeCommands(t, "go run ./cmd/hotcount top ")
	if len(loads) != 1 || len(curls) != 2 || len(tops) != 1 {
		t.Fatalf("the README's trending demo has %d loads, %d curls and %d tops; this test runs 1, 2 and 1", len(loads), len(curls), len(tops))
	}
	args := hotcountArgs(loads[0])
	i := slices.Index(args, "--report")
	if i < 0 || i+1 == len(args) {
		t.Fatalf("the README's trending load %q writes no report", loads[0])
	}
	t.Chdir(t.TempDir())
	var stdout, stderr bytes.Buffer
	if err := dispatch(context.Background(), append(args, "--nats-url", "nats://127.0.0.1:"+natsPort), nil, &stdout, &stderr); err != nil {
		t.Fatalf("load: %v\n%s", err, stderr.String())
	}
	raw, err := os.ReadFile(args[i+1])
	if err != nil {
		t.Fatal(err)
	}
	var sent struct{ PerTopic map[string]int64 }
	if err := json.Unmarshal(raw, &sent); err != nil {
		t.Fatal(err)
	}
	if sent.PerTopic["surge"] == 0 {
		t.Fatalf("the load published no surge: %s", stdout.String())
	}
	t.Logf("load: %s", stdout.String())

	get := func(curl []string, v any) error {
		u := strings.NewReplacer("localhost:8080", httpAddr).Replace(curl[len(curl)-1])
		resp, err := http.Get("http://" + u)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 200 {
			return fmt.Errorf("%d %s", resp.StatusCode, body)
		}
		return json.Unmarshal(body, v)
	}
	var list trend.Trending
	var surge trend.Count
	testenv.Eventually(t, 30*time.Second, func() error {
		if err := get(curls[0], &list); err != nil {
			return fmt.Errorf("README %q: %w", curls[0], err)
		}
		if err := get(curls[1], &surge); err != nil {
			return fmt.Errorf("README %q: %w", curls[1], err)
		}
		if surge.Count != sent.PerTopic["surge"] {
			return fmt.Errorf("surge over %s: %d, the report says %d published", surge.Window, surge.Count, sent.PerTopic["surge"])
		}
		if len(list.Topics) == 0 || list.Topics[0].Topic != "surge" {
			return fmt.Errorf("the surge is not first: %+v", list.Topics)
		}
		return nil
	})
	t.Logf("trending: %+v", list.Topics)

	stdout.Reset()
	if err := dispatch(context.Background(), append(hotcountArgs(tops[0]), "--http", httpAddr), nil, &stdout, &stderr); err != nil {
		t.Fatalf("top: %v\n%s", err, stderr.String())
	}
	var first []string
	for _, line := range strings.Split(stdout.String(), "\n") {
		if f := strings.Fields(line); len(f) == 6 && f[0] == "1" {
			first = f
		}
	}
	if len(first) != 6 || first[1] != "surge" {
		t.Errorf("top's first row is %q, want the surge:\n%s", first, stdout.String())
	}

	// --watch redraws the table in place until interrupted.
	stdout.Reset()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if err := dispatch(ctx, append(hotcountArgs(tops[0]), "--http", httpAddr, "--watch", "--every", "200ms"), nil, &stdout, &stderr); err != nil {
		t.Fatalf("top --watch: %v\n%s", err, stderr.String())
	}
	if n := strings.Count(stdout.String(), "\x1b[H\x1b[2J"); n < 2 || !strings.Contains(stdout.String(), "surge") {
		t.Errorf("top --watch drew the table %d times in a second (every 200ms):\n%q", n, stdout.String())
	}
}
