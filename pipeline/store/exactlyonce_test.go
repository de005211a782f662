package store_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/hotcount/hotcount/internal/testtools/ddbfault"
	"github.com/hotcount/hotcount/internal/testtools/testenv"
	"github.com/hotcount/hotcount/pipeline/store"
	"github.com/hotcount/hotcount/schema"
)

// faultStore is the DynamoDB store as production builds it (the SDK's
// standard retries included) against dynalite behind the fault emulator.
type faultStore struct {
	st    *store.DynamoDB
	proxy *ddbfault.Proxy
	dyn   *testenv.Dynalite
	table string
	reg   *prometheus.Registry
}

func newFaultStore(t *testing.T, cfg ddbfault.Config) *faultStore {
	t.Helper()
	testenv.AWSEnv(t)
	d := testenv.StartDynalite(t)
	table := d.Table(t, "once")
	cfg.Upstream = d.Endpoint
	p := ddbfault.New(cfg)
	url, stop, err := p.Serve("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stop() }) //nolint:errcheck // test teardown
	client, err := store.NewDynamoDBClient(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	return &faultStore{st: store.NewDynamoDB(client, table, store.NewMetrics(reg)), proxy: p, dyn: d, table: table, reg: reg}
}

// item reads an item straight from dynalite.
func (f *faultStore) item(t *testing.T, key string) map[string]types.AttributeValue {
	t.Helper()
	out, err := f.dyn.Client().GetItem(context.Background(), &dynamodb.GetItemInput{
		TableName:      &f.table,
		Key:            map[string]types.AttributeValue{schema.AttrPK: &types.AttributeValueMemberS{Value: key}},
		ConsistentRead: aws.Bool(true),
	})
	if err != nil {
		t.Fatal(err)
	}
	return out.Item
}

func (f *faultStore) count(t *testing.T, key string) int64 {
	t.Helper()
	n, _ := f.item(t, key)[schema.AttrCount].(*types.AttributeValueMemberN)
	if n == nil {
		return 0
	}
	v, err := strconv.ParseInt(n.Value, 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func (f *faultStore) metric(t *testing.T, name string, label ...string) float64 {
	if len(label) == 2 {
		return testenv.MetricWith(t, f.reg, name, label[0], label[1])
	}
	return testenv.Metric(t, f.reg, name)
}

// TestLostAnswerAppliesOnce: DynamoDB applies a write and the answer is
// lost (a reset, a 500, a hang past the client's timeout). The call says
// the outcome is unknown; the same write sent again is refused by its mark
// and reported applied; the item holds the delta once.
func TestLostAnswerAppliesOnce(t *testing.T) {
	for _, kind := range []string{ddbfault.Ambiguous, ddbfault.Ambiguous500, ddbfault.AmbiguousHang, ddbfault.AmbiguousCut} {
		t.Run(kind, func(t *testing.T) {
			f := newFaultStore(t, ddbfault.Config{})
			f.proxy.SetHang(5 * time.Second)
			f.proxy.LoseAnswers(1, kind) // every attempt of the first call
			w := testenv.W("golang", 2, 7)
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			err := f.st.Add(ctx, w, time.Now())
			cancel()
			if !errors.Is(err, store.ErrAmbiguous) {
				t.Fatalf("Add with the answer lost = %v, want ErrAmbiguous", err)
			}
			if got := f.count(t, w.Key()); got != 7 {
				t.Fatalf("item count %d after the lost answer, want 7 (the emulator applies it)", got)
			}
			f.proxy.LoseAnswers(0)
			w.Retry = true
			if err := f.st.Add(context.Background(), w, time.Now()); err != nil {
				t.Fatalf("the same write again: %v", err)
			}
			if got := f.count(t, w.Key()); got != 7 {
				t.Errorf("item count %d after the retry, want 7: applied twice", got)
			}
			if got := f.metric(t, "hotcount_store_ambiguous_total"); got != 1 {
				t.Errorf("hotcount_store_ambiguous_total = %v, want 1", got)
			}
			if got := f.metric(t, "hotcount_store_resolved_total", "outcome", "applied"); got != 1 {
				t.Errorf(`resolved{outcome="applied"} = %v, want 1`, got)
			}
		})
	}
}

// TestSDKRetryOfLostAnswer: only the first attempt's answer is lost; the
// SDK's own retry, inside the same call, is the same request: it is refused
// by the mark and the call returns success, once.
func TestSDKRetryOfLostAnswer(t *testing.T) {
	f := newFaultStore(t, ddbfault.Config{})
	f.proxy.AmbiguousNext(1)
	w := testenv.W("golang", 0, 5)
	if err := f.st.Add(context.Background(), w, time.Now()); err != nil {
		t.Fatalf("Add: %v", err)
	}
	if got := f.count(t, w.Key()); got != 5 {
		t.Errorf("item count %d, want 5", got)
	}
	if got := f.metric(t, "hotcount_store_resolved_total", "outcome", "applied"); got != 1 {
		t.Errorf(`resolved{outcome="applied"} = %v, want 1`, got)
	}
}

// TestSDKRetryOfLostSpanAnswer: the same for a write with stream
// positions. The SDK's retry finds the item at the span's end, written at
// this call's time: its first attempt applied it, and the call says so
// (nil), not ErrCovered, which a caller reads as another writer's write.
func TestSDKRetryOfLostSpanAnswer(t *testing.T) {
	f := newFaultStore(t, ddbfault.Config{})
	f.proxy.AmbiguousNext(1)
	w := spanWrite("golang", 5, "MENTIONS-0", epoch1, 1, 3)
	if err := f.st.Add(context.Background(), w, time.Now()); err != nil {
		t.Fatalf("Add: %v, want nil: the call's own attempt applied it", err)
	}
	if got := f.count(t, w.Key()); got != 5 {
		t.Errorf("item count %d, want 5", got)
	}
	if got := f.metric(t, "hotcount_store_resolved_total", "outcome", "applied"); got != 1 {
		t.Errorf(`resolved{outcome="applied"} = %v, want 1`, got)
	}
	if got := f.metric(t, "hotcount_store_ambiguous_total"); got != 1 {
		t.Errorf("hotcount_store_ambiguous_total = %v, want 1", got)
	}
	if err := f.st.Add(context.Background(), w, time.Now()); !errors.Is(err, store.ErrCovered) {
		t.Errorf("the same write in a new call = %v, want ErrCovered", err)
	}
}

// TestSDKRetryFindsAnotherWritersSpan: the first attempt answers 500
// (in doubt; it applied nothing) and the SDK's retry finds the span in the
// item, written a minute before by another writer: covered, not this
// call's, though the item ends at the span's last position.
func TestSDKRetryFindsAnotherWritersSpan(t *testing.T) {
	f := newFaultStore(t, ddbfault.Config{})
	w := spanWrite("golang", 5, "MENTIONS-0", epoch1, 1, 3)
	if err := f.st.Add(context.Background(), w, time.Now().Add(-time.Minute)); err != nil {
		t.Fatalf("the other writer's write: %v", err)
	}
	f.proxy.FailNext(1, 500)
	if err := f.st.Add(context.Background(), w, time.Now()); !errors.Is(err, store.ErrCovered) {
		t.Fatalf("Add after a 500, the span another writer's = %v, want ErrCovered", err)
	}
	if st := f.proxy.Stats(); st.Did[ddbfault.Failed] != 1 {
		t.Fatalf("the emulator failed %d requests, want the first attempt", st.Did[ddbfault.Failed])
	}
	if got := f.count(t, w.Key()); got != 5 {
		t.Errorf("item count %d, want 5", got)
	}
}

// TestRetryOfUnappliedWrite: a 500 that applied nothing is in doubt too;
// the retry applies the delta, once, and says it had not been applied.
func TestRetryOfUnappliedWrite(t *testing.T) {
	f := newFaultStore(t, ddbfault.Config{})
	f.proxy.FailNext(1, 500)
	w := testenv.W("golang", 1, 9)
	if err := f.st.Add(context.Background(), w, time.Now()); err != nil {
		t.Fatalf("Add: %v", err)
	}
	if got := f.count(t, w.Key()); got != 9 {
		t.Errorf("item count %d, want 9", got)
	}
	if got := f.metric(t, "hotcount_store_resolved_total", "outcome", "not_applied"); got != 1 {
		t.Errorf(`resolved{outcome="not_applied"} = %v, want 1`, got)
	}
}

// TestThrottleAfterLostAnswerIsInDoubt: the first attempt is applied and
// its answer lost, the SDK's retry is throttled. A throttle alone would let
// the flusher move the delta to another shard; after a lost answer that
// would count it twice, so the call must say "in doubt", not "throttled".
func TestThrottleAfterLostAnswerIsInDoubt(t *testing.T) {
	f := newFaultStore(t, ddbfault.Config{WriteUnits: 0.01, WriteBurst: 1})
	f.proxy.AmbiguousNext(1)
	w := testenv.W("golang", 3, 4)
	err := f.st.Add(context.Background(), w, time.Now())
	if !errors.Is(err, store.ErrAmbiguous) || errors.Is(err, store.ErrThrottled) {
		t.Fatalf("Add = %v, want ErrAmbiguous and not ErrThrottled", err)
	}
	if st := f.proxy.Stats(); st.Did[ddbfault.Throttled] == 0 {
		t.Fatalf("the retry was not throttled: %v", st.Did)
	}
	if got := f.count(t, w.Key()); got != 4 {
		t.Errorf("item count %d, want 4", got)
	}
}

// TestMarksStayBounded: 1,000 writer restarts, each a new writer id that
// writes the same hot item once, five seconds apart (a container restart
// takes longer; Kubernetes backs a crash loop off from 10 s to 5 min). The
// item keeps one write unit (under 1 KB) and the exact count, in both
// stores.
func TestMarksStayBounded(t *testing.T) {
	const restarts = 1000
	clock := time.Unix(1_800_000_000, 0)
	now := func() time.Time { return clock }
	write := func(t *testing.T, add func(store.Write, time.Time) error) {
		for range restarts {
			id, seq := store.NewWriterID(), store.NewSequencer(now)
			if err := add(store.Write{Counter: schema.TotalOf("hot"), Shard: 0, Delta: 1, Writer: id, Seq: seq.Next()}, clock); err != nil {
				t.Fatal(err)
			}
			clock = clock.Add(5 * time.Second)
		}
	}
	t.Run("dynamodb", func(t *testing.T) {
		f := newFaultStore(t, ddbfault.Config{})
		write(t, func(w store.Write, at time.Time) error { return f.st.Add(context.Background(), w, at) })
		item := f.item(t, schema.ShardKey("hot", 0))
		size, marks := store.ItemSize(item), 0
		for name := range item {
			if strings.HasPrefix(name, store.MarkPrefix) {
				marks++
			}
		}
		t.Logf("after %d restarts: %d bytes, %d marks, %v trims", restarts, size, marks, f.metric(t, "hotcount_store_trims_total"))
		if size >= 1024 {
			t.Errorf("item is %d bytes, over one write unit", size)
		}
		if got := f.count(t, schema.ShardKey("hot", 0)); got != restarts {
			t.Errorf("count %d, want %d", got, restarts)
		}
	})
	t.Run("bolt", func(t *testing.T) {
		reg := prometheus.NewRegistry()
		b, err := store.OpenBolt(t.TempDir(), store.NewMetrics(reg))
		if err != nil {
			t.Fatal(err)
		}
		defer b.Close()
		write(t, func(w store.Write, at time.Time) error { return b.Add(context.Background(), w, at) })
		size, err := store.BoltItemSize(b, schema.ShardKey("hot", 0))
		if err != nil {
			t.Fatal(err)
		}
		if size >= 1024 {
			t.Errorf("item is %d bytes", size)
		}
		got, err := b.Gather(context.Background(), "hot", 1, true)
		if err != nil || got[0].Count != restarts {
			t.Errorf("count %v (%v), want %d", got, err, restarts)
		}
	})
}

// TestSameWriteTwiceEverywhere: both stores apply a write sent three
// times once.
func TestSameWriteTwiceEverywhere(t *testing.T) {
	for name, open := range stores(t) {
		t.Run(name, func(t *testing.T) {
			st, _ := open(t)
			ctx := context.Background()
			w := testenv.W("twice", 0, 3)
			if err := st.Add(ctx, w, time.Now()); err != nil {
				t.Fatal(err)
			}
			w.Retry = true // as the flusher sends a write in doubt again
			for range 2 {
				if err := st.Add(ctx, w, time.Now()); err != nil {
					t.Fatalf("retry: %v", err)
				}
			}
			got, err := st.Gather(ctx, "twice", 1, true)
			if err != nil || got[0].Count != 3 {
				t.Errorf("count %v (%v), want 3", got, err)
			}
		})
	}
}

// TestRefusalReadThrottledStaysInDoubt: the first attempt is applied and
// its answer lost, the SDK's retry is refused by the mark, and the read
// that would settle it is throttled. The write is in doubt, never
// "throttled": a throttle would let the flusher move an applied delta to
// another shard.
func TestRefusalReadThrottledStaysInDoubt(t *testing.T) {
	f := newFaultStore(t, ddbfault.Config{ReadUnits: 0.0001, ReadBurst: 1})
	w := testenv.W("golang", 0, 6)
	if _, err := f.st.Gather(context.Background(), "golang", 1, true); err != nil { // spends the read burst of shard 0
		t.Fatal(err)
	}
	f.proxy.AmbiguousNext(1)
	err := f.st.Add(context.Background(), w, time.Now())
	if !errors.Is(err, store.ErrAmbiguous) || errors.Is(err, store.ErrThrottled) {
		t.Fatalf("Add = %v, want ErrAmbiguous and not ErrThrottled", err)
	}
	if got := f.count(t, w.Key()); got != 6 {
		t.Errorf("item count %d, want 6", got)
	}
}

// TestReplayOfAppliedWrite: a journal replay sends a write its writer
// already applied (and wrote past since): refused by the mark, it reads as
// applied, in both stores, and the count is unchanged.
func TestReplayOfAppliedWrite(t *testing.T) {
	for name, open := range stores(t) {
		t.Run(name, func(t *testing.T) {
			st, _ := open(t)
			ctx := context.Background()
			w := testenv.Writer()
			first, second := w("replayed", 0, 4), w("replayed", 0, 5)
			for _, x := range []store.Write{first, second} {
				if err := st.Add(ctx, x, time.Now()); err != nil {
					t.Fatal(err)
				}
			}
			first.Replay = true
			if err := st.Add(ctx, first, time.Now()); err != nil {
				t.Fatalf("replay of an applied write: %v", err)
			}
			got, err := st.Gather(ctx, "replayed", 1, true)
			if err != nil || got[0].Count != 9 {
				t.Errorf("count %v (%v), want 9", got, err)
			}
		})
	}
}

// TestEndedContextIsNotSent: a first write whose context has ended (the
// shutdown deadline passed) is not sent and says so, not "in doubt": the
// flusher keeps its delta whole instead of reporting it maybe applied. The
// same write then lands once.
func TestEndedContextIsNotSent(t *testing.T) {
	f := newFaultStore(t, ddbfault.Config{})
	w := testenv.W("golang", 1, 9)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := f.st.Add(ctx, w, time.Now())
	if err == nil || errors.Is(err, store.ErrAmbiguous) || !errors.Is(err, context.Canceled) {
		t.Fatalf("Add with an ended context = %v, want a plain 'not sent' error", err)
	}
	if got := f.metric(t, "hotcount_store_ambiguous_total"); got != 0 {
		t.Errorf("ambiguous = %v, want 0", got)
	}
	if err := f.st.Add(context.Background(), w, time.Now()); err != nil {
		t.Fatalf("Add: %v", err)
	}
	if got := f.count(t, w.Key()); got != 9 {
		t.Errorf("item count %d, want 9", got)
	}
}
