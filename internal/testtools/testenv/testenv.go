// Package testenv starts the real services hotcount's tests run against: an
// in-process NATS server and a dynalite process (a real implementation of the
// DynamoDB API, from test/dynalite). Under CI=true a service that cannot
// start fails the test; elsewhere the test is skipped with the reason.
package testenv

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/hotcount/hotcount/durability/streams"
	"github.com/hotcount/hotcount/internal/embeddednats"
	"github.com/hotcount/hotcount/pipeline/store"
	"github.com/hotcount/hotcount/schema"
)

// unavailable fails the test under CI=true, where every service must be
// there, and skips it elsewhere.
func unavailable(t testing.TB, format string, args ...any) {
	t.Helper()
	msg := fmt.Sprintf(format, args...)
	if os.Getenv("CI") == "true" {
		t.Fatalf("%s (CI=true: a missing service is a failure)", msg)
	}
	t.Skipf("%s; run `make test`, which installs it", msg)
}

// NATS starts an in-process NATS server with JetStream on a free port and
// stops it when the test ends.
func NATS(t testing.TB) *server.Server { t.Helper(); return NATSMapped(t, nil) }

// NATSWithoutJetStream is a NATS server with JetStream off: a plain
// server, as core mode may run against.
func NATSWithoutJetStream(t testing.TB) *server.Server {
	t.Helper()
	return NATSWith(t, &server.Options{Host: "127.0.0.1", Port: -1})
}

// NATSWith starts an in-process NATS server with opts (quiet, and deaf
// to signals) and stops it when the test ends: a server the other
// helpers do not make, such as one from a configuration file.
func NATSWith(t testing.TB, opts *server.Options) *server.Server {
	t.Helper()
	opts.NoLog, opts.NoSigs = true, true
	ns, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	go ns.Start()
	t.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })
	if !ns.ReadyForConnections(10 * time.Second) {
		t.Fatal("NATS not ready")
	}
	return ns
}

// Partitioned is the server mapping of partitioned mode's layout l, for
// NATSMapped and NATSCluster: what deploy/nats/hotcount.conf sets.
func Partitioned(l streams.Layout) map[string]string {
	from, to := l.Mapping()
	return map[string]string{from: to}
}

// NATSMapped is NATS with subject mappings (Partitioned's).
func NATSMapped(t testing.TB, mappings map[string]string) *server.Server {
	t.Helper()
	s, err := embeddednats.Start(-1, t.TempDir(), mappings)
	if err != nil {
		t.Fatalf("start NATS: %v", err)
	}
	t.Cleanup(func() {
		s.Shutdown()
		s.WaitForShutdown()
	})
	return s
}

// Connect connects to the NATS server at url and closes the connection when
// the test ends.
func Connect(t testing.TB, url string) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatalf("connect NATS: %v", err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// Dynalite is a running dynalite process.
type Dynalite struct {
	// Endpoint is its URL, for --dynamodb-endpoint.
	Endpoint string
	port     int
	dir      string
	cmd      *exec.Cmd
	t        testing.TB
}

// binary finds test/dynalite's launcher from the module root: dynalite's own
// command line behind a guard that keeps it up when a client goes away
// mid-request (see serve.js; a SIGKILLed sidecar used to take it down).
func binary() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			break
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("no go.mod above the test's folder")
		}
		dir = parent
	}
	if _, err := os.Stat(filepath.Join(dir, "test", "dynalite", "node_modules", "dynalite")); err != nil {
		return "", fmt.Errorf("dynalite is not installed in test/dynalite (make deps installs it): %w", err)
	}
	return filepath.Join(dir, "test", "dynalite", "serve.js"), nil
}

// DynaliteBinary returns the path of test/dynalite's dynalite, for a test
// of code that starts it itself (hotcount demo).
func DynaliteBinary(t testing.TB) string {
	t.Helper()
	bin, err := binary()
	if err != nil {
		unavailable(t, "dynalite: %v", err)
	}
	return bin
}

// StartDynalite starts dynalite on a free port, persisting to a folder of
// the test's (so that Restart keeps the data), and stops it when the test
// ends.
func StartDynalite(t testing.TB) *Dynalite {
	t.Helper()
	d := &Dynalite{t: t, dir: t.TempDir()}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("free port: %v", err)
	}
	d.port = ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	d.Endpoint = "http://127.0.0.1:" + strconv.Itoa(d.port)
	d.start()
	t.Cleanup(d.Stop)
	return d
}

