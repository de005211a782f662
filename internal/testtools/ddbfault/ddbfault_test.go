package ddbfault_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/ratelimit"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/smithy-go"
	smithyhttp "github.com/aws/smithy-go/transport/http"

	"github.com/hotcount/hotcount/internal/testtools/ddbfault"
	"github.com/hotcount/hotcount/internal/testtools/testenv"
	"github.com/hotcount/hotcount/schema"
)

// fixture is dynalite with a table, and a proxy in front of it.
type fixture struct {
	d     *testenv.Dynalite
	table string
	proxy *ddbfault.Proxy
	url   string
	stop  func() error
}

func newFixture(t *testing.T, d *testenv.Dynalite, table string, cfg ddbfault.Config) *fixture {
	t.Helper()
	cfg.Upstream = d.Endpoint
	p := ddbfault.New(cfg)
	url, stop, err := p.Serve("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stop() }) //nolint:errcheck // closing; stop is idempotent
	return &fixture{d: d, table: table, proxy: p, url: url, stop: stop}
}

// client is an SDK client through the proxy, without retries, so that a
// lost answer is the call's error.
func (f *fixture) client() *dynamodb.Client { return testenv.Client(f.url) }

// add is hotcount's counting write, ADD :delta to the key's count.
func add(ctx context.Context, c *dynamodb.Client, table, pk string, delta int64, opts ...func(*dynamodb.Options)) error {
	_, err := c.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName:                 aws.String(table),
		Key:                       map[string]types.AttributeValue{schema.AttrPK: &types.AttributeValueMemberS{Value: pk}},
		UpdateExpression:          aws.String("ADD #count :delta"),
		ExpressionAttributeNames:  map[string]string{"#count": schema.AttrCount},
		ExpressionAttributeValues: map[string]types.AttributeValue{":delta": &types.AttributeValueMemberN{Value: strconv.FormatInt(delta, 10)}},
	}, opts...)
	return err
}

// count reads the key's count with c; a missing item is 0.
func count(t *testing.T, c *dynamodb.Client, table, pk string) int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	out, err := c.GetItem(ctx, &dynamodb.GetItemInput{
		TableName:      aws.String(table),
		Key:            map[string]types.AttributeValue{schema.AttrPK: &types.AttributeValueMemberS{Value: pk}},
		ConsistentRead: aws.Bool(true),
	})
	if err != nil {
		t.Fatalf("GetItem %s: %v", pk, err)
	}
	return testenv.CountOf(t, out.Item)
}

