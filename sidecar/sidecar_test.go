package sidecar_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap/zaptest"

	"github.com/hotcount/hotcount/config"
	"github.com/hotcount/hotcount/durability/streams"
	"github.com/hotcount/hotcount/internal/testtools/ddbfault"
	"github.com/hotcount/hotcount/internal/testtools/testenv"
	"github.com/hotcount/hotcount/internal/testtools/testenv/sidecartest"
	"github.com/hotcount/hotcount/mention"
	"github.com/hotcount/hotcount/pipeline/ingest"
	"github.com/hotcount/hotcount/schema"
	"github.com/hotcount/hotcount/sidecar"
	"github.com/hotcount/hotcount/tools/loadgen"
)

// env is one sidecar against a real NATS server and a real dynalite,
// started by sidecartest.Run.
type env struct {
	ns    *server.Server
	cfg   config.Config
	dyn   *testenv.Dynalite
	fault *ddbfault.Proxy // nil without the emulator
	sc    *sidecartest.Sidecar
	nats  string
	opts  []sidecar.Option // New's, for every sidecar of the env
}

func newEnv(t testing.TB, tune func(*config.Config)) *env {
	return newFaultEnv(t, nil, tune)
}

// newFaultEnv is newEnv with the fault emulator between the sidecar and
// dynalite, when fc is set.
func newFaultEnv(t testing.TB, fc *ddbfault.Config, tune func(*config.Config), opts ...sidecar.Option) *env {
	d := testenv.StartDynalite(t)
	testenv.AWSEnv(t)
	cfg := config.Default()
	cfg.DynamoDBEndpoint = d.Endpoint
	cfg.Table = d.Table(t, "hotcount")
	var fault *ddbfault.Proxy
	if fc != nil {
		fc.Upstream = d.Endpoint
		fault = ddbfault.New(*fc)
		url, stop, err := fault.Serve("127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { stop() }) //nolint:errcheck // closing
		cfg.DynamoDBEndpoint = url
	}
	cfg.HTTPAddr = "127.0.0.1:0"
	cfg.AdminAddr = "127.0.0.1:0"
	cfg.FlushInterval = 100 * time.Millisecond
	cfg.DataDir = t.TempDir() // the spill folder, in core mode
	// Time buckets on, so that every conservation test checks them too
	// (exactBuckets); a test turns them off where it measures without.
	cfg.Windows = config.DevWindows
	if tune != nil {
		tune(&cfg)
	}
	// NATS and the stream, or in partitioned mode the server's mapping
	// and the partition streams.
	var ns *server.Server
	if cfg.NATSMode == config.ModePartitioned {
		l := streams.Layout{Stream: cfg.Stream, Subject: cfg.Subject, Partitions: cfg.Partitions}
		ns = testenv.NATSMapped(t, testenv.Partitioned(l))
		js, err := jetstream.New(testenv.Connect(t, ns.ClientURL()))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := streams.Ensure(context.Background(), js, l, streams.Options{MaxAge: time.Hour, MaxBytes: 1 << 30, Duplicates: time.Minute}); err != nil {
			t.Fatal(err)
		}
	} else {
		ns = testenv.NATS(t)
		if _, err := ingest.EnsureStream(context.Background(), testenv.Connect(t, ns.ClientURL()), cfg.Stream, cfg.Subject, time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	cfg.NATSURL = ns.ClientURL()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	e := &env{ns: ns, cfg: cfg, dyn: d, fault: fault, nats: ns.ClientURL(), opts: opts}
	e.sc = sidecartest.Run(t, cfg, zaptest.NewLogger(t), opts...)
	return e
}

// newEnvOn starts another sidecar on base's NATS, table and emulator, with
// base's settings as tune changes them: its --data-dir too, which is right
// for a sidecar that follows base (a restart) and wrong for one that runs
// next to it (tune gives that one its own).
func newEnvOn(t testing.TB, base *env, tune func(*config.Config)) *env {
	cfg := base.cfg
	if tune != nil {
		tune(&cfg)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	e := &env{ns: base.ns, cfg: cfg, dyn: base.dyn, fault: base.fault, nats: base.nats, opts: base.opts}
	e.sc = sidecartest.Run(t, cfg, zaptest.NewLogger(t), e.opts...)
	return e
}

// stop is SIGTERM: it returns Run's error (sidecartest's Stop).
func (e *env) stop() error { return e.sc.Stop() }

// probe is nil when the admin listener answers path with 200.
func (e *env) probe(path string) error { return e.sc.Probe(path) }

func tableCounts(t testing.TB, d *testenv.Dynalite, table string) (map[string]int64, int) {
	return d.Counts(t, table)
}

func publish(t testing.TB, url string, c loadgen.Config) loadgen.Report {
	t.Helper()
	nc := testenv.Connect(t, url)
	rep, err := loadgen.Run(context.Background(), nc, c)
	if err != nil {
		t.Fatal(err)
	}
	return rep
}

func sum(m map[string]int64) (s int64) {
	for _, v := range m {
		s += v
	}
	return s
}

// TestConservation publishes mentions over many topics (Zipf-skewed, empty
// and {"count": n} payloads, topics with dots), sends SIGTERM while deltas
// are still buffered, and finds exactly what was published in the table,
// topic by topic, in far fewer writes than mentions.
func TestConservation(t *testing.T) {
	e := newEnv(t, func(c *config.Config) {
		c.FlushInterval = time.Hour // nothing flushes before SIGTERM but the final flush
		// The final flush sends its 909 writes at once, and one dynalite
		// on a loaded machine took past the default 5 s for 81 of them:
		// sent again, they were writes the count below is not about. On a
		// busier one the default 25 s budget left the final flush 6 s, too
		// few for them all (the rest went to the spill folder, as it
		// should). The test is about what one flush writes, not how fast.
		c.WriteTimeout = 20 * time.Second
		c.ShutdownTimeout = 2 * time.Minute
	})
	ones := publish(t, e.nats, loadgen.Config{Prefix: "mentions.", Topics: 300, Zipf: 1.2, Messages: 40_000, Count: 1, Seed: 1})
	sevens := publish(t, e.nats, loadgen.Config{Prefix: "mentions.", Topics: 50, Messages: 2_000, Count: 7, Seed: 2})
	dotted := publish(t, e.nats, loadgen.Config{Prefix: "mentions.eu.west.", Topics: 3, Messages: 500, Count: 1, Seed: 3})

	if w := testenv.Metric(t, e.sc.Registry(), "hotcount_store_writes_total"); w != 0 {
		t.Fatalf("%v writes before SIGTERM; the test needs the deltas buffered", w)
	}
	if err := e.stop(); err != nil {
		t.Fatalf("shutdown: %v", err)
	}

	want := make(map[string]int64)
	for _, rep := range []loadgen.Report{ones, sevens} {
		for topic, n := range rep.PerTopic {
			want[topic] += n
		}
	}
	for topic, n := range dotted.PerTopic {
		want["eu.west."+topic] += n
	}
	got, items := tableCounts(t, e.dyn, e.cfg.Table)
	if sum(got) != sum(want) {
		t.Errorf("table holds %d mentions, published %d", sum(got), sum(want))
	}
	for topic, n := range want {
		if got[topic] != n {
			t.Errorf("topic %s: table %d, published %d", topic, got[topic], n)
		}
	}
	if len(got) != len(want) {
		t.Errorf("table has %d topics, published %d", len(got), len(want))
	}
	// Each mention is in its topic's minute and hour buckets too (the
	// default --windows), once.
	buckets, bucketItems := e.dyn.Buckets(t, e.cfg.Table)
	for _, g := range []schema.Granularity{schema.Minute, schema.Hour} {
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
		if len(per) != len(want) {
			t.Errorf("%s buckets of %d topics, published %d", g, len(per), len(want))
		}
	}
	msgs := ones.Messages + sevens.Messages + dotted.Messages
	writes := testenv.Metric(t, e.sc.Registry(), "hotcount_store_writes_total")
	if writes != float64(items+bucketItems) || items != len(want) {
		t.Errorf("%v writes for %d topics (%d total items, %d bucket items): want one write per item", writes, len(want), items, bucketItems)
	}
	t.Logf("%d messages, %d mentions, %d topics -> %v UpdateItem calls (%d to buckets)", msgs, sum(want), len(want), writes, bucketItems)
}

// TestOutageLosesNothing stops dynalite while mentions keep arriving: the
// sidecar stays up, readiness fails, health fails once the last good flush
// is older than --health-flush-age, deltas keep merging, and after dynalite
// comes back every mention is in the table.
func TestOutageLosesNothing(t *testing.T) {
	e := newEnv(t, func(c *config.Config) {
		c.HealthFlushAge = 500 * time.Millisecond
	})
	first := publish(t, e.nats, loadgen.Config{Prefix: "mentions.", Topics: 100, Messages: 5_000, Count: 1, Seed: 4})
	testenv.Eventually(t, 10*time.Second, func() error {
		if f := testenv.Metric(t, e.sc.Registry(), "hotcount_flusher_flushed_mentions_total"); f != float64(first.Mentions) {
			return fmt.Errorf("%v of %d mentions flushed", f, first.Mentions)
		}
		return nil
	})

	e.dyn.Stop()
	second := publish(t, e.nats, loadgen.Config{Prefix: "mentions.", Topics: 100, Messages: 5_000, Count: 3, Seed: 5})
	testenv.Eventually(t, 10*time.Second, func() error {
		if err := e.probe("/readyz"); err != nil {
			return fmt.Errorf("not ready while the store is down: the lookup API can still answer: %v", err)
		}
		if testenv.MetricWith(t, e.sc.Registry(), "hotcount_dependency_up", "dependency", "store") != 0 {
			return errors.New("the store reads as up while it is down")
		}
		if e.probe("/healthz") == nil {
			return errors.New("healthy while no flush succeeds")
		}
		if testenv.Metric(t, e.sc.Registry(), "hotcount_flusher_requeued_mentions_total") == 0 {
			return errors.New("no failed write has put its delta back yet")
		}
		return nil
	})

	e.dyn.Restart()
	testenv.Eventually(t, 20*time.Second, func() error {
		if err := e.probe("/healthz"); err != nil {
			return err
		}
		if testenv.MetricWith(t, e.sc.Registry(), "hotcount_dependency_up", "dependency", "store") != 1 {
			return errors.New("the store reads as down after it came back")
		}
		return e.probe("/readyz")
	})
	if err := e.stop(); err != nil {
		t.Fatalf("shutdown: %v", err)
	}
	got, _ := tableCounts(t, e.dyn, e.cfg.Table)
	for topic := range got {
		if want := first.PerTopic[topic] + second.PerTopic[topic]; got[topic] != want {
			t.Errorf("topic %s: table %d, published %d", topic, got[topic], want)
		}
	}
	if total := sum(got); total != first.Mentions+second.Mentions {
		t.Errorf("table holds %d mentions, published %d", total, first.Mentions+second.Mentions)
	}
}

// consumerIdle waits until e's sidecars have written every mention
// the stream stores: the checkpoint at the stream's end.
func consumerIdle(t *testing.T, e *env) {
	t.Helper()
	testenv.Checkpointed(t, e.nats, []string{e.cfg.Stream}, 30*time.Second)
}

// TestJetStreamConservation: in JetStream mode every published mention is
// in the table after a SIGTERM, and every message is acknowledged.
func TestJetStreamConservation(t *testing.T) {
	e := newEnv(t, func(c *config.Config) {
		c.NATSMode = config.ModeJetStream
		c.FlushInterval = 200 * time.Millisecond
	})
	ones := publish(t, e.nats, loadgen.Config{Prefix: "mentions.", Topics: 200, Zipf: 1.3, Messages: 20_000, Count: 1, Seed: 6, JetStream: true})
	fives := publish(t, e.nats, loadgen.Config{Prefix: "mentions.", Topics: 20, Messages: 1_000, Count: 5, Seed: 7, JetStream: true})
	consumerIdle(t, e)
	if err := e.stop(); err != nil {
		t.Fatalf("shutdown: %v", err)
	}
	got, _ := tableCounts(t, e.dyn, e.cfg.Table)
	want := ones.Mentions + fives.Mentions
	if sum(got) != want {
		t.Errorf("table holds %d mentions, published %d", sum(got), want)
	}
	for topic, n := range ones.PerTopic {
		if got[topic] != n+fives.PerTopic[topic] {
			t.Errorf("topic %s: table %d, published %d", topic, got[topic], n+fives.PerTopic[topic])
		}
	}
}

// TestJetStreamSurvivesNATSRestart restarts the NATS server (same port,
// same store) while the first burst's messages are held unacknowledged in
// the window, then publishes a second burst: every mention is counted
// exactly once (the held messages are written and acknowledged after the
// reconnection, under the keep-alive, not redelivered).
func TestJetStreamSurvivesNATSRestart(t *testing.T) {
	e := newEnv(t, func(c *config.Config) {
		c.NATSMode = config.ModeJetStream
		c.FlushInterval = 3 * time.Second
	})
	first := publish(t, e.nats, loadgen.Config{Prefix: "mentions.", Topics: 50, Messages: 10_000, Count: 1, Seed: 8, JetStream: true})
	testenv.Eventually(t, 10*time.Second, func() error {
		if h := testenv.Metric(t, e.sc.Registry(), "hotcount_ingest_events_total"); h == 0 {
			return errors.New("no message read yet")
		}
		return nil
	})
	if w := testenv.Metric(t, e.sc.Registry(), "hotcount_store_writes_total"); w != 0 {
		t.Fatalf("%v writes before the restart; the test needs messages held", w)
	}
	e.ns = testenv.RestartNATS(t, e.ns)
	testenv.Subscribed(t, e.sc.AdminAddr(), 20*time.Second)
	second := publish(t, e.nats, loadgen.Config{Prefix: "mentions.", Topics: 50, Messages: 10_000, Count: 1, Seed: 9, JetStream: true})
	consumerIdle(t, e)
	if err := e.stop(); err != nil {
		t.Fatalf("shutdown: %v", err)
	}
	got, _ := tableCounts(t, e.dyn, e.cfg.Table)
	published := first.Mentions + second.Mentions
	for topic := range first.PerTopic {
		if want := first.PerTopic[topic] + second.PerTopic[topic]; got[topic] != want {
			t.Errorf("topic %s: table %d, published %d", topic, got[topic], want)
		}
	}
	t.Logf("NATS restart: published %d, table %d", published, sum(got))
	if sum(got) != published {
		t.Errorf("table holds %d mentions, published %d", sum(got), published)
	}
}

// TestHostileInput sends, in JetStream mode, valid mentions interleaved with
// every kind of bad message: the valid counts are exact, each bad message is
// counted by reason and dead-lettered once with its reason, and the sidecar
// stays ready.
func TestHostileInput(t *testing.T) {
	e := newEnv(t, func(c *config.Config) {
		c.NATSMode = config.ModeJetStream
		c.MaxCount = 1000
		c.MaxTopicBytes = 64
	})
	nc := testenv.Connect(t, e.nats)
	dlq, err := nc.SubscribeSync(e.cfg.DeadLetterSubject)
	if err != nil {
		t.Fatal(err)
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(nc.Flush())
	js, err := jetstream.New(nc)
	must(err)
	bad := []struct{ subject, payload, reason string }{
		{"mentions.x", `{"count": 1001}`, mention.ReasonCount},
		{"mentions.x", `{"count": 9223372036854775807}`, mention.ReasonCount},
		{"mentions.x", `{"count": 99999999999999999999999}`, mention.ReasonCount},
		{"mentions.x", `{"count": -5}`, mention.ReasonCount},
		{"mentions.x", `{"count": 0}`, mention.ReasonCount},
		{"mentions.x", `{"count": 2.5}`, mention.ReasonCount},
		{"mentions.x", `{"count": "7"}`, mention.ReasonCount},
		{"mentions.x", `{"count": [1]}`, mention.ReasonCount},
		{"mentions.x", `{"count": null}`, mention.ReasonPayload},
		{"mentions.x", `{"cnt": 1}`, mention.ReasonPayload},
		{"mentions.x", `{"count": 1`, mention.ReasonPayload},
		{"mentions.x", "\xff\xfe", mention.ReasonPayload},
		{"mentions.x", `{"count": 1, "pad": "` + strings.Repeat("p", 5000) + `"}`, mention.ReasonPayload},
		{"mentions." + strings.Repeat("t", 65), ``, mention.ReasonTopic},
		{"mentions.bad\xffutf8", ``, mention.ReasonTopic},
		{"mentions.ctl\x7fchar", ``, mention.ReasonTopic},
	}
	ctx := context.Background()
	var valid int64
	for round := range 20 {
		for _, b := range bad {
			_, err := js.Publish(ctx, b.subject, []byte(b.payload))
			must(err)
			_, err = js.Publish(ctx, "mentions.x", []byte(fmt.Sprintf(`{"count": %d}`, round+1)))
			must(err)
			valid += int64(round + 1)
		}
		_, err := js.Publish(ctx, "mentions.x", nil)
		must(err)
		valid++
	}
	consumerIdle(t, e)
	must(e.probe("/readyz"))

	reasons := map[string]int{}
	for range 20 * len(bad) {
		msg, err := dlq.NextMsg(5 * time.Second)
		must(err)
		reasons[msg.Header.Get(ingest.ErrorHeader)]++
	}
	if extra, err := dlq.NextMsg(300 * time.Millisecond); err == nil {
		t.Errorf("a bad message was dead-lettered twice: %s %q", extra.Header.Get(ingest.SubjectHeader), extra.Data)
	}
	for _, r := range []string{mention.ReasonCount, mention.ReasonPayload, mention.ReasonTopic} {
		want := 0
		for _, b := range bad {
			if b.reason == r {
				want += 20
			}
		}
		if reasons[r] != want {
			t.Errorf("dead letters with reason %s: %d, want %d", r, reasons[r], want)
		}
		if n := testenv.MetricWith(t, e.sc.Registry(), "hotcount_ingest_invalid_total", "reason", r); n != float64(want) {
			t.Errorf("invalid{reason=%s} = %v, want %d", r, n, want)
		}
	}
	must(e.stop())
	got, _ := tableCounts(t, e.dyn, e.cfg.Table)
	if got["x"] != valid || len(got) != 1 {
		t.Errorf("table: %v, want only x = %d", got, valid)
	}
}
