package store

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
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
	"github.com/cenkalti/backoff/v5"
	"golang.org/x/sync/errgroup"

	"github.com/hotcount/hotcount/internal/waits"
	"github.com/hotcount/hotcount/schema"
)

// maxBatchGetKeys is DynamoDB's limit of keys in one BatchGetItem call.
const maxBatchGetKeys = 100

// metaLookups is how many BatchGetItem calls of one metadata lookup run at
// once.
const metaLookups = 16

// DynamoAPI is the part of the DynamoDB client the store calls. The SDK's
// *dynamodb.Client satisfies it.
type DynamoAPI interface {
	UpdateItem(ctx context.Context, in *dynamodb.UpdateItemInput, opts ...func(*dynamodb.Options)) (*dynamodb.UpdateItemOutput, error)
	BatchGetItem(ctx context.Context, in *dynamodb.BatchGetItemInput, opts ...func(*dynamodb.Options)) (*dynamodb.BatchGetItemOutput, error)
	DescribeTable(ctx context.Context, in *dynamodb.DescribeTableInput, opts ...func(*dynamodb.Options)) (*dynamodb.DescribeTableOutput, error)
	CreateTable(ctx context.Context, in *dynamodb.CreateTableInput, opts ...func(*dynamodb.Options)) (*dynamodb.CreateTableOutput, error)
	PutItem(ctx context.Context, in *dynamodb.PutItemInput, opts ...func(*dynamodb.Options)) (*dynamodb.PutItemOutput, error)
	GetItem(ctx context.Context, in *dynamodb.GetItemInput, opts ...func(*dynamodb.Options)) (*dynamodb.GetItemOutput, error)
}