// TestLostAnswers: for each way of losing an answer, the UpdateItem call
// through the proxy fails while dynalite, read directly, has applied it;
// and stop ends a hang in progress at once.
func TestLostAnswers(t *testing.T) {
	d := testenv.StartDynalite(t)
	table := d.Table(t, "faults")
	direct := d.Client()

	t.Run("kinds", func(t *testing.T) {
		f := newFixture(t, d, table, ddbfault.Config{})
		f.proxy.SetHang(5 * time.Second)
		c := f.client()
		for i, kind := range []string{ddbfault.Ambiguous, ddbfault.Ambiguous500, ddbfault.AmbiguousHang} {
			delta := int64(10 + i)
			pk := "lost-" + kind
			f.proxy.LoseAnswers(1, kind)
			ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
			start := time.Now()
			err := add(ctx, c, table, pk, delta)
			took := time.Since(start)
			cancel()
			f.proxy.LoseAnswers(0)
			if err == nil {
				t.Fatalf("%s: UpdateItem succeeded, want the answer lost", kind)
			}
			t.Logf("%s: UpdateItem failed after %v: %v", kind, took.Round(time.Millisecond), err)
			switch kind {
			case ddbfault.Ambiguous500:
				// An answer the SDK reads (CRC32 and all) as DynamoDB's.
				var api smithy.APIError
				if !errors.As(err, &api) || api.ErrorCode() != "InternalServerError" {
					t.Errorf("%s: error %v, want an InternalServerError API error", kind, err)
				}
			case ddbfault.AmbiguousHang:
				if !errors.Is(err, context.DeadlineExceeded) {
					t.Errorf("%s: error %v, want the client's deadline", kind, err)
				}
				if took > 3*time.Second {
					t.Errorf("%s: the call took %v, want its 500ms timeout", kind, took)
				}
				// The client went away: the proxy lets go long before the 5s hang.
				testenv.Eventually(t, 2*time.Second, func() error {
					if n := f.proxy.Hanging(); n != 0 {
						return fmt.Errorf("%d connections still held after the client gave up", n)
					}
					return nil
				})
			}
			if got := count(t, direct, table, pk); got != delta {
				t.Errorf("%s: dynalite has count %d, want %d: the write was to be applied", kind, got, delta)
			}
			st := f.proxy.Stats()
			if st.Did[kind] != 1 {
				t.Errorf("%s: Did[%s] = %d, want 1", kind, kind, st.Did[kind])
			}
			if st.Lost() != i+1 {
				t.Errorf("%s: Lost() = %d, want %d", kind, st.Lost(), i+1)
			}
			if st.Writes[pk] != 1 {
				t.Errorf("%s: Writes[%s] = %d, want 1", kind, pk, st.Writes[pk])
			}
		}
		// Off again: answers come back.
		if err := add(context.Background(), c, table, "lost-off", 1); err != nil {
			t.Fatalf("LoseAnswers(0): %v", err)
		}
		if got := count(t, c, table, "lost-off"); got != 1 {
			t.Errorf("through the proxy: count %d, want 1", got)
		}
		if st := f.proxy.Stats(); st.Lost() != 3 {
			t.Errorf("Lost() = %d after LoseAnswers(0), want 3", st.Lost())
		}
	})

	t.Run("mixed", func(t *testing.T) {
		// No kinds: all three, chosen at random; only UpdateItem loses
		// answers, and every lost write was applied.
		f := newFixture(t, d, table, ddbfault.Config{})
		f.proxy.SetHang(20 * time.Millisecond)
		f.proxy.LoseAnswers(1)
		c := f.client()
		const n, delta = 30, 3
		for i := range n {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			err := add(ctx, c, table, "mixed", delta)
			cancel()
			if err == nil {
				t.Fatalf("call %d: UpdateItem succeeded with LoseAnswers(1)", i)
			}
		}
		if got := count(t, c, table, "mixed"); got != n*delta { // a GetItem through the proxy: answered
			t.Errorf("count %d, want %d", got, n*delta)
		}
		st := f.proxy.Stats()
		t.Logf("did %v", st.Did)
		if st.Lost() != n {
			t.Errorf("Lost() = %d, want %d", st.Lost(), n)
		}
		for _, k := range []string{ddbfault.Ambiguous, ddbfault.Ambiguous500, ddbfault.AmbiguousHang} {
			if st.Did[k] == 0 { // each missing from 30 uniform draws: (2/3)^30
				t.Errorf("no %s among %d lost answers: %v", k, n, st.Did)
			}
		}
	})

	t.Run("throttled first", func(t *testing.T) {
		// The ceiling is decided before the answer is lost: a throttled
		// write is refused, not applied, and not lost.
		f := newFixture(t, d, table, ddbfault.Config{WriteUnits: 0.001, WriteBurst: 1})
		f.proxy.LoseAnswers(1, ddbfault.Ambiguous500)
		c := f.client()
		for range 2 {
			if err := add(context.Background(), c, table, "throttled", 5); err == nil {
				t.Fatal("UpdateItem succeeded")
			}
		}
		st := f.proxy.Stats()
		if st.Did[ddbfault.Ambiguous500] != 1 || st.Did[ddbfault.Throttled] != 1 {
			t.Errorf("did %v; want one lost, one throttled", st.Did)
		}
		if got := count(t, direct, table, "throttled"); got != 5 {
			t.Errorf("count %d, want 5 (the lost write only)", got)
		}
	})

	t.Run("stop during hang", func(t *testing.T) {
		f := newFixture(t, d, table, ddbfault.Config{})
		f.proxy.SetHang(time.Minute)
		f.proxy.LoseAnswers(1, ddbfault.AmbiguousHang)
		errc := make(chan error, 1)
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			errc <- add(ctx, f.client(), table, "stopped", 7)
		}()
		testenv.Eventually(t, 5*time.Second, func() error {
			if f.proxy.Hanging() != 1 {
				return errors.New("no hang in progress yet")
			}
			return nil
		})
		start := time.Now()
		f.stop() //nolint:errcheck // closing
		if took := time.Since(start); took > time.Second {
			t.Errorf("stop took %v with a hang in progress, want under 1s", took)
		}
		if n := f.proxy.Hanging(); n != 0 {
			t.Errorf("%d connections still held after stop", n)
		}
		select {
		case err := <-errc:
			if err == nil {
				t.Error("UpdateItem succeeded, want the answer lost")
			}
		case <-time.After(time.Second):
			t.Error("the client still waits 1s after stop")
		}
		if got := count(t, direct, table, "stopped"); got != 7 {
			t.Errorf("count %d, want 7: the write was to be applied", got)
		}
	})
}