func (d *Dynalite) start() {
	d.t.Helper()
	bin, err := binary()
	if err != nil {
		unavailable(d.t, "dynalite: %v", err)
	}
	cmd := exec.Command(bin, "--host", "127.0.0.1", "--port", strconv.Itoa(d.port), "--path", d.dir,
		"--createTableMs", "0", "--deleteTableMs", "0", "--updateTableMs", "0")
	cmd.Stderr = os.Stderr // its stdout only says where it listens
	if err := cmd.Start(); err != nil {
		unavailable(d.t, "dynalite: start %s: %v", bin, err)
	}
	d.cmd = cmd
	deadline := time.Now().Add(20 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", "127.0.0.1:"+strconv.Itoa(d.port), 200*time.Millisecond)
		if err == nil {
			c.Close()
			return
		}
		if time.Now().After(deadline) {
			d.Stop()
			unavailable(d.t, "dynalite did not listen on port %d within 20s: %v", d.port, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Stop kills dynalite (the data stays in its folder). Stopping a stopped
// dynalite does nothing.
func (d *Dynalite) Stop() {
	if d.cmd == nil {
		return
	}
	d.cmd.Process.Kill() //nolint:errcheck // it may have exited
	d.cmd.Wait()         //nolint:errcheck // killed: the error says so
	d.cmd = nil
}

// Restart starts a stopped dynalite again on the same port and data.
func (d *Dynalite) Restart() {
	d.t.Helper()
	d.Stop()
	d.start()
}

// Client returns an SDK client for d with static test credentials and no
// retries, so that tests see each call's own result.
func (d *Dynalite) Client() *dynamodb.Client { return Client(d.Endpoint) }

// Client returns an SDK client for the DynamoDB API at endpoint (dynalite,
// or a proxy in front of it) with static test credentials and no retries.
func Client(endpoint string) *dynamodb.Client {
	return dynamodb.New(dynamodb.Options{
		Region:           "us-east-1",
		BaseEndpoint:     aws.String(endpoint),
		Credentials:      credentials.NewStaticCredentialsProvider("test", "test", ""),
		RetryMaxAttempts: 1,
	})
}

// Table creates a table with the hotcount schema and returns its name.
func (d *Dynalite) Table(t testing.TB, name string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := store.CreateTable(ctx, d.Client(), name); err != nil {
		t.Fatalf("create table %s: %v", name, err)
	}
	return name
}

// AWSEnv sets the environment the SDK's default chain reads, for code that
// builds its own client (the sidecar), to static test credentials.
func AWSEnv(t testing.TB) {
	t.Setenv("AWS_ACCESS_KEY_ID", "test")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "test")
	t.Setenv("AWS_REGION", "us-east-1")
	t.Setenv("AWS_EC2_METADATA_DISABLED", "true")
	t.Setenv("AWS_CONFIG_FILE", filepath.Join(t.TempDir(), "none"))
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", filepath.Join(t.TempDir(), "none"))
}

// Eventually polls cond (as Poll does) until it returns nil or timeout
// passes, then fails the test with cond's last error.
func Eventually(t testing.TB, timeout time.Duration, cond func() error) {
	t.Helper()
	if err := Poll(timeout, cond); err != nil {
		t.Fatal(err)
	}
}

// EventuallyEvery is Eventually polling every interval throughout: for a
// benchmark, whose clock stops when cond first holds, so that Poll's
// slower polls after a second do not count in its figure.
func EventuallyEvery(t testing.TB, timeout, interval time.Duration, cond func() error) {
	t.Helper()
	if err := poll(timeout, func(time.Duration) time.Duration { return interval }, cond); err != nil {
		t.Fatal(err)
	}
}

// Poll is Eventually for where a failure must not stop the test at once (a
// goroutine other than the test's, a failure that adds logs): it polls cond
// until it returns nil, and returns nil, or until timeout passes, and
// returns an error wrapping cond's last. It polls every 10 ms for a
// second, then every 100 ms: a wait that lasts is a catch-up, and a
// condition that scans a table or reads /metrics every 10 ms took CPU
// the catch-up needed, on a machine whose two cores the tests share
// (cmd/hotcount's tests took 18% less CPU).
func Poll(timeout time.Duration, cond func() error) error {
	return poll(timeout, func(waited time.Duration) time.Duration {
		if waited < time.Second {
			return 10 * time.Millisecond
		}
		return 100 * time.Millisecond
	}, cond)
}

// poll calls cond until it returns nil or timeout passes, sleeping
// interval(time waited so far) between calls.
func poll(timeout time.Duration, interval func(time.Duration) time.Duration, cond func() error) error {
	start := time.Now()
	for {
		err := cond()
		if err == nil {
			return nil
		}
		waited := time.Since(start)
		if waited > timeout {
			return fmt.Errorf("not within %s: %w", timeout, err)
		}
		time.Sleep(interval(waited))
	}
}

// Metric sums every series of the named counter or gauge in g; it fails
// the test when g has no such metric.
func Metric(t testing.TB, g prometheus.Gatherer, name string) float64 {
	t.Helper()
	v, err := MetricValue(g, name, "", "")
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// MetricWith is the value of the series of name whose label has value.
func MetricWith(t testing.TB, g prometheus.Gatherer, name, label, value string) float64 {
	t.Helper()
	v, err := MetricValue(g, name, label, value)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// MetricValue is Metric, or MetricWith when label is set, for code without
// a testing.TB (a helper's poll, an example): the sum of the series of the
// named counter or gauge in g (those whose label has value, when label is
// set), or an error when there is none.
func MetricValue(g prometheus.Gatherer, name, label, value string) (float64, error) {
	mfs, err := g.Gather()
	if err != nil {
		return 0, err
	}
	var sum float64
	found := false
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if label == "" || slices.ContainsFunc(m.GetLabel(), func(l *dto.LabelPair) bool {
				return l.GetName() == label && l.GetValue() == value
			}) {
				found = true
				sum += m.GetCounter().GetValue() + m.GetGauge().GetValue()
			}
		}
	}
	if !found {
		if label != "" {
			return 0, fmt.Errorf("no metric %s with %s=%q", name, label, value)
		}
		return 0, fmt.Errorf("no metric %s", name)
	}
	return sum, nil
}

// RestartNATS stops s and starts a new server on the same port with the
// same JetStream store, as a NATS server restart does; the new server is
// stopped when the test ends. It has no mappings: a NATSMapped server
// comes back unmapped.
func RestartNATS(t testing.TB, s *server.Server) *server.Server {
	t.Helper()
	port := s.Addr().(*net.TCPAddr).Port
	dir := s.JetStreamConfig().StoreDir
	s.Shutdown()
	s.WaitForShutdown()
	ns, err := embeddednats.Start(port, dir, nil)
	if err != nil {
		t.Fatalf("restart NATS: %v", err)
	}
	t.Cleanup(func() {
		ns.Shutdown()
		ns.WaitForShutdown()
	})
	return ns
}

// Counts scans the whole table: topic -> summed count, and the number of
// shard items (metadata items are not counted), so that a count under an
// unexpected key cannot hide. A key outside
// the schema fails the test.
func (d *Dynalite) Counts(t testing.TB, table string) (map[string]int64, int) {
	t.Helper()
	counts := make(map[string]int64)
	items := 0
	d.scan(t, table, func(pk string, it map[string]types.AttributeValue) {
		if base, _ := schema.SplitRegion(pk); strings.HasSuffix(base, "#"+schema.MetaSuffix) || base == schema.HistoryKey {
			return // a topic's shard metadata, the fleet's history (a Region's or not): not counts
		}
		if _, _, _, _, err := schema.ParseBucketKey(pk); err == nil {
			return // a time bucket: see Buckets
		}
		items++
		topic, shard, err := schema.ParseShardKey(pk)
		if err != nil || shard >= schema.MaxShards {
			t.Fatalf("item with a key outside the schema: %q", pk)
		}
		counts[topic] += number(t, it, schema.AttrCount)
	})
	return counts, items
}

// scan calls each with every item of table and its partition key.
func (d *Dynalite) scan(t testing.TB, table string, each func(pk string, it map[string]types.AttributeValue)) {
	t.Helper()
	p := dynamodb.NewScanPaginator(d.Client(), &dynamodb.ScanInput{TableName: &table})
	for p.HasMorePages() {
		// A read is safe to repeat, and its first try may meet a
		// keep-alive connection dynalite (Node.js: 5 s idle) has just
		// closed: a few tries before the test fails on it.
		var page *dynamodb.ScanOutput
		var err error
		for try := 0; try < 3; try++ {
			if page, err = p.NextPage(context.Background()); err == nil {
				break
			}
		}
		if err != nil {
			t.Fatal(err)
		}
		for _, it := range page.Items {
			pk, _ := it[schema.AttrPK].(*types.AttributeValueMemberS)
			if pk == nil {
				t.Fatalf("item without a string %s: %v", schema.AttrPK, it)
			}
			each(pk.Value, it)
		}
	}
}

// EachItem calls each with the key and count of every item of table that
// has a count (totals and buckets, of every Region layout).
func (d *Dynalite) EachItem(t testing.TB, table string, each func(pk string, count int64)) {
	t.Helper()
	d.scan(t, table, func(pk string, it map[string]types.AttributeValue) {
		if _, ok := it[schema.AttrCount]; ok {
			each(pk, number(t, it, schema.AttrCount))
		}
	})
}

// number is an item's number attribute name; the test fails without it.
func number(t testing.TB, it map[string]types.AttributeValue, name string) int64 {
	t.Helper()
	v, _ := it[name].(*types.AttributeValueMemberN)
	if v == nil {
		t.Fatalf("item without a number %s: %v", name, it)
	}
	n, err := strconv.ParseInt(v.Value, 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// CountOf is an item's count attribute, 0 for an item without one (or
// none: a missing item has counted nothing).
func CountOf(t testing.TB, it map[string]types.AttributeValue) int64 {
	t.Helper()
	if _, ok := it[schema.AttrCount]; !ok {
		return 0
	}
	return number(t, it, schema.AttrCount)
}

// Bucket names one time bucket of a topic.
type Bucket struct {
	Topic string
	G     schema.Granularity
	Index int64
}

// Buckets scans table and sums each time bucket's count over its shards;
// it also returns the number of bucket items.
func (d *Dynalite) Buckets(t testing.TB, table string) (map[Bucket]int64, int) {
	t.Helper()
	counts := make(map[Bucket]int64)
	items := 0
	d.scan(t, table, func(pk string, it map[string]types.AttributeValue) {
		topic, g, i, _, err := schema.ParseBucketKey(pk)
		if err != nil {
			return // a total or metadata
		}
		items++
		number(t, it, schema.AttrExpiresAt) // every bucket expires
		counts[Bucket{topic, g, i}] += number(t, it, schema.AttrCount)
	})
	return counts, items
}

// Checkpointed waits until every stream in streams has a position
// engine checkpoint (in its bucket, hotcount_checkpoints) at its last
// sequence, in its epoch: every mention it stores is in the store (or
// held in the checkpoint).
func Checkpointed(t testing.TB, url string, streams []string, timeout time.Duration) {
	t.Helper()
	js, err := jetstream.New(Connect(t, url))
	if err != nil {
		t.Fatal(err)
	}
	Eventually(t, timeout, func() error {
		ctx := context.Background()
		kv, err := js.KeyValue(ctx, "hotcount_checkpoints")
		if err != nil {
			return err
		}
		for _, name := range streams {
			st, err := js.Stream(ctx, name)
			if err != nil {
				return err
			}
			info := st.CachedInfo()
			e, err := kv.Get(ctx, name)
			if err != nil {
				return fmt.Errorf("%s: checkpoint: %w", name, err)
			}
			first, _, _ := strings.Cut(string(e.Value()), "\n")
			want := fmt.Sprintf("%d:%d", info.Created.UnixMicro(), info.State.LastSeq)
			if first != want {
				return fmt.Errorf("%s: checkpoint %s, want %s", name, first, want)
			}
		}
		return nil
	})
}

// Clock is a settable time for code that takes a clock: pass Now, move it
// with Add. It is safe for concurrent use.
type Clock struct {
	mu sync.Mutex
	t  time.Time
}

// NewClock returns a clock reading t.
func NewClock(t time.Time) *Clock { return &Clock{t: t} }

// Now is the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

// Add moves the clock on by d.
func (c *Clock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// testWriter and testSeq give tests' direct store writes an identity, as
// the flusher gives its own.
var (
	testWriter = store.NewWriterID()
	testSeq    = store.NewSequencer(time.Now)
)

// W is an increment of delta to one shard of topic's total, as a new write
// of the tests' own writer. One writer writes an item one write at a time
// (the flusher's rule): concurrent writers each take a Writer.
func W(topic string, shard int, delta int64) store.Write {
	return Inc(schema.TotalOf(topic), shard, delta)
}

// Inc is W for any counter (a time bucket's).
func Inc(c schema.Counter, shard int, delta int64) store.Write {
	return store.Write{Counter: c, Shard: shard, Delta: delta, Writer: testWriter, Seq: testSeq.Next()}
}

// Writer returns a W of a writer of its own.
func Writer() func(topic string, shard int, delta int64) store.Write {
	id, seq := store.NewWriterID(), store.NewSequencer(time.Now)
	return func(topic string, shard int, delta int64) store.Write {
		return store.Write{Counter: schema.TotalOf(topic), Shard: shard, Delta: delta, Writer: id, Seq: seq.Next()}
	}
}

// Subscribed polls the admin listener at addr until its /healthz body says
// NATS is ok (subscribed, or the consumer bound): /readyz no longer waits
// for that, it only says the lookup API can answer.
func Subscribed(t testing.TB, addr string, timeout time.Duration) {
	t.Helper()
	Eventually(t, timeout, func() error {
		resp, err := http.Get("http://" + addr + "/healthz")
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		var body struct {
			Dependencies map[string]string `json:"dependencies"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
			return err
		}
		if s := body.Dependencies["nats"]; s != "ok" {
			return fmt.Errorf("nats: %q", s)
		}
		return nil
	})
}
