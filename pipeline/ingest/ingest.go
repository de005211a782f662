// Package ingest takes mention events from NATS, checks them, and adds them
// to the aggregator. Several sidecars share one stream of mentions through a
// NATS queue group. A message it cannot use is rejected: counted, logged at a
// sampled rate and republished to the dead-letter subject with its reason.
package ingest

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/hotcount/hotcount/internal/natsauth"
	"github.com/hotcount/hotcount/mention"
)

// DefaultDeadLetterSubject receives rejected messages (config's default
// too).
const DefaultDeadLetterSubject = "hotcount.dlq"

// Pending limits of the subscription: how far nats.go may buffer ahead of
// the handler before it drops (and reports a slow consumer). A handler that
// keeps up holds a handful; these absorb a flush-sized pause.
const (
	pendingMsgs  = 512 << 10
	pendingBytes = 64 << 20
)

// Headers on a dead-lettered message.
const (
	// ErrorHeader gives the reason the message was rejected.
	ErrorHeader = "Hotcount-Error"
	// SubjectHeader gives the subject it was published to.
	SubjectHeader = "Hotcount-Subject"
	// StreamHeader, EpochHeader and SequenceHeader say, in the durable
	// modes, where it was stored: the stream, its creation (Unix
	// microseconds) and the sequence. A dead letter is published at least
	// once: a mention read again (a restart, a hand-over, a rewind) is
	// dead-lettered again, with the same three.
	StreamHeader   = "Hotcount-Stream"
	EpochHeader    = "Hotcount-Epoch"
	SequenceHeader = "Hotcount-Sequence"
)

// Sink receives accepted mentions. The aggregator is one.
type Sink interface {
	Add(topic string, delta int64)
}

// TimedSink is a Sink that also takes mentions at the time they happened
// (a message's "at"), to count them in that time's buckets. The aggregator
// is one. A Sink that is not one gets such mentions through Add.
type TimedSink interface {
	AddAt(topic string, delta int64, at time.Time)
}

// Clock is a Sink that tells the time it places mentions by. The
// aggregator is one: with time buckets on, its clock puts a mention
// without "at" in its minute. A core-mode mention's "at" is judged
// against this time (its arrival), so that what the ingest takes as
// within --max-lateness and the minute the sink counts it in read the
// same clock, a test's fake one included. A Sink that is not one is
// judged by the wall clock.
type Clock interface {
	Now() time.Time
}

// clockOf is sink's clock, or the wall clock.
func clockOf(sink any) func() time.Time {
	if c, ok := sink.(Clock); ok {
		return c.Now
	}
	return time.Now
}

// Config is the ingest's part of the configuration.
type Config struct {
	Subject           string
	QueueGroup        string
	DeadLetterSubject string
	DrainTimeout      time.Duration
	Limits            mention.Limits
	// Contributors is told of each accepted mention that names its
	// contributor ("by"), at the time it is counted at; nil: nobody.
	Contributors Contributors
}

// Contributors counts who mentioned each topic: trending's estimate of
// distinct contributors (trend.Contributors) is one. Saw must not keep
// by, which is the message's memory.
type Contributors interface {
	Saw(topic string, at time.Time, by []byte)
}

// checker parses messages and rejects the bad ones; the core subscriber
// and the durable engine's Checker share it.
type checker struct {
	nc      *nats.Conn
	cfg     Config
	prefix  string
	now     func() time.Time // the sink's clock (clockOf): a core-mode message's arrival
	log     *zap.Logger      // for events of the subscription
	sampled *zap.Logger      // for rejected messages: at most one line a second per reason
	metrics *Metrics
}

func newChecker(nc *nats.Conn, cfg Config, now func() time.Time, log *zap.Logger, m *Metrics) (*checker, error) {
	prefix, err := mention.Prefix(cfg.Subject)
	if err != nil {
		return nil, err
	}
	log = log.Named("ingest")
	return &checker{
		nc: nc, cfg: cfg, prefix: prefix, now: now, log: log, metrics: m,
		sampled: log.WithOptions(zap.WrapCore(func(c zapcore.Core) zapcore.Core {
			return zapcore.NewSamplerWithOptions(c, time.Second, 1, 0)
		})),
	}, nil
}

// check returns a message's topic, count and, if its payload has one, its
// "at" (zero without), or the reason it is rejected after rejecting it. An
// "at" is judged against published, the message's publication in the
// durable modes; zero (core mode) is its arrival, the sink's now.
func (c *checker) check(subject string, data []byte, hdr nats.Header, published time.Time) (topic string, delta int64, at time.Time, reason string) {
	return c.checkWith(c.cfg.Limits, subject, data, hdr, published, nil)
}

