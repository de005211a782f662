package store

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/ratelimit"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/smithy-go"
	"github.com/aws/smithy-go/middleware"
	smithyhttp "github.com/aws/smithy-go/transport/http"
)

// maxBatchGetKeys is DynamoDB's limit of keys in one BatchGetItem call.
const maxBatchGetKeys = 100

// DynamoAPI is the part of the DynamoDB client the store calls. The SDK's
// *dynamodb.Client satisfies it.
type DynamoAPI interface {
	UpdateItem(ctx context.Context, in *dynamodb.UpdateItemInput, opts ...func(*dynamodb.Options)) (*dynamodb.UpdateItemOutput, error)
	BatchGetItem(ctx context.Context, in *dynamodb.BatchGetItemInput, opts ...func(*dynamodb.Options)) (*dynamodb.BatchGetItemOutput, error)
	DescribeTable(ctx context.Context, in *dynamodb.DescribeTableInput, opts ...func(*dynamodb.Options)) (*dynamodb.DescribeTableOutput, error)
	CreateTable(ctx context.Context, in *dynamodb.CreateTableInput, opts ...func(*dynamodb.Options)) (*dynamodb.CreateTableOutput, error)
	PutItem(ctx context.Context, in *dynamodb.PutItemInput, opts ...func(*dynamodb.Options)) (*dynamodb.PutItemOutput, error)
}

// DynamoDB is the store on an Amazon DynamoDB table (or anything that speaks
// its API: dynalite, DynamoDB Local, LocalStack). It is safe for concurrent
// use; it holds no state of its own beyond the client.
type DynamoDB struct {
	client  DynamoAPI
	table   string
	metrics *Metrics
	lastOK  atomic.Int64 // Unix nanoseconds of the last call DynamoDB answered without error
	lastErr atomic.Int64 // ... and of the last that failed
}

// pingFresh is how recent a successful call must be for Ping to trust it
// instead of asking DescribeTable: readiness probes of a large fleet would
// otherwise make hundreds of control-plane calls a second.
const pingFresh = 10 * time.Second

// NewDynamoDB returns a store on table through client.
func NewDynamoDB(client DynamoAPI, table string, m *Metrics) *DynamoDB {
	return &DynamoDB{client: client, table: table, metrics: m}
}

// Add increments one shard of topic by delta with
// `ADD #count :delta SET #updatedAt = :now`. ADD is atomic on the item and
// creates it when absent. It is not idempotent: if DynamoDB applied an attempt
// whose response was lost, the SDK's retry applies it again (counted in
// hotcount_store_ambiguous_total). A throttled write is not retried here: it
// comes back at once wrapping ErrThrottled, for the caller to move it to
// another shard.
func (d *DynamoDB) Add(ctx context.Context, topic string, shard int, delta int64, now time.Time) error {
	d.metrics.writes.Inc()
	_, err := d.client.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName: &d.table,
		Key: map[string]types.AttributeValue{
			AttrPK: &types.AttributeValueMemberS{Value: ShardKey(topic, shard)},
		},
		UpdateExpression: aws.String("ADD #count :delta SET #updatedAt = :now"),
		ExpressionAttributeNames: map[string]string{
			"#count":     AttrCount,
			"#updatedAt": AttrUpdatedAt,
		},
		ExpressionAttributeValues: map[string]types.AttributeValue{
			":delta": &types.AttributeValueMemberN{Value: strconv.FormatInt(delta, 10)},
			":now":   &types.AttributeValueMemberN{Value: strconv.FormatInt(UnixMilli(now), 10)},
		},
	}, d.countAmbiguous, withoutThrottleRetries)
	if err != nil {
		err = classify(fmt.Errorf("store: update %s: %w", ShardKey(topic, shard), err))
		d.metrics.failed("write", err)
		d.lastErr.Store(time.Now().UnixNano())
		return err
	}
	d.answered()
	return nil
}

// noThrottleRetry is the SDK's retryer but for throughput refusals, which
// it hands straight back: retrying them on the same key (the same
// partition) after a backoff is what the flusher does better, at once, on
// another shard.
type noThrottleRetry struct{ aws.RetryerV2 }

