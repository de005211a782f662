package main

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hotcount/hotcount/internal/testtools/testenv"
	"github.com/hotcount/hotcount/tools/loadgen"
)

// TestOneProcessPerDataDir starts two core-mode `hotcount run` processes
// on one --data-dir, as two sidecars started from one working directory
// would be. Sharing it lost mentions: both named their spill segments
// alike and one replaced the other's. The second must fail at start with
// one line naming the holder, and the table must hold every mention the
// first took, once; once the first has stopped, the folder is free again.
func TestOneProcessPerDataDir(t *testing.T) {
	ns := testenv.NATS(t)
	nc := testenv.Connect(t, ns.ClientURL())
	d := testenv.StartDynalite(t)
	table := d.Table(t, "datadir")
	testenv.AWSEnv(t)
	dir := t.TempDir()
	args := []string{"--nats-mode", "core", "--nats-url", ns.ClientURL(), "--dynamodb-endpoint", d.Endpoint,
		"--table", table, "--data-dir", dir, "--flush-interval", "100ms", "--log-level", "warn"}

	first := startChild(t, args...)

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	second := exec.CommandContext(ctx, os.Args[0], append([]string{"run", "--admin", freeAddr(t), "--http", freeAddr(t)}, args...)...)
	second.Env = append(os.Environ(), runMainEnv+"=1")
	out, err := second.CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != exitError {
		t.Fatalf("second process on %s: %v, want exit code %d; its output:\n%s", dir, err, exitError, out)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	holder := "process " + strconv.Itoa(first.cmd.Process.Pid)
	if len(lines) != 1 || !strings.Contains(lines[0], holder) || !strings.Contains(lines[0], dir) {
		t.Fatalf("second process said:\n%s\nwant one line naming %s and the folder", out, holder)
	}

	rep, err := loadgen.Run(ctx, nc, loadgen.Config{Prefix: "mentions.", Topics: 50, Rate: 5_000, Messages: 10_000, Count: 1, Seed: 3})
	if err != nil {
		t.Fatal(err)
	}
	// Core NATS publishes are fire and forget: wait until the sidecar has
	// taken every one the server received before stopping it.
	testenv.Eventually(t, 30*time.Second, func() error {
		if n := first.metric(t, "hotcount_ingest_events_total"); n < float64(rep.Messages) {
			return errors.New("sidecar has taken " + strconv.FormatFloat(n, 'f', 0, 64) + " of " + strconv.FormatInt(rep.Messages, 10))
		}
		return nil
	})
	if err := first.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := first.cmd.Wait(); err != nil {
		t.Fatalf("SIGTERM: %v\n%s", err, first.logs)
	}
	got, _ := d.Counts(t, table)
	for topic, n := range rep.PerTopic {
		if got[topic] != n {
			t.Errorf("%s: table holds %d, published %d", topic, got[topic], n)
		}
	}
	if len(got) != len(rep.PerTopic) {
		t.Errorf("table holds %d topics, published %d", len(got), len(rep.PerTopic))
	}

	// The lock went with the process: the folder takes a new one.
	startChild(t, args...)
}
