package store

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/big"
	"strconv"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/hotcount/hotcount/schema"
)

// Exactly-once by stream position, beside the writer marks (write.go). A
// write that carries a Span says which stream positions its delta counts:
// the mentions of one counter at sequences First..Last of one partition
// stream. The item records, per stream and epoch (one creation of the
// stream), the last position it includes, p_<stream>.<epoch> =
// Epoch*10^20 + Seq, and the write is conditional on that position being
// below First:
//
//	ADD #count :delta SET #updatedAt = :now, #p = :last
//	IF attribute_not_exists(#p) OR #p < :first
//
// A write sent again, by anyone (a retry, a replay, another consumer of the
// same stream after a rebalance), is refused once the item includes its
// positions, however long ago it was applied: positions need no trimming,
// unlike marks, and the item holds one attribute per stream creation, not
// per writer. A stream deleted and created again (a new epoch) gets an
// attribute of its own, so that its writes and the old creation's never
// judge each other: a write of the old stream still in flight when the
// new one's land applies, or not, against the old stream's position
// alone, and neither is lost. One number orders (epoch, seq): Seq < 10^20
// (MaxUint64 is about 1.8*10^19), so Epoch*10^20 + Seq grows with Epoch
// first, then Seq. An epoch below 10^18 keeps it within DynamoDB's 38
// digits.

// PositionPrefix starts a stream's position attribute, p_<stream>.<epoch>.
const PositionPrefix = "p_"

// maxStreamLen bounds a stream's name: it is part of an attribute name
// (and, in the embedded store, stored behind a one-byte length).
const maxStreamLen = 200

// maxEpoch keeps Epoch*10^20 + Seq below 10^38, DynamoDB's precision.
const maxEpoch = 1e18 - 1

// spanAttempts bounds the sends of one span write that is refused and then
// found allowed (its item deleted by TTL in between, say): each refusal
// applied nothing, so sending it again is safe.
const spanAttempts = 3

// Span is the stream positions a durable write covers: the mentions of one
// counter at stream sequences First..Last of one partition stream.
type Span struct {
	// Stream is the partition stream's name, e.g. "MENTIONS-3", of
	// [A-Za-z0-9_-]; the item keeps its position in attribute
	// PositionAttr(Stream, Epoch).
	Stream string
	// Epoch is the stream's creation time in Unix microseconds: a stream
	// deleted and created again starts afresh, in an attribute of its
	// own.
	Epoch int64
	// First and Last are stream sequences, 1 <= First <= Last.
	First, Last uint64
}

// Position is what an item records for one stream: the epoch and the last
// sequence whose mentions it includes.
type Position struct {
	Epoch int64
	Seq   uint64
}

// ErrCovered marks a span write refused because the item already includes
// every position of it (its recorded position is at or past Last): nothing
// was applied, and nothing needs to be. A retry whose first attempt was applied ends so too.
var ErrCovered = errors.New("store: the item already includes every position of the write")

// OverlapError is a span write refused because the item includes its
// positions up to Recorded.Seq, with First <= Recorded.Seq < Last in the
// same epoch: some of its mentions are counted already, some not. Nothing
// was applied; the caller recounts the counter's mentions after
// Recorded.Seq and writes those.
type OverlapError struct {
	Key      string // the item
	Span     Span   // the write's span
	Recorded Position
}

func (e *OverlapError) Error() string {
	return fmt.Sprintf("store: update %s: stream %s epoch %d: the item includes positions up to %d, the write covers %d..%d: recount the mentions after %d",
		e.Key, e.Span.Stream, e.Span.Epoch, e.Recorded.Seq, e.Span.First, e.Span.Last, e.Recorded.Seq)
}

// PositionAttr is the attribute that holds the position of stream as it
// was created at epoch.
func PositionAttr(stream string, epoch int64) string { return PositionPrefix + slot(stream, epoch) }