// retrying gives one call the SDK's standard retryer, 3 attempts without
// backoff or retry quota, so that a test sees whether the SDK retries an
// answer (the fixture's client does not retry).
func retrying(o *dynamodb.Options) {
	o.Retryer = retry.NewStandard(func(so *retry.StandardOptions) {
		so.MaxAttempts = 3
		so.Backoff = retry.BackoffDelayerFunc(func(int, error) (time.Duration, error) { return 0, nil })
		so.RateLimiter = ratelimit.None
	})
}

// batchGet reads pks in one BatchGetItem and returns their counts; a
// missing item is absent.
func batchGet(ctx context.Context, c *dynamodb.Client, table string, pks ...string) (map[string]int64, error) {
	keys := make([]map[string]types.AttributeValue, len(pks))
	for i, pk := range pks {
		keys[i] = map[string]types.AttributeValue{schema.AttrPK: &types.AttributeValueMemberS{Value: pk}}
	}
	out, err := c.BatchGetItem(ctx, &dynamodb.BatchGetItemInput{
		RequestItems: map[string]types.KeysAndAttributes{table: {Keys: keys, ConsistentRead: aws.Bool(true)}},
	})
	if err != nil {
		return nil, err
	}
	if n := len(out.UnprocessedKeys); n > 0 {
		return nil, fmt.Errorf("%d tables with unprocessed keys", n)
	}
	got := map[string]int64{}
	for _, item := range out.Responses[table] {
		pk, _ := item[schema.AttrPK].(*types.AttributeValueMemberS)
		n, _ := item[schema.AttrCount].(*types.AttributeValueMemberN)
		if pk == nil || n == nil {
			return nil, fmt.Errorf("item without %s or %s: %v", schema.AttrPK, schema.AttrCount, item)
		}
		v, err := strconv.ParseInt(n.Value, 10, 64)
		if err != nil {
			return nil, err
		}
		got[pk.Value] = v
	}
	return got, nil
}

// wantDenied fails the test unless err is an API error answered with
// HTTP status and error code, as the SDK reads DynamoDB's.
func wantDenied(t *testing.T, what string, err error, status int, code string) {
	t.Helper()
	if err == nil {
		t.Errorf("%s succeeded, want %d %s", what, status, code)
		return
	}
	var api smithy.APIError
	if !errors.As(err, &api) || api.ErrorCode() != code {
		t.Errorf("%s: error %v, want an API error %s", what, err, code)
	}
	var resp *smithyhttp.ResponseError
	if !errors.As(err, &resp) || resp.HTTPStatusCode() != status {
		t.Errorf("%s: error %v, want HTTP status %d", what, err, status)
	}
}