// Origin is where a durable mode's message was stored: a dead letter
// carries it (StreamHeader, EpochHeader, SequenceHeader), so that the
// repeats a re-read or a hand-over sends (dead letters are at least once)
// can be told apart.
type Origin struct {
	Stream string
	Epoch  int64
	Seq    uint64
}

// checkWith is check under limits l.
func (c *checker) checkWith(l mention.Limits, subject string, data []byte, hdr nats.Header, published time.Time, from *Origin) (topic string, delta int64, at time.Time, reason string) {
	topic, delta, at, by, byErr, err := judge(c.prefix, subject, data, published, c.now, l)
	if err != nil {
		return "", 0, time.Time{}, c.reject(subject, data, hdr, err, from)
	}
	if byErr != nil {
		c.metrics.byIgnored.Inc()
		c.sampled.Warn("contributor ignored; the mention counts", zap.String("subject", subject), zap.Error(byErr))
	}
	if by != nil && c.cfg.Contributors != nil {
		when := at
		switch {
		case !when.IsZero():
		case !published.IsZero():
			when = published
		default:
			when = c.now()
		}
		c.cfg.Contributors.Saw(topic, when, by)
	}
	return topic, delta, at, ""
}

// Judge says what the durable modes make of a message stored on subject
// (partitioned mode: the streams package's Unstored) with payload data and published
// at its stream timestamp: its topic, its count and the time it is
// counted at (the payload's "at", else published), or the reason it is
// rejected (an *InvalidError). It is Checker's own judgement (check calls
// the same code), for a reader of the stream that must agree with it:
// hotcount audit. It keeps no state.
func Judge(prefix, subject string, data []byte, published time.Time, l mention.Limits) (topic string, delta int64, at time.Time, err error) {
	topic, delta, at, _, _, err = judge(prefix, subject, data, published, nil, l)
	if err == nil && at.IsZero() {
		at = published
	}
	return topic, delta, at, err
}

// judge is check's and Judge's judgement: a message's topic, count,
// "at" (zero without one) and "by" (nil without one; data's memory), or
// why a "by" was ignored. An "at" is judged against published, or when
// that is zero against now() (core mode: the arrival). A "by" decides
// no count.
func judge(prefix, subject string, data []byte, published time.Time, now func() time.Time, l mention.Limits) (topic string, delta int64, at time.Time, by []byte, byErr, err error) {
	topic, err = mention.Topic(prefix, subject, l)
	if err != nil {
		return "", 0, time.Time{}, nil, nil, err
	}
	p, err := mention.ParsePayload(data, l.MaxCount)
	if err != nil {
		return "", 0, time.Time{}, nil, nil, err
	}
	if p.HasAt {
		if published.IsZero() && now != nil {
			published = now()
		}
		if at, err = mention.CheckAt(p.At, published, l.MaxLateness); err != nil {
			return "", 0, time.Time{}, nil, nil, err
		}
	}
	return topic, p.Count, at, p.By, p.ByErr, nil
}

// accepted counts a message once its count is in the buffer: a reader
// that sees the metric then finds the count (include=pending).
func (c *checker) accepted(delta int64) {
	c.metrics.events.Inc()
	c.metrics.mentions.Add(float64(delta))
}

// reject counts, logs (sampled) and dead-letters a message, and returns the
// reason. A dead-letter publish that fails is counted too.
func (c *checker) reject(subject string, data []byte, hdr nats.Header, err error, from *Origin) string {
	reason := mention.ReasonPayload
	var inv *mention.InvalidError
	if errors.As(err, &inv) {
		reason = inv.Reason
	}
	c.metrics.invalid.WithLabelValues(reason).Inc()
	c.sampled.Warn("message rejected", zap.String("reason", reason), zap.String("subject", subject), zap.Error(err))
	if c.cfg.DeadLetterSubject == "" {
		return reason
	}
	dl := nats.NewMsg(c.cfg.DeadLetterSubject)
	dl.Data = data
	for k, v := range hdr {
		dl.Header[k] = v
	}
	dl.Header.Set(ErrorHeader, reason)
	dl.Header.Set(SubjectHeader, subject)
	if from != nil {
		dl.Header.Set(StreamHeader, from.Stream)
		dl.Header.Set(EpochHeader, strconv.FormatInt(from.Epoch, 10))
		dl.Header.Set(SequenceHeader, strconv.FormatUint(from.Seq, 10))
	}
	if err := c.nc.PublishMsg(dl); err != nil {
		c.metrics.dropped.WithLabelValues("dead_letter").Inc()
		c.sampled.Warn("dead-letter publish failed", zap.Error(err))
	}
	return reason
}

// Subscriber is the core NATS ingest: a queue subscription whose handler
// checks each message and adds it to the sink. Run owns the subscription.
type Subscriber struct {
	*checker
	sink  Sink
	timed TimedSink // sink, if it is one
	sub   atomic.Pointer[nats.Subscription]
}

