package journal_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap/zaptest"

	"github.com/hotcount/hotcount/durability/journal"
	"github.com/hotcount/hotcount/durability/quarantine"
	"github.com/hotcount/hotcount/internal/testtools/testenv"
	"github.com/hotcount/hotcount/pipeline/store"
)

// mentions is what a journal test works with: a NATS server holding the
// MENTIONS stream, an embedded store, and the journal's configuration on
// both.
type mentions struct {
	nc  *nats.Conn
	js  jetstream.JetStream
	st  *store.Bolt
	cfg journal.Config
}

// mentionStream starts a NATS server with the MENTIONS stream and opens an
// embedded store, both closed when t ends. The stream has no consumer
// until durable creates one.
func mentionStream(t *testing.T) *mentions {
	t.Helper()
	ns := testenv.NATS(t)
	nc := testenv.Connect(t, ns.ClientURL())
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateStream(context.Background(), jetstream.StreamConfig{Name: "MENTIONS", Subjects: []string{"mentions.>"}}); err != nil {
		t.Fatal(err)
	}
	st, err := store.OpenBolt(t.TempDir(), store.NewMetrics(prometheus.NewRegistry()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return &mentions{
		nc: nc, js: js, st: st,
		cfg: journal.Config{Bucket: journal.DefaultBucket, WritersBucket: journal.DefaultWritersBucket, Stream: "MENTIONS", Consumer: "hotcount"},
	}
}

// durable creates the consumer the journal's configuration names, with
// explicit acknowledgements, as the ingest binds it.
func (m *mentions) durable(t *testing.T) jetstream.Consumer {
	t.Helper()
	c, err := m.js.CreateOrUpdateConsumer(context.Background(), "MENTIONS", jetstream.ConsumerConfig{Durable: "hotcount", AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// open opens writer's journal on m's stream and store.
func (m *mentions) open(t *testing.T, writer string) *journal.Journal {
	t.Helper()
	j, err := journal.Open(context.Background(), m.nc, m.cfg, writer, m.st, zaptest.NewLogger(t), journal.NewMetrics(prometheus.NewRegistry()))
	if err != nil {
		t.Fatal(err)
	}
	// What Covered reads, as the sidecar keeps it (stopped with the test).
	ctx, stop := context.WithCancel(context.Background())
	watched := make(chan struct{})
	go func() { defer close(watched); j.Watch(ctx) }()
	t.Cleanup(func() { stop(); <-watched })
	return j
}

// entries is the journal's bucket of entries.
func (m *mentions) entries(t *testing.T) jetstream.KeyValue {
	t.Helper()
	kv, err := m.js.KeyValue(context.Background(), journal.DefaultBucket)
	if err != nil {
		t.Fatal(err)
	}
	return kv
}

// TestReplayAppliesOnce: writer A journals three writes, applies one of
// them, and dies (its heartbeat gone). Writer B replays A's entry under A's
// identity: the store ends with each delta once, the entry is done, and the
// messages it carried read as covered while others do not.
func TestReplayAppliesOnce(t *testing.T) {
	ctx := context.Background()
	env := mentionStream(t)
	env.durable(t)
	st := env.st

	a := env.open(t, "writera")
	seq := store.NewSequencer(time.Now)
	writes := []store.Write{
		{Counter: store.TotalOf("golang"), Shard: 0, Delta: 5, Writer: "writera", Seq: seq.Next()},
		{Counter: store.TotalOf("rust"), Shard: 1, Delta: 2, Writer: "writera", Seq: seq.Next()},
		{Counter: store.TotalOf("zig"), Shard: 0, Delta: 9, Writer: "writera", Seq: seq.Next()},
	}
	recs, err := a.Record(ctx, writes, map[string][]int64{"golang": {10, 11, 12}, "rust": {14}, "zig": {13}})
	if err != nil || len(recs) != 1 || len(recs[0].Counters) != 3 {
		t.Fatalf("Record = %v, %v", recs, err)
	}
	// A applied golang's write, then died before the others.
	if err := st.Add(ctx, writes[0], time.Now()); err != nil {
		t.Fatal(err)
	}
	if err := a.Leave(ctx); err != nil {
		t.Fatal(err)
	}

	b := env.open(t, "writerb")
	for _, tc := range []struct {
		seq     int64
		covered bool
	}{{10, true}, {12, true}, {13, true}, {14, true}, {9, false}, {15, false}} {
		got, err := b.Covered(ctx, tc.seq)
		if err != nil || got != tc.covered {
			t.Errorf("Covered(%d) = %v, %v; want %v", tc.seq, got, err, tc.covered)
		}
	}
	if err := b.Replay(ctx); err != nil {
		t.Fatal(err)
	}
	for _, w := range writes {
		got, err := st.Gather(ctx, w.Counter.Topic, 2, true)
		if err != nil {
			t.Fatal(err)
		}
		if sum, _ := store.Sum(got); sum != w.Delta {
			t.Errorf("%s: store holds %d, want %d once", w.Counter.Topic, sum, w.Delta)
		}
	}
	e, err := env.entries(t).Get(ctx, recs[0].Key)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(e.Value()), `"done":true`) {
		t.Errorf("entry after replay = %s, want done", e.Value())
	}
	// A second replay (another sidecar racing) changes nothing.
	if err := b.Replay(ctx); err != nil {
		t.Fatal(err)
	}
	got, _ := st.Gather(ctx, "zig", 1, true)
	if got[0].Count != 9 {
		t.Errorf("zig after a second replay = %d, want 9", got[0].Count)
	}
}

// TestReplaysAnEarlierEntry: an entry as the previous version wrote it
// (each write's counter by name: a total's is its topic, a bucket's the
// mark, its kind, five index digits and the topic), left by a dead writer,
// is replayed after an upgrade to the same items; and an entry recorded
// now holds the same bytes.
func TestReplaysAnEarlierEntry(t *testing.T) {
	ctx := context.Background()
	env := mentionStream(t)
	st := env.st
	j := env.open(t, "writerb")
	// 2026-12-03 12:00 UTC: minute 29938320 ("1oDAG"), hour 498972 ("01vqS").
	const m, h = 29938320, 498972
	old := `{"writer":"writerz","writes":[` +
		`{"t":"golang","s":1,"d":4,"q":100},` +
		`{"t":"\u0001m1oDAGgolang","s":0,"d":4,"q":101},` +
		`{"t":"\u0001h01vqSgolang","s":1,"d":4,"q":102}],"seqs":[[7,7]]}`
	kv := env.entries(t)
	if _, err := kv.Create(ctx, "writerz.1", []byte(old)); err != nil {
		t.Fatal(err)
	}
	if err := j.Replay(ctx); err != nil {
		t.Fatal(err)
	}
	total, err := st.Gather(ctx, "golang", 2, true)
	if err != nil {
		t.Fatal(err)
	}
	minute, hour := store.BucketKey("golang", store.Minute, m, 0), store.BucketKey("golang", store.Hour, h, 1)
	buckets, err := st.Counts(ctx, []string{minute, hour}, true)
	if err != nil {
		t.Fatal(err)
	}
	if sum, _ := store.Sum(total); sum != 4 || total[1].Count != 4 || buckets[minute] != 4 || buckets[hour] != 4 {
		t.Errorf("replayed: total %v, minute %d, hour %d; want 4 on shard 1, 4, 4", total, buckets[minute], buckets[hour])
	}

	recs, err := j.Record(ctx, []store.Write{
		{Counter: store.TotalOf("golang"), Shard: 1, Delta: 4, Seq: 100},
		{Counter: store.BucketOf("golang", store.Minute, m), Shard: 0, Delta: 4, Seq: 101},
		{Counter: store.BucketOf("golang", store.Hour, h), Shard: 1, Delta: 4, Seq: 102},
	}, map[string][]int64{"golang": {7}})
	if err != nil {
		t.Fatal(err)
	}
	e, err := kv.Get(ctx, recs[0].Key)
	if err != nil {
		t.Fatal(err)
	}
	if want := strings.Replace(old, "writerz", "writerb", 1); string(e.Value()) != want {
		t.Errorf("entry recorded now:\n%s\nwant, as the previous version's:\n%s", e.Value(), want)
	}
}

// TestSettledWaitsForTheAckFloor: an entry whose writes are in the store is
// not retired while any of its messages is unacknowledged at the consumer
// (an acknowledgement a failing server lost brings the message back, and
// the entry must still be there to recognise it); once the consumer has
// them all, it is.
func TestSettledWaitsForTheAckFloor(t *testing.T) {
	ctx := context.Background()
	env := mentionStream(t)
	cons := env.durable(t)
	for range 3 {
		if _, err := env.js.Publish(ctx, "mentions.golang", nil); err != nil {
			t.Fatal(err)
		}
	}
	batch, err := cons.Fetch(3)
	if err != nil {
		t.Fatal(err)
	}
	var msgs []jetstream.Msg
	for m := range batch.Messages() {
		msgs = append(msgs, m)
	}
	if len(msgs) != 3 {
		t.Fatalf("fetched %d messages", len(msgs))
	}
	j := env.open(t, "writera")
	w := store.Write{Counter: store.TotalOf("golang"), Delta: 3, Writer: "writera", Seq: store.NewSequencer(time.Now).Next()}
	recs, err := j.Record(ctx, []store.Write{w}, map[string][]int64{"golang": {1, 2, 3}})
	if err != nil {
		t.Fatal(err)
	}
	key := recs[0].Key

	// Two of three acknowledged: the third may come back.
	for _, m := range msgs[:2] {
		if err := m.DoubleAck(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if err := j.Settled(ctx, key); !errors.Is(err, journal.ErrNotAcknowledged) {
		t.Fatalf("Settled with a message unacknowledged = %v, want ErrNotAcknowledged", err)
	}
	if covered, err := j.Covered(ctx, 3); err != nil || !covered {
		t.Errorf("Covered(3) = %v, %v while its entry waits: a redelivery would count twice", covered, err)
	}

	if err := msgs[2].DoubleAck(ctx); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, func() error { return j.Settled(ctx, key) })
	if _, err := env.entries(t).Get(ctx, key); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Errorf("entry after every acknowledgement: %v, want retired", err)
	}
}

// TestRetiringWaitsForASecondReading: an entry is retired only when two
// readings of the ack floors, floorConfirm apart, both pass it; a reading
// in between that does not (a consumer leader lost with acknowledgements
// it had not replicated: its successor's floor is lower) starts over.
func TestRetiringWaitsForASecondReading(t *testing.T) {
	confirmed := journal.NewConfirmer()
	t0 := time.Unix(1000, 0)
	steps := []struct {
		past bool
		at   time.Duration
		want bool
	}{
		{true, 0, false},                             // first sighting
		{true, journal.FloorConfirm / 2, false},      // too soon
		{false, journal.FloorConfirm * 3 / 4, false}, // the floor went back
		{true, journal.FloorConfirm, false},          // first sighting again
		{true, journal.FloorConfirm * 2, true},       // confirmed
	}
	for i, s := range steps {
		if got := confirmed("w.1", s.past, t0.Add(s.at)); got != s.want {
			t.Errorf("step %d (past %v at %v): confirmed %v, want %v", i, s.past, s.at, got, s.want)
		}
	}
}

// TestReplayLeavesAQuarantinedWrite: a dead writer's entry whose write
// the quarantine holds (marked by Quarantine) is replayed without it:
// the other writes land once, that one not at all, and Release is told
// of it before the entry is done; a replay whose Release fails leaves the
// entry for the next round. Holds reads the mark; Quarantine refuses an
// entry already replayed.
func TestReplayLeavesAQuarantinedWrite(t *testing.T) {
	ctx := context.Background()
	env := mentionStream(t)
	env.durable(t)
	a := env.open(t, "writera")
	seq := store.NewSequencer(time.Now)
	writes := []store.Write{
		{Counter: store.TotalOf("poison"), Shard: 0, Delta: 5, Writer: "writera", Seq: seq.Next()},
		{Counter: store.TotalOf("golang"), Shard: 0, Delta: 2, Writer: "writera", Seq: seq.Next()},
	}
	recs, err := a.Record(ctx, writes, map[string][]int64{"poison": {1}, "golang": {2}})
	if err != nil || len(recs) != 1 {
		t.Fatalf("Record = %v, %v", recs, err)
	}
	key := recs[0].Key
	if err := a.Quarantine(ctx, key, store.TotalOf("poison")); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name          string
		found, marked bool
	}{{store.TotalOf("poison").Name(), true, true}, {store.TotalOf("golang").Name(), true, false}, {"other", false, false}} {
		found, marked, err := journal.Holds(ctx, env.entries(t), key, tc.name)
		if err != nil || found != tc.found || marked != tc.marked {
			t.Errorf("Holds(%s) = %v, %v, %v; want %v, %v", tc.name, found, marked, err, tc.found, tc.marked)
		}
	}
	if err := a.Leave(ctx); err != nil {
		t.Fatal(err)
	}

	type released struct {
		writer string
		seq    int64
	}
	var got []released
	fail := true
	env.cfg.Release = func(_ context.Context, writer string, seq int64) error {
		if fail {
			return errors.New("injected: quarantine unreachable")
		}
		got = append(got, released{writer, seq})
		return nil
	}
	b := env.open(t, "writerb")
	if err := b.Replay(ctx); err == nil {
		t.Fatal("Replay with a failing Release = nil, want its error")
	}
	if e, _ := env.entries(t).Get(ctx, key); strings.Contains(string(e.Value()), `"done":true`) {
		t.Fatal("entry done though its quarantined write was not released")
	}
	fail = false
	if err := b.Replay(ctx); err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0] != (released{"writera", writes[0].Seq}) {
		t.Fatalf("released %v, want poison's write", got)
	}
	total := func(topic string) int64 {
		g, err := env.st.Gather(ctx, topic, 1, true)
		if err != nil {
			t.Fatal(err)
		}
		n, _ := store.Sum(g)
		return n
	}
	if p, g := total("poison"), total("golang"); p != 0 || g != 2 {
		t.Fatalf("after the replay poison=%d golang=%d; want 0 (the quarantine's) and 2", p, g)
	}
	if err := a.Quarantine(ctx, key, store.TotalOf("golang")); !errors.Is(err, journal.ErrReplayed) {
		t.Fatalf("Quarantine of a replayed entry = %v, want ErrReplayed", err)
	}
}

// denying is the embedded store refusing for good every write of one
// topic, as DynamoDB answers a replay it refuses: in doubt (an earlier
// attempt may have landed), and refused for good.
type denying struct {
	*store.Bolt
	topic string
}

func (d *denying) Add(ctx context.Context, w store.Write, now time.Time) error {
	if w.Counter.Topic == d.topic {
		return fmt.Errorf("%w: %w", store.ErrAmbiguous, fmt.Errorf("injected: AccessDeniedException: %w", store.ErrDenied))
	}
	return d.Bolt.Add(ctx, w, now)
}

// TestReplayQuarantinesAWriteRefusedForGood: a dead writer's entry one of
// whose writes the store refuses for good is replayed without it: the
// others land, and once the refusals have lasted QuarantineAfter the
// write goes to the quarantine under the dead writer's identity, marked
// in the entry and released, and the entry is finished by the next pass.
func TestReplayQuarantinesAWriteRefusedForGood(t *testing.T) {
	ctx := context.Background()
	env := mentionStream(t)
	env.durable(t)
	a := env.open(t, "writera")
	seq := store.NewSequencer(time.Now)
	writes := []store.Write{
		{Counter: store.TotalOf("poison"), Delta: 5, Writer: "writera", Seq: seq.Next()},
		{Counter: store.TotalOf("golang"), Delta: 2, Writer: "writera", Seq: seq.Next()},
	}
	recs, err := a.Record(ctx, writes, map[string][]int64{"poison": {1}, "golang": {2}})
	if err != nil || len(recs) != 1 {
		t.Fatalf("Record = %v, %v", recs, err)
	}
	if err := a.Leave(ctx); err != nil {
		t.Fatal(err)
	}
	q, err := quarantine.OpenDir(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	env.cfg.Hold = q.Put
	env.cfg.Release = func(ctx context.Context, writer string, seq int64) error {
		return quarantine.Release(ctx, q, quarantine.Entry{Writer: writer, Seq: seq}.Key())
	}
	env.cfg.QuarantineAfter = time.Nanosecond // the test's bound: the second pass is past it
	st := &denying{Bolt: env.st, topic: "poison"}
	b, err := journal.Open(ctx, env.nc, env.cfg, "writerb", st, zaptest.NewLogger(t), journal.NewMetrics(prometheus.NewRegistry()))
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Replay(ctx); err == nil {
		t.Fatal("first pass = nil: the refused write's run has only begun")
	}
	if err := b.Replay(ctx); err != nil {
		t.Fatalf("second pass (quarantines): %v", err)
	}
	if err := b.Replay(ctx); err != nil {
		t.Fatalf("third pass (finishes the entry): %v", err)
	}
	e, err := env.entries(t).Get(ctx, recs[0].Key)
	if err != nil || !strings.Contains(string(e.Value()), `"done":true`) {
		t.Fatalf("entry = %s, %v; want done", e.Value(), err)
	}
	es, err := q.List(ctx)
	if err != nil || len(es) != 1 || es[0].Topic != "poison" || es[0].Delta != 5 || !es[0].Released ||
		es[0].Replay == nil || es[0].Replay.Writer != "writera" || es[0].Replay.Seq != writes[0].Seq {
		t.Fatalf("quarantine = %+v, %v; want poison's 5, released, to be sent under writera's identity", es, err)
	}
	got, _ := env.st.Gather(ctx, "golang", 1, true)
	if got[0].Count != 2 {
		t.Fatalf("golang = %d, want 2", got[0].Count)
	}
	// Once the store takes it, the quarantine's replay writes it once
	// (the mark of writera tells whether the dead writer had).
	r, err := quarantine.Replay(ctx, q, env.st, nil, store.NewSequencer(time.Now), store.NewWriterID, time.Now)
	if err != nil || len(r.Written) != 1 {
		t.Fatalf("quarantine replay = %+v, %v", r, err)
	}
	got, _ = env.st.Gather(ctx, "poison", 1, true)
	if got[0].Count != 5 {
		t.Fatalf("poison = %d, want 5", got[0].Count)
	}
}

// TestReplayKeepsToItsRegion: an entry records the Region whose items its
// writes went to. A sidecar of another layout (here the single-Region
// one, as after a change of --region) leaves it alone, since its items
// would lack the dead writer's marks; a sidecar of the entry's Region
// replays it.
func TestReplayKeepsToItsRegion(t *testing.T) {
	ctx := context.Background()
	env := mentionStream(t)
	env.durable(t)
	in := func(region string) *mentions { e := *env; e.cfg.Region = region; return &e }

	a := in("eu-west-1").open(t, "writera")
	w := store.Write{Counter: store.TotalOf("golang"), Delta: 5, Writer: "writera", Seq: store.NewSequencer(time.Now).Next()}
	recs, err := a.Record(ctx, []store.Write{w}, map[string][]int64{"golang": {1, 2}})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Leave(ctx); err != nil { // dead
		t.Fatal(err)
	}
	entry := func() string {
		e, err := env.entries(t).Get(ctx, recs[0].Key)
		if err != nil {
			t.Fatal(err)
		}
		return string(e.Value())
	}
	if !strings.Contains(entry(), `"region":"eu-west-1"`) {
		t.Fatalf("entry %s does not name its Region", entry())
	}
	total := func() int64 {
		got, err := env.st.Gather(ctx, "golang", 1, true)
		if err != nil {
			t.Fatal(err)
		}
		sum, _ := store.Sum(got)
		return sum
	}
	if err := in("").open(t, "writerb").Replay(ctx); err != nil {
		t.Fatal(err)
	}
	if n := total(); n != 0 || strings.Contains(entry(), `"done":true`) {
		t.Fatalf("a sidecar of another layout replayed it: store %d, entry %s", n, entry())
	}
	if err := in("eu-west-1").open(t, "writerc").Replay(ctx); err != nil {
		t.Fatal(err)
	}
	if n := total(); n != 5 || !strings.Contains(entry(), `"done":true`) {
		t.Errorf("its Region's sidecar: store %d, entry %s; want 5, done", n, entry())
	}
}
