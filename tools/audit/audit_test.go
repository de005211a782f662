package audit_test

import (
	"context"
	"fmt"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/hotcount/hotcount/durability/durable"
	"github.com/hotcount/hotcount/durability/streams"
	"github.com/hotcount/hotcount/internal/testtools/testenv"
	"github.com/hotcount/hotcount/mention"
	"github.com/hotcount/hotcount/pipeline/ingest"
	"github.com/hotcount/hotcount/pipeline/store"
	"github.com/hotcount/hotcount/schema"
	"github.com/hotcount/hotcount/tools/audit"
)

// env is a NATS server with JetStream and a table on dynalite.
type env struct {
	nc    *nats.Conn
	js    jetstream.JetStream
	d     *testenv.Dynalite
	table string
	st    *store.DynamoDB
}

func newEnv(t *testing.T, mappings map[string]string) *env {
	t.Helper()
	s := testenv.NATSMapped(t, mappings)
	nc := testenv.Connect(t, s.ClientURL())
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	d := testenv.StartDynalite(t)
	table := d.Table(t, "hotcount")
	return &env{nc: nc, js: js, d: d, table: table, st: store.NewDynamoDB(d.Client(), table, store.NewMetrics(prometheus.NewRegistry()))}
}

func ctxOf(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// msg is one message the tests publish: to mentions.<topic>, with a
// payload; probe marks it as `stream create`'s probe.
type msg struct {
	topic, payload string
	probe          bool
}

// published is a message as the stream stored it.
type published struct {
	msg
	at time.Time // its stream timestamp
}

// publish publishes msgs with JetStream acknowledgements and reads back
// each one's stream timestamp.
func (e *env) publish(t *testing.T, msgs []msg) []published {
	t.Helper()
	ctx := ctxOf(t)
	var out []published
	for _, m := range msgs {
		nm := nats.NewMsg("mentions." + m.topic)
		nm.Data = []byte(m.payload)
		if m.probe {
			nm.Header.Set(streams.ProbeHeader, "test")
		}
		ack, err := e.js.PublishMsg(ctx, nm)
		if err != nil {
			t.Fatalf("publish %s: %v", nm.Subject, err)
		}
		s, err := e.js.Stream(ctx, ack.Stream)
		if err != nil {
			t.Fatal(err)
		}
		raw, err := s.GetMsg(ctx, ack.Sequence)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, published{msg: m, at: raw.Time})
	}
	return out
}

// counts are the counters the sidecars would write for msgs (the tests'
// own reckoning, written out here rather than by ingest.Judge): a valid
// payload's count in its topic's total, minute and hour, at its "at" or
// else its publication.
func counts(t *testing.T, msgs []published) map[schema.Counter]int64 {
	t.Helper()
	out := make(map[schema.Counter]int64)
	for _, m := range msgs {
		if m.probe {
			continue
		}
		n, at, ok := parse(t, m.payload)
		if !ok {
			continue
		}
		if at.IsZero() {
			at = m.at
		}
		out[schema.TotalOf(m.topic)] += n
		out[schema.BucketOf(m.topic, schema.Minute, schema.Minute.Index(at))] += n
		out[schema.BucketOf(m.topic, schema.Hour, schema.Hour.Index(at))] += n
	}
	return out
}

// parse reads the payloads the tests use: "" (1), {"count":n},
// {"count":n,"at":ms} and {"count":n,"at":"RFC 3339"}; ok is false for
// the ones made to be rejected (marked "bad:").
func parse(t *testing.T, p string) (n int64, at time.Time, ok bool) {
	t.Helper()
	switch {
	case p == "":
		return 1, time.Time{}, true
	case strings.HasPrefix(p, "bad:"):
		return 0, time.Time{}, false
	}
	var count, when string
	if _, err := fmt.Sscanf(p, `{"count":%s`, &count); err != nil {
		t.Fatalf("payload %q: %v", p, err)
	}
	count, rest, _ := strings.Cut(count, ",")
	count = strings.TrimSuffix(count, "}")
	n, err := strconv.ParseInt(count, 10, 64)
	if err != nil {
		t.Fatalf("payload %q: %v", p, err)
	}
	if when, ok = strings.CutPrefix(rest, `"at":`); ok {
		when = strings.TrimSuffix(when, "}")
		if ms, err := strconv.ParseInt(when, 10, 64); err == nil {
			at = time.UnixMilli(ms)
		} else if at, err = time.Parse(time.RFC3339, strings.Trim(when, `"`)); err != nil {
			t.Fatalf("payload %q: %v", p, err)
		}
	}
	return n, at, true
}

