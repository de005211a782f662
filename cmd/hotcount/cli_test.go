package main

import (
	"bytes"
	"context"
	"errors"
	"io"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/hotcount/hotcount/internal/datadir"
	"github.com/hotcount/hotcount/pipeline/store"
	"github.com/hotcount/hotcount/schema"
)

// commands lists every command and subcommand a user can type.
var commands = [][]string{
	{"run"}, {"dev"}, {"table"}, {"table", "create"}, {"stream"}, {"stream", "create"}, {"stream", "status"}, {"stream", "rules"}, {"stream", "rules", "show"}, {"stream", "rules", "set"}, {"stream", "rewind"},
	{"load"}, {"top"}, {"shards"}, {"shards", "show"}, {"shards", "set"}, {"demo"}, {"check-config"}, {"help"},
	{"trending"}, {"trending", "hide"}, {"trending", "unhide"}, {"trending", "allow"}, {"trending", "list"},
}

// TestHelpEverywhere: --help (and -h) on every command and subcommand prints
// help and exits 0.
func TestHelpEverywhere(t *testing.T) {
	for _, cmd := range commands {
		for _, flag := range []string{"--help", "-h"} {
			args := append(append([]string{}, cmd...), flag)
			var stdout, stderr bytes.Buffer
			err := dispatch(context.Background(), args, nil, &stdout, &stderr)
			if code := exitCode(err, &stderr); code != exitOK {
				t.Errorf("hotcount %s: exit %d, want 0 (%v)", strings.Join(args, " "), code, err)
			}
			if !strings.Contains(stdout.String()+stderr.String(), "Usage") && !strings.Contains(stdout.String()+stderr.String(), "--") {
				t.Errorf("hotcount %s printed no help:\n%s%s", strings.Join(args, " "), stdout.String(), stderr.String())
			}
		}
	}
}

// TestSettingErrors: a bad value names where it came from, conflicting
// addresses are refused, and a former variable name works with a warning.
func TestSettingErrors(t *testing.T) {
	tests := []exitCase{
		{"env names the variable", []string{"check-config"}, []string{"HOTCOUNT_SHARDS=abc"}, exitUsage, `$HOTCOUNT_SHARDS: "abc" is not a whole number (--shards)`},
		{"unknown env suggests", []string{"check-config"}, []string{"HOTCOUNT_SHARD=3"}, exitUsage, "did you mean HOTCOUNT_SHARDS?"},
		{"same port", []string{"check-config", "--http", "127.0.0.1:9091", "--admin", ":9091"}, nil, exitUsage, "would bind the same port"},
		{"former name warns", []string{"check-config"}, []string{"HOTCOUNT_HTTP_ADDR=127.0.0.1:7070"}, exitOK, "HOTCOUNT_HTTP_ADDR is deprecated and will be refused in the next release: rename it HOTCOUNT_HTTP"},
		{"range error names the variable", []string{"check-config"}, []string{"HOTCOUNT_SHARDS=1000"}, exitUsage, "shards: 1000 is outside 1..100 (from $HOTCOUNT_SHARDS)"},
		{"same port, two loopback names", []string{"check-config", "--http", "localhost:8080", "--admin", "127.0.0.1:8080"}, nil, exitUsage, "would bind the same port"},
		{"nats port out of range", []string{"dev", "--nats-port", "0"}, nil, exitUsage, "--nats-port 0 is not a port"},
	}
	checkExits(t, tests)
}