// DynamoDB is the store on an Amazon DynamoDB table (or anything that speaks
// its API: dynalite, DynamoDB Local, LocalStack). It is safe for concurrent
// use; it holds no state of its own beyond the client.
type DynamoDB struct {
	client  DynamoAPI
	table   string
	metrics *Metrics
	// Retention sets the expiry (AttrExpiresAt) of bucket writes; set it
	// before the first write.
	Retention schema.Retention
	// Regions makes the store write only its Region's items and read
	// every Region's (schema/region.go); set it before the first call. The zero
	// value is the single-Region layout.
	Regions schema.Regions
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

// Add applies one idempotent increment (see Write):
// `ADD #count :delta SET #updatedAt = :now, #mark = :seq` on condition that
// the writer's mark is below seq (and, absent, that the floor is too). It
// returns nil once the delta is in the item exactly once, whether this call
// or an earlier attempt applied it; ErrThrottled (wrapped) when DynamoDB
// refused it for throughput and no attempt is in doubt, so it may move to
// another shard with a new seq; ErrAmbiguous (wrapped) when it may or may
// not have been applied, for the caller to send the same Write again.
// The SDK retries within the call re-send the same request, so they are
// safe. Every other error means it was not applied. A Write with a Span
// is idempotent by stream position instead, and answers as addSpan says.
func (d *DynamoDB) Add(ctx context.Context, w Write, now time.Time) error {
	if err := ctx.Err(); err != nil && !w.Retry && !w.Replay {
		// Never sent, so never applied; sent, a cancelled call would be in
		// doubt (and a retry of a write in doubt stays in doubt).
		return fmt.Errorf("store: update %s: not sent: %w", d.key(w), err)
	}
	if w.Span != nil {
		return d.addSpan(ctx, w, now) // position.go
	}
	d.metrics.writes.Inc()
	var doubt bool // an attempt of this call may have been applied
	out, err := d.client.UpdateItem(ctx, d.addInput(w, now), d.watchAttempts(&doubt), withoutThrottleRetries)
	// Counted once per write: a retry of a write in doubt was counted
	// when its doubt began; a replay is another process's write.
	firstTry := !w.Retry && !w.Replay
	if doubt && firstTry {
		d.metrics.ambiguous.Inc()
	}
	var cond *types.ConditionalCheckFailedException
	switch {
	case err == nil:
		d.answered()
		if doubt || w.Retry {
			d.metrics.resolved.WithLabelValues(ResolvedNotApplied).Inc()
		}
		d.trim(ctx, d.key(w), out.Attributes, now)
		return nil
	case errors.As(err, &cond):
		d.answered()
		err = d.refused(ctx, w, doubt || !firstTry)
	default:
		err = d.addFailed(w, err, doubt)
	}
	if firstTry && !doubt && errors.Is(err, ErrAmbiguous) {
		d.metrics.ambiguous.Inc() // its doubt began after the call: not counted above
	}
	return err
}

// key is w's item: in this store's own Region when it has one.
func (d *DynamoDB) key(w Write) string { return schema.InRegion(w.Key(), d.Regions.Own) }

// addInput is Add's UpdateItem call: the increment, applied only if the
// writer's mark (or, absent, the floor) is below the write's seq.
func (d *DynamoDB) addInput(w Write, now time.Time) *dynamodb.UpdateItemInput {
	update := "ADD #count :delta SET #updatedAt = :now, #mark = :seq"
	names := map[string]string{
		"#count":     schema.AttrCount,
		"#updatedAt": schema.AttrUpdatedAt,
		"#mark":      MarkPrefix + w.Writer,
		"#floor":     AttrFloor,
	}
	values := map[string]types.AttributeValue{
		":delta": &types.AttributeValueMemberN{Value: strconv.FormatInt(w.Delta, 10)},
		":now":   &types.AttributeValueMemberN{Value: strconv.FormatInt(schema.UnixMilli(now), 10)},
		":seq":   &types.AttributeValueMemberN{Value: strconv.FormatInt(w.Seq, 10)},
	}
	update = d.withExpiry(w, update, names, values)
	return &dynamodb.UpdateItemInput{
		TableName: &d.table,
		Key: map[string]types.AttributeValue{
			schema.AttrPK: &types.AttributeValueMemberS{Value: d.key(w)},
		},
		UpdateExpression:          aws.String(update),
		ConditionExpression:       aws.String("(attribute_not_exists(#mark) AND (attribute_not_exists(#floor) OR #floor < :seq)) OR #mark < :seq"),
		ExpressionAttributeNames:  names,
		ExpressionAttributeValues: values,
		// The item as written, to see its marks: the response is not billed
		// in write units, and it saves a read to decide on trimming.
		ReturnValues: types.ReturnValueAllNew,
	}
}

// withExpiry adds to a write's SET clause, for a bucket, its TTL: the same
// on every write of it.
func (d *DynamoDB) withExpiry(w Write, update string, names map[string]string, values map[string]types.AttributeValue) string {
	if exp := d.Retention.Expiry(w.Counter); exp > 0 {
		update += ", #exp = :exp"
		names["#exp"] = schema.AttrExpiresAt
		values[":exp"] = &types.AttributeValueMemberN{Value: strconv.FormatInt(exp, 10)}
	}
	return update
}

// addFailed settles a write that failed other than by its condition. It is
// in doubt (ErrAmbiguous) when an attempt of this call may have been
// applied, or an earlier one of the same write (a retry of a write in
// doubt, a replay of the quarantine); else nothing was applied.
func (d *DynamoDB) addFailed(w Write, err error, doubt bool) error {
	err = classify(fmt.Errorf("store: update %s: %w", d.key(w), err))
	d.metrics.failed("write", err)
	d.lastErr.Store(time.Now().UnixNano())
	if ambiguous(err) {
		doubt = true // no attempt was watched (the call ended before one ran)
	}
	if doubt || w.Retry || w.Replay {
		if errors.Is(err, ErrDenied) {
			// In doubt still, and refused for good now: a caller that
			// may quarantine it under this identity must know both.
			return fmt.Errorf("%w: %w", ErrAmbiguous, err)
		}
		// %v, not %w: a throttle after a lost answer must not read as
		// "throttled, nothing applied" to a caller that would reroute it.
		return fmt.Errorf("%w: %v", ErrAmbiguous, err)
	}
	return err
}

// Outcomes of a write in doubt, the values of
// hotcount_store_resolved_total's outcome label.
const (
	// ResolvedApplied: an earlier attempt had been applied; the retry was
	// refused by the mark.
	ResolvedApplied = "applied"
	// ResolvedNotApplied: no earlier attempt had been applied; the retry
	// applied the delta.
	ResolvedNotApplied = "not_applied"
	// ResolvedUnresolvable: the mark had been trimmed (see ErrUnresolvable).
	ResolvedUnresolvable = "unresolvable"
)

// FloorError is a first attempt refused because its seq is at or below the
// item's floor: the writer's clock is behind the writers that trimmed the
// item's marks. Nothing was applied; raise the sequencer past Floor and
// write again.
type FloorError struct {
	Key   string
	Floor int64
}

func (e *FloorError) Error() string {
	return fmt.Sprintf("store: update %s: seq at or below the item's floor %d (this writer's clock is behind)", e.Key, e.Floor)
}

// refused settles a write that failed its condition: it reads the item
// (strongly consistent) to tell "already applied" (the mark is at or past
// seq) from a seq at or below the floor.
func (d *DynamoDB) refused(ctx context.Context, w Write, inDoubt bool) error {
	d.metrics.reads.Inc()
	got, err := d.client.GetItem(ctx, &dynamodb.GetItemInput{
		TableName:      &d.table,
		Key:            map[string]types.AttributeValue{schema.AttrPK: &types.AttributeValueMemberS{Value: d.key(w)}},
		ConsistentRead: aws.Bool(true),
	})
	if err != nil {
		d.metrics.failed("read", err)
		// %v: whatever the read's error (a throttle), the write is in doubt.
		return fmt.Errorf("%w: store: read %s after a refused write: %v", ErrAmbiguous, d.key(w), err)
	}
	mark, err := numberAttr(got.Item, MarkPrefix+w.Writer)
	if err != nil {
		return fmt.Errorf("store: item %s: %w", d.key(w), err)
	}
	floor, err := numberAttr(got.Item, AttrFloor)
	if err != nil {
		return fmt.Errorf("store: item %s: %w", d.key(w), err)
	}
	switch {
	case mark >= w.Seq && inDoubt:
		// Applied by an earlier attempt (a lost answer, or a replay cut
		// off): done, once.
		if !w.Replay || w.Retry {
			d.metrics.resolved.WithLabelValues(ResolvedApplied).Inc()
		}
		return nil
	case mark >= w.Seq:
		// No attempt was in doubt, so this one was never applied: the
		// writer broke its own rule (two writes to one item at once).
		return fmt.Errorf("store: update %s: refused, a newer write of writer %s is on the item", d.key(w), w.Writer)
	case floor >= w.Seq && inDoubt:
		d.metrics.resolved.WithLabelValues(ResolvedUnresolvable).Inc()
		return fmt.Errorf("store: update %s: %w", d.key(w), ErrUnresolvable)
	case floor >= w.Seq:
		return &FloorError{Key: d.key(w), Floor: floor}
	default:
		// The item changed between the write and the read (another
		// writer's trim): nothing is known, so the same write goes again.
		return fmt.Errorf("%w: store: update %s refused, then the item allowed it", ErrAmbiguous, d.key(w))
	}
}

// trim removes the marks toTrim picks from the item just written (attrs)
// and raises its floor, on condition that those marks are unchanged (a
// writer that wrote again since keeps its new mark). Best effort: a trim
// that fails is tried by the next writer.
func (d *DynamoDB) trim(ctx context.Context, key string, attrs map[string]types.AttributeValue, now time.Time) {
	var marks []mark
	var floor int64
	for name, av := range attrs {
		n, ok := av.(*types.AttributeValueMemberN)
		switch {
		case !ok:
		case strings.HasPrefix(name, MarkPrefix):
			if v, err := strconv.ParseInt(n.Value, 10, 64); err == nil {
				marks = append(marks, mark{writer: name[len(MarkPrefix):], seq: v})
			}
		case name == AttrFloor:
			floor, _ = strconv.ParseInt(n.Value, 10, 64)
		}
	}
	drop, newFloor := toTrim(marks, now)
	if len(drop) == 0 {
		return
	}
	names := map[string]string{"#floor": AttrFloor}
	values := map[string]types.AttributeValue{
		":floor": &types.AttributeValueMemberN{Value: strconv.FormatInt(max(floor, newFloor), 10)},
	}
	var remove, conds []string
	for i, m := range drop {
		n, v := "#m"+strconv.Itoa(i), ":m"+strconv.Itoa(i)
		names[n] = MarkPrefix + m.writer
		values[v] = &types.AttributeValueMemberN{Value: strconv.FormatInt(m.seq, 10)}
		remove = append(remove, n)
		conds = append(conds, n+" = "+v)
	}
	d.metrics.trims.Inc()
	_, err := d.client.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName:                 &d.table,
		Key:                       map[string]types.AttributeValue{schema.AttrPK: &types.AttributeValueMemberS{Value: key}},
		UpdateExpression:          aws.String("REMOVE " + strings.Join(remove, ", ") + " SET #floor = :floor"),
		ConditionExpression:       aws.String(strings.Join(conds, " AND ") + " AND (attribute_not_exists(#floor) OR #floor <= :floor)"),
		ExpressionAttributeNames:  names,
		ExpressionAttributeValues: values,
	})
	if err != nil {
		d.metrics.trimErrors.Inc()
	}
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

