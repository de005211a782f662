package store_test

import (
	"context"
	"encoding/binary"
	"errors"
	"math"
	"math/big"
	"reflect"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

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

// epoch1 and epoch2 are two creations of one stream, in Unix microseconds.
const (
	epoch1 = 1_796_198_815_543_000
	epoch2 = epoch1 + 3_600_000_000
)

func TestPositionEncoding(t *testing.T) {
	const maxEpoch = 999_999_999_999_999_999
	ordered := []store.Position{
		{0, 0}, {0, 1}, {0, math.MaxUint64},
		{1, 0}, {1, 1},
		{epoch1, 0}, {epoch1, 1}, {epoch1, 99}, {epoch1, 100}, {epoch1, 1 << 53}, {epoch1, 1<<53 + 1}, {epoch1, math.MaxUint64 - 1}, {epoch1, math.MaxUint64},
		{epoch1 + 1, 0},
		{epoch2, 7},
		{maxEpoch, math.MaxUint64},
	}
	var prev *big.Int
	for _, p := range ordered {
		s := store.EncodePosition(p)
		if len(s) > 38 {
			t.Errorf("%+v encodes to %d digits, over DynamoDB's 38", p, len(s))
		}
		got, err := store.DecodePosition(s)
		if err != nil || got != p {
			t.Errorf("DecodePosition(%s) = %+v, %v; want %+v", s, got, err, p)
		}
		n, ok := new(big.Int).SetString(s, 10)
		if !ok {
			t.Fatalf("%+v encodes to %q, not a decimal integer", p, s)
		}
		if prev != nil && prev.Cmp(n) >= 0 {
			t.Errorf("%+v encodes to %s, not above the position before it (%s)", p, s, prev)
		}
		prev = n
	}
	if got := store.EncodePosition(store.Position{Epoch: epoch1, Seq: 42}); got != "179619881554300000000000000000000042" {
		t.Errorf("EncodePosition = %s, want the epoch then 20 digits of seq", got)
	}
}

func TestPositionDecodingForms(t *testing.T) {
	// DynamoDB may hand a number back in another form than it was sent.
	for in, want := range map[string]store.Position{
		"1.7E+35":               {Epoch: 1_700_000_000_000_000, Seq: 0},
		"17e34":                 {Epoch: 1_700_000_000_000_000, Seq: 0},
		"0":                     {},
		"100000000000000000005": {Epoch: 1, Seq: 5},
	} {
		if got, err := store.DecodePosition(in); err != nil || got != want {
			t.Errorf("DecodePosition(%s) = %+v, %v; want %+v", in, got, err, want)
		}
	}
	for _, bad := range []string{
		"", "x", "-1", "1.5",
		"18446744073709551616",                     // seq 2^64
		"99999999999999999999",                     // seq below 10^20 but past 2^64
		"1000000000000000000000000000000000000000", // epoch 10^19: 40 digits
	} {
		if p, err := store.DecodePosition(bad); err == nil {
			t.Errorf("DecodePosition(%q) = %+v, want an error", bad, p)
		}
	}
}

// TestRefusalPosition: where DynamoDB returns the refused item with its
// ConditionalCheckFailedException (ReturnValuesOnConditionCheckFailure),
// the position and count come from it; absent, the store reads them.
func TestRefusalPosition(t *testing.T) {
	pos := store.Position{Epoch: epoch1, Seq: 12}
	item := map[string]types.AttributeValue{
		schema.AttrPK:                              &types.AttributeValueMemberS{Value: "TREND#golang#0"},
		schema.AttrCount:                           &types.AttributeValueMemberN{Value: "41"},
		store.PositionAttr("MENTIONS-3", epoch1):   &types.AttributeValueMemberN{Value: store.EncodePosition(pos)},
		store.PositionAttr("MENTIONS-30", epoch2):  &types.AttributeValueMemberN{Value: store.EncodePosition(store.Position{Epoch: epoch2, Seq: 1})},
		store.MarkPrefix + "abcdefgh":              &types.AttributeValueMemberN{Value: "1796198815543000"},
		store.PositionAttr("NOT-A-NUMBER", epoch1): &types.AttributeValueMemberS{Value: "12"},
	}
	cond := &types.ConditionalCheckFailedException{Message: aws.String("The conditional request failed"), Item: item}

	p, has, count, returned, err := store.RefusalPosition(cond, "MENTIONS-3", epoch1)
	if err != nil || !returned || !has || p != pos || count != 41 {
		t.Errorf("RefusalPosition = %+v, has %v, count %d, returned %v, %v; want %+v, true, 41, true", p, has, count, returned, err, pos)
	}
	if p, has, _, returned, err := store.RefusalPosition(cond, "MENTIONS-4", epoch1); err != nil || !returned || has {
		t.Errorf("another stream: %+v, has %v, returned %v, %v; want no position", p, has, returned, err)
	}
	if p, has, _, _, err := store.RefusalPosition(cond, "MENTIONS-3", epoch2); err != nil || has {
		t.Errorf("another creation of the stream: %+v, has %v, %v; want no position", p, has, err)
	}
	if _, _, _, _, err := store.RefusalPosition(cond, "NOT-A-NUMBER", epoch1); err == nil || !strings.Contains(err.Error(), "not a number") {
		t.Errorf("a position of the wrong type: %v, want an error", err)
	}
	if _, _, _, returned, err := store.RefusalPosition(&types.ConditionalCheckFailedException{}, "MENTIONS-3", epoch1); returned || err != nil {
		t.Errorf("a refusal without its item: returned %v, %v; want false (read it)", returned, err)
	}
}

// spanStore is what the span tests exercise in a store.
type spanStore interface {
	Add(ctx context.Context, w store.Write, now time.Time) error
	Gather(ctx context.Context, topic string, n int, consistent bool) ([]schema.Shard, error)
	Position(ctx context.Context, key, stream string, epoch int64) (store.Position, bool, error)
	Records(ctx context.Context, keys []string) (map[string][]store.Record, error)
}

// spanHarness is one store under test, its metrics, the size of one of
// its items as its backend bills it, and how many refusals it settled by
// a read of the item.
type spanHarness struct {
	st       spanStore
	m        *store.Metrics
	itemSize func(t *testing.T, key string) int
	reads    *atomic.Int64 // nil: not counted (bolt)
}

// spanStores: DynamoDB on dynalite (which returns no item with a refusal:
// the store reads it), DynamoDB on dynalite with the refused item handed
// back as DynamoDB does, and bolt.
func spanStores() map[string]func(t *testing.T) spanHarness {
	dynamo := func(t *testing.T, returnItem bool) spanHarness {
		d := testenv.StartDynalite(t)
		table := d.Table(t, "spans")
		client := &refusalItems{DynamoAPI: d.Client(), returnItem: returnItem}
		m := store.NewMetrics(prometheus.NewRegistry())
		size := func(t *testing.T, key string) int {
			out, err := d.Client().GetItem(context.Background(), &dynamodb.GetItemInput{
				TableName:      &table,
				Key:            map[string]types.AttributeValue{schema.AttrPK: &types.AttributeValueMemberS{Value: key}},
				ConsistentRead: aws.Bool(true),
			})
			if err != nil {
				t.Fatal(err)
			}
			return store.ItemSize(out.Item)
		}
		return spanHarness{st: store.NewDynamoDB(client, table, m), m: m, itemSize: size, reads: &client.reads}
	}
	return map[string]func(t *testing.T) spanHarness{
		"dynamodb":             func(t *testing.T) spanHarness { return dynamo(t, false) },
		"dynamodb-item-in-409": func(t *testing.T) spanHarness { return dynamo(t, true) },
		"bolt": func(t *testing.T) spanHarness {
			m := store.NewMetrics(prometheus.NewRegistry())
			b, err := store.OpenBolt(t.TempDir(), m)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { b.Close() })
			size := func(t *testing.T, key string) int {
				n, err := store.BoltItemSize(b, key)
				if err != nil {
					t.Fatal(err)
				}
				return n
			}
			return spanHarness{st: b, m: m, itemSize: size}
		},
	}
}

