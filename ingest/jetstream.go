package ingest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/hotcount/hotcount/aggregator"
)

// JetStream defaults, used by the config package.
const (
	// DefaultStream is the stream of mentions.
	DefaultStream = "MENTIONS"
	// DefaultConsumer is the durable pull consumer all replicas share.
	DefaultConsumer = "hotcount"
	// DefaultAckWait is how long the server waits for an acknowledgement
	// before redelivering. Held messages are kept alive (InProgress) every
	// third of it, so it only elapses for a sidecar that died.
	DefaultAckWait = 30 * time.Second
	// DefaultMaxAckPending bounds the messages delivered and not yet
	// acknowledged, per consumer (so for all replicas together). It is the
	// bound of the buffer in JetStream mode: at it the server stops
	// delivering, which is the backpressure. A held message costs about
	// 400 bytes.
	DefaultMaxAckPending = 100_000
	// DefaultDuplicateWindow is the stream's window for Nats-Msg-Id
	// de-duplication, set by `hotcount stream create`.
	DefaultDuplicateWindow = 2 * time.Minute
)

// pullBatch is how many messages one pull asks for: enough to keep the
// handler busy between round trips.
const pullBatch = 1000

// JetStreamConfig is the JetStream part of the configuration.
type JetStreamConfig struct {
	Stream        string
	Consumer      string
	AckWait       time.Duration
	MaxAckPending int
}

// AckSink receives accepted durable messages and gives back those it holds.
// The aggregator is one.
type AckSink interface {
	AddAcked(topic string, delta int64, m aggregator.Acker, seq int64)
	Held() []aggregator.Acker
}

// JetStreamConsumer is the durable ingest: a pull consumer shared by every
// replica, so each mention is handled by one sidecar. A message is not
// acknowledged here: it goes into the aggregator's window with its delta,
// and the flusher acknowledges it once that delta is in the store. Run owns
// the consumer, the pull iterator and the keep-alive loop.
type JetStreamConsumer struct {
	*checker
	js      jetstream.JetStream
	jcfg    JetStreamConfig
	sink    AckSink
	paused  func() bool
	bound   atomic.Bool
	journal Covering // nil: none
}

// Covering says whether a message's count is already carried by a journal
// entry (journal.Journal.Covered): a redelivery after its writer died.
type Covering interface {
	Covered(ctx context.Context, seq int64) (bool, error)
}

// SetJournal has redelivered messages checked against j before they are
// counted. Call it before Run.
func (c *JetStreamConsumer) SetJournal(j Covering) { c.journal = j }

// NewJetStreamConsumer returns a consumer on nc. paused is asked before each
// message: while it says true (the store is failing), nothing is fetched.
// Nothing starts until Run.
func NewJetStreamConsumer(nc *nats.Conn, cfg Config, jcfg JetStreamConfig, sink AckSink, paused func() bool, log *zap.Logger, m *Metrics) (*JetStreamConsumer, error) {
	c, err := newChecker(nc, cfg, log, m)
	if err != nil {
		return nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("ingest: jetstream: %w", err)
	}
	return &JetStreamConsumer{checker: c, js: js, jcfg: jcfg, sink: sink, paused: paused}, nil
}