// NewSubscriber returns a subscriber on nc. Nothing is subscribed until Run.
func NewSubscriber(nc *nats.Conn, cfg Config, sink Sink, log *zap.Logger, m *Metrics) (*Subscriber, error) {
	c, err := newChecker(nc, cfg, clockOf(sink), log, m)
	if err != nil {
		return nil, err
	}
	timed, _ := sink.(TimedSink)
	return &Subscriber{checker: c, sink: sink, timed: timed}, nil
}

// Run subscribes and takes messages until ctx ends, then drains: it stops
// taking new messages and handles those already received, for at most the
// drain timeout. Messages still pending after it are counted as dropped.
func (s *Subscriber) Run(ctx context.Context) error {
	sub, err := s.nc.QueueSubscribe(s.cfg.Subject, s.cfg.QueueGroup, s.handle)
	if err != nil {
		return fmt.Errorf("ingest: subscribe %s: %w", s.cfg.Subject, err)
	}
	if err := sub.SetPendingLimits(pendingMsgs, pendingBytes); err != nil {
		return fmt.Errorf("ingest: set pending limits: %w", err)
	}
	// The server has the subscription once a round trip has gone through
	// after it: readiness and the log line wait for that, since a mention
	// published before finds no interest and is gone (core NATS). A slow
	// server only delays them.
	if err := s.nc.FlushTimeout(5 * time.Second); err != nil {
		s.log.Warn("the server has not confirmed the subscription yet", zap.Error(err))
	}
	s.sub.Store(sub)
	s.log.Info("subscribed", zap.String("subject", s.cfg.Subject), zap.String("queue", s.cfg.QueueGroup))

	<-ctx.Done()
	return s.drain(sub)
}

func (s *Subscriber) drain(sub *nats.Subscription) error {
	drained := sub.StatusChanged(nats.SubscriptionClosed)
	if err := sub.Drain(); err != nil {
		return fmt.Errorf("ingest: drain: %w", err)
	}
	t := time.NewTimer(s.cfg.DrainTimeout)
	defer t.Stop()
	select {
	case <-drained:
		s.log.Info("drained")
		return nil
	case <-t.C:
		pending, _, _ := sub.Pending()
		_ = sub.Unsubscribe()
		s.metrics.dropped.WithLabelValues("shutdown").Add(float64(pending))
		return fmt.Errorf("ingest: drain timed out after %s with %d messages unhandled", s.cfg.DrainTimeout, pending)
	}
}

// Ready reports whether messages can arrive: subscribed, connected.
func (s *Subscriber) Ready() error {
	sub := s.sub.Load()
	switch {
	case sub == nil || !sub.IsValid():
		return errors.New("ingest: not subscribed")
	case !s.nc.IsConnected():
		return fmt.Errorf("ingest: NATS connection is %s", s.nc.Status())
	}
	return nil
}

// handle runs on the subscription's goroutine, one message at a time. A
// mention without "at" is placed in time by the sink (its arrival).
func (s *Subscriber) handle(msg *nats.Msg) {
	if msg.Header.Get(mention.ProbeHeader) != "" {
		return // a check of the routing (stream create, load): no mention
	}
	topic, delta, at, reason := s.check(msg.Subject, msg.Data, msg.Header, time.Time{})
	switch {
	case reason != "":
		return
	case at.IsZero() || s.timed == nil:
		s.sink.Add(topic, delta)
	default:
		s.timed.AddAt(topic, delta, at)
	}
	s.accepted(delta)
}

// Metrics are the ingest metrics.
type Metrics struct {
	events   prometheus.Counter
	mentions prometheus.Counter
	invalid  *prometheus.CounterVec
	dropped  *prometheus.CounterVec
	// byIgnored counts mentions whose "by" was ignored (they count).
	byIgnored prometheus.Counter
	// The durable modes (Checker.Partitions)
	partitions prometheus.Gauge // owned now
	configured prometheus.Gauge // --partitions

	mu          sync.Mutex
	seenDropped map[*nats.Subscription]int
}

