package ddbfault_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/smithy-go"

	"github.com/hotcount/hotcount/internal/ddbfault"
	"github.com/hotcount/hotcount/internal/testenv"
	"github.com/hotcount/hotcount/store"
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
func add(ctx context.Context, c *dynamodb.Client, table, pk string, delta int64) error {
	_, err := c.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName:                 aws.String(table),
		Key:                       map[string]types.AttributeValue{store.AttrPK: &types.AttributeValueMemberS{Value: pk}},
		UpdateExpression:          aws.String("ADD #count :delta"),
		ExpressionAttributeNames:  map[string]string{"#count": store.AttrCount},
		ExpressionAttributeValues: map[string]types.AttributeValue{":delta": &types.AttributeValueMemberN{Value: strconv.FormatInt(delta, 10)}},
	})
	return err
}

// count reads the key's count with c; a missing item is 0.
func count(t *testing.T, c *dynamodb.Client, table, pk string) int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	out, err := c.GetItem(ctx, &dynamodb.GetItemInput{
		TableName:      aws.String(table),
		Key:            map[string]types.AttributeValue{store.AttrPK: &types.AttributeValueMemberS{Value: pk}},
		ConsistentRead: aws.Bool(true),
	})
	if err != nil {
		t.Fatalf("GetItem %s: %v", pk, err)
	}
	n, ok := out.Item[store.AttrCount].(*types.AttributeValueMemberN)
	if !ok {
		return 0
	}
	v, err := strconv.ParseInt(n.Value, 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return v
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