func (r noThrottleRetry) IsErrorRetryable(err error) bool {
	if errors.Is(classify(err), ErrThrottled) {
		return false
	}
	return r.RetryerV2.IsErrorRetryable(err)
}

func withoutThrottleRetries(o *dynamodb.Options) {
	if r, ok := o.Retryer.(aws.RetryerV2); ok {
		o.Retryer = noThrottleRetry{r}
	}
}

// countAmbiguous adds, to one UpdateItem call, a step that runs on every
// attempt (inside the SDK's retry loop) and counts the attempts whose
// outcome is unknown: the request may have reached DynamoDB, but no answer
// came back (a reset or timeout after sending). Each such attempt that was in
// fact applied is counted twice once retried: the over-count of ADD.
func (d *DynamoDB) countAmbiguous(o *dynamodb.Options) {
	o.APIOptions = append(o.APIOptions, func(stack *middleware.Stack) error {
		return stack.Finalize.Insert(middleware.FinalizeMiddlewareFunc("hotcountAmbiguous",
			func(ctx context.Context, in middleware.FinalizeInput, next middleware.FinalizeHandler) (middleware.FinalizeOutput, middleware.Metadata, error) {
				out, md, err := next.HandleFinalize(ctx, in)
				if err != nil && ambiguous(err) {
					d.metrics.ambiguous.Inc()
				}
				return out, md, err
			}), "Retry", middleware.After)
	})
}

// ambiguous says whether a failed attempt may have been applied: it was
// sent (not refused at connect) and no HTTP response came back.
func ambiguous(err error) bool {
	var send *smithyhttp.RequestSendError
	if !errors.As(err, &send) {
		return false // DynamoDB answered (an error answer applied nothing), or nothing was sent
	}
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return false // never connected: never sent
	}
	return true
}

// Gather reads shards 0..n-1 of topic in one BatchGetItem round trip (more
// only when n > 100 or DynamoDB returns UnprocessedKeys, which are retried
// with backoff until ctx ends). It returns one entry per shard, in shard
// order, zero for a shard never written. consistent asks for strongly
// consistent reads (twice the read units).
func (d *DynamoDB) Gather(ctx context.Context, topic string, n int, consistent bool) ([]Shard, error) {
	m, err := d.GatherMany(ctx, []string{topic}, n, consistent)
	if err != nil {
		return nil, err
	}
	return m[topic], nil
}

// GatherMany is Gather for several topics at once: their shard keys and
// metadata keys share BatchGetItem calls, 100 keys each, so 20 topics of 4
// shards cost one round trip. n is the caller's guess of the read set; a
// topic whose metadata says it has more shards gets them in a second round,
// so a count is never outside what is summed. The caller owns the map.
func (d *DynamoDB) GatherMany(ctx context.Context, topics []string, n int, consistent bool) (map[string][]Shard, error) {
	d.metrics.gathers.Add(float64(len(topics)))
	out := make(map[string][]Shard, len(topics))
	metas := make(map[string]Meta, len(topics))
	want := make(map[string][2]int, len(topics))
	for _, t := range topics {
		want[t] = [2]int{0, n}
	}
	if err := d.readShards(ctx, want, true, consistent, out, metas); err != nil {
		return nil, d.readFailed(topics, err)
	}
	more := make(map[string][2]int)
	for t, m := range metas {
		if r := m.Read(); r > n {
			more[t] = [2]int{n, r}
		}
	}
	if len(more) > 0 {
		if err := d.readShards(ctx, more, false, consistent, out, metas); err != nil {
			return nil, d.readFailed(topics, err)
		}
	}
	d.answered()
	return out, nil
}

func (d *DynamoDB) readFailed(topics []string, err error) error {
	err = classify(fmt.Errorf("store: gather %q: %w", topics, err))
	d.metrics.failed("read", err)
	d.lastErr.Store(time.Now().UnixNano())
	return err
}

