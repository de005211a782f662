package durable_test

import (
	"context"
	"fmt"
	"maps"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/hotcount/hotcount/durability/durable"
	"github.com/hotcount/hotcount/internal/testtools/ddbfault"
	"github.com/hotcount/hotcount/internal/testtools/testenv"
	"github.com/hotcount/hotcount/mention"
	"github.com/hotcount/hotcount/pipeline/ingest"
	"github.com/hotcount/hotcount/pipeline/store"
	"github.com/hotcount/hotcount/schema"
)

// env is one test's NATS (one stream, MENTIONS on mentions.>) and table.
type env struct {
	nc    *nats.Conn
	js    jetstream.JetStream
	db    *testenv.Dynalite
	table string
}

func setup(t *testing.T) *env {
	t.Helper()
	srv := testenv.NATS(t)
	nc := testenv.Connect(t, srv.ClientURL())
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	e := &env{nc: nc, js: js}
	e.createStream(t)
	e.db = testenv.StartDynalite(t)
	e.table = e.db.Table(t, "hotcount")
	return e
}

func (e *env) createStream(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := e.js.CreateStream(ctx, jetstream.StreamConfig{Name: "MENTIONS", Subjects: []string{"mentions.>"}}); err != nil {
		t.Fatal(err)
	}
}

// store is a store on the test's table, through endpoint (dynalite's, or
// a fault proxy's in front of it).
func (e *env) store(endpoint string) *store.DynamoDB {
	return store.NewDynamoDB(testenv.Client(endpoint), e.table, store.NewMetrics(prometheus.NewRegistry()))
}

// sidecar is one engine, run until the test ends.
type sidecar struct {
	*durable.Engine
	reg *prometheus.Registry
}

func (e *env) start(t *testing.T, st durable.Store) sidecar {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	s := e.run(t, ctx, st, nil)
	t.Cleanup(cancel) // before run's wait, which the test's end runs first
	return s
}

// run starts an engine on st, with the tests' settings as tune changes
// them, that stops when ctx ends; the test waits for it at its end.
func (e *env) run(t *testing.T, ctx context.Context, st durable.Store, tune func(*durable.Config)) sidecar {
	t.Helper()
	reg := prometheus.NewRegistry()
	cfg := durable.Config{
		Stream: "MENTIONS", Subject: "mentions.>",
		Interval: 100 * time.Millisecond, WriteTimeout: 2 * time.Second, Concurrency: 16,
		Limits: mention.Limits{MaxCount: 1000, MaxTopicBytes: 256},
	}
	if tune != nil {
		tune(&cfg)
	}
	eng, err := durable.New(cfg, e.nc, st, nil, zap.NewNop(), durable.NewMetrics(reg), ingest.NewMetrics(reg), time.Now)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { defer close(done); _ = eng.Run(ctx) }()
	t.Cleanup(func() { <-done })
	return sidecar{eng, reg}
}

// publish publishes n mentions of {"count":1} over topics topics and
// returns what each topic got.
func (e *env) publish(t *testing.T, n, topics int, want map[string]int64) {
	t.Helper()
	for i := range n {
		topic := fmt.Sprintf("topic-%d", i%topics)
		if _, err := e.js.PublishAsync("mentions."+topic, []byte(`{"count":1}`)); err != nil {
			t.Fatal(err)
		}
		want[topic]++
		if i%1000 == 999 { // at most a thousand unacknowledged: a loaded machine stalls nats.go's async publisher past its bound
			select {
			case <-e.js.PublishAsyncComplete():
			case <-time.After(30 * time.Second):
				t.Fatal("publishes not acknowledged")
			}
		}
	}
	select {
	case <-e.js.PublishAsyncComplete():
	case <-time.After(30 * time.Second):
		t.Fatal("publishes not acknowledged")
	}
}

// exact waits until the table holds exactly want, and fails if it ever
// holds more of a topic than was published.
func (e *env) exact(t *testing.T, want map[string]int64) {
	t.Helper()
	testenv.Eventually(t, 60*time.Second, func() error {
		got, _ := e.db.Counts(t, e.table)
		for topic, n := range got {
			if n > want[topic] {
				t.Fatalf("%s counted %d times, published %d", topic, n, want[topic])
			}
		}
		for topic, n := range want {
			if got[topic] != n {
				return fmt.Errorf("%s: %d of %d", topic, got[topic], n)
			}
		}
		return nil
	})
}

// gate is a store that a test can freeze: while closed, every write waits
// (a sidecar stopped by SIGSTOP, a long pause, a node cut off), then goes
// to the real store.
type gate struct {
	durable.Store
	mu   sync.Mutex
	open chan struct{}
}

