package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/hotcount/hotcount/ingest"
	"github.com/hotcount/hotcount/internal/ddbfault"
	"github.com/hotcount/hotcount/internal/testenv"
	"github.com/hotcount/hotcount/journal"
	"github.com/hotcount/hotcount/loadgen"
	"github.com/hotcount/hotcount/store"
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
	logs  *logBuf
}

// logBuf keeps a child's log lines; safe for concurrent use.
type logBuf struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *logBuf) WriteString(s string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.b.WriteString(s)
}

func (l *logBuf) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// startChild starts `hotcount run` with args and free ports and waits until
// it serves and is subscribed. A port taken between choosing and binding it
// (other packages' tests run at the same time) is chosen again.
func startChild(t testing.TB, args ...string) *child {
	t.Helper()
	for attempt := 1; ; attempt++ {
		c, err := tryChild(t, args)
		if err == nil {
			return c
		}
		if !errors.Is(err, errPortTaken) || attempt == 3 {
			t.Fatal(err)
		}
	}
}

var errPortTaken = errors.New("a port was taken before the child bound it")

func tryChild(t testing.TB, args []string) (*child, error) {
	t.Helper()
	c := &child{admin: freeAddr(t), logs: &logBuf{}}
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
	// Generous: under `go test ./...` on two cores the race-instrumented
	// child starts next to every other package's tests.
	taken := false
	if err := testenv.Poll(90*time.Second, func() error {
		_, err := c.get("/readyz")
		if err != nil && strings.Contains(c.logs.String(), "address already in use") {
			taken = true
			return nil
		}
		return err
	}); err != nil {
		return nil, fmt.Errorf("child not serving: %w; its log:\n%s", err, c.logs)
	}
	if taken {
		c.cmd.Process.Kill() //nolint:errcheck // it is exiting anyway
		c.cmd.Wait()         //nolint:errcheck // killed
		return nil, errPortTaken
	}
	testenv.Subscribed(t, c.admin, 60*time.Second)
	return c, nil
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
// process against a slow store (every DynamoDB call delayed 200 ms, as on
// a bad day, so that kills land between writes and acknowledgements) and
// kills it with SIGKILL five times at random moments while mentions arrive,
// each time starting a new one. The journal carries the killed writers'
// counts: the table ends with exactly what was published, topic by topic,
// and redelivered messages whose counts a journal entry carried are not
// counted again.
func TestSIGKILLLosesNothing(t *testing.T) {
	ns := testenv.NATS(t)
	nc := testenv.Connect(t, ns.ClientURL())
	if _, err := ingest.EnsureStream(context.Background(), nc, "MENTIONS", "mentions.>", time.Minute); err != nil {
		t.Fatal(err)
	}
	d := testenv.StartDynalite(t)
	table := d.Table(t, "crash")
	testenv.AWSEnv(t)
	slow := ddbfault.New(ddbfault.Config{Upstream: d.Endpoint})
	slow.SetLatency(200 * time.Millisecond)
	endpoint, stop, err := slow.Serve("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer stop() //nolint:errcheck // test teardown
	args := []string{"--nats-mode", "jetstream", "--nats-url", ns.ClientURL(), "--dynamodb-endpoint", endpoint,
		"--table", table, "--flush-interval", "300ms", "--flush-timeout", "1s", "--ack-wait", "10s", "--log-level", "warn", "--durable-engine", "journal",
		"--windows", "1m,1h"} // time buckets on: their counts must survive the kills too

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	type result struct {
		rep loadgen.Report
		err error
	}
	sent := make(chan result, 1)
	go func() {
		rep, err := loadgen.Run(ctx, nc, loadgen.Config{Prefix: "mentions.", Topics: 100, Zipf: 1.2, Rate: 2_000, Messages: 40_000, Count: 1, Seed: 11, JetStream: true})
		sent <- result{rep, err}
	}()
	rng := rand.New(rand.NewPCG(11, uint64(time.Now().UnixNano())))
	cur := startChild(t, args...)
	const kills = 5
	for i := range kills {
		// Once it has journaled (and so acknowledged) some flushes, at a
		// random moment of the next ones: between a journal entry, its
		// writes and its retirement. The publisher (20 s) outlasts the
		// kills.
		testenv.Eventually(t, 30*time.Second, func() error {
			if n := cur.metric(t, "hotcount_journal_recorded_total"); n < 2 {
				return fmt.Errorf("%v journal entries so far (kill %d)", n, i+1)
			}
			return nil
		})
		// A random moment of the next flushes: the point of the test is
		// the wait.
		time.Sleep(time.Duration(rng.Int64N(int64(900 * time.Millisecond))))
		if err := cur.cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		cur.cmd.Wait() //nolint:errcheck // killed: its error says so
		t.Logf("kill %d of %d", i+1, kills)
		cur = startChild(t, args...)
	}
	r := <-sent
	if r.err != nil {
		t.Fatal(r.err)
	}
	// The killed writers' heartbeats expire after journal.Lease; the
	// survivor then replays their entries.
	testenv.ConsumerIdle(t, ns.ClientURL(), "MENTIONS", "hotcount", 2*journal.Lease)
	testenv.Eventually(t, 3*journal.Lease, func() error {
		open, err := openJournalEntries(nc, journal.DefaultBucket)
		if err != nil {
			return err
		}
		if open > 0 {
			return fmt.Errorf("%d journal entries not yet replayed; survivor's log:\n%s", open, cur.logs)
		}
		return nil
	})
	testenv.ConsumerIdle(t, ns.ClientURL(), "MENTIONS", "hotcount", 30*time.Second)
	redelivered := cur.metric(t, "hotcount_ingest_redelivered_total")
	journaled := cur.metric(t, "hotcount_ingest_journaled_redeliveries_total")
	replayed := cur.metric(t, "hotcount_journal_replayed_total")
	if err := cur.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := cur.cmd.Wait(); err != nil {
		t.Fatalf("SIGTERM: %v\n%s", err, cur.logs)
	}

	got, _ := d.Counts(t, table)
	var total int64
	for _, n := range got {
		total += n
	}
	for topic, n := range r.rep.PerTopic {
		if got[topic] != n {
			t.Errorf("topic %s: table %d, published %d", topic, got[topic], n)
		}
	}
	t.Logf("%d SIGKILLs: published %d, table %d; the survivor saw %v redeliveries, %v of them already journaled, and replayed %v entries",
		kills, r.rep.Mentions, total, redelivered, journaled, replayed)
	if replayed == 0 {
		t.Error("no journal entry was replayed: no kill landed between a journal entry and its retirement")
	}
	if total != r.rep.Mentions {
		t.Errorf("table holds %d mentions, published %d: over-count %d", total, r.rep.Mentions, total-r.rep.Mentions)
	}
	// The time buckets are journaled and replayed with their totals: each
	// granularity holds every mention once too.
	exactBuckets(t, d, table, r.rep.PerTopic)
}

// exactBuckets checks that each granularity of table's time buckets holds
// every mention of want once, topic by topic.
func exactBuckets(t *testing.T, d *testenv.Dynalite, table string, want map[string]int64) {
	t.Helper()
	buckets, _ := d.Buckets(t, table)
	for _, g := range []store.Granularity{store.Minute, store.Hour} {
		per := make(map[string]int64)
		for b, n := range buckets {
			if b.G == g {
				per[b.Topic] += n
			}
		}
		for topic, n := range want {
			if per[topic] != n {
				t.Errorf("topic %s: its %s buckets hold %d, published %d", topic, g, per[topic], n)
			}
		}
	}
}

// openJournalEntries counts the journal entries not yet done, in bucket.
func openJournalEntries(nc *nats.Conn, bucket string) (int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	js, err := jetstream.New(nc)
	if err != nil {
		return 0, err
	}
	return journal.Unsettled(ctx, js, bucket)
}