// NewMetrics registers the ingest metrics with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		events: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "hotcount_ingest_events_total",
			Help: "Mention messages accepted.",
		}),
		mentions: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "hotcount_ingest_mentions_total",
			Help: "Mentions accepted: the sum of the accepted messages' counts.",
		}),
		invalid: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hotcount_ingest_invalid_total",
			Help: "Messages rejected, by reason (topic, payload, count, at).",
		}, []string{"reason"}),
		dropped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hotcount_ingest_dropped_total",
			Help: "Messages lost before the handler saw them, by cause: slow_consumer (nats.go's pending buffer overflowed), shutdown (pending when the drain timed out), dead_letter (rejected and the dead-letter publish failed).",
		}, []string{"cause"}),
		seenDropped: make(map[*nats.Subscription]int),
	}
	m.byIgnored = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "hotcount_ingest_contributors_ignored_total",
		Help: "Mentions accepted whose contributor (\"by\") was ignored: not a string of 1..128 bytes of UTF-8 without control characters. They count; trending does not see who made them.",
	})
	m.partitions = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "hotcount_ingest_partitions_owned",
		Help: "Partitions of the stream this sidecar consumes now (partitioned mode).",
	})
	m.configured = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "hotcount_ingest_partitions",
		Help: "Partitions of the stream (--partitions) in partitioned mode, 0 in the other modes: the fleet's sum of hotcount_ingest_partitions_owned should reach it.",
	})
	reg.MustRegister(m.events, m.mentions, m.invalid, m.dropped, m.byIgnored, m.partitions, m.configured)
	for _, r := range []string{mention.ReasonTopic, mention.ReasonPayload, mention.ReasonCount, mention.ReasonAt} {
		m.invalid.WithLabelValues(r)
	}
	for _, c := range []string{"slow_consumer", "shutdown", "dead_letter"} {
		m.dropped.WithLabelValues(c)
	}
	return m
}

// slowConsumer adds the messages nats.go dropped on sub since last seen.
func (m *Metrics) slowConsumer(sub *nats.Subscription) {
	n, err := sub.Dropped()
	if err != nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if d := n - m.seenDropped[sub]; d > 0 {
		m.dropped.WithLabelValues("slow_consumer").Add(float64(d))
		m.seenDropped[sub] = n
	}
}

// Connect opens the NATS connection the ingest uses: it retries the first
// connection and reconnects forever (a sidecar may start before NATS is
// reachable; readiness says so meanwhile), and counts slow-consumer drops.
func Connect(url string, log *zap.Logger, m *Metrics, opts ...nats.Option) (*nats.Conn, error) {
	log = log.Named("nats")
	base := []nats.Option{
		nats.Name("hotcount"),
		nats.RetryOnFailedConnect(true),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(time.Second),
		nats.DisconnectErrHandler(func(nc *nats.Conn, err error) {
			if !nc.IsClosed() { // closing at shutdown is no news
				log.Warn("disconnected", zap.Error(err))
			}
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) {
			log.Info("reconnected", zap.String("url", nc.ConnectedUrlRedacted()))
		}),
		nats.ErrorHandler(func(_ *nats.Conn, sub *nats.Subscription, err error) {
			if errors.Is(err, nats.ErrSlowConsumer) && sub != nil {
				m.slowConsumer(sub)
			}
			log.Warn("async error", zap.Error(err))
		}),
	}
	nc, err := nats.Connect(url, append(base, opts...)...)
	if err != nil {
		return nil, natsauth.RedactErr(fmt.Errorf("ingest: connect %s: %w", url, err), url)
	}
	return nc, nil
}

// Checker judges messages for the reader of the durable streams (package
// durable): the same checks, metrics, log lines and dead letters as the
// core subscription's.
type Checker struct{ c *checker }

// NewChecker returns a checker on nc (for dead letters).
func NewChecker(nc *nats.Conn, cfg Config, log *zap.Logger, m *Metrics) (*Checker, error) {
	c, err := newChecker(nc, cfg, time.Now, log, m)
	if err != nil {
		return nil, err
	}
	return &Checker{c}, nil
}

// Check returns a message's topic, count and time (its "at", else
// published), or ok false after rejecting it: the judgement is Judge's
// under limits l (the stream's rules at the message's sequence), a
// function of the message and its stream timestamp alone.
func (k *Checker) Check(l mention.Limits, subject string, data []byte, hdr nats.Header, published time.Time, from *Origin) (topic string, delta int64, at time.Time, ok bool) {
	if Probe(hdr) {
		return "", 0, time.Time{}, false // no mention, and no error either
	}
	topic, delta, at, reason := k.c.checkWith(l, subject, data, hdr, published, from)
	if reason != "" {
		return "", 0, time.Time{}, false
	}
	if at.IsZero() {
		at = published
	}
	return topic, delta, at, true
}

// Probe says whether a message with headers hdr is a probe (hotcount
// stream create's, hotcount load's): read, never counted.
func Probe(hdr nats.Header) bool { return hdr.Get(mention.ProbeHeader) != "" }

// Accepted counts an accepted message of delta mentions.
func (k *Checker) Accepted(delta int64) { k.c.accepted(delta) }

// Partitions sets the partition gauges: of partitions in all (the one
// stream of jetstream mode is one), owned are read by this sidecar.
func (k *Checker) Partitions(partitions, owned int) {
	k.c.metrics.configured.Set(float64(partitions))
	k.c.metrics.partitions.Set(float64(owned))
}