// readShards reads shards [from, to) of each topic in want (and, with
// withMeta, its metadata item) into out and metas, in BatchGetItem calls of
// up to 100 keys.
func (d *DynamoDB) readShards(ctx context.Context, want map[string][2]int, withMeta, consistent bool, out map[string][]Shard, metas map[string]Meta) error {
	type slot struct {
		topic string
		shard int // -1: the metadata item
	}
	index := make(map[string]slot)
	var keys []map[string]types.AttributeValue
	key := func(k string, s slot) {
		index[k] = s
		keys = append(keys, map[string]types.AttributeValue{AttrPK: &types.AttributeValueMemberS{Value: k}})
	}
	for topic, r := range want {
		shards := out[topic]
		for i := r[0]; i < r[1]; i++ {
			shards = append(shards, Shard{Shard: i})
			key(ShardKey(topic, i), slot{topic, i})
		}
		out[topic] = shards
		if withMeta {
			key(MetaKey(topic), slot{topic, -1})
		}
	}
	d.metrics.reads.Add(float64(len(keys)))
	for start := 0; start < len(keys); start += maxBatchGetKeys {
		chunk := keys[start:min(start+maxBatchGetKeys, len(keys))]
		err := d.batchGet(ctx, chunk, consistent, func(item map[string]types.AttributeValue) error {
			pk, ok := item[AttrPK].(*types.AttributeValueMemberS)
			if !ok {
				return fmt.Errorf("store: item without a string %s", AttrPK)
			}
			at, ok := index[pk.Value]
			if !ok {
				return fmt.Errorf("store: unexpected item %q in gather", pk.Value)
			}
			if at.shard < 0 {
				m, err := decodeMeta(item)
				if err != nil {
					return fmt.Errorf("store: item %s: %w", pk.Value, err)
				}
				metas[at.topic] = m
				return nil
			}
			sh := &out[at.topic][at.shard]
			var err error
			if sh.Count, err = numberAttr(item, AttrCount); err != nil {
				return fmt.Errorf("store: item %s: %w", pk.Value, err)
			}
			if sh.UpdatedAt, err = numberAttr(item, AttrUpdatedAt); err != nil {
				return fmt.Errorf("store: item %s: %w", pk.Value, err)
			}
			return nil
		})
		if err != nil {
			return err
		}
	}
	return nil
}

func decodeMeta(item map[string]types.AttributeValue) (Meta, error) {
	s, err := numberAttr(item, AttrShards)
	if err != nil {
		return Meta{}, err
	}
	r, err := numberAttr(item, AttrReadShards)
	if err != nil {
		return Meta{}, err
	}
	if s < 1 || s > MaxShards || r < s || r > MaxShards {
		return Meta{}, fmt.Errorf("shard metadata %d/%d outside 1..%d", s, r, MaxShards)
	}
	return Meta{Shards: int(s), ReadShards: int(r)}, nil
}

// Metas reads the metadata of topics (zero Meta for those without).
func (d *DynamoDB) Metas(ctx context.Context, topics []string) (map[string]Meta, error) {
	metas := make(map[string]Meta, len(topics))
	index := make(map[string]string, len(topics))
	keys := make([]map[string]types.AttributeValue, 0, len(topics))
	for _, t := range topics {
		index[MetaKey(t)] = t
		keys = append(keys, map[string]types.AttributeValue{AttrPK: &types.AttributeValueMemberS{Value: MetaKey(t)}})
	}
	d.metrics.reads.Add(float64(len(keys)))
	for start := 0; start < len(keys); start += maxBatchGetKeys {
		err := d.batchGet(ctx, keys[start:min(start+maxBatchGetKeys, len(keys))], true, func(item map[string]types.AttributeValue) error {
			pk, _ := item[AttrPK].(*types.AttributeValueMemberS)
			if pk == nil {
				return fmt.Errorf("store: item without a string %s", AttrPK)
			}
			m, err := decodeMeta(item)
			if err != nil {
				return fmt.Errorf("store: item %s: %w", pk.Value, err)
			}
			metas[index[pk.Value]] = m
			return nil
		})
		if err != nil {
			return nil, d.readFailed(topics, err)
		}
	}
	d.answered()
	return metas, nil
}