// refusalItems stands between the store and dynalite. It counts the
// store's reads of single items, and with returnItem, hands a refused
// UpdateItem's item back in its ConditionalCheckFailedException, as
// DynamoDB does under ReturnValuesOnConditionCheckFailure ALL_OLD and
// dynalite 4.0.0 does not.
type refusalItems struct {
	store.DynamoAPI
	returnItem bool
	reads      atomic.Int64
}

func (r *refusalItems) UpdateItem(ctx context.Context, in *dynamodb.UpdateItemInput, opts ...func(*dynamodb.Options)) (*dynamodb.UpdateItemOutput, error) {
	out, err := r.DynamoAPI.UpdateItem(ctx, in, opts...)
	var cond *types.ConditionalCheckFailedException
	if r.returnItem && errors.As(err, &cond) && cond.Item == nil && in.ReturnValuesOnConditionCheckFailure == types.ReturnValuesOnConditionCheckFailureAllOld {
		got, gerr := r.DynamoAPI.GetItem(ctx, &dynamodb.GetItemInput{TableName: in.TableName, Key: in.Key, ConsistentRead: aws.Bool(true)})
		if gerr != nil {
			return nil, gerr
		}
		cond.Item = got.Item
	}
	return out, err
}

func (r *refusalItems) GetItem(ctx context.Context, in *dynamodb.GetItemInput, opts ...func(*dynamodb.Options)) (*dynamodb.GetItemOutput, error) {
	r.reads.Add(1)
	return r.DynamoAPI.GetItem(ctx, in, opts...)
}

