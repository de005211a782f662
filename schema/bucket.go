package schema

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Time buckets: besides its all-time shards, a topic's mentions are counted
// per minute and per hour of their publication, for windowed counts and
// trending. A bucket is sharded like the total, with the shard in the
// partition key and the topic's shard count (its metadata covers both):
//
//	MINUTE#<topic>#<minute>#<shard>   minute = Unix seconds / 60
//	HOUR#<topic>#<hour>#<shard>       hour   = Unix seconds / 3600
//
// The index and the shard are the last two '#'-separated fields, so topics
// may hold '#'; the prefixes keep buckets apart from the totals' keys. Each
// bucket item carries AttrExpiresAt, the table's TTL attribute: DynamoDB
// deletes it some time after, and readers ignore it once past.
const (
	// AttrExpiresAt is a bucket's expiry (number, Unix seconds): the TTL
	// attribute `hotcount table create` enables.
	AttrExpiresAt = "expiresAt"
	// DefaultMinuteRetention is how long minute buckets are kept: two
	// days, for windows up to a day and a day of baseline before them.
	DefaultMinuteRetention = 48 * time.Hour
	// DefaultHourRetention is how long hour buckets are kept: 35 days, for
	// windows up to a week with four weeks of baseline.
	DefaultHourRetention = 35 * 24 * time.Hour
)

// Granularity is a bucket's length: Minute or Hour.
type Granularity byte

// The granularities.
const (
	Minute Granularity = 'm'
	Hour   Granularity = 'h'
)

// Duration is g's length.
func (g Granularity) Duration() time.Duration {
	if g == Hour {
		return time.Hour
	}
	return time.Minute
}

func (g Granularity) String() string {
	if g == Hour {
		return "1h"
	}
	return "1m"
}

func (g Granularity) prefix() string {
	if g == Hour {
		return "HOUR#"
	}
	return "MINUTE#"
}

// Index is the bucket of g that holds t.
func (g Granularity) Index(t time.Time) int64 {
	return floorDiv(t.Unix(), int64(g.Duration()/time.Second))
}

// Start is the start of bucket i of g.
func (g Granularity) Start(i int64) time.Time {
	return time.Unix(i*int64(g.Duration()/time.Second), 0).UTC()
}

func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && a < 0 {
		q--
	}
	return q
}

// BucketKey returns the partition key of one shard of topic's bucket i of
// g.
func BucketKey(topic string, g Granularity, i int64, shard int) string {
	return g.prefix() + topic + "#" + strconv.FormatInt(i, 10) + "#" + strconv.Itoa(shard)
}

// ParseBucketKey splits a bucket item's partition key (BucketKey) into its
// topic, granularity, bucket index and shard id.
func ParseBucketKey(pk string) (topic string, g Granularity, i int64, shard int, err error) {
	pk, _ = SplitRegion(pk) // a Region's bucket shard parses as the single-Region one
	var rest string
	switch {
	case strings.HasPrefix(pk, Minute.prefix()):
		g, rest = Minute, pk[len(Minute.prefix()):]
	case strings.HasPrefix(pk, Hour.prefix()):
		g, rest = Hour, pk[len(Hour.prefix()):]
	default:
		return "", 0, 0, 0, fmt.Errorf("store: key %q is not a bucket's", pk)
	}
	j := strings.LastIndexByte(rest, '#')
	k := strings.LastIndexByte(rest[:max(j, 0)], '#')
	if j < 0 || k < 0 {
		return "", 0, 0, 0, fmt.Errorf("store: key %q is not %s<topic>#<index>#<shard>", pk, g.prefix())
	}
	if i, err = strconv.ParseInt(rest[k+1:j], 10, 64); err != nil {
		return "", 0, 0, 0, fmt.Errorf("store: key %q has no bucket index", pk)
	}
	if shard, err = strconv.Atoi(rest[j+1:]); err != nil || shard < 0 {
		return "", 0, 0, 0, fmt.Errorf("store: key %q has no shard id", pk)
	}
	return rest[:k], g, i, shard, nil
}

// Retention is how long each granularity's buckets are kept; a zero field
// is its default (DefaultMinuteRetention, DefaultHourRetention).
type Retention struct{ Minute, Hour time.Duration }

// Of is g's retention.
func (r Retention) Of(g Granularity) time.Duration {
	switch {
	case g == Hour && r.Hour > 0:
		return r.Hour
	case g == Hour:
		return DefaultHourRetention
	case r.Minute > 0:
		return r.Minute
	}
	return DefaultMinuteRetention
}

// Expiry is the expiresAt of a write of c (0 for a total): the end of its
// bucket plus the retention.
func (r Retention) Expiry(c Counter) int64 {
	if c.Kind == Total {
		return 0
	}
	g := c.bucket()
	return g.Start(c.Index + 1).Add(r.Of(g)).Unix()
}

// The fleet's history: the time the first bucket was written, the same for
// every sidecar however long each has run. Trending cuts a baseline there
// (a topic has no baseline before the fleet counted anything). One item,
// pk = HistoryKey, attribute AttrSince (Unix seconds), lowered to the
// earliest time any writer reports (MarkHistory).
const (
	// HistoryKey is the partition key of the fleet's history item.
	HistoryKey = "FLEET#history"
	// AttrSince is the history item's start (number, Unix seconds).
	AttrSince = "since"
)