// Run binds the durable consumer (retrying until the stream exists and NATS
// answers), takes messages until ctx ends, then drains (at most the drain
// timeout): it stops pulling and hands what was already delivered to the
// sink, so the final flush writes and acknowledges it.
func (c *JetStreamConsumer) Run(ctx context.Context) error {
	cons := c.bind(ctx)
	if cons == nil {
		return nil // ctx ended first
	}
	consume := func() (jetstream.ConsumeContext, error) {
		return cons.Consume(func(msg jetstream.Msg) { c.handle(ctx, msg) },
			jetstream.PullMaxMessages(pullBatch),
			jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) {
				// Missed heartbeats and the like during a NATS restart:
				// nats.go pulls again by itself once the connection is back.
				c.sampled.Warn("consume", zap.Error(err))
			}),
		)
	}
	var cc jetstream.ConsumeContext // nil while stopped
	if !c.paused() {
		var err error
		if cc, err = consume(); err != nil {
			return fmt.Errorf("ingest: consume %s/%s: %w", c.jcfg.Stream, c.jcfg.Consumer, err)
		}
	} else {
		c.metrics.paused.Inc()
	}
	c.bound.Store(true)
	defer c.bound.Store(false)
	c.log.Info("consuming", zap.String("stream", c.jcfg.Stream), zap.String("consumer", c.jcfg.Consumer))

	var wg sync.WaitGroup
	kaCtx, stopKeepAlive := context.WithCancel(context.Background())
	wg.Go(func() { c.keepAlive(kaCtx) })
	defer func() {
		stopKeepAlive()
		wg.Wait()
	}()

	// Backpressure: while the flusher writes nothing (the store is down),
	// consuming stops altogether. Merely blocking the handler would leave
	// up to pullBatch messages in nats.go's buffer, out of reach of the
	// keep-alive: after --ack-wait the server hands them to another
	// sidecar, and this one would count them too once it resumed. Stopped,
	// the buffer is dropped unhandled (never counted), and the server
	// redelivers those messages after --ack-wait.
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			if cc == nil {
				return nil
			}
			return c.drain(cc)
		case <-tick.C:
		}
		switch paused := c.paused(); {
		case paused && cc != nil:
			cc.Stop()
			<-cc.Closed()
			cc = nil
			c.metrics.paused.Inc()
			c.log.Warn("flushes write nothing: consuming stopped until they do")
		case !paused && cc == nil:
			var err error
			if cc, err = consume(); err != nil {
				cc = nil
				c.sampled.Warn("consume again", zap.Error(err))
				continue
			}
			c.log.Info("flushes write again: consuming")
		}
	}
}

// drain stops pulling; what nats.go already holds goes through the
// handler, so that the final flush writes and acknowledges it.
func (c *JetStreamConsumer) drain(cc jetstream.ConsumeContext) error {
	cc.Drain()
	t := time.NewTimer(c.cfg.DrainTimeout)
	defer t.Stop()
	select {
	case <-cc.Closed():
		c.log.Info("drained")
		return nil
	case <-t.C:
		cc.Stop()
		return fmt.Errorf("ingest: drain timed out after %s; undelivered messages will be redelivered", c.cfg.DrainTimeout)
	}
}

func (c *JetStreamConsumer) handle(ctx context.Context, msg jetstream.Msg) {
	md, err := msg.Metadata()
	if err != nil {
		c.sampled.Warn("message without JetStream metadata; handed back", zap.Error(err))
		msg.Nak() //nolint:errcheck // redelivered either way
		return
	}
	seq := int64(md.Sequence.Stream)
	if md.NumDelivered > 1 {
		c.metrics.redelivered.Inc()
		if c.journal != nil {
			jctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			covered, err := c.journal.Covered(jctx, seq)
			cancel()
			switch {
			case err != nil:
				// Cannot tell whether it was counted: neither count nor
				// drop it; it comes back in a second.
				c.sampled.Warn("journal unreadable; redelivered message handed back", zap.Error(err))
				msg.NakWithDelay(time.Second) //nolint:errcheck // redelivered either way
				return
			case covered:
				// Its count is in a dead writer's journal entry, which is
				// replayed: counting it again would count it twice.
				c.metrics.journaled.Inc()
				if err := msg.Ack(); err != nil {
					c.sampled.Warn("ack journaled redelivery", zap.Error(err))
				}
				return
			}
		}
	}
	topic, delta, reason := c.check(msg.Subject(), msg.Data(), msg.Headers())
	if reason != "" {
		// Terminated, never redelivered: a bad message stays bad.
		if err := msg.TermWithReason(reason); err != nil {
			c.sampled.Warn("terminate rejected message", zap.Error(err))
		}
		return
	}
	c.sink.AddAcked(topic, delta, msg, seq)
	c.accepted(delta)
}