// slot names one creation of a stream, stream.epoch: where an item keeps
// its position (the attribute's name in DynamoDB, the name in a bolt
// item). A stream's name has no dot.
func slot(stream string, epoch int64) string { return stream + "." + strconv.FormatInt(epoch, 10) }

// check refuses a span no item could record: the caller's mistake, which
// no retry changes (ErrDenied).
func (s Span) check() error {
	if err := checkStream(s.Stream); err != nil {
		return err
	}
	switch {
	case s.Epoch < 0 || s.Epoch > maxEpoch:
		return fmt.Errorf("%w: span of stream %s: epoch %d outside 0..%d", ErrDenied, s.Stream, s.Epoch, int64(maxEpoch))
	case s.First < 1 || s.First > s.Last:
		return fmt.Errorf("%w: span of stream %s: sequences %d..%d, want 1 <= first <= last", ErrDenied, s.Stream, s.First, s.Last)
	}
	return nil
}

// checkStream accepts 1..200 characters of [A-Za-z0-9_-]: a stream's name
// becomes part of an attribute name.
func checkStream(name string) error {
	ok := name != "" && len(name) <= maxStreamLen
	for _, r := range name {
		ok = ok && (r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' || r == '-')
	}
	if !ok {
		return fmt.Errorf("%w: stream name %q is not 1..%d characters of [A-Za-z0-9_-]", ErrDenied, name, maxStreamLen)
	}
	return nil
}

// seqRadix is 10^20, the weight of the epoch in a position's number.
var seqRadix = new(big.Int).Exp(big.NewInt(10), big.NewInt(20), nil)

// encodePosition writes p as the decimal Epoch*10^20 + Seq. big.Int keeps
// it exact: the value has up to 38 digits, past any machine word.
func encodePosition(p Position) string {
	n := new(big.Int).Mul(big.NewInt(p.Epoch), seqRadix)
	return n.Add(n, new(big.Int).SetUint64(p.Seq)).String()
}

// decodePosition reads encodePosition's number back. It takes any form a
// DynamoDB number may come back in ("1.5E+35" too), but only an integer
// whose quotient and remainder by 10^20 fit an epoch and a seq.
func decodePosition(v string) (Position, error) {
	r, ok := new(big.Rat).SetString(v)
	if !ok || !r.IsInt() || r.Sign() < 0 {
		return Position{}, fmt.Errorf("position %q is not a non-negative integer", v)
	}
	epoch, seq := new(big.Int).QuoRem(r.Num(), seqRadix, new(big.Int))
	if !epoch.IsInt64() || epoch.Int64() > maxEpoch || !seq.IsUint64() {
		return Position{}, fmt.Errorf("position %q is not epoch*10^20 + seq (epoch below 10^18, seq below 2^64)", v)
	}
	return Position{Epoch: epoch.Int64(), Seq: seq.Uint64()}, nil
}

// recorded is what decides a span write: the item's position for its
// stream (has: one is recorded) and its count; and when the write that last
// applied was made (updatedAt, Unix ms).
type recorded struct {
	pos     Position
	has     bool
	count   int64
	updated int64
}

// verdict is what the item's record makes of a span write.
type verdict int

const (
	applies   verdict = iota // past the recorded position, and the count has room
	covered                  // ErrCovered
	overlaps                 // *OverlapError
	overflows                // ErrOverflow
)

// judge decides a span write of delta against the item's record, the same
// way in both stores.
func judge(s Span, delta int64, r recorded) verdict {
	switch {
	// An item keeps one position per stream creation (PositionAttr), so
	// the recorded epoch is the span's.
	case r.has && r.pos.Seq >= s.Last:
		return covered
	case r.has && r.pos.Seq >= s.First:
		return overlaps
	case wouldOverflow(r.count, delta):
		return overflows
	}
	return applies
}

// wouldOverflow says whether count+delta leaves the int64 range.
func wouldOverflow(count, delta int64) bool {
	return delta > 0 && count > math.MaxInt64-delta || delta < 0 && count < math.MinInt64-delta
}

// refusal is the error of a span write refused by v (not applies).
func refusal(key string, s Span, delta int64, r recorded, v verdict) error {
	switch v {
	case covered:
		return fmt.Errorf("store: update %s: stream %s at epoch %d seq %d, the write covers %d..%d of epoch %d: %w",
			key, s.Stream, r.pos.Epoch, r.pos.Seq, s.First, s.Last, s.Epoch, ErrCovered)
	case overlaps:
		return &OverlapError{Key: key, Span: s, Recorded: r.pos}
	case overflows:
		return fmt.Errorf("store: update %s: count %d + %d: %w", key, r.count, delta, ErrOverflow)
	}
	return fmt.Errorf("store: update %s: no refusal (a bug)", key)
}

// settleSpan counts a span write in doubt that its outcome settled: an
// earlier attempt had applied it (ErrCovered), or none had (applied now, or
// refused as an overlap, which no attempt of its own can have caused).
func (m *Metrics) settleSpan(err error) {
	var overlap *OverlapError
	switch {
	case err == nil || errors.As(err, &overlap):
		m.resolved.WithLabelValues(ResolvedNotApplied).Inc()
	case errors.Is(err, ErrCovered):
		m.resolved.WithLabelValues(ResolvedApplied).Inc()
	}
}

// addSpan is Add for a write with a Span: one conditional UpdateItem, no
// marks, no trims. It returns nil when this call applied it (an attempt of
// it whose answer was lost included: see errAppliedHere), ErrCovered
// (wrapped) when the item included its positions already (an earlier call
// of it in doubt included), *OverlapError, ErrOverflow, or the errors of
// Add (ErrThrottled, ErrAmbiguous, ErrDenied).
func (d *DynamoDB) addSpan(ctx context.Context, w Write, now time.Time) error {
	if err := w.Span.check(); err != nil {
		return fmt.Errorf("store: update %s: %w", d.key(w), err)
	}
	d.metrics.writes.Inc()
	firstTry := !w.Retry && !w.Replay
	var doubt bool // an attempt of this call may have been applied
	err := d.sendSpan(ctx, w, d.spanInput(w, now), schema.UnixMilli(now), &doubt)
	ambiguous := errors.Is(err, ErrAmbiguous)
	if firstTry && (doubt || ambiguous) {
		d.metrics.ambiguous.Inc() // the doubt begins: counted once per write
	}
	if !ambiguous && (w.Retry || firstTry && doubt) {
		d.metrics.settleSpan(err) // ... and ends
	}
	if errors.Is(err, ErrOverflow) {
		d.metrics.failed("write", err)
	}
	if errors.Is(err, errAppliedHere) {
		return nil
	}
	return err
}

// errAppliedHere marks a span write refused as covered by the write of an
// earlier attempt of the same call, whose answer was lost: the call
// applied it (addSpan returns nil).
var errAppliedHere = errors.New("store: applied by an attempt of this call whose answer was lost")

// sendSpan sends the span write, made at the time written (Unix ms), and
// again (up to spanAttempts) while a refusal turns out to allow it. *doubt
// is set once an attempt may have been applied.
func (d *DynamoDB) sendSpan(ctx context.Context, w Write, in *dynamodb.UpdateItemInput, written int64, doubt *bool) error {
	for attempt := 1; ; attempt++ {
		if attempt > 1 {
			d.metrics.writes.Inc() // each send is an UpdateItem call
		}
		var maybe bool
		_, err := d.client.UpdateItem(ctx, in, d.watchAttempts(&maybe), withoutThrottleRetries)
		*doubt = *doubt || maybe
		var cond *types.ConditionalCheckFailedException
		switch {
		case err == nil:
			d.answered()
			return nil
		case !errors.As(err, &cond):
			return d.addFailed(w, err, *doubt)
		}
		d.answered()
		r, err := d.spanRecord(ctx, d.key(w), PositionAttr(w.Span.Stream, w.Span.Epoch), cond)
		if err != nil {
			return err
		}
		v := judge(*w.Span, w.Delta, r)
		if v == covered && *doubt && r.pos.Seq == w.Span.Last && r.updated == written {
			// The item ends at this span, written at this call's time,
			// after an attempt whose answer was lost: that attempt applied
			// it. Covered, the caller would take it for another writer's
			// write and count its mentions flushed nowhere, nor show them
			// to trending (a loaded run saw the flushed total stop short
			// of the table's). This writer's next span of the counter waits
			// behind this one, so no later write of its own can be there.
			return fmt.Errorf("%w: %w", errAppliedHere, refusal(d.key(w), *w.Span, w.Delta, r, v))
		}
		if v != applies {
			return refusal(d.key(w), *w.Span, w.Delta, r, v)
		}
		// A refused write applied nothing; allowed now, it goes again.
		if attempt == spanAttempts {
			return fmt.Errorf("store: update %s: refused %d times, each time by an item that then allowed it; nothing was applied", d.key(w), attempt)
		}
	}
}

// spanInput is the span write's UpdateItem: the increment and the new
// position, on condition that the recorded position is below First and
// the count has room for the delta.
func (d *DynamoDB) spanInput(w Write, now time.Time) *dynamodb.UpdateItemInput {
	s := w.Span
	update := "ADD #count :delta SET #updatedAt = :now, #p = :last"
	cond := "(attribute_not_exists(#p) OR #p < :first)"
	names := map[string]string{
		"#count":     schema.AttrCount,
		"#updatedAt": schema.AttrUpdatedAt,
		"#p":         PositionAttr(s.Stream, s.Epoch),
	}
	values := map[string]types.AttributeValue{
		":delta": number(w.Delta),
		":now":   number(schema.UnixMilli(now)),
		":first": &types.AttributeValueMemberN{Value: encodePosition(Position{Epoch: s.Epoch, Seq: s.First})},
		":last":  &types.AttributeValueMemberN{Value: encodePosition(Position{Epoch: s.Epoch, Seq: s.Last})},
	}
	// DynamoDB numbers go to 38 digits: without a guard the count would
	// grow past int64, and no reader could read it.
	switch {
	case w.Delta > 0:
		cond += " AND (attribute_not_exists(#count) OR #count <= :room)"
		values[":room"] = number(math.MaxInt64 - w.Delta)
	case w.Delta < 0:
		cond += " AND (attribute_not_exists(#count) OR #count >= :room)"
		values[":room"] = number(math.MinInt64 - w.Delta)
	}
	update = d.withExpiry(w, update, names, values)
	return &dynamodb.UpdateItemInput{
		TableName:                 &d.table,
		Key:                       map[string]types.AttributeValue{schema.AttrPK: &types.AttributeValueMemberS{Value: d.key(w)}},
		UpdateExpression:          aws.String(update),
		ConditionExpression:       aws.String(cond),
		ExpressionAttributeNames:  names,
		ExpressionAttributeValues: values,
		// The refused item comes back with the refusal: it saves the read
		// that decides it (where the endpoint honours it; dynalite does not).
		ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
	}
}

func number(v int64) *types.AttributeValueMemberN {
	return &types.AttributeValueMemberN{Value: strconv.FormatInt(v, 10)}
}

// spanRecord reads what refused a span write: the item DynamoDB returned
// with the refusal, or else a strongly consistent read of it.
func (d *DynamoDB) spanRecord(ctx context.Context, key, attr string, cond *types.ConditionalCheckFailedException) (recorded, error) {
	r, returned, err := refusalRecord(cond, attr)
	if err != nil {
		return r, fmt.Errorf("store: item %s: %w", key, err)
	}
	if returned {
		return r, nil
	}
	item, err := d.readPosition(ctx, key, attr, true)
	if err != nil {
		// %v: whatever the read's error (a throttle), an earlier attempt
		// of the write may be in the item: it stays in doubt.
		return r, fmt.Errorf("%w: store: read %s after a refused write: %v", ErrAmbiguous, key, err)
	}
	if r, err = recordedIn(item, attr); err != nil {
		return r, fmt.Errorf("store: item %s: %w", key, err)
	}
	return r, nil
}

// refusalRecord decodes the record of stream from the item a refusal
// carries (ReturnValuesOnConditionCheckFailure); returned is false when it
// carries none.
func refusalRecord(cond *types.ConditionalCheckFailedException, attr string) (r recorded, returned bool, err error) {
	if cond == nil || cond.Item == nil {
		return recorded{}, false, nil
	}
	r, err = recordedIn(cond.Item, attr)
	return r, true, err
}

// recordedIn decodes the record of stream from an item's attributes.
func recordedIn(item map[string]types.AttributeValue, attr string) (recorded, error) {
	var r recorded
	var err error
	if r.count, err = numberAttr(item, schema.AttrCount); err != nil {
		return r, err
	}
	if r.updated, err = numberAttr(item, schema.AttrUpdatedAt); err != nil {
		return r, err
	}
	r.pos, r.has, err = positionAttr(item, attr)
	return r, err
}

// positionAttr decodes the position attribute name (PositionAttr); has is
// false when the item has none.
func positionAttr(item map[string]types.AttributeValue, name string) (p Position, has bool, err error) {
	av, ok := item[name]
	if !ok {
		return Position{}, false, nil
	}
	n, ok := av.(*types.AttributeValueMemberN)
	if !ok {
		return Position{}, false, fmt.Errorf("attribute %s is not a number", name)
	}
	if p, err = decodePosition(n.Value); err != nil {
		return Position{}, false, fmt.Errorf("attribute %s: %w", name, err)
	}
	return p, true, nil
}

// readPosition reads the count and the position attribute attr of the
// item key.
func (d *DynamoDB) readPosition(ctx context.Context, key, attr string, consistent bool) (map[string]types.AttributeValue, error) {
	d.metrics.reads.Inc()
	out, err := d.client.GetItem(ctx, &dynamodb.GetItemInput{
		TableName:                &d.table,
		Key:                      map[string]types.AttributeValue{schema.AttrPK: &types.AttributeValueMemberS{Value: key}},
		ConsistentRead:           aws.Bool(consistent),
		ProjectionExpression:     aws.String("#p, #count, #updatedAt"),
		ExpressionAttributeNames: map[string]string{"#p": attr, "#count": schema.AttrCount, "#updatedAt": schema.AttrUpdatedAt},
	})
	if err != nil {
		err = classify(err)
		d.metrics.failed("read", err)
		d.lastErr.Store(time.Now().UnixNano())
		return nil, err
	}
	d.answered()
	return out.Item, nil
}

// Position reads (strongly consistent) the position the item key records
// for stream as created at epoch; has is false when it records none. key
// is a Write's Key: in this store's own Region when it has one, as writes
// are.
func (d *DynamoDB) Position(ctx context.Context, key, stream string, epoch int64) (p Position, has bool, err error) {
	if err := checkStream(stream); err != nil {
		return Position{}, false, fmt.Errorf("store: position of %s: %w", key, err)
	}
	key = schema.InRegion(key, d.Regions.Own)
	attr := PositionAttr(stream, epoch)
	item, err := d.readPosition(ctx, key, attr, true)
	if err != nil {
		return Position{}, false, fmt.Errorf("store: read position of %s: %w", key, err)
	}
	if p, has, err = positionAttr(item, attr); err != nil {
		return Position{}, false, fmt.Errorf("store: item %s: %w", key, err)
	}
	return p, has, nil
}

// EpochOf is the epoch of a stream created at created: its creation time
// in Unix microseconds, as Span.Epoch has it.
func EpochOf(created time.Time) int64 { return created.UnixMicro() }