// SetMeta changes topic's metadata from old (what the caller last read;
// zero: no item) to m, only if it is still old: writers racing to change it
// agree on one value. Refused: ErrConflict.
func (d *DynamoDB) SetMeta(ctx context.Context, topic string, old, m Meta) error {
	in := &dynamodb.PutItemInput{
		TableName: &d.table,
		Item: map[string]types.AttributeValue{
			AttrPK:         &types.AttributeValueMemberS{Value: MetaKey(topic)},
			AttrShards:     &types.AttributeValueMemberN{Value: itoa(m.Shards)},
			AttrReadShards: &types.AttributeValueMemberN{Value: itoa(m.ReadShards)},
		},
		ExpressionAttributeNames: map[string]string{"#pk": AttrPK},
	}
	if !old.Exists() {
		in.ConditionExpression = aws.String("attribute_not_exists(#pk)")
	} else {
		in.ConditionExpression = aws.String("#s = :s AND #r = :r")
		in.ExpressionAttributeNames["#s"] = AttrShards
		in.ExpressionAttributeNames["#r"] = AttrReadShards
		delete(in.ExpressionAttributeNames, "#pk")
		in.ExpressionAttributeValues = map[string]types.AttributeValue{
			":s": &types.AttributeValueMemberN{Value: itoa(old.Shards)},
			":r": &types.AttributeValueMemberN{Value: itoa(old.ReadShards)},
		}
	}
	d.metrics.metaWrites.Inc()
	_, err := d.client.PutItem(ctx, in)
	var cond *types.ConditionalCheckFailedException
	switch {
	case errors.As(err, &cond):
		return fmt.Errorf("store: set shards of %q: %w", topic, ErrConflict)
	case err != nil:
		err = classify(fmt.Errorf("store: set shards of %q: %w", topic, err))
		d.metrics.failed("write", err)
		return err
	}
	return nil
}

// batchGet runs one BatchGetItem over keys (at most 100), retrying the
// UnprocessedKeys DynamoDB hands back (under load it returns part of a batch
// rather than fail it) with jittered exponential backoff.
func (d *DynamoDB) batchGet(ctx context.Context, keys []map[string]types.AttributeValue, consistent bool, each func(map[string]types.AttributeValue) error) error {
	d.metrics.batchGets.Inc()
	req := map[string]types.KeysAndAttributes{
		d.table: {Keys: keys, ConsistentRead: aws.Bool(consistent)},
	}
	backoff := 10 * time.Millisecond
	for {
		out, err := d.client.BatchGetItem(ctx, &dynamodb.BatchGetItemInput{RequestItems: req})
		if err != nil {
			return err
		}
		for _, item := range out.Responses[d.table] {
			if err := each(item); err != nil {
				return err
			}
		}
		if len(out.UnprocessedKeys[d.table].Keys) == 0 {
			return nil
		}
		req = out.UnprocessedKeys
		d.metrics.batchGets.Inc()
		t := time.NewTimer(backoff/2 + rand.N(backoff/2+1))
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("unprocessed keys left: %w", ctx.Err())
		case <-t.C:
		}
		backoff = min(2*backoff, time.Second)
	}
}

// numberAttr reads a number attribute as int64; absent is 0. A value that is
// not an int64 (DynamoDB numbers go to 38 digits) is an error, not a wrap.
func numberAttr(item map[string]types.AttributeValue, name string) (int64, error) {
	av, ok := item[name]
	if !ok {
		return 0, nil
	}
	n, ok := av.(*types.AttributeValueMemberN)
	if !ok {
		return 0, fmt.Errorf("attribute %s is not a number", name)
	}
	v, err := strconv.ParseInt(n.Value, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("attribute %s = %s is not an int64: %w", name, n.Value, err)
	}
	return v, nil
}

// Ping checks that the table exists and answers: DescribeTable, unless a
// call succeeded within the last 10 s and none failed since.
func (d *DynamoDB) Ping(ctx context.Context) error {
	ok := d.lastOK.Load()
	if time.Since(time.Unix(0, ok)) < pingFresh && ok > d.lastErr.Load() {
		return nil // a write or a read succeeded just now, and none failed since
	}
	out, err := d.client.DescribeTable(ctx, &dynamodb.DescribeTableInput{TableName: &d.table})
	if err != nil {
		return fmt.Errorf("store: describe table %s: %w", d.table, err)
	}
	if s := out.Table.TableStatus; s != types.TableStatusActive && s != types.TableStatusUpdating {
		return fmt.Errorf("store: table %s is %s", d.table, s)
	}
	d.answered()
	return nil
}

