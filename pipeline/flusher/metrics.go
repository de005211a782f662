package flusher

import "github.com/prometheus/client_golang/prometheus"

// Metrics are the flusher's metrics.
type Metrics struct {
	flushes     *prometheus.CounterVec
	duration    prometheus.Histogram
	flushed     prometheus.Counter
	requeued    prometheus.Counter
	rerouted    prometheus.Counter
	early       prometheus.Counter
	unflushed   prometheus.Counter
	doubtAtExit prometheus.Counter
	lastSuccess prometheus.Gauge
	pending     prometheus.Gauge

	quarantined         prometheus.Counter
	quarantinedMentions prometheus.Counter
}

// NewMetrics registers the flusher's metrics with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		flushes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hotcount_flusher_flushes_total",
			Help: "Flushes, by result: ok (everything written) or error (some deltas kept for the next flush).",
		}, []string{"result"}),
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "hotcount_flusher_flush_seconds",
			Help:    "Time one flush took.",
			Buckets: prometheus.ExponentialBuckets(0.001, 4, 8),
		}),
		flushed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "hotcount_flusher_flushed_mentions_total",
			Help: "Mentions written to the store (the sum of the deltas of successful writes).",
		}),
		requeued: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "hotcount_flusher_requeued_mentions_total",
			Help: "Mentions whose write failed or was not started in time and went back into the buffer.",
		}),
		rerouted: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "hotcount_flusher_rerouted_total",
			Help: "Throttled writes retried on another shard.",
		}),
		early: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "hotcount_flusher_early_total",
			Help: "Flushes started before the interval because the window reached --max-topics.",
		}),
		unflushed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "hotcount_flusher_unflushed_total",
			Help: "Mentions still buffered when the shutdown deadline passed and not kept in the spill folder: lost.",
		}),
		doubtAtExit: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "hotcount_flusher_doubt_at_shutdown_total",
			Help: "Mentions in writes still in doubt (no answer) when the shutdown deadline passed, in core mode: each may or may not be in the store.",
		}),
		pending: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "hotcount_flusher_pending_writes",
			Help: "Writes in doubt (outcome unknown) waiting to be sent again unchanged; their topics' newer deltas wait behind them.",
		}),
		quarantined: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "hotcount_flusher_quarantined_writes_total",
			Help: "Writes the store refused for good (AccessDenied, Validation, overflow) for --quarantine-after, moved to the quarantine: `hotcount quarantine list` shows them, `hotcount quarantine replay` writes them.",
		}),
		quarantinedMentions: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "hotcount_flusher_quarantined_mentions_total",
			Help: "Mentions in the topic totals moved to the quarantine (time buckets' writes repeat them and are not counted here).",
		}),
		lastSuccess: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "hotcount_flusher_last_success_timestamp_seconds",
			Help: "Unix time of the last flush that wrote everything it drained.",
		}),
	}
	reg.MustRegister(m.flushes, m.duration, m.flushed, m.requeued, m.rerouted, m.early, m.unflushed, m.lastSuccess, m.pending, m.doubtAtExit, m.quarantined, m.quarantinedMentions)
	m.flushes.WithLabelValues("ok")
	m.flushes.WithLabelValues("error")
	return m
}
