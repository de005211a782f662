package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hotcount/hotcount/internal/testtools/testenv"
	"github.com/hotcount/hotcount/schema"
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
		if t.Failed() { // what the sidecar said, for the failure's reader
			logs := c.logs.String()
			t.Logf("log of sidecar %s %v (last 8 KB):\n%s", c.admin, args, logs[max(0, len(logs)-8<<10):])
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

// bucketSums adds up table's time buckets by granularity (minute, hour)
// and topic.
func bucketSums(t testing.TB, d *testenv.Dynalite, table string) map[schema.Granularity]map[string]int64 {
	buckets, _ := d.Buckets(t, table)
	out := map[schema.Granularity]map[string]int64{schema.Minute: {}, schema.Hour: {}}
	for b, n := range buckets {
		if per, ok := out[b.G]; ok {
			per[b.Topic] += n
		}
	}
	return out
}

// exactBuckets checks that each granularity of table's time buckets holds
// every mention of want once, topic by topic.
func exactBuckets(t *testing.T, d *testenv.Dynalite, table string, want map[string]int64) {
	t.Helper()
	for g, per := range bucketSums(t, d, table) {
		for topic, n := range want {
			if per[topic] != n {
				t.Errorf("topic %s: its %s buckets hold %d, published %d", topic, g, per[topic], n)
			}
		}
	}
}
