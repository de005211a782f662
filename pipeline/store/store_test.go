package store_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/smithy-go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/hotcount/hotcount/internal/testtools/testenv"
	"github.com/hotcount/hotcount/pipeline/store"
	"github.com/hotcount/hotcount/schema"
)

// counter is the part of a store the conformance tests exercise.
type counter interface {
	Add(ctx context.Context, w store.Write, now time.Time) error
	Gather(ctx context.Context, topic string, n int, consistent bool) ([]schema.Shard, error)
	Ping(ctx context.Context) error
}

// stores returns both implementations, each fresh, with their metrics.
func stores(t *testing.T) map[string]func(t *testing.T) (counter, *store.Metrics) {
	return map[string]func(t *testing.T) (counter, *store.Metrics){
		"dynamodb": func(t *testing.T) (counter, *store.Metrics) {
			d := testenv.StartDynalite(t)
			m := store.NewMetrics(prometheus.NewRegistry())
			return store.NewDynamoDB(d.Client(), d.Table(t, "hotcount"), m), m
		},
		"bolt": func(t *testing.T) (counter, *store.Metrics) {
			m := store.NewMetrics(prometheus.NewRegistry())
			b, err := store.OpenBolt(t.TempDir(), m)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { b.Close() })
			return b, m
		},
	}
}

// TestConformance runs the same semantics against both stores: atomic adds
// under concurrency, gathers in shard order with zeros for unwritten shards,
// updatedAt in Unix ms, unknown topics as zeros, topics that share a prefix
// kept apart.
func TestConformance(t *testing.T) {
	for name, open := range stores(t) {
		t.Run(name, func(t *testing.T) {
			st, m := open(t)
			ctx := context.Background()
			if err := st.Ping(ctx); err != nil {
				t.Fatalf("Ping: %v", err)
			}
			now := time.UnixMilli(1796198815543)

			// 8 goroutines × 25 adds of 3 to shard 1, and one add to shard 3.
			var wg sync.WaitGroup
			for range 8 {
				wg.Go(func() {
					w := testenv.Writer() // a sidecar of its own
					for range 25 {
						if err := st.Add(ctx, w("golang", 1, 3), now); err != nil {
							t.Errorf("Add: %v", err)
						}
					}
				})
			}
			wg.Wait()
			if err := st.Add(ctx, testenv.W("golang", 3, 7), now.Add(time.Second)); err != nil {
				t.Fatal(err)
			}
			if err := st.Add(ctx, testenv.W("golang.eu", 1, 100), now); err != nil {
				t.Fatal(err)
			}

			got, err := st.Gather(ctx, "golang", 4, false)
			if err != nil {
				t.Fatal(err)
			}
			want := []schema.Shard{
				{Shard: 0},
				{Shard: 1, Count: 600, UpdatedAt: now.UnixMilli()},
				{Shard: 2},
				{Shard: 3, Count: 7, UpdatedAt: now.Add(time.Second).UnixMilli()},
			}
			if fmt.Sprint(got) != fmt.Sprint(want) {
				t.Errorf("Gather(golang) = %v, want %v", got, want)
			}
			if sum, sat := schema.Sum(got); sum != 607 || sat {
				t.Errorf("Sum = %d, %v; want 607, false", sum, sat)
			}

			unknown, err := st.Gather(ctx, "nobody-said-this", 4, true)
			if err != nil {
				t.Fatal(err)
			}
			if sum, _ := schema.Sum(unknown); sum != 0 || len(unknown) != 4 {
				t.Errorf("unknown topic: %v, want 4 zero shards", unknown)
			}

			if w := testutil.ToFloat64(m.Writes()); w != 202 {
				t.Errorf("writes metric = %v, want 202", w)
			}
			if r := testutil.ToFloat64(m.Reads()); r != 10 {
				t.Errorf("reads metric = %v, want 10 (two gathers of 4 shards and the metadata item)", r)
			}
		})
	}
}

