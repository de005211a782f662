package store

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/hotcount/hotcount/schema"
)

// Records are what `hotcount audit` reads of the items (package audit):
// each item's count with the positions it records (position.go), read
// together, so that the audit holds a counter exactly to the mentions up
// to those positions.

// Slot is one creation of a stream: its name and its epoch (Span's).
type Slot struct {
	Stream string
	Epoch  int64
}

// Record is one item as `hotcount audit` reads it: its count and the
// position it records for each stream creation that wrote it, read
// together, so that the count includes exactly the mentions up to each
// position.
type Record struct {
	// Region is the Region whose item it is ("": the single-Region
	// layout).
	Region    string
	Count     int64
	Positions map[Slot]uint64
}

// parseSlot reads an attribute name p_<stream>.<epoch> (PositionAttr);
// ok is false for any other name.
func parseSlot(name string) (s Slot, ok bool) {
	rest, ok := strings.CutPrefix(name, PositionPrefix)
	if !ok {
		return Slot{}, false
	}
	i := strings.LastIndexByte(rest, '.')
	if i < 0 {
		return Slot{}, false
	}
	epoch, err := strconv.ParseInt(rest[i+1:], 10, 64)
	if err != nil || checkStream(rest[:i]) != nil {
		return Slot{}, false
	}
	return Slot{Stream: rest[:i], Epoch: epoch}, true
}

// recordOf decodes an item's count and positions.
func recordOf(item map[string]types.AttributeValue) (Record, error) {
	var r Record
	var err error
	if r.Count, err = numberAttr(item, schema.AttrCount); err != nil {
		return r, err
	}
	for name := range item {
		s, ok := parseSlot(name)
		if !ok {
			continue
		}
		p, _, err := positionAttr(item, name)
		if err != nil {
			return r, err
		}
		if r.Positions == nil {
			r.Positions = make(map[Slot]uint64)
		}
		r.Positions[s] = p.Seq
	}
	return r, nil
}

// Records reads the items keys name, strongly consistent, in BatchGetItem
// calls of up to 100 keys: with Regions, each key in the single-Region
// layout and in every Region. A key's entry lists the items found; a
// missing item, or one past its expiresAt, is not listed. The caller owns
// the map.
func (d *DynamoDB) Records(ctx context.Context, keys []string) (map[string][]Record, error) {
	now := time.Now().Unix()
	out := make(map[string][]Record, len(keys))
	var req []map[string]types.AttributeValue
	for _, k := range keys {
		if _, dup := out[k]; dup {
			continue
		}
		out[k] = nil
		for _, r := range d.Regions.Reads() {
			req = append(req, map[string]types.AttributeValue{schema.AttrPK: &types.AttributeValueMemberS{Value: schema.InRegion(k, r)}})
		}
	}
	d.metrics.reads.Add(float64(len(req)))
	for start := 0; start < len(req); start += maxBatchGetKeys {
		err := d.batchGet(ctx, req[start:min(start+maxBatchGetKeys, len(req))], true, func(item map[string]types.AttributeValue) error {
			pk, ok := item[schema.AttrPK].(*types.AttributeValueMemberS)
			if !ok {
				return fmt.Errorf("store: item without a string %s", schema.AttrPK)
			}
			if exp, err := numberAttr(item, schema.AttrExpiresAt); err == nil && exp > 0 && exp < now {
				return nil // gone, whenever DynamoDB gets to deleting it
			}
			r, err := recordOf(item)
			if err != nil {
				return fmt.Errorf("store: item %s: %w", pk.Value, err)
			}
			k, region := schema.SplitRegion(pk.Value)
			r.Region = region
			out[k] = append(out[k], r)
			return nil
		})
		if err != nil {
			err = classify(fmt.Errorf("store: read %d items: %w", len(req), err))
			d.metrics.failed("read", err)
			d.lastErr.Store(time.Now().UnixNano())
			return nil, err
		}
	}
	d.answered()
	return out, nil
}