// spanWrite is a write of delta to shard 0 of topic's total covering span.
func spanWrite(topic string, delta int64, stream string, epoch int64, first, last uint64) store.Write {
	return store.Write{Counter: schema.TotalOf(topic), Delta: delta, Span: &store.Span{Stream: stream, Epoch: epoch, First: first, Last: last}}
}

// TestSpanWrites: both stores apply a span write once, past the recorded
// position only, and tell a write covered from one that overlaps.
func TestSpanWrites(t *testing.T) {
	for name, open := range spanStores() {
		t.Run(name, func(t *testing.T) {
			h := open(t)
			ctx := context.Background()
			key := schema.ShardKey("spans", 0)
			var refusalReads int64 // reads of the item inside Add
			add := func(w store.Write) error {
				if h.reads == nil {
					return h.st.Add(ctx, w, time.Now())
				}
				before := h.reads.Load()
				defer func() { refusalReads += h.reads.Load() - before }()
				return h.st.Add(ctx, w, time.Now())
			}
			count := func() int64 {
				t.Helper()
				got, err := h.st.Gather(ctx, "spans", 1, true)
				if err != nil {
					t.Fatal(err)
				}
				return got[0].Count
			}
			position := func(stream string, want store.Position) {
				t.Helper()
				got, has, err := h.st.Position(ctx, key, stream, want.Epoch)
				if err != nil || !has || got != want {
					t.Errorf("Position(%s) = %+v, %v, %v; want %+v", stream, got, has, err, want)
				}
			}
			covered := func(w store.Write, wantCount int64) {
				t.Helper()
				if err := add(w); !errors.Is(err, store.ErrCovered) {
					t.Errorf("write of %+v = %v, want ErrCovered", *w.Span, err)
				}
				if got := count(); got != wantCount {
					t.Errorf("count %d after a covered write, want %d", got, wantCount)
				}
			}
			overlap := func(w store.Write, recorded uint64, wantCount int64) {
				t.Helper()
				var o *store.OverlapError
				err := add(w)
				if !errors.As(err, &o) || o.Recorded != (store.Position{Epoch: w.Span.Epoch, Seq: recorded}) {
					t.Errorf("write of %+v = %v, want an OverlapError at %d", *w.Span, err, recorded)
				}
				if got := count(); got != wantCount {
					t.Errorf("count %d after an overlapping write, want %d", got, wantCount)
				}
			}

			// A first write applies; sent again, it is covered.
			first := spanWrite("spans", 5, "MENTIONS-3", epoch1, 1, 10)
			if err := add(first); err != nil {
				t.Fatalf("first write: %v", err)
			}
			position("MENTIONS-3", store.Position{Epoch: epoch1, Seq: 10})
			covered(first, 5)
			covered(spanWrite("spans", 1, "MENTIONS-3", epoch1, 3, 9), 5)

			// First at or below the recorded position, Last past it.
			overlap(spanWrite("spans", 3, "MENTIONS-3", epoch1, 5, 15), 10, 5)
			overlap(spanWrite("spans", 3, "MENTIONS-3", epoch1, 10, 15), 10, 5)
			position("MENTIONS-3", store.Position{Epoch: epoch1, Seq: 10})

			// The following writes apply and move the position.
			if err := add(spanWrite("spans", 4, "MENTIONS-3", epoch1, 11, 20)); err != nil {
				t.Fatalf("following write: %v", err)
			}
			if err := add(spanWrite("spans", 2, "MENTIONS-3", epoch1, 21, 21)); err != nil {
				t.Fatalf("write of one position: %v", err)
			}
			position("MENTIONS-3", store.Position{Epoch: epoch1, Seq: 21})
			if got := count(); got != 11 {
				t.Errorf("count %d, want 11", got)
			}

			// The stream created again: its new epoch applies from 1, and
			// the old one's writes still in flight apply against the old
			// creation's position, once: neither judges the other.
			if err := add(spanWrite("spans", 7, "MENTIONS-3", epoch2, 1, 3)); err != nil {
				t.Fatalf("write of a newer epoch: %v", err)
			}
			position("MENTIONS-3", store.Position{Epoch: epoch2, Seq: 3})
			if err := add(spanWrite("spans", 1, "MENTIONS-3", epoch1, 22, 30)); err != nil {
				t.Fatalf("the old creation's write after the new one's: %v", err)
			}
			position("MENTIONS-3", store.Position{Epoch: epoch1, Seq: 30})
			covered(spanWrite("spans", 1, "MENTIONS-3", epoch1, 22, 30), 19)

			// Another stream on the same item keeps its own position.
			if err := add(spanWrite("spans", 6, "MENTIONS-30", epoch1, 1, 4)); err != nil {
				t.Fatalf("write of a second stream: %v", err)
			}
			position("MENTIONS-30", store.Position{Epoch: epoch1, Seq: 4})
			position("MENTIONS-3", store.Position{Epoch: epoch2, Seq: 3})
			covered(spanWrite("spans", 1, "MENTIONS-30", epoch1, 2, 4), 25)
			if err := add(spanWrite("spans", 1, "MENTIONS-3", epoch2, 4, 5)); err != nil {
				t.Fatalf("the first stream after the second: %v", err)
			}
			position("MENTIONS-30", store.Position{Epoch: epoch1, Seq: 4})
			if _, has, err := h.st.Position(ctx, key, "MENTIONS-4", epoch1); has || err != nil {
				t.Errorf("Position of a stream never written: has %v, %v", has, err)
			}
			if got := count(); got != 26 {
				t.Errorf("count %d, want 26", got)
			}
			// The audit reads the count and every position in one read.
			recs, err := h.st.Records(ctx, []string{key, schema.ShardKey("spans", 1)})
			if err != nil {
				t.Fatal(err)
			}
			wantRec := store.Record{Count: 26, Positions: map[store.Slot]uint64{
				{Stream: "MENTIONS-3", Epoch: epoch1}: 30, {Stream: "MENTIONS-3", Epoch: epoch2}: 5, {Stream: "MENTIONS-30", Epoch: epoch1}: 4,
			}}
			if got := recs[key]; len(got) != 1 || !reflect.DeepEqual(got[0], wantRec) {
				t.Errorf("Records(%s) = %+v, want [%+v]", key, got, wantRec)
			}
			if got, ok := recs[schema.ShardKey("spans", 1)]; !ok || len(got) != 0 {
				t.Errorf("Records of an item never written = %+v, %v; want an empty entry", got, ok)
			}

			// Whether a refusal cost a read: only where the endpoint
			// returns no item with it.
			if h.reads != nil {
				if want := map[bool]int64{true: 0, false: 6}[name == "dynamodb-item-in-409"]; refusalReads != want {
					t.Errorf("%d reads to settle 6 refusals, want %d", refusalReads, want)
				}
			}
		})
	}
}