// bind creates or updates the durable consumer, retrying with backoff until
// it succeeds or ctx ends (nil then). All replicas bind the same consumer.
func (c *JetStreamConsumer) bind(ctx context.Context) jetstream.Consumer {
	backoff := 100 * time.Millisecond
	for {
		cons, err := c.js.CreateOrUpdateConsumer(ctx, c.jcfg.Stream, jetstream.ConsumerConfig{
			Durable:       c.jcfg.Consumer,
			Description:   "hotcount sidecars: mentions coalesced into sharded DynamoDB counters",
			FilterSubject: c.cfg.Subject,
			AckPolicy:     jetstream.AckExplicitPolicy,
			AckWait:       c.jcfg.AckWait,
			MaxAckPending: c.jcfg.MaxAckPending,
			MaxDeliver:    -1,
			DeliverPolicy: jetstream.DeliverAllPolicy,
		})
		if err == nil {
			return cons
		}
		if ctx.Err() != nil {
			return nil
		}
		hint := ""
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			hint = "create it with `hotcount stream create`"
		}
		c.log.Warn("cannot bind consumer; retrying", zap.String("stream", c.jcfg.Stream),
			zap.String("consumer", c.jcfg.Consumer), zap.String("hint", hint), zap.Error(err))
		sleep(ctx, backoff)
		backoff = min(2*backoff, 5*time.Second)
	}
}

// keepAlive resets the redelivery timer of every held message every third
// of AckWait, so that the server redelivers a message only when the sidecar
// holding it has died, not while its delta waits for a flush or a store
// outage to end.
func (c *JetStreamConsumer) keepAlive(ctx context.Context) {
	t := time.NewTicker(c.jcfg.AckWait / 3)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		for _, m := range c.sink.Held() {
			m.InProgress() //nolint:errcheck // best effort: at worst a redelivery
		}
	}
}

// Ready reports whether messages can arrive: consumer bound, connected.
func (c *JetStreamConsumer) Ready() error {
	switch {
	case !c.bound.Load():
		return fmt.Errorf("ingest: consumer %s/%s not bound", c.jcfg.Stream, c.jcfg.Consumer)
	case !c.nc.IsConnected():
		return fmt.Errorf("ingest: NATS connection is %s", c.nc.Status())
	}
	return nil
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// Stream limits, `hotcount stream create`'s defaults.
const (
	// DefaultStreamMaxAge is how long the stream keeps a message: a day
	// for a fleet to come back from an outage before mentions age out.
	DefaultStreamMaxAge = 24 * time.Hour
	// DefaultStreamMaxBytes bounds the stream's storage (1 GiB). Full, it
	// refuses new publishes (producers see the error) rather than drop
	// stored mentions nobody has counted yet.
	DefaultStreamMaxBytes = 1 << 30
)

// StreamLimits bound the stream of mentions; zero fields take the defaults.
type StreamLimits struct {
	MaxAge   time.Duration
	MaxBytes int64
}

// EnsureStream creates the stream of mentions (subjects: subject; file
// storage; a duplicate window for Nats-Msg-Id de-duplication; limits, by
// default DefaultStreamMaxAge and DefaultStreamMaxBytes, past which new
// publishes are refused) unless a stream of that name exists, which is then
// used as it is.
func EnsureStream(ctx context.Context, nc *nats.Conn, name, subject string, duplicates time.Duration, limits ...StreamLimits) (created bool, err error) {
	var lim StreamLimits
	if len(limits) > 0 {
		lim = limits[0]
	}
	if lim.MaxAge == 0 {
		lim.MaxAge = DefaultStreamMaxAge
	}
	if lim.MaxBytes == 0 {
		lim.MaxBytes = DefaultStreamMaxBytes
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return false, fmt.Errorf("ingest: jetstream: %w", err)
	}
	if _, err := js.Stream(ctx, name); err == nil {
		return false, nil
	} else if !errors.Is(err, jetstream.ErrStreamNotFound) {
		return false, fmt.Errorf("ingest: look up stream %s: %w", name, err)
	}
	_, err = js.CreateStream(ctx, jetstream.StreamConfig{
		Name:        name,
		Description: "mentions for hotcount",
		Subjects:    []string{subject},
		Storage:     jetstream.FileStorage,
		Retention:   jetstream.LimitsPolicy,
		Duplicates:  duplicates,
		MaxAge:      lim.MaxAge,
		MaxBytes:    lim.MaxBytes,
		Discard:     jetstream.DiscardNew,
	})
	if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
		return false, nil // another replica created it first
	}
	if err != nil {
		return false, fmt.Errorf("ingest: create stream %s: %w", name, err)
	}
	return true, nil
}