// write puts want into the table as the flusher would: each topic on
// shards[topic] shards (metadata recorded when more than one), each
// counter spread over them.
func (e *env) write(t *testing.T, want map[schema.Counter]int64, shards map[string]int) {
	t.Helper()
	ctx := ctxOf(t)
	metas := map[string]bool{}
	for c, delta := range want {
		n := max(shards[c.Topic], 1)
		if n > 1 && !metas[c.Topic] {
			metas[c.Topic] = true
			if err := e.st.SetMeta(ctx, c.Topic, schema.Meta{}, schema.Meta{Shards: n, ReadShards: n}); err != nil {
				t.Fatal(err)
			}
		}
		for s := range n {
			part := delta / int64(n)
			if int64(s) < delta%int64(n) {
				part++
			}
			if part == 0 {
				continue
			}
			if err := e.st.Add(ctx, testenv.Inc(c, s, part), time.Now()); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// set sets one item's count by hand.
func (e *env) set(t *testing.T, key string, count int64) {
	t.Helper()
	_, err := e.d.Client().UpdateItem(ctxOf(t), &dynamodb.UpdateItemInput{
		TableName:                 &e.table,
		Key:                       map[string]types.AttributeValue{schema.AttrPK: &types.AttributeValueMemberS{Value: key}},
		UpdateExpression:          aws.String("SET #c = :c"),
		ExpressionAttributeNames:  map[string]string{"#c": schema.AttrCount},
		ExpressionAttributeValues: map[string]types.AttributeValue{":c": &types.AttributeValueMemberN{Value: strconv.FormatInt(count, 10)}},
	})
	if err != nil {
		t.Fatal(err)
	}
}

// mix is the tests' messages: three topics, counts above one, payloads
// with and without "at" (in milliseconds and RFC 3339, an hour and a
// half and half an hour back), three the sidecars reject and a probe.
func mix(now time.Time) []msg {
	return []msg{
		{topic: "golang"}, {topic: "golang"}, {topic: "golang"},
		{topic: "golang", payload: `{"count":5}`},
		{topic: "rust", payload: `{"count":2}`},
		{topic: "rust", payload: fmt.Sprintf(`{"count":4,"at":%d}`, now.Add(-90*time.Minute).UnixMilli())},
		{topic: "k8s.eu", payload: fmt.Sprintf(`{"count":3,"at":"%s"}`, now.Add(-30*time.Minute).UTC().Format(time.RFC3339))},
		{topic: "bad", payload: `bad:{"count":0}`},
		{topic: "bad", payload: "bad:nope"},
		{topic: "rust", payload: fmt.Sprintf(`bad:{"count":1,"at":%d}`, now.Add(-48*time.Hour).UnixMilli())},
		{topic: "golang", probe: true},
	}
}

// wire turns the "bad:" marks into the payloads published.
func wire(ms []msg) []msg {
	out := make([]msg, len(ms))
	for i, m := range ms {
		m.payload, _ = strings.CutPrefix(m.payload, "bad:")
		out[i] = m
	}
	return out
}

// publishMix publishes mix and returns the counters they make.
func (e *env) publishMix(t *testing.T, now time.Time) map[schema.Counter]int64 {
	t.Helper()
	ms := mix(now)
	got := e.publish(t, wire(ms))
	for i := range got {
		got[i].msg = ms[i] // keep the marks for counts
	}
	return counts(t, got)
}

var mixShards = map[string]int{"golang": 3, "rust": 2}

func config(streamsToRead ...audit.Stream) audit.Config {
	return audit.Config{
		Streams: streamsToRead,
		Prefix:  "mentions.",
		Limits:  mention.Limits{MaxCount: mention.DefaultMaxCount, MaxTopicBytes: mention.DefaultMaxTopicBytes, MaxLateness: mention.DefaultMaxLateness},
		Minutes: true, Hours: true,
		Shards: 1,
		Rate:   -1,
	}
}

func run(t *testing.T, e *env, cfg audit.Config) audit.Report {
	t.Helper()
	r, err := audit.Run(ctxOf(t), e.js, e.st, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func buckets(want map[schema.Counter]int64) (n int64) {
	for c := range want {
		if c.IsBucket() {
			n++
		}
	}
	return n
}

// TestAuditFindsExactlyWhatDiffers: a table written as the flusher writes
// it matches the stream, every counter compared; one shard of a total and
// one shard of a bucket changed by hand are the two differences, with
// both numbers.
func TestAuditFindsExactlyWhatDiffers(t *testing.T) {
	e := newEnv(t, nil)
	if _, err := ingest.EnsureStream(ctxOf(t), e.nc, "MENTIONS", "mentions.>", time.Minute); err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	want := e.publishMix(t, now)
	e.write(t, want, mixShards)
	cfg := config(audit.Stream{Name: "MENTIONS"})

	r := run(t, e, cfg)
	if r.Differ() != 0 || len(r.Differences) != 0 {
		t.Fatalf("differences in a table that matches: %+v", r.Differences)
	}
	if !r.Totals.Checked || r.Totals.Compared != 3 || r.Buckets.Compared != buckets(want) || r.Buckets.Partial+r.Buckets.Expired+r.InFlight != 0 {
		t.Errorf("checked %+v totals, %+v buckets, %d in flight; want 3 totals and %d buckets compared, none skipped", r.Totals, r.Buckets, r.InFlight, buckets(want))
	}
	if r.Messages != 11 || r.Mentions != 17 || r.Topics != 3 || r.Probes != 1 ||
		!reflect.DeepEqual(r.Rejected, map[string]int64{mention.ReasonCount: 1, mention.ReasonPayload: 1, mention.ReasonAt: 1}) {
		t.Errorf("read %d messages, %d mentions of %d topics, %d probes, rejected %v; want 11, 17, 3, 1, one each of count, payload, at",
			r.Messages, r.Mentions, r.Topics, r.Probes, r.Rejected)
	}

	// A shard of golang's total (8) gains 7; one of rust's minute
	// buckets, with "at" (4, 2 on each shard), loses a shard's 2.
	e.set(t, schema.ShardKey("golang", 1), 3+7)
	late := time.UnixMilli(mustAt(t, mix(now)[5].payload))
	minute := schema.BucketOf("rust", schema.Minute, schema.Minute.Index(late))
	e.set(t, minute.Key(1), 0)

	r = run(t, e, cfg)
	start := schema.Minute.Start(minute.Index)
	wantDiffs := []audit.Difference{
		{Topic: "golang", Counter: "total", Stream: 8, Table: 15, Difference: 7},
		{Topic: "rust", Counter: "minute", Bucket: &start, Stream: 4, Table: 2, Difference: -2},
	}
	if !reflect.DeepEqual(r.Differences, wantDiffs) || r.Differ() != 2 || r.Totals.Differ != 1 || r.Buckets.Differ != 1 {
		t.Errorf("differences %s (%d), want %s", show(r.Differences), r.Differ(), show(wantDiffs))
	}
}

func mustAt(t *testing.T, payload string) int64 {
	t.Helper()
	_, at, _ := parse(t, payload)
	return at.UnixMilli()
}

func show(ds []audit.Difference) string {
	var b strings.Builder
	for _, d := range ds {
		bucket := ""
		if d.Bucket != nil {
			bucket = d.Bucket.UTC().Format(time.RFC3339)
		}
		fmt.Fprintf(&b, "[%s %s %s: %d/%d %+d] ", d.Topic, d.Counter, bucket, d.Stream, d.Table, d.Difference)
	}
	return b.String()
}

// TestAuditBoundedMemory: with room for three counters at a time, the
// audit reads the stream once per share of the topics and reports what
// the unbounded audit reports.
func TestAuditBoundedMemory(t *testing.T) {
	e := newEnv(t, nil)
	if _, err := ingest.EnsureStream(ctxOf(t), e.nc, "MENTIONS", "mentions.>", time.Minute); err != nil {
		t.Fatal(err)
	}
	want := e.publishMix(t, time.Now())
	// More topics, so that the shares have several to split.
	var more []msg
	for i := range 20 {
		more = append(more, msg{topic: fmt.Sprintf("topic-%d", i), payload: fmt.Sprintf(`{"count":%d}`, i+1)})
	}
	for c, n := range counts(t, e.publish(t, more)) {
		want[c] += n
	}
	e.write(t, want, mixShards)
	e.set(t, schema.ShardKey("topic-7", 0), 1)

	cfg := config(audit.Stream{Name: "MENTIONS"})
	whole := run(t, e, cfg)
	cfg.MaxCounters = 3
	bounded := run(t, e, cfg)
	t.Logf("bounded to 3 counters: %d passes, %d shares", bounded.Passes, bounded.Shares)
	if whole.Passes != 1 || whole.Shares != 1 {
		t.Errorf("unbounded: %d passes, %d shares; want 1 and 1", whole.Passes, whole.Shares)
	}
	if bounded.Shares < 2 || bounded.Passes < bounded.Shares {
		t.Errorf("bounded: %d passes, %d shares; want the topics in shares, each read in a pass", bounded.Passes, bounded.Shares)
	}
	if whole.Differ() != 1 || whole.Differences[0].Topic != "topic-7" {
		t.Errorf("unbounded differences %s, want topic-7's total", show(whole.Differences))
	}
	whole.Passes, whole.Shares, bounded.Passes, bounded.Shares = 0, 0, 0, 0
	if !reflect.DeepEqual(whole, bounded) {
		t.Errorf("bounded report differs from the unbounded one:\nunbounded %+v\nbounded   %+v", whole, bounded)
	}
}

// TestAuditPartitioned reads every partition stream, each message's
// subject without its partition, as partitioned mode's sidecars do.
func TestAuditPartitioned(t *testing.T) {
	l := streams.Layout{Stream: "MENTIONS", Subject: "mentions.>", Partitions: 2}
	e := newEnv(t, testenv.Partitioned(l))
	if _, err := streams.Ensure(ctxOf(t), e.js, l, streams.Options{MaxAge: time.Hour, Duplicates: time.Minute}); err != nil {
		t.Fatal(err)
	}
	want := e.publishMix(t, time.Now())
	var more []msg
	for i := range 10 {
		more = append(more, msg{topic: fmt.Sprintf("topic-%d", i), payload: `{"count":2}`})
	}
	for c, n := range counts(t, e.publish(t, more)) {
		want[c] += n
	}
	e.write(t, want, mixShards)
	cfg := config(audit.Stream{Name: l.Name(0), Partitioned: true, Durable: true}, audit.Stream{Name: l.Name(1), Partitioned: true, Durable: true})
	cfg.Checkpoints = durable.NewCheckpoints(e.js, "")
	e.checkpointAll(t, l.Name(0), l.Name(1)) // the sidecars have written everything

	r := run(t, e, cfg)
	for _, s := range r.Streams {
		if s.Messages == 0 {
			t.Errorf("stream %s holds no message: the test wants both partitions used", s.Name)
		}
	}
	if r.Differ() != 0 || r.Totals.Compared != 13 || r.Buckets.Compared != buckets(want) || r.Mentions != 17+20 {
		t.Errorf("%d differ (%s), %d totals and %d buckets compared, %d mentions; want 0, 13, %d, 37",
			r.Differ(), show(r.Differences), r.Totals.Compared, r.Buckets.Compared, buckets(want), r.Mentions)
	}
	e.set(t, schema.ShardKey("topic-3", 0), 5)
	r = run(t, e, cfg)
	if want := []audit.Difference{{Topic: "topic-3", Counter: "total", Stream: 2, Table: 5, Difference: 3}}; !reflect.DeepEqual(r.Differences, want) {
		t.Errorf("differences %s, want %s", show(r.Differences), show(want))
	}
}

// TestAuditUpToPosition: mentions past their stream's checkpoint (package
// durable's record: at and below it, every mention is in the table) may
// not be in the table yet. Each counter is compared exactly up to the
// position its item records: a mention the item does not include yet is
// not expected of it, one it includes is, whether the audit read it or it
// was published during the audit; a count changed by hand is found at
// once, checkpoint or not.
func TestAuditUpToPosition(t *testing.T) {
	e := newEnv(t, nil)
	ctx := ctxOf(t)
	if _, err := ingest.EnsureStream(ctx, e.nc, "MENTIONS", "mentions.>", time.Minute); err != nil {
		t.Fatal(err)
	}
	// Sequences 1..4: a, b (3), a, b (2).
	e.publish(t, []msg{{topic: "a"}, {topic: "b", payload: `{"count":3}`}, {topic: "a"}, {topic: "b", payload: `{"count":2}`}})
	cfg := config(audit.Stream{Name: "MENTIONS", Durable: true})
	cfg.Minutes, cfg.Hours = false, false
	cfg.Checkpoints = durable.NewCheckpoints(e.js, "")
	a, b := schema.TotalOf("a"), schema.TotalOf("b")
	// No checkpoint; a's item includes sequence 1, b's nothing yet.
	e.spanWrite(t, a, 1, 1, 1)
	r := run(t, e, cfg)
	if r.Differ() != 0 || r.InFlight != 0 || r.Totals.Compared != 2 {
		t.Errorf("a written up to 1: %d differ (%s), %d in flight, %d compared; want 0, 0, 2", r.Differ(), show(r.Differences), r.InFlight, r.Totals.Compared)
	}
	// a's count changed by hand, its position not: a difference, counted
	// against what a's item says it includes (sequence 1).
	e.set(t, a.Key(0), 5)
	r = run(t, e, cfg)
	if want := []audit.Difference{{Topic: "a", Counter: "total", Stream: 1, Table: 5, Difference: 4}}; !reflect.DeepEqual(r.Differences, want) || r.InFlight != 0 {
		t.Errorf("a changed: differences %s, %d in flight; want %s, none in flight", show(r.Differences), r.InFlight, show(want))
	}
	e.set(t, a.Key(0), 1)
	// b's item includes 2..4 (its write covered the sequences read up to
	// 4), and a mention of a published during the audit (sequence 5) lands
	// with a's write of 3..5 while the audit reads: all as expected.
	e.spanWrite(t, b, 5, 2, 4)
	table := &racing{DynamoDB: e.st, before: func() {
		e.publish(t, []msg{{topic: "a"}})
		e.spanWrite(t, a, 2, 3, 5)
	}}
	if r, err := audit.Run(ctx, e.js, table, cfg); err != nil {
		t.Fatal(err)
	} else if r.Differ() != 0 || r.InFlight != 0 || r.Totals.Compared != 2 || r.Messages != 4 {
		t.Errorf("written while read: %d differ (%s), %d in flight, %d compared, %d read; want 0, 0, 2, 4", r.Differ(), show(r.Differences), r.InFlight, r.Totals.Compared, r.Messages)
	}
	// Checkpointed past everything, and a mention (6) the checkpoint
	// claims is in the table is not: a loss, reported.
	e.publish(t, []msg{{topic: "b"}})
	e.checkpointAll(t, "MENTIONS")
	r = run(t, e, cfg)
	if want := []audit.Difference{{Topic: "b", Counter: "total", Stream: 6, Table: 5, Difference: -1}}; !reflect.DeepEqual(r.Differences, want) || r.Totals.Compared != 2 {
		t.Errorf("checkpointed past a loss: differences %s, %d compared; want %s, 2 compared", show(r.Differences), r.Totals.Compared, show(want))
	}
}

// spanWrite writes delta into c's item as the durable sidecars do:
// conditional on, and recording, stream MENTIONS's positions first..last.
func (e *env) spanWrite(t *testing.T, c schema.Counter, delta int64, first, last uint64) {
	t.Helper()
	ctx := ctxOf(t)
	st, err := e.js.Stream(ctx, "MENTIONS")
	if err != nil {
		t.Fatal(err)
	}
	span := &store.Span{Stream: "MENTIONS", Epoch: store.EpochOf(st.CachedInfo().Created), First: first, Last: last}
	if err := e.st.Add(ctx, store.Write{Counter: c, Delta: delta, Span: span}, time.Now()); err != nil {
		t.Fatal(err)
	}
}

// TestAuditCheckpointOfAnEarlierStream: a checkpoint recorded for a
// stream since deleted and created again says nothing of the new one: a
// mention of the new stream that no item includes yet is not expected of
// the table (with the old checkpoint, it would be, and differ).
func TestAuditCheckpointOfAnEarlierStream(t *testing.T) {
	e := newEnv(t, nil)
	ctx := ctxOf(t)
	if _, err := ingest.EnsureStream(ctx, e.nc, "MENTIONS", "mentions.>", time.Minute); err != nil {
		t.Fatal(err)
	}
	e.publish(t, []msg{{topic: "a"}, {topic: "a"}})
	e.checkpointAll(t, "MENTIONS")
	if err := e.js.DeleteStream(ctx, "MENTIONS"); err != nil {
		t.Fatal(err)
	}
	if _, err := ingest.EnsureStream(ctx, e.nc, "MENTIONS", "mentions.>", time.Minute); err != nil {
		t.Fatal(err)
	}
	e.publish(t, []msg{{topic: "a"}})
	cfg := config(audit.Stream{Name: "MENTIONS", Durable: true})
	cfg.Checkpoints = durable.NewCheckpoints(e.js, "")
	r := run(t, e, cfg)
	if r.Differ() != 0 || r.InFlight != 0 || r.Totals.Compared+r.Buckets.Compared != 3 {
		t.Errorf("%d differ (%s), %d in flight, %d compared; want 0, 0 and 3 (a's total and buckets)", r.Differ(), show(r.Differences), r.InFlight, r.Totals.Compared+r.Buckets.Compared)
	}
}

// checkpointAll records, for each stream named, a checkpoint at its last
// sequence, as the durable sidecars do once they have written it all.
func (e *env) checkpointAll(t *testing.T, names ...string) {
	t.Helper()
	ctx := ctxOf(t)
	for _, name := range names {
		st, err := e.js.Stream(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		if err := durable.Advance(ctx, e.js, name, "", st.CachedInfo().State.LastSeq); err != nil {
			t.Fatal(err)
		}
	}
}

// TestAuditSince: a range that starts after the stream's start cannot
// prove totals, and says so; neither can it prove the buckets at its
// start.
func TestAuditSince(t *testing.T) {
	e := newEnv(t, nil)
	if _, err := ingest.EnsureStream(ctxOf(t), e.nc, "MENTIONS", "mentions.>", time.Minute); err != nil {
		t.Fatal(err)
	}
	first := e.publish(t, []msg{{topic: "a"}, {topic: "a"}})
	e.publish(t, []msg{{topic: "a"}, {topic: "b"}})
	cfg := config(audit.Stream{Name: "MENTIONS"})
	cfg.Since = first[1].at.Add(time.Nanosecond)
	r := run(t, e, cfg)
	if r.Totals.Checked || r.Totals.Compared != 0 || r.Messages != 2 {
		t.Errorf("totals %+v after reading %d messages; want none checked of 2", r.Totals, r.Messages)
	}
	if !strings.Contains(strings.Join(r.Notes, "\n"), "--since") {
		t.Errorf("notes do not say why totals were not checked: %q", r.Notes)
	}
	if r.Buckets.Compared != 0 || r.Buckets.Partial == 0 || r.Differ() != 0 {
		t.Errorf("buckets %+v, %d differ: want the buckets at --since skipped as partial", r.Buckets, r.Differ())
	}
}

// TestAuditAgedStream: a stream older than its max age has lost its
// first mentions: totals are not checked, and the report says from when
// the stream holds mentions.
func TestAuditAgedStream(t *testing.T) {
	e := newEnv(t, nil)
	ctx := ctxOf(t)
	if _, err := ingest.EnsureStream(ctx, e.nc, "MENTIONS", "mentions.>", 500*time.Millisecond, ingest.StreamOptions{MaxAge: time.Second}); err != nil {
		t.Fatal(err)
	}
	e.publish(t, []msg{{topic: "a"}, {topic: "b"}})
	s, err := e.js.Stream(ctx, "MENTIONS")
	if err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 20*time.Second, func() error {
		info, err := s.Info(ctx)
		if err != nil {
			return err
		}
		if info.State.FirstSeq < 3 {
			return fmt.Errorf("stream's first sequence %d: not aged yet", info.State.FirstSeq)
		}
		return nil
	})
	e.publish(t, []msg{{topic: "a"}})
	r := run(t, e, config(audit.Stream{Name: "MENTIONS"}))
	if r.Totals.Checked || r.Totals.Compared != 0 {
		t.Errorf("totals %+v: want none checked", r.Totals)
	}
	// The time named is the first mention read, or (it aged out too on a
	// slow machine) the audit's: which, the test cannot know.
	notes := strings.Join(r.Notes, "\n")
	if !regexp.MustCompile(`stream MENTIONS: mentions before 20\d\d-\d\d-\d\dT\d\d:\d\d:\d\dZ are no longer in the stream \(it keeps them 1s, .*\): totals not checked`).MatchString(notes) {
		t.Errorf("notes %q do not say from when the stream holds mentions, and that totals were not checked", r.Notes)
	}
}

// racing is the table with something happening on the first read of
// totals, before or after it: a sidecar's write landing while the audit
// reads.
type racing struct {
	*store.DynamoDB
	before, after func()
	done          bool
}

func (r *racing) GatherMany(ctx context.Context, topics []string, n int, consistent bool) (map[string][]schema.Shard, error) {
	first := !r.done
	r.done = true
	if first && r.before != nil {
		r.before()
	}
	m, err := r.DynamoDB.GatherMany(ctx, topics, n, consistent)
	if first && r.after != nil {
		r.after()
	}
	return m, err
}

// TestAuditMentionsDuringTheAudit: a mention published after the audit
// began and written before it read the table makes its counters differ
// from what the audit read; it reads what the stream took meanwhile and
// counts them in flight, not as differences.
func TestAuditMentionsDuringTheAudit(t *testing.T) {
	e := newEnv(t, nil)
	if _, err := ingest.EnsureStream(ctxOf(t), e.nc, "MENTIONS", "mentions.>", time.Minute); err != nil {
		t.Fatal(err)
	}
	want := counts(t, e.publish(t, []msg{{topic: "golang"}, {topic: "rust", payload: `{"count":2}`}}))
	e.write(t, want, nil)
	table := &racing{DynamoDB: e.st, before: func() {
		// A sidecar takes a new mention of golang and flushes it.
		e.write(t, counts(t, e.publish(t, []msg{{topic: "golang", payload: `{"count":4}`}})), nil)
	}}
	r, err := audit.Run(ctxOf(t), e.js, table, config(audit.Stream{Name: "MENTIONS"}))
	if err != nil {
		t.Fatal(err)
	}
	if r.Differ() != 0 || r.InFlight == 0 || r.Messages != 2 {
		t.Errorf("%d differ (%s), %d in flight, %d messages read; want none, golang's counters in flight, 2 read", r.Differ(), show(r.Differences), r.InFlight, r.Messages)
	}
	// Audited again, all of it is settled and compared.
	r = run(t, e, config(audit.Stream{Name: "MENTIONS"}))
	if r.Differ() != 0 || r.InFlight != 0 || r.Totals.Compared != 2 {
		t.Errorf("again: %d differ, %d in flight, %d totals compared; want 0, 0, 2", r.Differ(), r.InFlight, r.Totals.Compared)
	}
}

// TestAuditWriteLandingWhileRead: a difference that changes while the
// audit reads it (a flush's write landing just after the table was read)
// is in flight; one that stays is reported.
func TestAuditWriteLandingWhileRead(t *testing.T) {
	e := newEnv(t, nil)
	if _, err := ingest.EnsureStream(ctxOf(t), e.nc, "MENTIONS", "mentions.>", time.Minute); err != nil {
		t.Fatal(err)
	}
	e.publish(t, []msg{{topic: "golang", payload: `{"count":3}`}, {topic: "rust", payload: `{"count":2}`}})
	e.write(t, map[schema.Counter]int64{schema.TotalOf("golang"): 2, schema.TotalOf("rust"): 1}, nil)
	cfg := config(audit.Stream{Name: "MENTIONS"})
	cfg.Minutes, cfg.Hours = false, false
	table := &racing{DynamoDB: e.st, after: func() {
		e.write(t, map[schema.Counter]int64{schema.TotalOf("golang"): 1}, nil) // golang's last mention lands
	}}
	r, err := audit.Run(ctxOf(t), e.js, table, cfg)
	if err != nil {
		t.Fatal(err)
	}
	want := []audit.Difference{{Topic: "rust", Counter: "total", Stream: 2, Table: 1, Difference: -1}}
	if !reflect.DeepEqual(r.Differences, want) || r.InFlight != 1 || r.Totals.Compared != 1 {
		t.Errorf("differences %s, %d in flight, %d compared; want %s, golang in flight, rust compared", show(r.Differences), r.InFlight, r.Totals.Compared, show(want))
	}
}

// recordsRace runs before() once, just before the audit's first Records
// read.
type recordsRace struct {
	*store.DynamoDB
	before func()
	done   bool
}

func (r *recordsRace) Records(ctx context.Context, keys []string) (map[string][]store.Record, error) {
	if !r.done {
		r.done = true
		r.before()
	}
	return r.DynamoDB.Records(ctx, keys)
}

// TestAuditWriteAfterTheGrowthScan: a caught-up sidecar writes a mention
// published during the audit just before the audit reads the items: the
// item's position is past what the stream held when the audit began, and
// the audit reads the stream up to it (found by an outside review: the
// stream was read first, up to its end then, and the correct table
// differed).
func TestAuditWriteAfterTheGrowthScan(t *testing.T) {
	e := newEnv(t, nil)
	ctx := ctxOf(t)
	if _, err := ingest.EnsureStream(ctx, e.nc, "MENTIONS", "mentions.>", time.Minute); err != nil {
		t.Fatal(err)
	}
	e.publish(t, []msg{{topic: "a"}, {topic: "a"}}) // 1, 2
	cfg := config(audit.Stream{Name: "MENTIONS", Durable: true})
	cfg.Minutes, cfg.Hours = false, false
	cfg.Checkpoints = durable.NewCheckpoints(e.js, "")
	a := schema.TotalOf("a")
	e.spanWrite(t, a, 1, 1, 1) // the sidecar has written 1; 2 is in its window
	table := &recordsRace{DynamoDB: e.st, before: func() {
		e.publish(t, []msg{{topic: "a"}}) // 3
		e.spanWrite(t, a, 2, 2, 3)        // the sidecar flushes 2..3
	}}
	r, err := audit.Run(ctx, e.js, table, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if r.Differ() != 0 || r.Totals.Compared != 1 {
		t.Errorf("a correct table: %d differ (%s), %d compared; want 0 and 1", r.Differ(), show(r.Differences), r.Totals.Compared)
	}
}

// TestAuditItemsOfAnotherCreation: a stream deleted and created again;
// the items hold the old creation's mentions and the new one's, each
// once. The new stream is young and whole, but the audit cannot see the
// old mentions: the total is not proved either way (foreign), not
// reported as a difference; a count changed by hand in a counter of the
// new creation alone is still found.
func TestAuditItemsOfAnotherCreation(t *testing.T) {
	e := newEnv(t, nil)
	ctx := ctxOf(t)
	if _, err := ingest.EnsureStream(ctx, e.nc, "MENTIONS", "mentions.>", time.Minute); err != nil {
		t.Fatal(err)
	}
	a := schema.TotalOf("a")
	e.publish(t, []msg{{topic: "a"}, {topic: "a"}})
	e.spanWrite(t, a, 2, 1, 2) // the old creation, written whole
	e.checkpointAll(t, "MENTIONS")
	if err := e.js.DeleteStream(ctx, "MENTIONS"); err != nil {
		t.Fatal(err)
	}
	if _, err := ingest.EnsureStream(ctx, e.nc, "MENTIONS", "mentions.>", time.Minute); err != nil {
		t.Fatal(err)
	}
	e.publish(t, []msg{{topic: "a"}, {topic: "b"}})
	e.spanWrite(t, a, 1, 1, 1) // the new creation, written whole
	e.spanWrite(t, schema.TotalOf("b"), 1, 2, 2)
	e.checkpointAll(t, "MENTIONS")
	cfg := config(audit.Stream{Name: "MENTIONS", Durable: true})
	cfg.Minutes, cfg.Hours = false, false
	cfg.Checkpoints = durable.NewCheckpoints(e.js, "")
	r := run(t, e, cfg)
	if r.Differ() != 0 || r.Foreign != 1 || r.Totals.Compared != 1 {
		t.Errorf("%d differ (%s), %d foreign, %d compared; want 0, a's total foreign, b's compared", r.Differ(), show(r.Differences), r.Foreign, r.Totals.Compared)
	}
	e.set(t, schema.ShardKey("b", 0), 4)
	if r = run(t, e, cfg); r.Totals.Differ != 1 || r.Differences[0].Topic != "b" {
		t.Errorf("b changed by hand: differences %s, want b's", show(r.Differences))
	}
}