// TestDeny: a denial refuses the writes of one topic's items with a
// definite error, which the SDK neither retries nor the store applies,
// while other topics' writes and (by default) every read pass; Allow ends
// it; Stats counts what it refused.
func TestDeny(t *testing.T) {
	d := testenv.StartDynalite(t)
	table := d.Table(t, "deny")
	direct := d.Client()
	var (
		shard  = schema.ShardKey("news", 0)
		minute = schema.BucketKey("news", schema.Minute, schema.Minute.Index(time.Now()), 1)
		meta   = schema.MetaKey("news")
		other  = schema.ShardKey("sports", 0)
	)

	t.Run("writes", func(t *testing.T) {
		f := newFixture(t, d, table, ddbfault.Config{})
		c := f.client()
		ctx := context.Background()
		// The retrying client does retry what it may: a 500, then the
		// write lands.
		f.proxy.FailNext(1, http.StatusInternalServerError)
		if err := add(ctx, c, table, shard, 5, retrying); err != nil {
			t.Fatalf("UpdateItem after one 500, with retries: %v", err)
		}
		if n := f.proxy.Stats().Did[ddbfault.Failed]; n != 1 {
			t.Fatalf("Did[failed] = %d, want 1: the retryer did not retry", n)
		}
		for _, pk := range []string{minute, other} {
			if err := add(ctx, c, table, pk, 5); err != nil {
				t.Fatalf("UpdateItem %s: %v", pk, err)
			}
		}

		f.proxy.Deny(ddbfault.Denial{Keys: ddbfault.TopicKeys("news"), Status: http.StatusForbidden, Type: "AccessDeniedException"})
		err := add(ctx, c, table, shard, 1, retrying)
		wantDenied(t, "UpdateItem of the denied topic's shard", err, http.StatusForbidden, "AccessDeniedException")
		t.Logf("denied: %v", err)
		if n := f.proxy.Stats().Did[ddbfault.Denied]; n != 1 {
			t.Errorf("Did[denied] = %d after one call with retries, want 1: a denial is not retried", n)
		}
		// Each write of the topic's items: a bucket, its metadata (PutItem),
		// a delete.
		wantDenied(t, "UpdateItem of the denied topic's bucket", add(ctx, c, table, minute, 1), http.StatusForbidden, "AccessDeniedException")
		_, err = c.PutItem(ctx, &dynamodb.PutItemInput{
			TableName: aws.String(table),
			Item: map[string]types.AttributeValue{
				schema.AttrPK:    &types.AttributeValueMemberS{Value: meta},
				schema.AttrCount: &types.AttributeValueMemberN{Value: "8"},
			},
		})
		wantDenied(t, "PutItem of the denied topic's metadata", err, http.StatusForbidden, "AccessDeniedException")
		_, err = c.DeleteItem(ctx, &dynamodb.DeleteItemInput{
			TableName: aws.String(table),
			Key:       map[string]types.AttributeValue{schema.AttrPK: &types.AttributeValueMemberS{Value: shard}},
		})
		wantDenied(t, "DeleteItem of the denied topic's shard", err, http.StatusForbidden, "AccessDeniedException")

		// Meanwhile another topic's write goes through, and reads pass,
		// a BatchGetItem mixing the topics too.
		if err := add(ctx, c, table, other, 1); err != nil {
			t.Errorf("UpdateItem of another topic during the denial: %v", err)
		}
		if got := count(t, c, table, shard); got != 5 {
			t.Errorf("GetItem %s through the proxy: count %d, want 5", shard, got)
		}
		got, err := batchGet(ctx, c, table, shard, minute, other)
		if err != nil {
			t.Errorf("BatchGetItem mixing the topics during a write denial: %v", err)
		} else if want := map[string]int64{shard: 5, minute: 5, other: 6}; !maps.Equal(got, want) {
			t.Errorf("BatchGetItem: %v, want %v", got, want)
		}

		// Nothing of the denied topic changed.
		for pk, want := range map[string]int64{shard: 5, minute: 5, meta: 0, other: 6} {
			if got := count(t, direct, table, pk); got != want {
				t.Errorf("dynalite has %s = %d, want %d", pk, got, want)
			}
		}
		st := f.proxy.Stats()
		t.Logf("did %v, denied keys %v", st.Did, st.DeniedKeys)
		if st.Did[ddbfault.Denied] != 4 {
			t.Errorf("Did[denied] = %d, want 4", st.Did[ddbfault.Denied])
		}
		if want := map[string]int{shard: 2, minute: 1, meta: 1}; !maps.Equal(st.DeniedKeys, want) {
			t.Errorf("DeniedKeys = %v, want %v", st.DeniedKeys, want)
		}
		if st.Writes[shard] != 1 || st.Writes[minute] != 1 || st.Writes[meta] != 0 || st.Writes[other] != 2 {
			t.Errorf("Writes = %v; want the denied ones not counted", st.Writes)
		}

		// Allowed again: the topic's writes land.
		f.proxy.Allow()
		if err := add(ctx, c, table, shard, 1); err != nil {
			t.Fatalf("UpdateItem after Allow: %v", err)
		}
		if got := count(t, direct, table, shard); got != 6 {
			t.Errorf("count %d after Allow, want 6", got)
		}
		if n := f.proxy.Stats().Did[ddbfault.Denied]; n != 4 {
			t.Errorf("Did[denied] = %d after Allow, want still 4", n)
		}
	})

	t.Run("reads", func(t *testing.T) {
		// Reads: true denies a GetItem of the topic, and a BatchGetItem
		// with any of its keys, whole; the zero Status and Type are
		// DynamoDB's answer to an IAM denial, 400 AccessDeniedException.
		f := newFixture(t, d, table, ddbfault.Config{})
		c := f.client()
		ctx := context.Background()
		f.proxy.Deny(ddbfault.Denial{Keys: ddbfault.TopicKeys("news"), Reads: true})
		_, err := c.GetItem(ctx, &dynamodb.GetItemInput{
			TableName: aws.String(table),
			Key:       map[string]types.AttributeValue{schema.AttrPK: &types.AttributeValueMemberS{Value: shard}},
		})
		wantDenied(t, "GetItem of the denied topic", err, http.StatusBadRequest, "AccessDeniedException")
		_, err = batchGet(ctx, c, table, other, minute)
		wantDenied(t, "BatchGetItem with a denied key", err, http.StatusBadRequest, "AccessDeniedException")
		if got, err := batchGet(ctx, c, table, other); err != nil || len(got) != 1 {
			t.Errorf("BatchGetItem of another topic: %v, %v", got, err)
		}
		if got := count(t, c, table, other); got == 0 {
			t.Errorf("GetItem of another topic: count 0, want the item")
		}
		st := f.proxy.Stats()
		if st.Did[ddbfault.Denied] != 2 {
			t.Errorf("Did[denied] = %d, want 2", st.Did[ddbfault.Denied])
		}
		if want := map[string]int{shard: 1, minute: 1, other: 1}; !maps.Equal(st.DeniedKeys, want) {
			t.Errorf("DeniedKeys = %v, want %v (every key of a denied request)", st.DeniedKeys, want)
		}
	})

	t.Run("validation", func(t *testing.T) {
		// Another error, on one key only: its neighbour is written.
		f := newFixture(t, d, table, ddbfault.Config{})
		c := f.client()
		ctx := context.Background()
		f.proxy.Deny(ddbfault.Denial{Keys: func(pk string) bool { return pk == other }, Type: "ValidationException"})
		wantDenied(t, "UpdateItem of the denied key", add(ctx, c, table, other, 1, retrying), http.StatusBadRequest, "ValidationException")
		if err := add(ctx, c, table, schema.ShardKey("sports", 1), 1); err != nil {
			t.Errorf("UpdateItem of the next shard: %v", err)
		}
		if n := f.proxy.Stats().Did[ddbfault.Denied]; n != 1 {
			t.Errorf("Did[denied] = %d, want 1 (not retried)", n)
		}
	})
}