func newGate(st durable.Store) *gate {
	g := &gate{Store: st, open: make(chan struct{})}
	close(g.open)
	return g
}

func (g *gate) freeze() { g.mu.Lock(); g.open = make(chan struct{}); g.mu.Unlock() }
func (g *gate) thaw()   { g.mu.Lock(); close(g.open); g.mu.Unlock() }

func (g *gate) Add(ctx context.Context, w store.Write, now time.Time) error {
	g.mu.Lock()
	open := g.open
	g.mu.Unlock()
	<-open
	return g.Store.Add(ctx, w, now)
}

// A sidecar frozen with a window read and unwritten, while another reads
// the same partition and writes it all, counts nothing twice when it
// wakes: its writes are refused by the positions the items record, or
// recounted from the stream where the other wrote half of a span.
func TestFrozenReaderCountsOnce(t *testing.T) {
	e := setup(t)
	want := map[string]int64{}
	g := newGate(e.store(e.db.Endpoint))
	a := e.start(t, g)
	e.publish(t, 4000, 40, want)
	e.exact(t, want)

	g.freeze()
	e.publish(t, 4000, 40, want) // a reads these, and cannot write them
	testenv.Eventually(t, 30*time.Second, func() error {
		if n := testenv.Metric(t, a.reg, "hotcount_ingest_events_total"); n != 8000 {
			return fmt.Errorf("a read %v of 8000", n)
		}
		return nil
	})
	b := e.start(t, e.store(e.db.Endpoint))
	e.publish(t, 4000, 40, want) // both read these
	e.exact(t, want)

	g.thaw()
	e.publish(t, 2000, 40, want)
	testenv.Eventually(t, 30*time.Second, func() error {
		if n := testenv.MetricWith(t, a.reg, "hotcount_durable_writes_total", "outcome", "covered"); n == 0 {
			return fmt.Errorf("a has had no write refused yet")
		}
		return nil
	})
	e.exact(t, want)
	for _, s := range []sidecar{a, b} {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		if err := s.Final(ctx); err != nil {
			t.Errorf("final flush: %v", err)
		}
		cancel()
	}
	e.exact(t, want)
}

// An item that holds the first part of a span (another reader wrote it)
// refuses the whole span; the rest is counted again from the stream.
func TestOverlapIsRecounted(t *testing.T) {
	e := setup(t)
	want := map[string]int64{}
	e.publish(t, 10, 1, want) // topic-0 at sequences 1..10
	info, err := e.js.Stream(context.Background(), "MENTIONS")
	if err != nil {
		t.Fatal(err)
	}
	epoch := info.CachedInfo().Created.UnixMicro()
	st := e.store(e.db.Endpoint)
	// Another reader wrote sequences 1..4.
	if err := st.Add(context.Background(), store.Write{Counter: schema.TotalOf("topic-0"), Delta: 4,
		Span: &store.Span{Stream: "MENTIONS", Epoch: epoch, First: 1, Last: 4}}, time.Now()); err != nil {
		t.Fatal(err)
	}
	s := e.start(t, st)
	e.exact(t, want)
	if n := testenv.Metric(t, s.reg, "hotcount_durable_recounts_total"); n != 1 {
		t.Errorf("recounts: %v, want 1", n)
	}
}

// A stream deleted and created again (an operator's mistake, a restore)
// starts afresh: its mentions count, from its first sequence.
func TestRecreatedStreamCountsAfresh(t *testing.T) {
	e := setup(t)
	want := map[string]int64{}
	e.start(t, e.store(e.db.Endpoint))
	e.publish(t, 2000, 20, want)
	e.exact(t, want)
	if err := e.js.DeleteStream(context.Background(), "MENTIONS"); err != nil {
		t.Fatal(err)
	}
	e.createStream(t)
	e.publish(t, 800, 20, want)
	e.exact(t, want)
}

