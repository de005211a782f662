// Package store keeps hotcount's sharded counters: two implementations of
// the same semantics over the key schema (package schema), DynamoDB
// (production) and bbolt (the embedded store of `hotcount dev`), their
// idempotent writes and their metrics.
package store

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

// ErrConflict marks a metadata change refused because the item is no longer
// what the caller last read: another writer changed it first. Read it again.
var ErrConflict = errors.New("store: shard metadata changed by another writer")

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