// TestShardsShowFindsDevStore: after `hotcount dev` wrote to a data
// directory, `shards show --data-dir` reads it without --store, and prints
// times as RFC 3339.
func TestShardsShowFindsDevStore(t *testing.T) {
	dir := t.TempDir()
	st, err := store.OpenBolt(dir, store.NewMetrics(prometheus.NewRegistry()))
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Add(context.Background(), store.Write{Counter: schema.TotalOf("golang"), Shard: 0, Delta: 7, Writer: store.NewWriterID(), Seq: store.NewSequencer(time.Now).Next()}, time.Now()); err != nil {
		t.Fatal(err)
	}
	st.Close()
	var stdout, stderr bytes.Buffer
	if err := dispatch(context.Background(), []string{"shards", "show", "golang", "--data-dir", dir}, nil, &stdout, &stderr); err != nil {
		t.Fatalf("shards show: %v\n%s", err, stderr.String())
	}
	if !strings.Contains(stdout.String(), "golang: total 7") {
		t.Errorf("show did not read the dev store:\n%s", stdout.String())
	}
	if !regexp.MustCompile(`shard 0: 7 \(updated 20\d\d-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z\)`).MatchString(stdout.String()) {
		t.Errorf("show does not print RFC 3339 times:\n%s", stdout.String())
	}
	// While dev runs, it holds its store: the answer says so and where to
	// read instead.
	held, err := store.OpenBolt(dir, store.NewMetrics(prometheus.NewRegistry()))
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	err = dispatch(context.Background(), []string{"shards", "show", "golang", "--data-dir", dir}, nil, io.Discard, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "in use by a running hotcount") || !strings.Contains(err.Error(), "/v1/topics/TOPIC/shards") {
		t.Errorf("shards show on a held store = %v, want it to say the store is in use and how to read it", err)
	}
}

// TestDevStartupConflicts: each conflict with another process fails within a
// second, on one line that names it, and before the banner.
func TestDevStartupConflicts(t *testing.T) {
	dev := func(t *testing.T, args ...string) (string, time.Duration, error) {
		t.Helper()
		var stdout, stderr bytes.Buffer
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		start := time.Now()
		err := dispatch(ctx, append([]string{"dev", "--log-level", "error"}, args...), nil, &stdout, &stderr)
		if stdout.Len() > 0 {
			t.Errorf("the banner printed before the failure:\n%s", stdout.String())
		}
		return stderr.String(), time.Since(start), err
	}
	free := func() string { _, p, _ := net.SplitHostPort(freeAddr(t)); return p }

	t.Run("nats port in use", func(t *testing.T) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		_, port, _ := net.SplitHostPort(ln.Addr().String())
		_, took, err := dev(t, "--nats-port", port, "--data-dir", t.TempDir(), "--http", freeAddr(t), "--admin", freeAddr(t))
		if err == nil || !strings.Contains(err.Error(), "port "+port+" is in use") || !strings.Contains(err.Error(), "--nats-port") {
			t.Errorf("err = %v, want the NATS port named as in use, and the flag that moves it", err)
		}
		if took > time.Second {
			t.Errorf("failed after %s, want within a second", took)
		}
	})
	t.Run("data dir in use", func(t *testing.T) {
		dir := t.TempDir()
		unlock, err := datadir.Lock(dir) // as a running `hotcount dev` holds it
		if err != nil {
			t.Fatal(err)
		}
		defer unlock()
		jsDir := filepath.Join(dir, "jetstream")
		_, took, err := dev(t, "--nats-port", free(), "--data-dir", dir, "--http", freeAddr(t), "--admin", freeAddr(t))
		var locked *datadir.LockedError
		if !errors.As(err, &locked) || locked.Dir != dir || locked.PID != os.Getpid() {
			t.Errorf("err = %v, want the data directory named as held by this process (%d)", err, os.Getpid())
		}
		if took > time.Second {
			t.Errorf("failed after %s, want within a second", took)
		}
		if _, err := os.Stat(jsDir); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("the second dev opened the JetStream folder of the first (stat: %v)", err)
		}
	})
	t.Run("http port in use", func(t *testing.T) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		_, took, err := dev(t, "--nats-port", free(), "--data-dir", t.TempDir(), "--http", ln.Addr().String(), "--admin", freeAddr(t))
		if err == nil || !strings.Contains(err.Error(), "--http "+ln.Addr().String()+" is in use") {
			t.Errorf("err = %v, want the HTTP address named as in use", err)
		}
		if took > 5*time.Second {
			t.Errorf("failed after %s", took)
		}
	})
}