// TestSpanRetrySettles: a write in doubt sent again settles as applied
// when it is covered, as not applied when it applies.
func TestSpanRetrySettles(t *testing.T) {
	for name, open := range spanStores() {
		t.Run(name, func(t *testing.T) {
			h := open(t)
			ctx := context.Background()
			w := spanWrite("retried", 3, "MENTIONS-0", epoch1, 1, 2)
			w.Retry = true
			if err := h.st.Add(ctx, w, time.Now()); err != nil {
				t.Fatalf("retry that applies: %v", err)
			}
			if err := h.st.Add(ctx, w, time.Now()); !errors.Is(err, store.ErrCovered) {
				t.Fatalf("retry of an applied write: %v, want ErrCovered", err)
			}
			if a, n := h.m.Resolved(store.ResolvedApplied), h.m.Resolved(store.ResolvedNotApplied); a != 1 || n != 1 {
				t.Errorf("resolved applied %v, not_applied %v; want 1 and 1", a, n)
			}
			if w := testutil.ToFloat64(h.m.Writes()); w != 2 {
				t.Errorf("writes metric %v, want 2", w)
			}
		})
	}
}

// TestSpanRefusedForGood: an increment past int64 is ErrOverflow and
// changes nothing, position included; a span no item can record is
// ErrDenied.
func TestSpanRefusedForGood(t *testing.T) {
	for name, open := range spanStores() {
		t.Run(name, func(t *testing.T) {
			h := open(t)
			ctx := context.Background()
			if err := h.st.Add(ctx, spanWrite("full", 2, "MENTIONS-1", epoch1, 1, 1), time.Now()); err != nil {
				t.Fatal(err)
			}
			err := h.st.Add(ctx, spanWrite("full", math.MaxInt64-1, "MENTIONS-1", epoch1, 2, 2), time.Now())
			if !errors.Is(err, store.ErrOverflow) {
				t.Fatalf("increment past int64 = %v, want ErrOverflow", err)
			}
			if p, _, err := h.st.Position(ctx, schema.ShardKey("full", 0), "MENTIONS-1", epoch1); err != nil || p.Seq != 1 {
				t.Errorf("position %+v (%v) after the overflow, want seq 1", p, err)
			}
			if err := h.st.Add(ctx, spanWrite("full", math.MaxInt64-2, "MENTIONS-1", epoch1, 2, 2), time.Now()); err != nil {
				t.Errorf("increment to math.MaxInt64: %v", err)
			}
			for _, bad := range []store.Write{
				spanWrite("full", 1, "MENTIONS-1", epoch1, 0, 3),
				spanWrite("full", 1, "MENTIONS-1", epoch1, 5, 4),
				spanWrite("full", 1, "MENTIONS 1", epoch1, 5, 5),
				spanWrite("full", 1, "", epoch1, 5, 5),
				spanWrite("full", 1, "MENTIONS-1", -1, 5, 5),
			} {
				if err := h.st.Add(ctx, bad, time.Now()); !errors.Is(err, store.ErrDenied) {
					t.Errorf("span %+v: %v, want ErrDenied", *bad.Span, err)
				}
			}
		})
	}
}