func (d *DynamoDB) answered() { d.lastOK.Store(time.Now().UnixNano()) }

// Close does nothing: the SDK client holds no resources that need releasing.
func (d *DynamoDB) Close() error { return nil }

// CreateTable creates table with pk as its only (HASH) key and on-demand
// billing, and waits until it is active. An existing table is left as it is:
// calling it twice is safe.
func CreateTable(ctx context.Context, client DynamoAPI, table string) (created bool, err error) {
	_, err = client.CreateTable(ctx, &dynamodb.CreateTableInput{
		TableName: &table,
		AttributeDefinitions: []types.AttributeDefinition{
			{AttributeName: aws.String(AttrPK), AttributeType: types.ScalarAttributeTypeS},
		},
		KeySchema: []types.KeySchemaElement{
			{AttributeName: aws.String(AttrPK), KeyType: types.KeyTypeHash},
		},
		BillingMode: types.BillingModePayPerRequest,
	})
	var inUse *types.ResourceInUseException
	switch {
	case errors.As(err, &inUse):
		// Exists already (or is being created): wait for it below.
	case err != nil:
		return false, fmt.Errorf("store: create table %s: %w", table, err)
	default:
		created = true
	}
	w := dynamodb.NewTableExistsWaiter(client, func(o *dynamodb.TableExistsWaiterOptions) {
		o.MinDelay = 100 * time.Millisecond
		o.MaxDelay = 2 * time.Second
	})
	if err := w.Wait(ctx, &dynamodb.DescribeTableInput{TableName: &table}, 2*time.Minute); err != nil {
		return created, fmt.Errorf("store: wait for table %s: %w", table, err)
	}
	return created, nil
}

// classify marks throughput refusals with ErrThrottled so callers can branch
// on them without knowing the SDK's error types.
func classify(err error) error {
	var api smithy.APIError
	if errors.As(err, &api) {
		switch api.ErrorCode() {
		case "ProvisionedThroughputExceededException", "ThrottlingException", "RequestLimitExceeded":
			return fmt.Errorf("%w: %w", ErrThrottled, err)
		}
	}
	return err
}

// NewDynamoDBClient builds the SDK client from the standard AWS chain
// (environment, shared files, IRSA web identity, instance role). endpoint,
// when set, replaces AWS's own (dynalite, DynamoDB Local, LocalStack); a
// region is then optional. The SDK's retries stay on (3 attempts, jittered
// backoff), but without its client-side retry quota: under a long outage the
// quota turns every call into a local "retry quota exceeded" error, and the
// flusher already backs off by keeping deltas for the next flush.
func NewDynamoDBClient(ctx context.Context, endpoint string) (*dynamodb.Client, error) {
	cfg, err := awsconfig.LoadDefaultConfig(ctx,
		awsconfig.WithRetryer(func() aws.Retryer {
			return retry.NewStandard(func(o *retry.StandardOptions) {
				o.RateLimiter = ratelimit.None
			})
		}),
		awsconfig.WithHTTPClient(awshttp.NewBuildableClient().WithTransportOptions(func(t *http.Transport) {
			// The flusher keeps up to --flush-concurrency requests in
			// flight; the default of 10 idle connections per host would
			// close and reopen connections every flush.
			t.MaxIdleConnsPerHost = 256
		})),
	)
	if err != nil {
		return nil, fmt.Errorf("store: AWS config: %w", err)
	}
	if endpoint != "" && cfg.Region == "" {
		cfg.Region = "us-east-1" // a local endpoint ignores it, the signer needs one
	}
	return dynamodb.NewFromConfig(cfg, func(o *dynamodb.Options) {
		if endpoint != "" {
			o.BaseEndpoint = aws.String(endpoint)
		}
	}), nil
}
