package store_test

import (
	"context"
	"errors"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/hotcount/hotcount/pipeline/store"
	"github.com/hotcount/hotcount/schema"
)

// partialGets is a DynamoDB whose BatchGetItem answers one key of each call
// (count 7) and hands the others back unprocessed, as DynamoDB does under
// load; stuck, it answers none. Each call is reported on calls.
type partialGets struct {
	store.DynamoAPI // the rest: not called
	stuck           bool
	n               atomic.Int32
	calls           chan struct{}
}

func (p *partialGets) BatchGetItem(_ context.Context, in *dynamodb.BatchGetItemInput, _ ...func(*dynamodb.Options)) (*dynamodb.BatchGetItemOutput, error) {
	p.n.Add(1)
	select {
	case p.calls <- struct{}{}:
	default:
	}
	out := &dynamodb.BatchGetItemOutput{Responses: map[string][]map[string]types.AttributeValue{}}
	for table, req := range in.RequestItems {
		keys := req.Keys
		if !p.stuck {
			item := map[string]types.AttributeValue{
				schema.AttrPK:    keys[0][schema.AttrPK],
				schema.AttrCount: &types.AttributeValueMemberN{Value: "7"},
			}
			out.Responses[table] = append(out.Responses[table], item)
			keys = keys[1:]
		}
		if len(keys) > 0 {
			req.Keys = keys
			out.UnprocessedKeys = map[string]types.KeysAndAttributes{table: req}
		}
	}
	return out, nil
}

// TestBatchGetRetriesUnprocessedKeys: the keys a BatchGetItem hands back
// are asked again, after a backoff, until every one is answered.
func TestBatchGetRetriesUnprocessedKeys(t *testing.T) {
	api := &partialGets{calls: make(chan struct{}, 1)}
	d := store.NewDynamoDB(api, "hotcount", store.NewMetrics(prometheus.NewRegistry()))
	keys := []string{"a", "b", "c", "d"}
	got, err := d.Counts(context.Background(), keys, true)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		if got[k] != 7 {
			t.Errorf("count of %s = %d, want 7 (all: %v)", k, got[k], got)
		}
	}
	if n := api.n.Load(); n != int32(len(keys)) {
		t.Errorf("%d BatchGetItem calls, want %d (one key answered each)", n, len(keys))
	}
}

// TestBatchGetStopsWhenContextEnds: keys never answered are retried until
// the context ends, and then the read returns at once with its error.
func TestBatchGetStopsWhenContextEnds(t *testing.T) {
	api := &partialGets{stuck: true, calls: make(chan struct{}, 1)}
	d := store.NewDynamoDB(api, "hotcount", store.NewMetrics(prometheus.NewRegistry()))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	keys := make([]string, 3)
	for i := range keys {
		keys[i] = strconv.Itoa(i)
	}
	go func() {
		_, err := d.Counts(ctx, keys, true)
		done <- err
	}()
	<-api.calls // the first attempt ...
	<-api.calls // ... and a retry, which leaves the keys unprocessed again
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("Counts = %v, want the context's error", err)
	}
}
