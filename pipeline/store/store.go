// Package store keeps hotcount's sharded counters: the key schema in one
// place, and two implementations of the same semantics, DynamoDB (production)
// and bbolt (the embedded store of `hotcount dev`).
//
// A topic's count lives in N shard items whose partition keys differ only by
// the shard id, TREND#<topic>#<shardId>. An increment goes to one shard; a
// total is the sum of all N. The shard id sits in the partition key because a
// sort key would leave all N items on one partition, with none of the
// headroom that sharding is for.
package store

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

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

// ErrThrottled marks a write or read that DynamoDB refused for throughput
// (ProvisionedThroughputExceeded, Throttling, RequestLimitExceeded): nothing
// was applied, so the caller may retry it, preferably on another shard.
var ErrThrottled = errors.New("store: throttled")

// ErrOverflow marks an increment that would take a shard past the int64
// range. Nothing is applied.
var ErrOverflow = errors.New("store: count would overflow int64")

// ErrDenied marks a write refused with an answer that no retry of the same
// request changes: DynamoDB's AccessDeniedException (an IAM condition on
// some keys) or ValidationException (a malformed key, a number out of
// range). Nothing was applied; it takes a change outside hotcount (a
// policy, a key) before it can be.
var ErrDenied = errors.New("store: refused for good")

// Denied says whether err refuses a write for good: ErrDenied or
// ErrOverflow.
func Denied(err error) bool { return errors.Is(err, ErrDenied) || errors.Is(err, ErrOverflow) }

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

// Metrics counts what the stores do. Both implementations take one.
type Metrics struct {
	writes     prometheus.Counter
	reads      prometheus.Counter
	throttled  prometheus.Counter
	errors     *prometheus.CounterVec
	gathers    prometheus.Counter
	batchGets  prometheus.Counter
	ambiguous  prometheus.Counter
	resolved   *prometheus.CounterVec
	trims      prometheus.Counter
	trimErrors prometheus.Counter
	metaWrites prometheus.Counter
}

// NewMetrics registers the store metrics with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	counter := func(name, help string) prometheus.Counter {
		c := prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help})
		reg.MustRegister(c)
		return c
	}
	counterVec := func(name, help, label string, values ...string) *prometheus.CounterVec {
		c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, []string{label})
		reg.MustRegister(c)
		for _, v := range values {
			c.WithLabelValues(v) // present at 0 from the start
		}
		return c
	}
	return &Metrics{
		writes: counter("hotcount_store_writes_total",
			"Increment calls made to the store (DynamoDB UpdateItem calls), each carrying one coalesced delta."),
		reads: counter("hotcount_store_reads_total",
			"Shard items read from the store (keys asked for, found or not)."),
		throttled: counter("hotcount_store_throttled_total",
			"Store calls refused for throughput after the SDK's own retries."),
		errors: counterVec("hotcount_store_errors_total",
			"Store calls that failed, by operation (write, read).",
			"op", "write", "read"),
		gathers: counter("hotcount_store_gathers_total",
			"Topic totals gathered from the store (all shards of one topic)."),
		batchGets: counter("hotcount_store_batch_gets_total",
			"BatchGetItem calls (up to 100 shard keys each, retries of UnprocessedKeys included)."),
		ambiguous: counter("hotcount_store_ambiguous_total",
			"Writes whose outcome was unknown (a reset, a timeout, a 5xx answer): each is retried as the same write until hotcount_store_resolved_total settles it."),
		resolved: counterVec("hotcount_store_resolved_total",
			"Writes in doubt settled, by outcome: applied (an earlier attempt had applied it; the retry was refused by its mark), not_applied (the retry applied it), unresolvable (its mark was trimmed first; counted as applied; expected 0).",
			"outcome", ResolvedApplied, ResolvedNotApplied, ResolvedUnresolvable),
		trims: counter("hotcount_store_trims_total",
			"Conditional writes that removed old writer marks from a shard item (to keep it under one write unit)."),
		trimErrors: counter("hotcount_store_trim_errors_total",
			"Trims that failed or found the item changed; the next writer tries again."),
		metaWrites: counter("hotcount_store_meta_writes_total",
			"Conditional writes of a topic's shard metadata (first multi-shard write, raises, operator changes)."),
	}
}

func (m *Metrics) failed(op string, err error) {
	if errors.Is(err, ErrThrottled) {
		m.throttled.Inc()
	}
	m.errors.WithLabelValues(op).Inc()
}

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