// TestTopicKeys: TopicKeys matches every item of its topic and no other
// topic's, though topics hold '#'; Deny refuses a Denial that could not be
// definite.
func TestTopicKeys(t *testing.T) {
	for _, c := range []struct {
		topic, pk string
		want      bool
	}{
		{"news", "TREND#news#0", true},
		{"news", "TREND#news#17", true},
		{"news", "TREND#news#meta", true},
		{"news", "MINUTE#news#29000000#3", true},
		{"news", "HOUR#news#480000#0", true},
		{"news", "TREND#sports#0", false},
		{"news", "TREND#newsy#0", false},
		{"news", "TREND#news#x#0", false},           // topic news#x
		{"news", "TREND#news#meta#0", false},        // topic news#meta
		{"news", "MINUTE#news#x#29000000#1", false}, // topic news#x
		{"news", "HOUR#sports#480000#0", false},
		{"news", "TREND#news", false},
		{"news", "news", false},
		{"news", "", false},
		{"a#b", "TREND#a#b#2", true},
		{"a#b", "TREND#a#b#meta", true},
		{"a#b", "MINUTE#a#b#5#0", true},
		{"a#b", "TREND#a#2", false},
		{"a#b", "TREND#b#2", false},
	} {
		if got := ddbfault.TopicKeys(c.topic)(c.pk); got != c.want {
			t.Errorf("TopicKeys(%q)(%q) = %v, want %v", c.topic, c.pk, got, c.want)
		}
	}

	p := ddbfault.New(ddbfault.Config{})
	for name, den := range map[string]ddbfault.Denial{
		"no keys": {Status: http.StatusForbidden},
		"5xx":     {Keys: ddbfault.TopicKeys("news"), Status: http.StatusInternalServerError},
		"2xx":     {Keys: ddbfault.TopicKeys("news"), Status: http.StatusOK},
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("Deny with %s did not panic", name)
				}
			}()
			p.Deny(den)
		}()
	}
}