// A stream deleted and created again while the window holds the old
// one's mentions unwritten (the store down): once the store is back, the
// old creation's writes and the new one's land in the same flushes, in
// any order, each against its own creation's positions: every mention
// read of either stream is counted, once. (With one position per stream
// name, an old write landing after a new one was refused as covered.)
func TestRecreatedStreamKeepsWhatWasRead(t *testing.T) {
	e := setup(t)
	proxy := ddbfault.New(ddbfault.Config{Upstream: e.db.Endpoint})
	srv := httptest.NewServer(proxy)
	t.Cleanup(srv.Close)
	s := e.start(t, e.store(srv.URL))
	want := map[string]int64{}
	proxy.SetOutage(time.Hour)
	e.publish(t, 1000, 20, want)
	testenv.Eventually(t, 30*time.Second, func() error {
		if n := testenv.Metric(t, s.reg, "hotcount_ingest_mentions_total"); n != 1000 {
			return fmt.Errorf("%v of 1000 read", n)
		}
		return nil
	})
	if err := e.js.DeleteStream(context.Background(), "MENTIONS"); err != nil {
		t.Fatal(err)
	}
	e.createStream(t)
	e.publish(t, 1000, 20, want) // the same topics: the same items
	testenv.Eventually(t, 30*time.Second, func() error {
		if n := testenv.Metric(t, s.reg, "hotcount_ingest_mentions_total"); n != 2000 {
			return fmt.Errorf("%v of 2000 read", n)
		}
		return nil
	})
	proxy.EndOutage()
	e.exact(t, want)
	if n := testenv.Metric(t, s.reg, "hotcount_durable_retention_lost_total"); n != 0 {
		t.Errorf("%v counted lost: every mention was read", n)
	}
}

// Answers lost after DynamoDB applied the write (a reset, a 500, a hang,
// a 200 cut short) are settled by the same condition when the write is
// sent again.
func TestLostAnswersCountOnce(t *testing.T) {
	e := setup(t)
	proxy := ddbfault.New(ddbfault.Config{Upstream: e.db.Endpoint})
	proxy.SetHang(3 * time.Second)
	proxy.LoseAnswers(0.2)
	srv := httptest.NewServer(proxy)
	t.Cleanup(srv.Close)
	s := e.start(t, e.store(srv.URL))
	want := map[string]int64{}
	e.publish(t, 6000, 30, want)
	e.exact(t, want)
	if proxy.Stats().Lost() == 0 {
		t.Fatal("no answer was lost: the test proves nothing")
	}
	if n := testenv.MetricWith(t, s.reg, "hotcount_durable_writes_total", "outcome", "in_doubt"); n == 0 {
		t.Error("no write was in doubt")
	}
}

// A stream that deletes messages once delivered (interest or work-queue
// retention) cannot be read again after a crash: the engine reads none of
// it and says why, rather than count what it could lose.
func TestRefusesAStreamThatForgets(t *testing.T) {
	srv := testenv.NATS(t)
	nc := testenv.Connect(t, srv.ClientURL())
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateStream(context.Background(), jetstream.StreamConfig{Name: "MENTIONS", Subjects: []string{"mentions.>"}, Retention: jetstream.WorkQueuePolicy}); err != nil {
		t.Fatal(err)
	}
	e := &env{nc: nc, js: js}
	want := map[string]int64{}
	e.publish(t, 10, 1, want)
	logs := &lines{}
	reg := prometheus.NewRegistry()
	eng, err := durable.New(durable.Config{Stream: "MENTIONS", Subject: "mentions.>", Interval: 100 * time.Millisecond, WriteTimeout: time.Second,
		Limits: mention.Limits{MaxCount: 10, MaxTopicBytes: 256}}, nc, nil, nil, zap.New(logs), durable.NewMetrics(reg), ingest.NewMetrics(reg), time.Now)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { _ = eng.Run(ctx) })
	defer func() { cancel(); wg.Wait() }()
	testenv.Eventually(t, 10*time.Second, func() error {
		if !logs.has("WorkQueue retention") {
			return fmt.Errorf("no line says why")
		}
		return nil
	})
	if n := testenv.Metric(t, reg, "hotcount_ingest_events_total"); n != 0 {
		t.Errorf("%v mentions read from a work-queue stream", n)
	}
}

// lines is a zap core keeping the messages and errors it is given.
type lines struct {
	zapcore.LevelEnabler
	mu  sync.Mutex
	all []string
}

func (l *lines) Enabled(zapcore.Level) bool        { return true }
func (l *lines) With([]zapcore.Field) zapcore.Core { return l }
func (l *lines) Sync() error                       { return nil }
func (l *lines) Check(e zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	return ce.AddCore(e, l)
}