// TestSpanItemSize: an item written through several streams, at the
// largest positions, stays one write unit with room to spare.
func TestSpanItemSize(t *testing.T) {
	for name, open := range spanStores() {
		t.Run(name, func(t *testing.T) {
			h := open(t)
			ctx := context.Background()
			key := schema.ShardKey("sized", 0)
			one := 0
			for i, stream := range []string{"MENTIONS-3", "MENTIONS-17", "MENTIONS-123"} {
				if err := h.st.Add(ctx, spanWrite("sized", 1, stream, epoch2, 1, math.MaxUint64), time.Now()); err != nil {
					t.Fatal(err)
				}
				if i == 0 {
					one = h.itemSize(t, key)
				}
			}
			all := h.itemSize(t, key)
			t.Logf("item of one stream: %d bytes; of three: %d bytes", one, all)
			if one > 100 || all > 200 {
				t.Errorf("item is %d bytes with one stream, %d with three; want at most 100 and 200 (1 KB is one write unit)", one, all)
			}
		})
	}
}

// TestSpanBesideMarks: span writes and marked writes share an item, in
// both stores, each with its own bookkeeping.
func TestSpanBesideMarks(t *testing.T) {
	for name, open := range spanStores() {
		t.Run(name, func(t *testing.T) {
			h := open(t)
			ctx := context.Background()
			marked := testenv.W("both", 0, 2)
			for _, w := range []store.Write{marked, spanWrite("both", 3, "MENTIONS-1", epoch1, 1, 5)} {
				if err := h.st.Add(ctx, w, time.Now()); err != nil {
					t.Fatal(err)
				}
			}
			marked.Retry = true
			if err := h.st.Add(ctx, marked, time.Now()); err != nil {
				t.Fatalf("the marked write again: %v", err)
			}
			if err := h.st.Add(ctx, spanWrite("both", 3, "MENTIONS-1", epoch1, 1, 5), time.Now()); !errors.Is(err, store.ErrCovered) {
				t.Fatalf("the span write again: %v, want ErrCovered", err)
			}
			if err := h.st.Add(ctx, testenv.W("both", 0, 4), time.Now()); err != nil {
				t.Fatal(err)
			}
			got, err := h.st.Gather(ctx, "both", 1, true)
			if err != nil || got[0].Count != 9 {
				t.Errorf("count %v (%v), want 9", got, err)
			}
			if p, has, err := h.st.Position(ctx, schema.ShardKey("both", 0), "MENTIONS-1", epoch1); err != nil || !has || p.Seq != 5 {
				t.Errorf("position %+v, %v, %v after a marked write; want seq 5", p, has, err)
			}
		})
	}
}

