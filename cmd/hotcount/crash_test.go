package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hotcount/hotcount/ingest"
	"github.com/hotcount/hotcount/internal/testenv"
	"github.com/hotcount/hotcount/loadgen"
)

// runMainEnv makes the test binary act as the hotcount binary, so that a
// test can run (and SIGKILL) a real sidecar process without a build step.
const runMainEnv = "HC_TEST_RUN_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(runMainEnv) == "1" {
		main()
		return
	}
	os.Exit(m.Run())
}

// child is a hotcount process started from the test binary.
type child struct {
	cmd   *exec.Cmd
	admin string
	logs  *strings.Builder
}

func startChild(t testing.TB, args ...string) *child {
	t.Helper()
	c := &child{admin: freeAddr(t), logs: &strings.Builder{}}
	c.cmd = exec.Command(os.Args[0], append([]string{"run", "--admin", c.admin, "--http", freeAddr(t)}, args...)...)
	c.cmd.Env = append(os.Environ(), runMainEnv+"=1")
	stderr, err := c.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { // keep the logs for the failure message
		s := bufio.NewScanner(stderr)
		for s.Scan() {
			c.logs.WriteString(s.Text() + "\n")
		}
	}()
	t.Cleanup(func() {
		if c.cmd.ProcessState == nil {
			c.cmd.Process.Kill() //nolint:errcheck // may have exited
			c.cmd.Wait()         //nolint:errcheck // killed
		}
	})
	testenv.Eventually(t, 30*time.Second, func() error { _, err := c.get("/readyz"); return err })
	return c
}

func (c *child) get(path string) (string, error) {
	resp, err := http.Get("http://" + c.admin + path)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		return "", fmt.Errorf("%s: %d %s", path, resp.StatusCode, b)
	}
	return string(b), nil
}

// metric reads one unlabelled metric from the child's /metrics.
func (c *child) metric(t testing.TB, name string) float64 {
	t.Helper()
	body, err := c.get("/metrics")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(body, "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
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

// TestSIGKILLLosesNothing runs `hotcount run --nats-mode jetstream` as a
// process, kills it with SIGKILL while it holds unacknowledged messages and
// has flushed others, starts it again, and finds every published mention in
// the table. The over-count (messages whose delta was written but whose ack
// died with the process) is reported and bounded by the redeliveries.
func TestSIGKILLLosesNothing(t *testing.T) {
	ns := testenv.NATS(t)
	nc := testenv.Connect(t, ns.ClientURL())
	if _, err := ingest.EnsureStream(context.Background(), nc, "MENTIONS", "mentions.>", time.Minute); err != nil {
		t.Fatal(err)
	}
	d := testenv.StartDynalite(t)
	table := d.Table(t, "crash")
	testenv.AWSEnv(t)
	args := []string{"--nats-mode", "jetstream", "--nats-url", ns.ClientURL(), "--dynamodb-endpoint", d.Endpoint,
		"--table", table, "--flush-interval", "300ms", "--flush-timeout", "1s", "--ack-wait", "10s", "--log-level", "warn"}

	first := startChild(t, args...)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	type result struct {
		rep loadgen.Report
		err error
	}
	sent := make(chan result, 1)
	go func() {
		rep, err := loadgen.Run(ctx, nc, loadgen.Config{Prefix: "mentions.", Topics: 100, Zipf: 1.2, Rate: 20_000, Messages: 40_000, Count: 1, Seed: 11, JetStream: true})
		sent <- result{rep, err}
	}()
	// Kill once some flushes have landed and more messages are held.
	testenv.Eventually(t, 30*time.Second, func() error {
		if w := first.metric(t, "hotcount_flusher_flushed_mentions_total"); w < 5000 {
			return fmt.Errorf("%v flushed so far", w)
		}
		if h := first.metric(t, "hotcount_aggregator_held_messages"); h == 0 {
			return fmt.Errorf("nothing held right now")
		}
		return nil
	})
	if err := first.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	first.cmd.Wait() //nolint:errcheck // killed: its error says so

	second := startChild(t, args...)
	r := <-sent
	if r.err != nil {
		t.Fatal(r.err)
	}
	testenv.ConsumerIdle(t, ns.ClientURL(), "MENTIONS", "hotcount", 60*time.Second)
	redelivered := second.metric(t, "hotcount_ingest_redelivered_total")
	if err := second.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := second.cmd.Wait(); err != nil {
		t.Fatalf("SIGTERM: %v\n%s", err, second.logs)
	}

	got, _ := d.Counts(t, table)
	var total int64
	for _, n := range got {
		total += n
	}
	for topic, n := range r.rep.PerTopic {
		if got[topic] < n {
			t.Errorf("topic %s: table %d < published %d: lost mentions", topic, got[topic], n)
		}
	}
	over := total - r.rep.Mentions
	t.Logf("SIGKILL: published %d, table %d, over-count %d, redelivered after restart %v", r.rep.Mentions, total, over, redelivered)
	if over < 0 || float64(over) > redelivered {
		t.Errorf("over-count %d outside 0..redelivered (%v)", over, redelivered)
	}
}
