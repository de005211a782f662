// Package schema is hotcount's key schema: a topic's counters (its total
// and its time buckets), their names, the partition keys of their shard
// items, the shard-count metadata and the Regions' shards, and how shards
// add up. Every reader and writer of the table goes through these names;
// the adapters (package store: DynamoDB, bbolt) apply them. It needs only
// the standard library (and package mention's topic rule), so that config
// and the tools name a counter without compiling the AWS SDK.
//
// A topic's count lives in N shard items whose partition keys differ only by
// the shard id, TREND#<topic>#<shardId>. An increment goes to one shard; a
// total is the sum of all N. The shard id sits in the partition key because a
// sort key would leave all N items on one partition, with none of the
// headroom that sharding is for.
package schema

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/hotcount/hotcount/mention"
)

// Key schema. Every reader and writer of the table goes through these names.
const (
	// KeyPrefix starts every shard item's partition key.
	KeyPrefix = "TREND#"
	// AttrPK is the table's only key attribute (string, HASH).
	AttrPK = "pk"
	// AttrCount is the shard's count (number).
	AttrCount = "count"
	// AttrUpdatedAt is the time of the shard's last increment (number, Unix ms).
	AttrUpdatedAt = "updatedAt"
)

// MaxShards bounds the shard count of one topic. It keeps a gather within one
// BatchGetItem call (100 keys) and the read cost of a total visible.
const MaxShards = 100

// ShardKey returns the partition key of one shard of a topic.
func ShardKey(topic string, shard int) string {
	return KeyPrefix + topic + "#" + strconv.Itoa(shard)
}

// ParseShardKey splits a shard item's partition key into its topic and
// shard id; the shard id is what follows the last '#', so topics may hold
// '#' themselves. A Region's shard (InRegion) parses as the same shard of
// the single-Region layout.
func ParseShardKey(pk string) (topic string, shard int, err error) {
	pk, _ = SplitRegion(pk)
	rest, ok := strings.CutPrefix(pk, KeyPrefix)
	i := strings.LastIndexByte(rest, '#')
	if !ok || i < 0 {
		return "", 0, fmt.Errorf("store: key %q is not %s<topic>#<shard>", pk, KeyPrefix)
	}
	shard, err = strconv.Atoi(rest[i+1:])
	if err != nil || shard < 0 {
		return "", 0, fmt.Errorf("store: key %q has no shard id", pk)
	}
	return rest[:i], shard, nil
}

// Shard is one shard item as read back.
type Shard struct {
	// Shard is the shard id, 0..N-1.
	Shard int `json:"shard"`
	// Region is the Region whose item it is (region.go); "" in the
	// single-Region layout.
	Region string `json:"region,omitempty"`
	// Count is the shard's count; 0 for a shard never written.
	Count int64 `json:"count"`
	// UpdatedAt is the Unix time in milliseconds of the last increment; 0 for
	// a shard never written.
	UpdatedAt int64 `json:"updatedAt"`
}

// Sum adds up the counts of shards. Counts are never negative (increments
// are positive), so the sum can only overflow upward; it saturates at
// math.MaxInt64 rather than wrap, and says so.
func Sum(shards []Shard) (total int64, saturated bool) {
	for _, s := range shards {
		if total, saturated = SatAdd(total, s.Count); saturated {
			return total, true
		}
	}
	return total, false
}

// SatAdd adds y to the count x, capping at math.MaxInt64 rather than
// wrapping, and says whether it capped: a count is never negative, so only
// a positive y can overflow it. Every stage adds counts with it.
func SatAdd(x, y int64) (sum int64, saturated bool) {
	if y > 0 && x > math.MaxInt64-y {
		return math.MaxInt64, true
	}
	return x + y, false
}

// UnixMilli is the updatedAt encoding of t.
func UnixMilli(t time.Time) int64 { return t.UnixMilli() }

// ValidateTopic checks a topic before it becomes part of a key
// (mention.CheckTopic).
func ValidateTopic(topic string, maxBytes int) error { return mention.CheckTopic(topic, maxBytes) }

// maxNamed is how many topics an error message names; the rest are counted.
const maxNamed = 3

// Named lists topics for an error message or a log line: at most three,
// quoted, and how many more, so that a failure over a million topics is
// still one short line.
func Named(topics []string) string {
	var b strings.Builder
	for i, t := range topics {
		if i == maxNamed {
			fmt.Fprintf(&b, " and %d more", len(topics)-maxNamed)
			break
		}
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(strconv.Quote(t))
	}
	return b.String()
}