// fakeRefusals is a DynamoDB that refuses the first refuse span writes
// with item (nil: none, for the store to read), then applies them; its
// reads answer readErr.
type fakeRefusals struct {
	store.DynamoAPI
	refuse  int
	item    map[string]types.AttributeValue
	readErr error
	updates int
}

func (f *fakeRefusals) UpdateItem(ctx context.Context, in *dynamodb.UpdateItemInput, opts ...func(*dynamodb.Options)) (*dynamodb.UpdateItemOutput, error) {
	f.updates++
	if f.updates <= f.refuse {
		return nil, &types.ConditionalCheckFailedException{Message: aws.String("The conditional request failed"), Item: f.item}
	}
	return &dynamodb.UpdateItemOutput{}, nil
}

func (f *fakeRefusals) GetItem(ctx context.Context, in *dynamodb.GetItemInput, opts ...func(*dynamodb.Options)) (*dynamodb.GetItemOutput, error) {
	return &dynamodb.GetItemOutput{Item: f.item}, f.readErr
}

// TestSpanRefusedThenAllowed: a refusal whose item allows the write (it
// changed in between: deleted by its TTL) applied nothing, so the store
// sends the write again, a bounded number of times.
func TestSpanRefusedThenAllowed(t *testing.T) {
	allowing := map[string]types.AttributeValue{schema.AttrCount: &types.AttributeValueMemberN{Value: "3"}}
	w := spanWrite("changing", 1, "MENTIONS-1", epoch1, 1, 1)
	for _, tc := range []struct {
		name   string
		refuse int
		ok     bool
	}{{"once", 1, true}, {"twice", 2, true}, {"always", 100, false}} {
		t.Run(tc.name, func(t *testing.T) {
			f := &fakeRefusals{refuse: tc.refuse, item: allowing}
			m := store.NewMetrics(prometheus.NewRegistry())
			err := store.NewDynamoDB(f, "t", m).Add(context.Background(), w, time.Now())
			switch {
			case tc.ok && err != nil:
				t.Errorf("Add = %v after %d refusals, want nil", err, tc.refuse)
			case !tc.ok && (err == nil || errors.Is(err, store.ErrAmbiguous) || errors.Is(err, store.ErrCovered)):
				t.Errorf("Add = %v, want a plain error (nothing applied)", err)
			}
			if want := min(tc.refuse+1, 3); f.updates != want || testutil.ToFloat64(m.Writes()) != float64(want) {
				t.Errorf("%d sends, writes metric %v; want %d", f.updates, testutil.ToFloat64(m.Writes()), want)
			}
			t.Logf("Add = %v", err)
		})
	}
}