// watchAttempts adds, to one UpdateItem call, a step that runs on every
// attempt (inside the SDK's retry loop) and sets *doubt when an attempt's
// outcome is unknown: it may have reached DynamoDB and no answer says it
// was not applied. A later attempt of the same call that is throttled or
// refused then does not mean "not applied".
func (d *DynamoDB) watchAttempts(doubt *bool) func(*dynamodb.Options) {
	return func(o *dynamodb.Options) {
		o.APIOptions = append(o.APIOptions, func(stack *middleware.Stack) error {
			return stack.Finalize.Insert(middleware.FinalizeMiddlewareFunc("hotcountDoubt",
				func(ctx context.Context, in middleware.FinalizeInput, next middleware.FinalizeHandler) (middleware.FinalizeOutput, middleware.Metadata, error) {
					out, md, err := next.HandleFinalize(ctx, in)
					if err != nil && ambiguous(err) {
						*doubt = true // attempts of one call run one after another
					}
					return out, md, err
				}), "Retry", middleware.After)
		})
	}
}

// ambiguous says whether a failed attempt may have been applied: it may have
// been sent and no answer refused it. An answer of 5xx is in doubt too
// (DynamoDB documents that the request may have succeeded); a 4xx answer
// applied nothing; a connection never made sent nothing. Everything else,
// a reset, a timeout, a cancelled context, is in doubt.
func ambiguous(err error) bool {
	var resp *smithyhttp.ResponseError
	if errors.As(err, &resp) && resp.HTTPStatusCode() > 0 { // 0: no answer came
		// Only a 4xx answer says nothing was applied. A 2xx whose body was
		// cut off (or failed to decode) was applied.
		code := resp.HTTPStatusCode()
		return code < 400 || code >= 500
	}
	var api smithy.APIError
	if errors.As(err, &api) && api.ErrorFault() == smithy.FaultClient {
		return false // an error answer with no HTTP wrapper (as in tests)
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
func (d *DynamoDB) Gather(ctx context.Context, topic string, n int, consistent bool) ([]schema.Shard, error) {
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
// so a count is never outside what is summed. With Regions, each topic's
// shards are read in the single-Region layout and in every Region, each
// with its own metadata: a Region's shards carry its name. The caller owns
// the map.
func (d *DynamoDB) GatherMany(ctx context.Context, topics []string, n int, consistent bool) (map[string][]schema.Shard, error) {
	d.metrics.gathers.Add(float64(len(topics)))
	out := make(map[string][]schema.Shard, len(topics))
	metas := make(map[regional]schema.Meta, len(topics))
	want := make(map[regional][2]int, len(topics))
	for _, t := range topics {
		for _, r := range d.Regions.Reads() {
			want[regional{t, r}] = [2]int{0, n}
		}
	}
	if err := d.readShards(ctx, want, true, consistent, out, metas); err != nil {
		return nil, d.readFailed(topics, err)
	}
	more := make(map[regional][2]int)
	for u, m := range metas {
		if r := m.Read(); r > n {
			more[u] = [2]int{n, r}
		}
	}
	if len(more) > 0 {
		if err := d.readShards(ctx, more, false, consistent, out, metas); err != nil {
			return nil, d.readFailed(topics, err)
		}
	}
	for _, shards := range out {
		slices.SortFunc(shards, func(a, b schema.Shard) int {
			return cmp.Or(strings.Compare(a.Region, b.Region), cmp.Compare(a.Shard, b.Shard))
		})
	}
	d.answered()
	return out, nil
}

// regional is a topic's items in one Region ("": the single-Region
// layout).
type regional struct{ topic, region string }

func (d *DynamoDB) readFailed(topics []string, err error) error {
	err = classify(fmt.Errorf("store: gather %s: %w", schema.Named(topics), err))
	d.metrics.failed("read", err)
	d.lastErr.Store(time.Now().UnixNano())
	return err
}

// readShards reads shards [from, to) of each topic's Region in want (and,
// with withMeta, its metadata item) into out and metas, in BatchGetItem
// calls of up to 100 keys.
func (d *DynamoDB) readShards(ctx context.Context, want map[regional][2]int, withMeta, consistent bool, out map[string][]schema.Shard, metas map[regional]schema.Meta) error {
	type slot struct {
		at    regional
		shard int // index in out[topic]; -1: the metadata item
	}
	index := make(map[string]slot)
	var keys []map[string]types.AttributeValue
	key := func(k string, s slot) {
		index[k] = s
		keys = append(keys, map[string]types.AttributeValue{schema.AttrPK: &types.AttributeValueMemberS{Value: k}})
	}
	for u, r := range want {
		shards := out[u.topic]
		for i := r[0]; i < r[1]; i++ {
			key(schema.InRegion(schema.ShardKey(u.topic, i), u.region), slot{u, len(shards)})
			shards = append(shards, schema.Shard{Shard: i, Region: u.region})
		}
		out[u.topic] = shards
		if withMeta {
			key(schema.InRegion(schema.MetaKey(u.topic), u.region), slot{u, -1})
		}
	}
	d.metrics.reads.Add(float64(len(keys)))
	for start := 0; start < len(keys); start += maxBatchGetKeys {
		chunk := keys[start:min(start+maxBatchGetKeys, len(keys))]
		err := d.batchGet(ctx, chunk, consistent, func(item map[string]types.AttributeValue) error {
			pk, ok := item[schema.AttrPK].(*types.AttributeValueMemberS)
			if !ok {
				return fmt.Errorf("store: item without a string %s", schema.AttrPK)
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
				metas[at.at] = m
				return nil
			}
			sh := &out[at.at.topic][at.shard]
			var err error
			if sh.Count, err = numberAttr(item, schema.AttrCount); err != nil {
				return fmt.Errorf("store: item %s: %w", pk.Value, err)
			}
			if sh.UpdatedAt, err = numberAttr(item, schema.AttrUpdatedAt); err != nil {
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

// Counts reads the count of each item in keys (bucket shards, as BucketKey
// names them) in BatchGetItem calls of up to 100 keys; a missing item, or
// one past its expiresAt, counts 0. With Regions, a key's count is the sum
// of its item in the single-Region layout and in every Region. The caller
// owns the map.
func (d *DynamoDB) Counts(ctx context.Context, keys []string, consistent bool) (map[string]int64, error) {
	now := time.Now().Unix()
	out := make(map[string]int64, len(keys))
	req := make([]map[string]types.AttributeValue, 0, len(keys))
	regions := d.Regions.Reads()
	for _, k := range keys {
		if _, dup := out[k]; dup {
			continue
		}
		out[k] = 0
		for _, r := range regions {
			req = append(req, map[string]types.AttributeValue{schema.AttrPK: &types.AttributeValueMemberS{Value: schema.InRegion(k, r)}})
		}
	}
	d.metrics.reads.Add(float64(len(req)))
	for start := 0; start < len(req); start += maxBatchGetKeys {
		err := d.batchGet(ctx, req[start:min(start+maxBatchGetKeys, len(req))], consistent, func(item map[string]types.AttributeValue) error {
			pk, ok := item[schema.AttrPK].(*types.AttributeValueMemberS)
			if !ok {
				return fmt.Errorf("store: item without a string %s", schema.AttrPK)
			}
			n, err := numberAttr(item, schema.AttrCount)
			if err != nil {
				return fmt.Errorf("store: item %s: %w", pk.Value, err)
			}
			// Past its TTL the item is gone, whenever DynamoDB gets to
			// deleting it: read it as gone now.
			if exp, err := numberAttr(item, schema.AttrExpiresAt); err == nil && exp > 0 && exp < now {
				n = 0
			}
			k, _ := schema.SplitRegion(pk.Value)
			out[k], _ = schema.SatAdd(out[k], n)
			return nil
		})
		if err != nil {
			err = classify(fmt.Errorf("store: read %d bucket items: %w", len(req), err))
			d.metrics.failed("read", err)
			d.lastErr.Store(time.Now().UnixNano())
			return nil, err
		}
	}
	d.answered()
	return out, nil
}

// MarkHistory lowers the fleet's history start (HistoryKey) to t if it is
// later or unset: one conditional UpdateItem.
func (d *DynamoDB) MarkHistory(ctx context.Context, t time.Time) error {
	_, err := d.client.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName:                &d.table,
		Key:                      map[string]types.AttributeValue{schema.AttrPK: &types.AttributeValueMemberS{Value: schema.InRegion(schema.HistoryKey, d.Regions.Own)}},
		UpdateExpression:         aws.String("SET #since = :t"),
		ConditionExpression:      aws.String("attribute_not_exists(#since) OR #since > :t"),
		ExpressionAttributeNames: map[string]string{"#since": schema.AttrSince},
		ExpressionAttributeValues: map[string]types.AttributeValue{
			":t": &types.AttributeValueMemberN{Value: strconv.FormatInt(t.Unix(), 10)},
		},
	})
	var cond *types.ConditionalCheckFailedException
	if errors.As(err, &cond) {
		return nil // an earlier start is recorded
	}
	if err != nil {
		return classify(fmt.Errorf("store: mark the fleet's history: %w", err))
	}
	return nil
}

// HistoryStart reads the fleet's history start (the zero time when nothing
// was ever marked): with Regions, the earliest of every Region's.
func (d *DynamoDB) HistoryStart(ctx context.Context) (time.Time, error) {
	var keys []map[string]types.AttributeValue
	for _, r := range d.Regions.Reads() {
		keys = append(keys, map[string]types.AttributeValue{schema.AttrPK: &types.AttributeValueMemberS{Value: schema.InRegion(schema.HistoryKey, r)}})
	}
	var first int64
	err := d.batchGet(ctx, keys, false, func(item map[string]types.AttributeValue) error {
		since, err := numberAttr(item, schema.AttrSince)
		if err == nil && since > 0 && (first == 0 || since < first) {
			first = since
		}
		return err
	})
	if err != nil {
		return time.Time{}, classify(fmt.Errorf("store: read the fleet's history: %w", err))
	}
	if first == 0 {
		return time.Time{}, nil
	}
	return time.Unix(first, 0).UTC(), nil
}

func decodeMeta(item map[string]types.AttributeValue) (schema.Meta, error) {
	s, err := numberAttr(item, schema.AttrShards)
	if err != nil {
		return schema.Meta{}, err
	}
	r, err := numberAttr(item, schema.AttrReadShards)
	if err != nil {
		return schema.Meta{}, err
	}
	if s < 1 || s > schema.MaxShards || r < s || r > schema.MaxShards {
		return schema.Meta{}, fmt.Errorf("shard metadata %d/%d outside 1..%d", s, r, schema.MaxShards)
	}
	return schema.Meta{Shards: int(s), ReadShards: int(r)}, nil
}

// Metas reads the topics' shard counts, for writers and readers: a topic
// without a metadata item has one shard (the zero Meta). With Regions, a
// topic's Meta is its own Region's, and Elsewhere the most shards the
// single-Region layout or any other Region ever had (readers read them
// all; only the own Region's item is ever changed).
func (d *DynamoDB) Metas(ctx context.Context, topics []string) (map[string]schema.Meta, error) {
	metas := make(map[string]schema.Meta, len(topics))
	index := make(map[string]regional, len(topics))
	keys := make([]map[string]types.AttributeValue, 0, len(topics))
	for _, t := range topics {
		for _, r := range d.Regions.Reads() {
			k := schema.InRegion(schema.MetaKey(t), r)
			index[k] = regional{t, r}
			keys = append(keys, map[string]types.AttributeValue{schema.AttrPK: &types.AttributeValueMemberS{Value: k}})
		}
	}
	d.metrics.reads.Add(float64(len(keys)))
	// A cold start looks up thousands of topics: their BatchGetItem calls
	// (100 keys each) go out in parallel, not one round trip after another.
	var mu sync.Mutex
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(metaLookups)
	for start := 0; start < len(keys); start += maxBatchGetKeys {
		chunk := keys[start:min(start+maxBatchGetKeys, len(keys))]
		g.Go(func() error {
			return d.batchGet(gctx, chunk, true, func(item map[string]types.AttributeValue) error {
				pk, _ := item[schema.AttrPK].(*types.AttributeValueMemberS)
				if pk == nil {
					return fmt.Errorf("store: item without a string %s", schema.AttrPK)
				}
				m, err := decodeMeta(item)
				if err != nil {
					return fmt.Errorf("store: item %s: %w", pk.Value, err)
				}
				at := index[pk.Value]
				mu.Lock()
				defer mu.Unlock()
				had := metas[at.topic]
				if at.region == d.Regions.Own {
					m.Elsewhere = had.Elsewhere
					metas[at.topic] = m
				} else {
					had.Elsewhere = max(had.Elsewhere, m.Read())
					metas[at.topic] = had
				}
				return nil
			})
		})
	}
	if err := g.Wait(); err != nil {
		return nil, d.readFailed(topics, err)
	}
	d.answered()
	return metas, nil
}

// SetMeta changes topic's metadata from old (what the caller last read;
// zero: no item) to m, only if it is still old: writers racing to change it
// agree on one value. Refused: ErrConflict.
func (d *DynamoDB) SetMeta(ctx context.Context, topic string, old, m schema.Meta) error {
	in := &dynamodb.PutItemInput{
		TableName: &d.table,
		Item: map[string]types.AttributeValue{
			schema.AttrPK:         &types.AttributeValueMemberS{Value: schema.InRegion(schema.MetaKey(topic), d.Regions.Own)},
			schema.AttrShards:     &types.AttributeValueMemberN{Value: strconv.Itoa(m.Shards)},
			schema.AttrReadShards: &types.AttributeValueMemberN{Value: strconv.Itoa(m.ReadShards)},
		},
		ExpressionAttributeNames: map[string]string{"#pk": schema.AttrPK},
	}
	if !old.Exists() {
		in.ConditionExpression = aws.String("attribute_not_exists(#pk)")
	} else {
		in.ConditionExpression = aws.String("#s = :s AND #r = :r")
		in.ExpressionAttributeNames["#s"] = schema.AttrShards
		in.ExpressionAttributeNames["#r"] = schema.AttrReadShards
		delete(in.ExpressionAttributeNames, "#pk")
		in.ExpressionAttributeValues = map[string]types.AttributeValue{
			":s": &types.AttributeValueMemberN{Value: strconv.Itoa(old.Shards)},
			":r": &types.AttributeValueMemberN{Value: strconv.Itoa(old.ReadShards)},
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
	b := waits.Unprocessed()
	left := false // keys handed back wait for the next attempt
	_, err := backoff.Retry(ctx, func() (struct{}, error) {
		left = false
		out, err := d.client.BatchGetItem(ctx, &dynamodb.BatchGetItemInput{RequestItems: req})
		if err != nil {
			return struct{}{}, backoff.Permanent(err)
		}
		for _, item := range out.Responses[d.table] {
			if err := each(item); err != nil {
				return struct{}{}, backoff.Permanent(err)
			}
		}
		if len(out.UnprocessedKeys[d.table].Keys) == 0 {
			return struct{}{}, nil
		}
		req, left = out.UnprocessedKeys, true
		d.metrics.batchGets.Inc()
		return struct{}{}, errUnprocessed
	}, backoff.WithBackOff(b), backoff.WithMaxElapsedTime(0)) // until ctx ends
	if left {
		return fmt.Errorf("unprocessed keys left: %w", ctx.Err()) // ctx ended with keys waiting
	}
	return err
}

// errUnprocessed is batchGet's attempt that left keys to retry.
var errUnprocessed = errors.New("unprocessed keys left")

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
			{AttributeName: aws.String(schema.AttrPK), AttributeType: types.ScalarAttributeTypeS},
		},
		KeySchema: []types.KeySchemaElement{
			{AttributeName: aws.String(schema.AttrPK), KeyType: types.KeyTypeHash},
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

// TTLAPI is the part of the DynamoDB client EnableTTL calls.
type TTLAPI interface {
	DescribeTimeToLive(ctx context.Context, in *dynamodb.DescribeTimeToLiveInput, opts ...func(*dynamodb.Options)) (*dynamodb.DescribeTimeToLiveOutput, error)
	UpdateTimeToLive(ctx context.Context, in *dynamodb.UpdateTimeToLiveInput, opts ...func(*dynamodb.Options)) (*dynamodb.UpdateTimeToLiveOutput, error)
}

// ErrNoTTL marks an endpoint that does not implement UpdateTimeToLive
// (dynalite, for one): buckets then stay until deleted by hand; readers
// ignore expired ones either way.
var ErrNoTTL = errors.New("store: this DynamoDB endpoint does not implement UpdateTimeToLive")

// EnableTTL turns on the table's TTL on AttrExpiresAt, so that DynamoDB
// deletes time buckets past their retention. It returns the TTL status
// (ENABLED, ENABLING), leaving it as it is when it is on already, and
// ErrNoTTL when the endpoint has no such call.
func EnableTTL(ctx context.Context, client TTLAPI, table string) (string, error) {
	d, err := client.DescribeTimeToLive(ctx, &dynamodb.DescribeTimeToLiveInput{TableName: &table})
	if err == nil && d.TimeToLiveDescription != nil {
		desc := d.TimeToLiveDescription
		switch desc.TimeToLiveStatus {
		case types.TimeToLiveStatusEnabled, types.TimeToLiveStatusEnabling:
			if desc.AttributeName != nil && *desc.AttributeName != schema.AttrExpiresAt {
				return "", fmt.Errorf("store: table %s has TTL on %q, not %q: buckets would never expire; disable it first", table, *desc.AttributeName, schema.AttrExpiresAt)
			}
			return string(desc.TimeToLiveStatus), nil
		}
	}
	out, err := client.UpdateTimeToLive(ctx, &dynamodb.UpdateTimeToLiveInput{
		TableName: &table,
		TimeToLiveSpecification: &types.TimeToLiveSpecification{
			AttributeName: aws.String(schema.AttrExpiresAt),
			Enabled:       aws.Bool(true),
		},
	})
	var api smithy.APIError
	if errors.As(err, &api) && (api.ErrorCode() == "UnknownOperationException" || strings.Contains(api.ErrorMessage(), "not implemented")) {
		return "", fmt.Errorf("%w: %v", ErrNoTTL, err)
	}
	if err != nil {
		return "", fmt.Errorf("store: enable TTL on table %s: %w", table, err)
	}
	if out.TimeToLiveSpecification != nil && aws.ToBool(out.TimeToLiveSpecification.Enabled) {
		return string(types.TimeToLiveStatusEnabling), nil
	}
	return "", fmt.Errorf("store: enable TTL on table %s: not enabled", table)
}

// classify marks throughput refusals with ErrThrottled, and refusals no
// retry changes with ErrDenied, so callers can branch on them without
// knowing the SDK's error types.
func classify(err error) error {
	var api smithy.APIError
	if errors.As(err, &api) {
		switch api.ErrorCode() {
		case "ProvisionedThroughputExceededException", "ThrottlingException", "RequestLimitExceeded",
			// A global table in multi-Region strong consistency refuses a
			// write to an item another Region is writing: refused, not
			// applied, like a throttle (an attempt before it that may have
			// been applied still makes the write one in doubt: addFailed).
			// With Region-owned shards no two Regions write one item.
			"ReplicatedWriteConflictException":
			return fmt.Errorf("%w: %w", ErrThrottled, err)
		case "AccessDeniedException", "ValidationException":
			return fmt.Errorf("%w: %w", ErrDenied, err)
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

// ItemSize is an item's size as DynamoDB bills it: per attribute, the
// name's bytes plus the value's (a string's bytes; a number's significant
// digits, two to a byte, plus one). Writes cost one unit per started KB.
func ItemSize(item map[string]types.AttributeValue) int {
	size := 0
	for name, av := range item {
		size += len(name)
		switch v := av.(type) {
		case *types.AttributeValueMemberS:
			size += len(v.Value)
		case *types.AttributeValueMemberN:
			digits := strings.Trim(strings.TrimLeft(v.Value, "-"), "0")
			size += (len(strings.ReplaceAll(digits, ".", ""))+1)/2 + 1
		default:
			size += 8 // not in hotcount's items; a rough figure
		}
	}
	return size
}