// TestRawItemShape reads an item back from dynalite without the store, to
// pin the data model others (dashboards, migrations) rely on.
func TestRawItemShape(t *testing.T) {
	d := testenv.StartDynalite(t)
	table := d.Table(t, "raw")
	st := store.NewDynamoDB(d.Client(), table, store.NewMetrics(prometheus.NewRegistry()))
	ctx := context.Background()
	now := time.UnixMilli(1796198815543)
	var last store.Write
	for _, delta := range []int64{5, 37} {
		last = testenv.W("eu.west.k8s", 2, delta)
		if err := st.Add(ctx, last, now); err != nil {
			t.Fatal(err)
		}
	}
	out, err := d.Client().GetItem(ctx, &dynamodb.GetItemInput{
		TableName: aws.String(table),
		Key:       map[string]types.AttributeValue{"pk": &types.AttributeValueMemberS{Value: "TREND#eu.west.k8s#2"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	// The writer's mark: its last seq on the item (see store.Write).
	want := map[string]string{"pk": "S:TREND#eu.west.k8s#2", "count": "N:42", "updatedAt": "N:1796198815543",
		"w_" + last.Writer: "N:" + strconv.FormatInt(last.Seq, 10)}
	if len(out.Item) != len(want) {
		t.Errorf("item has %d attributes, want %d: %v", len(out.Item), len(want), out.Item)
	}
	for k, w := range want {
		var got string
		switch v := out.Item[k].(type) {
		case *types.AttributeValueMemberS:
			got = "S:" + v.Value
		case *types.AttributeValueMemberN:
			got = "N:" + v.Value
		default:
			got = fmt.Sprintf("%T", v)
		}
		if got != w {
			t.Errorf("attribute %s = %s, want %s", k, got, w)
		}
	}

	desc, err := d.Client().DescribeTable(ctx, &dynamodb.DescribeTableInput{TableName: aws.String(table)})
	if err != nil {
		t.Fatal(err)
	}
	ks := desc.Table.KeySchema
	if len(ks) != 1 || *ks[0].AttributeName != "pk" || ks[0].KeyType != types.KeyTypeHash {
		t.Errorf("key schema = %+v, want pk HASH only", ks)
	}
}

func TestCreateTableIsIdempotent(t *testing.T) {
	d := testenv.StartDynalite(t)
	ctx := context.Background()
	created, err := store.CreateTable(ctx, d.Client(), "idem")
	if err != nil || !created {
		t.Fatalf("first CreateTable = %v, %v; want true, nil", created, err)
	}
	created, err = store.CreateTable(ctx, d.Client(), "idem")
	if err != nil || created {
		t.Fatalf("second CreateTable = %v, %v; want false, nil", created, err)
	}
}

// TestGatherManyShards covers a read set larger than one BatchGetItem.
func TestGatherManyShards(t *testing.T) {
	d := testenv.StartDynalite(t)
	st := store.NewDynamoDB(d.Client(), d.Table(t, "many"), store.NewMetrics(prometheus.NewRegistry()))
	ctx := context.Background()
	const n = 150
	for _, s := range []int{0, 99, 100, 149} {
		if err := st.Add(ctx, testenv.W("wide", s, int64(s+1)), time.Now()); err != nil {
			t.Fatal(err)
		}
	}
	got, err := st.Gather(ctx, "wide", n, false)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != n {
		t.Fatalf("got %d shards, want %d", len(got), n)
	}
	if sum, _ := schema.Sum(got); sum != 1+100+101+150 {
		t.Errorf("sum = %d, want %d", sum, 1+100+101+150)
	}
}

// TestCountBeyondInt64 plants a count that DynamoDB holds (38 digits) but an
// int64 cannot: the gather fails with a clear error rather than wrap.
func TestCountBeyondInt64(t *testing.T) {
	d := testenv.StartDynalite(t)
	table := d.Table(t, "big")
	st := store.NewDynamoDB(d.Client(), table, store.NewMetrics(prometheus.NewRegistry()))
	ctx := context.Background()
	_, err := d.Client().PutItem(ctx, &dynamodb.PutItemInput{
		TableName: aws.String(table),
		Item: map[string]types.AttributeValue{
			"pk":    &types.AttributeValueMemberS{Value: schema.ShardKey("huge", 0)},
			"count": &types.AttributeValueMemberN{Value: "99999999999999999999"},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Gather(ctx, "huge", 2, false); err == nil {
		t.Fatal("Gather of a count beyond int64 succeeded; want an error")
	}
}

func TestBoltOverflowAndPersistence(t *testing.T) {
	dir := t.TempDir()
	m := store.NewMetrics(prometheus.NewRegistry())
	b, err := store.OpenBolt(dir, m)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := b.Add(ctx, testenv.W("x", 0, math.MaxInt64-1), time.Now()); err != nil {
		t.Fatal(err)
	}
	if err := b.Add(ctx, testenv.W("x", 0, 2), time.Now()); !errors.Is(err, store.ErrOverflow) {
		t.Fatalf("Add past MaxInt64 = %v, want ErrOverflow", err)
	}
	if err := b.Add(ctx, testenv.W("x", 1, 5), time.Now()); err != nil {
		t.Fatal(err)
	}
	b.Close()

	b, err = store.OpenBolt(dir, m)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	got, err := b.Gather(ctx, "x", 2, false)
	if err != nil {
		t.Fatal(err)
	}
	if got[0].Count != math.MaxInt64-1 || got[1].Count != 5 {
		t.Errorf("after reopen: %v, want shard 0 = MaxInt64-1, shard 1 = 5", got)
	}
	if sum, sat := schema.Sum(got); sum != math.MaxInt64 || !sat {
		t.Errorf("Sum = %d, %v; want MaxInt64, saturated", sum, sat)
	}
}

// TestThrottleClassification pins which DynamoDB errors count as throttles,
// the branch the flusher takes to move a write to another shard.
func TestThrottleClassification(t *testing.T) {
	tests := []struct {
		code      string
		throttled bool
	}{
		{"ProvisionedThroughputExceededException", true},
		{"ThrottlingException", true},
		{"RequestLimitExceeded", true},
		{"ReplicatedWriteConflictException", true}, // MRSC: refused, not applied
		{"ValidationException", false},
		{"InternalServerError", false},
	}
	for _, tt := range tests {
		err := store.Classify(&smithy.GenericAPIError{Code: tt.code, Message: "x"})
		if got := errors.Is(err, store.ErrThrottled); got != tt.throttled {
			t.Errorf("%s: throttled = %v, want %v", tt.code, got, tt.throttled)
		}
	}
}

// FuzzValidateTopic: no topic panics the check, and every accepted topic is
// non-empty, within the limit, valid UTF-8 and free of control characters.
func FuzzValidateTopic(f *testing.F) {
	for _, s := range []string{"golang", "eu.west.k8s", "", "a\x00b", "a\xffb", "café", "\u0085", strings.Repeat("x", 300)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, topic string) {
		if schema.ValidateTopic(topic, 256) != nil {
			return
		}
		if topic == "" || len(topic) > 256 || !utf8.ValidString(topic) {
			t.Fatalf("accepted %q", topic)
		}
		for _, r := range topic {
			if unicode.IsControl(r) {
				t.Fatalf("accepted %q with control character %U", topic, r)
			}
		}
	})
}

// describeCounting is the real client, counting DescribeTable calls.
type describeCounting struct {
	store.DynamoAPI
	n atomic.Int64
}

func (c *describeCounting) DescribeTable(ctx context.Context, in *dynamodb.DescribeTableInput, opts ...func(*dynamodb.Options)) (*dynamodb.DescribeTableOutput, error) {
	c.n.Add(1)
	return c.DynamoAPI.DescribeTable(ctx, in, opts...)
}

// TestPingTrustsRecentCalls: readiness asks DescribeTable only when no call
// has succeeded lately, and reports a missing table.
func TestPingTrustsRecentCalls(t *testing.T) {
	d := testenv.StartDynalite(t)
	client := &describeCounting{DynamoAPI: d.Client()}
	st := store.NewDynamoDB(client, d.Table(t, "ping"), store.NewMetrics(prometheus.NewRegistry()))
	ctx := context.Background()
	if err := st.Ping(ctx); err != nil || client.n.Load() != 1 {
		t.Fatalf("first Ping = %v after %d DescribeTable calls, want nil after 1", err, client.n.Load())
	}
	if err := st.Add(ctx, testenv.W("x", 0, 1), time.Now()); err != nil {
		t.Fatal(err)
	}
	for range 10 {
		if err := st.Ping(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if n := client.n.Load(); n != 1 {
		t.Errorf("%d DescribeTable calls, want none after a recent success", n)
	}
	missing := store.NewDynamoDB(d.Client(), "no-such-table", store.NewMetrics(prometheus.NewRegistry()))
	if err := missing.Ping(ctx); err == nil {
		t.Error("Ping of a missing table succeeded")
	}
}

// TestShardMetadata, on both stores: a topic without metadata has one
// shard; metadata changes are conditional on what was read (racing writers
// agree); the read set never shrinks; and a gather follows the metadata
// past the caller's guess, so no count is outside the sum.
func TestShardMetadata(t *testing.T) {
	for name, open := range stores(t) {
		t.Run(name, func(t *testing.T) {
			st, _ := open(t)
			ms := st.(interface {
				Metas(ctx context.Context, topics []string) (map[string]schema.Meta, error)
				SetMeta(ctx context.Context, topic string, old, m schema.Meta) error
			})
			ctx := context.Background()
			got, err := ms.Metas(ctx, []string{"hot"})
			if err != nil || got["hot"].Exists() || got["hot"].Read() != 1 {
				t.Fatalf("Metas of a new topic = %v, %v; want none (one shard)", got, err)
			}
			two := schema.Meta{}.With(2)
			if err := ms.SetMeta(ctx, "hot", schema.Meta{}, two); err != nil {
				t.Fatal(err)
			}
			// A second writer that also read "no metadata" loses the race.
			if err := ms.SetMeta(ctx, "hot", schema.Meta{}, schema.Meta{}.With(4)); !errors.Is(err, store.ErrConflict) {
				t.Fatalf("racing SetMeta = %v, want ErrConflict", err)
			}
			eight := two.With(8)
			if err := ms.SetMeta(ctx, "hot", two, eight); err != nil {
				t.Fatal(err)
			}
			down := eight.With(2)
			if down.Write() != 2 || down.Read() != 8 {
				t.Fatalf("lowering to 2: %+v, want writes on 2, reads of 8", down)
			}
			if err := ms.SetMeta(ctx, "hot", eight, down); err != nil {
				t.Fatal(err)
			}
			if err := st.Add(ctx, testenv.W("hot", 6, 5), time.Now()); err != nil { // written while it had 8
				t.Fatal(err)
			}
			if err := st.Add(ctx, testenv.W("hot", 1, 2), time.Now()); err != nil {
				t.Fatal(err)
			}
			shards, err := st.Gather(ctx, "hot", 1, false) // guess: one shard
			if err != nil {
				t.Fatal(err)
			}
			if sum, _ := schema.Sum(shards); sum != 7 || len(shards) != 8 {
				t.Errorf("gather = %v: want 8 shards summing to 7", shards)
			}
			got, err = ms.Metas(ctx, []string{"hot"})
			if err != nil || got["hot"] != down {
				t.Errorf("Metas = %v, %v; want %+v", got, err, down)
			}
		})
	}
}

// TestBoltGroupsConcurrentWrites: many writes at once share transactions,
// and one that fails (an overflow) fails alone: every other is applied
// exactly once. After Close a write is refused, not left waiting.
func TestBoltGroupsConcurrentWrites(t *testing.T) {
	b, err := store.OpenBolt(t.TempDir(), store.NewMetrics(prometheus.NewRegistry()))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := b.Add(ctx, testenv.W("full", 0, math.MaxInt64), time.Now()); err != nil {
		t.Fatal(err)
	}
	const writers, each = 64, 50
	var wg sync.WaitGroup
	var overflows atomic.Int64
	for w := range writers {
		wg.Go(func() {
			write := testenv.Writer() // a writer's seqs rise per item: one each
			for i := range each {
				if w == 7 && i == 25 {
					if err := b.Add(ctx, testenv.W("full", 0, 1), time.Now()); errors.Is(err, store.ErrOverflow) {
						overflows.Add(1)
					} else {
						t.Errorf("overflowing write = %v, want ErrOverflow", err)
					}
				}
				if err := b.Add(ctx, write("t"+strconv.Itoa(i%10), w%4, 1), time.Now()); err != nil {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	if overflows.Load() != 1 {
		t.Errorf("%d overflows, want 1", overflows.Load())
	}
	var total int64
	for i := range 10 {
		shards, err := b.Gather(ctx, "t"+strconv.Itoa(i), 4, true)
		if err != nil {
			t.Fatal(err)
		}
		sum, _ := schema.Sum(shards)
		total += sum
	}
	if total != writers*each {
		t.Errorf("stored %d, want %d: a write was lost or applied twice", total, writers*each)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- b.Add(ctx, testenv.W("late", 0, 1), time.Now()) }()
	select {
	case err := <-done:
		if err == nil {
			t.Error("a write after Close succeeded")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a write after Close is still waiting")
	}
}

// TestBoltCloseTwice: a second Close returns, as bbolt's own does.
func TestBoltCloseTwice(t *testing.T) {
	b, err := store.OpenBolt(t.TempDir(), store.NewMetrics(prometheus.NewRegistry()))
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	_ = b.Close() // bbolt may say it is closed; it must not panic or hang
}