// TestSpanRefusalReadFails: a refusal the store cannot read (the read is
// throttled) leaves the write in doubt, never "throttled": a throttle
// would let the caller move a delta that may be in the item elsewhere.
func TestSpanRefusalReadFails(t *testing.T) {
	f := &fakeRefusals{refuse: 1, readErr: &smithy.GenericAPIError{Code: "ThrottlingException", Fault: smithy.FaultClient}}
	err := store.NewDynamoDB(f, "t", store.NewMetrics(prometheus.NewRegistry())).
		Add(context.Background(), spanWrite("unread", 1, "MENTIONS-1", epoch1, 1, 1), time.Now())
	if !errors.Is(err, store.ErrAmbiguous) || errors.Is(err, store.ErrThrottled) {
		t.Errorf("Add = %v, want ErrAmbiguous and not ErrThrottled", err)
	}
}

// TestBoltSpanOnOlderItems: items the embedded store wrote before
// positions (16 bytes; or with a floor and marks) take span writes and
// keep what they had.
func TestBoltSpanOnOlderItems(t *testing.T) {
	b, err := store.OpenBolt(t.TempDir(), store.NewMetrics(prometheus.NewRegistry()))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	ctx := context.Background()
	be := binary.BigEndian
	plain := be.AppendUint64(be.AppendUint64(nil, 7), 1_796_198_815_543)
	marked := be.AppendUint64(slices.Clone(plain), 0)               // floor 0
	marked = be.AppendUint64(append(marked, "\x08abcdefgh"...), 42) // writer abcdefgh's mark at seq 42
	for topic, v := range map[string][]byte{"plain": plain, "marked": marked} {
		if err := store.BoltPut(b, schema.ShardKey(topic, 0), v); err != nil {
			t.Fatal(err)
		}
		if err := b.Add(ctx, spanWrite(topic, 2, "MENTIONS-1", epoch1, 1, 3), time.Now()); err != nil {
			t.Fatalf("%s: span write on an older item: %v", topic, err)
		}
		got, err := b.Gather(ctx, topic, 1, true)
		if err != nil || got[0].Count != 9 {
			t.Errorf("%s: count %v (%v), want 9", topic, got, err)
		}
		if p, has, err := b.Position(ctx, schema.ShardKey(topic, 0), "MENTIONS-1", epoch1); err != nil || !has || p.Seq != 3 {
			t.Errorf("%s: position %+v, %v, %v; want seq 3", topic, p, has, err)
		}
	}
	// The mark survived the span write: its write, replayed, is refused.
	replay := store.Write{Counter: schema.TotalOf("marked"), Delta: 5, Writer: "abcdefgh", Seq: 42, Replay: true}
	if err := b.Add(ctx, replay, time.Now()); err != nil {
		t.Fatalf("replay of the marked write: %v", err)
	}
	if got, _ := b.Gather(ctx, "marked", 1, true); got[0].Count != 9 {
		t.Errorf("count %d after the replay, want 9 (the mark was lost)", got[0].Count)
	}
}