func (l *lines) Write(e zapcore.Entry, fs []zapcore.Field) error {
	enc := zapcore.NewMapObjectEncoder()
	for _, f := range fs {
		f.AddTo(enc)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.all = append(l.all, fmt.Sprint(e.Message, enc.Fields))
	return nil
}

func (l *lines) has(s string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, line := range l.all {
		if strings.Contains(line, s) {
			return true
		}
	}
	return false
}

// While the store takes no writes, the age of the oldest mention not in
// it grows, beside the stream's max age (what an alert compares), and
// falls back to 0 once everything is written.
func TestRetentionGauges(t *testing.T) {
	e := setup(t)
	if _, err := e.js.UpdateStream(context.Background(), jetstream.StreamConfig{Name: "MENTIONS", Subjects: []string{"mentions.>"}, MaxAge: time.Hour}); err != nil {
		t.Fatal(err)
	}
	proxy := ddbfault.New(ddbfault.Config{Upstream: e.db.Endpoint})
	srv := httptest.NewServer(proxy)
	t.Cleanup(srv.Close)
	proxy.SetWriteFailure(true)
	s := e.start(t, e.store(srv.URL))
	want := map[string]int64{}
	e.publish(t, 100, 5, want)
	testenv.Eventually(t, 20*time.Second, func() error {
		if age := testenv.Metric(t, s.reg, "hotcount_durable_oldest_unwritten_seconds"); age < 0.5 {
			return fmt.Errorf("oldest unwritten %vs", age)
		}
		return nil
	})
	if d := testenv.Metric(t, s.reg, "hotcount_durable_stream_max_age_seconds"); d != 3600 {
		t.Errorf("stream max age %vs, want 3600", d)
	}
	proxy.SetWriteFailure(false)
	e.exact(t, want)
	testenv.Eventually(t, 20*time.Second, func() error {
		if age := testenv.Metric(t, s.reg, "hotcount_durable_oldest_unwritten_seconds"); age != 0 {
			return fmt.Errorf("oldest unwritten %vs with everything written", age)
		}
		return nil
	})
}

// A NATS server restarted under a reading engine (its memory consumer
// gone with it) costs a few seconds of reading, and nothing else: the
// reader notices within its pull's heartbeats and reads on from its
// window.
func TestNATSRestart(t *testing.T) {
	srv := testenv.NATS(t)
	nc, err := nats.Connect(srv.ClientURL(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	e := &env{nc: nc, js: js}
	e.createStream(t)
	e.db = testenv.StartDynalite(t)
	e.table = e.db.Table(t, "hotcount")
	e.start(t, e.store(e.db.Endpoint))
	want := map[string]int64{}
	e.publish(t, 1000, 10, want)
	e.exact(t, want)
	testenv.RestartNATS(t, srv)
	testenv.Eventually(t, 10*time.Second, func() error {
		if !nc.IsConnected() {
			return fmt.Errorf("not connected again")
		}
		return nil
	})
	e.publish(t, 1000, 10, want)
	start := time.Now()
	e.exact(t, want)
	t.Logf("counted again %v after the restart's first publishes", time.Since(start).Round(100*time.Millisecond))
	if d := time.Since(start); d > 20*time.Second { // 30.6 s with the default pull expiry; 5.4 s measured
		t.Errorf("reading came back after %v", d)
	}
}

// TestJetStreamModeReadsItsSubjectOnly: in jetstream mode the stream may
// be a user's own, taking more than --subject (here also events.> and the
// dead-letter subject): only --subject is read. Found by an outside
// review: the reader took the whole stream, dead-lettered every other
// message, and read its own dead letters back, tens of thousands a
// second. Every mention counts once, nothing is dead-lettered.
func TestJetStreamModeReadsItsSubjectOnly(t *testing.T) {
	e := setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := e.js.CreateStream(ctx, jetstream.StreamConfig{Name: "MIXED", Subjects: []string{"mine.>", "events.>", "dead.>"}}); err != nil {
		t.Fatal(err)
	}
	var dead atomic.Int64
	sub, err := e.nc.Subscribe("dead.letters", func(*nats.Msg) { dead.Add(1) })
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe() //nolint:errcheck // test teardown
	rctx, stop := context.WithCancel(context.Background())
	a := e.run(t, rctx, e.store(e.db.Endpoint), func(c *durable.Config) {
		c.Stream, c.Subject, c.DeadLetter = "MIXED", "mine.>", "dead.letters"
	})
	t.Cleanup(stop) // after run's: cleanups run last first
	want := map[string]int64{}
	for i := range 300 {
		subject := fmt.Sprintf("mine.topic-%d", i%3)
		if i%3 == 0 {
			subject = "events.login" // between every mention, other subjects
		} else {
			want[subject[len("mine."):]]++
		}
		if _, err := e.js.Publish(ctx, subject, []byte(`{"count":1}`)); err != nil {
			t.Fatal(err)
		}
	}
	e.exact(t, want)
	if n := dead.Load(); n != 0 {
		t.Errorf("%d messages dead-lettered: the reader took subjects outside --subject", n)
	}
	if n := testenv.Metric(t, a.reg, "hotcount_durable_retention_lost_total"); n != 0 {
		t.Errorf("hotcount_durable_retention_lost_total %v: the other subjects' sequences read as dropped mentions", n)
	}
}

// TestDeadLetterSaysWhereItWasStored: a message the rules reject goes to
// the dead letters with its stream, creation and sequence, by which a
// consumer of them tells apart the repeats that a re-read sends.
func TestDeadLetterSaysWhereItWasStored(t *testing.T) {
	e := setup(t)
	dlq, err := e.nc.SubscribeSync("hotcount.dlq")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	e.run(t, ctx, e.store(e.db.Endpoint), func(c *durable.Config) { c.DeadLetter = "hotcount.dlq" })
	want := map[string]int64{}
	e.publish(t, 3, 1, want) // sequences 1..3
	ack, err := e.js.Publish(ctx, "mentions.bad", []byte(`{"count":0}`))
	if err != nil {
		t.Fatal(err)
	}
	msg, err := dlq.NextMsg(30 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	st, err := e.js.Stream(ctx, "MENTIONS")
	if err != nil {
		t.Fatal(err)
	}
	for h, v := range map[string]string{
		ingest.StreamHeader:   "MENTIONS",
		ingest.EpochHeader:    fmt.Sprint(store.EpochOf(st.CachedInfo().Created)),
		ingest.SequenceHeader: fmt.Sprint(ack.Sequence),
		ingest.ErrorHeader:    "count",
	} {
		if got := msg.Header.Get(h); got != v {
			t.Errorf("dead letter's %s = %q, want %q", h, got, v)
		}
	}
	e.exact(t, want)
}

// TestRegionLayoutChangesAtItsSequence is a table made global, Region by
// Region: `hotcount stream rules set --region` under a sidecar of the
// single-Region layout, which stops at the change having written what it
// read before it, and a sidecar of the Region layout that reads on from
// there (it refuses nothing, and waits for nobody). The mentions before
// the change are in the single-Region items, the ones after in the
// Region's, each once.
func TestRegionLayoutChangesAtItsSequence(t *testing.T) {
	e := setup(t)
	want := map[string]int64{}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	single := e.store(e.db.Endpoint)
	done := make(chan error, 1)
	reg := prometheus.NewRegistry()
	cfg := durable.Config{Stream: "MENTIONS", Subject: "mentions.>", Interval: 100 * time.Millisecond, WriteTimeout: 2 * time.Second,
		Concurrency: 16, Limits: mention.Limits{MaxCount: 1000, MaxTopicBytes: 256}, Table: e.table}
	old, err := durable.New(cfg, e.nc, single, nil, zap.NewNop(), durable.NewMetrics(reg), ingest.NewMetrics(reg), time.Now)
	if err != nil {
		t.Fatal(err)
	}
	go func() { done <- old.Run(ctx) }()
	e.publish(t, 500, 5, want)
	e.exact(t, want)

	book, err := durable.OpenRules(ctx, e.js, "", "MENTIONS")
	if err != nil {
		t.Fatal(err)
	}
	cur, ok, err := book.Latest(ctx, "MENTIONS")
	if err != nil || !ok {
		t.Fatalf("no rules recorded by the first sidecar: %v", err)
	}
	next := cur.Rules
	next.Region = "us-east-1"
	change, err := book.Set(ctx, "MENTIONS", next, "the table is global", cur)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "--region") {
			t.Fatalf("the single-Region sidecar ended with %v, want a refusal naming --region", err)
		}
	case <-time.After(30 * time.Second): // a deadline against a hang
		t.Fatal("the single-Region sidecar still runs after the change")
	}
	if err := old.Final(ctx); err != nil {
		t.Fatal(err)
	}
	after := map[string]int64{}
	e.publish(t, 500, 5, after)
	regional := e.store(e.db.Endpoint)
	regional.Regions = schema.Regions{Own: "us-east-1", All: []string{"us-east-1"}}
	e.run(t, ctx, regional, func(c *durable.Config) { c.Table, c.Region = e.table, "us-east-1" })
	before := maps.Clone(want)
	for topic, n := range after {
		want[topic] += n
	}
	e.exact(t, want)
	layouts := map[string]map[string]int64{"": {}, "us-east-1": {}}
	e.db.EachItem(t, e.table, func(pk string, count int64) {
		base, region := schema.SplitRegion(pk)
		if topic, _, err := schema.ParseShardKey(base); err == nil {
			layouts[region][topic] += count
		}
	})
	if !maps.Equal(layouts[""], before) || !maps.Equal(layouts["us-east-1"], after) {
		t.Fatalf("the single-Region items hold %v and the Region's %v; want %v (before the change at %d) and %v (after)",
			layouts[""], layouts["us-east-1"], before, change.Seq, after)
	}
}
