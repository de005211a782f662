package ingest

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/hotcount/hotcount/aggregator"
	"github.com/hotcount/hotcount/streams"
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
	// Partitions, when set, is partitioned mode: each partition is a
	// stream of its own (package streams), its durable consumer pinned to
	// one sidecar, and this sidecar consumes those Owner says it owns.
	Partitions int
	Owner      Owner
}

// Owner says which partitions this sidecar owns (fleet.Members).
type Owner interface {
	// Owned returns the partitions of 0..n-1 this sidecar owns now.
	Owned(n int) []int
	// Changed receives a value when the owners may have changed.
	Changed() <-chan struct{}
	// Settled says whether the view of the fleet is complete enough to
	// claim partitions.
	Settled() bool
}

// AckSink receives accepted durable messages and gives back those it holds.
// The aggregator is one.
type AckSink interface {
	AddAcked(topic string, delta int64, m aggregator.Acker, seq int64, at time.Time)
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

	lanes  map[int]*lane  // Run's: by partition (0 alone when not partitioned)
	layout streams.Layout // partitioned mode's streams
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
	c, err := newChecker(nc, cfg, clockOf(sink), log, m)
	if err != nil {
		return nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("ingest: jetstream: %w", err)
	}
	if jcfg.Partitions > 0 && jcfg.Owner == nil {
		return nil, errors.New("ingest: partitioned mode needs an Owner")
	}
	m.configured.Set(float64(jcfg.Partitions))
	return &JetStreamConsumer{checker: c, js: js, jcfg: jcfg, sink: sink, paused: paused, lanes: make(map[int]*lane),
		layout: streams.Layout{Stream: jcfg.Stream, Subject: cfg.Subject, Partitions: jcfg.Partitions}}, nil
}

// Run binds the durable consumer (retrying until the stream exists and NATS
// answers), takes messages until ctx ends, then drains (at most the drain
// timeout): it stops pulling and hands what was already delivered to the
// sink, so the final flush writes and acknowledges it. In partitioned mode
// it consumes the partitions this sidecar owns, and follows the fleet as
// their owners change.
func (c *JetStreamConsumer) Run(ctx context.Context) error {
	return c.RunWithin(ctx, context.WithoutCancel(ctx))
}

// RunWithin is Run whose waits on NATS once ctx has ended (the drain, a
// hand-over in progress, the unpins that follow them) stop when limit
// ends, wherever they are: the shutdown ends limit at the final flush's
// deadline, so that a NATS server that is slow or gone cannot hold the
// shutdown past it. What is still undelivered then is redelivered after
// --ack-wait, and a partition left pinned waits out pinnedTTL.
func (c *JetStreamConsumer) RunWithin(ctx, limit context.Context) error {
	if c.jcfg.Partitions == 0 {
		cons := c.bind(ctx)
		if cons == nil {
			return nil // ctx ended first
		}
		c.lanes[0] = &lane{cons: cons}
	} else if !c.checkPartitioned(ctx) {
		return nil // ctx ended first
	}
	c.bound.Store(true)
	defer c.bound.Store(false)
	c.log.Info("consuming", zap.String("stream", c.jcfg.Stream), zap.String("consumer", c.jcfg.Consumer), zap.Int("partitions", c.jcfg.Partitions))

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
	wasPaused := false
	for {
		paused := c.paused()
		switch {
		case paused && !wasPaused:
			c.metrics.paused.Inc()
			c.log.Warn("flushes write nothing: consuming stopped until they do")
		case !paused && wasPaused:
			c.log.Info("flushes write again: consuming")
		}
		wasPaused = paused
		c.follow(ctx, limit, paused)
		select {
		case <-ctx.Done():
			return c.drainAll(limit)
		case <-tick.C:
		case <-c.changes():
		}
	}
}

// lane is one consumer this sidecar pulls from: the shared durable
// consumer, or one partition stream's.
type lane struct {
	p      int // the partition (0 when not partitioned)
	stream jetstream.Stream
	cons   jetstream.Consumer
	cc     jetstream.ConsumeContext // nil while not consuming
	pin    atomic.Value             // string: the pin id of the last message received (partitioned mode)
	// What a partition lane has taken (partitioned mode): the messages
	// counted into the window and not yet acknowledged (held), and the
	// stream sequences it has dealt with for good (dealt: acknowledged
	// after their counts were journaled, acknowledged uncounted, or
	// refused), as ranges. See seen.
	mu    sync.Mutex
	held  map[uint64]struct{}
	dealt ranges
	// suspectUntil (UnixNano): until then every delivery is looked up in
	// the journal, whatever its delivery count: after the lane is claimed
	// or its pin changes, a consumer leader that lost track may deliver
	// again, with a count of 1, messages another sidecar counted.
	suspectUntil atomic.Int64
}

// suspectFor is how long a lane looks up every delivery after it is
// claimed or its pin changes: longer than the journal keeps no entry
// (two floor readings 10 s apart), a little.
const suspectFor = 30 * time.Second

func (l *lane) suspect() { l.suspectUntil.Store(time.Now().Add(suspectFor).UnixNano()) }

// suspicious says whether a first delivery must be looked up too.
func (l *lane) suspicious() bool { return time.Now().UnixNano() < l.suspectUntil.Load() }

// ranges is a set of stream sequences as sorted, disjoint, non-adjacent
// inclusive ranges: a lane deals with its stream mostly in order, so it
// stays a few ranges long. It keeps at most maxRanges, forgetting the
// lowest past that: a message held long (a poison topic's) leaves a hole
// per message, and a hole closed costs a copy of the ranges above it.
// What it forgets is the oldest, which a lagging leader is the least
// likely to deliver again; the journal still covers what it retains.
type ranges [][2]uint64

const maxRanges = 4096

// has says whether seq is in the set.
func (rs ranges) has(seq uint64) bool {
	i := sort.Search(len(rs), func(i int) bool { return rs[i][1] >= seq })
	return i < len(rs) && rs[i][0] <= seq
}

// add puts seq in the set.
func (rs *ranges) add(seq uint64) {
	s := *rs
	i := sort.Search(len(s), func(i int) bool { return s[i][1]+1 >= seq })
	switch {
	case i < len(s) && s[i][0] <= seq && seq <= s[i][1]:
		return // there already
	case i < len(s) && s[i][1]+1 == seq:
		s[i][1] = seq
		if i+1 < len(s) && s[i+1][0] == seq+1 { // bridges to the next
			s[i][1] = s[i+1][1]
			s = append(s[:i+1], s[i+2:]...)
		}
	case i < len(s) && s[i][0] == seq+1:
		s[i][0] = seq
	default:
		s = append(s, [2]uint64{})
		copy(s[i+1:], s[i:])
		s[i] = [2]uint64{seq, seq}
		if len(s) > maxRanges {
			s = append(s[:0], s[len(s)-maxRanges:]...)
		}
	}
	*rs = s
}

// delivery is what a partition lane makes of a message (seen).
type delivery uint8

const (
	// fresh: not dealt with here (new, handed back, or another
	// sidecar's before): count it.
	fresh delivery = iota
	// holding: delivered again while its first delivery is held in the
	// window; that one's acknowledgement settles both. Drop it.
	holding
	// settled: dealt with and acknowledged before (counted, or covered
	// by the journal, or refused), delivered again by a consumer leader
	// whose state lags its predecessor's (a NATS node lost), with a
	// delivery count that may say 1. Acknowledge it uncounted.
	settled
)

// seen says what the lane makes of a message at stream sequence seq.
func (l *lane) seen(seq uint64) delivery {
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, held := l.held[seq]; held {
		return holding
	}
	if l.dealt.has(seq) {
		return settled
	}
	return fresh
}

// done notes that the message at seq was dealt with without being held
// (acknowledged uncounted, refused).
func (l *lane) done(seq uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.dealt.add(seq)
}

// hold notes that msg, at seq, is counted into the window, and returns
// it as the window's acker: acknowledging it settles it here too, and
// handing it back makes its redelivery fresh.
func (l *lane) hold(msg jetstream.Msg, seq uint64) aggregator.Acker {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.held == nil {
		l.held = make(map[uint64]struct{})
	}
	l.held[seq] = struct{}{}
	return heldMsg{msg, l, seq}
}

// heldMsg is a message a partition lane holds (lane.hold).
type heldMsg struct {
	jetstream.Msg
	l   *lane
	seq uint64
}

// Ack settles the message: its counts are journaled (or written), so a
// delivery of it again, its ack lost or forgotten, is acknowledged
// uncounted.
func (m heldMsg) Ack() error {
	// Dealt with before the ack goes: a delivery again that overtakes it
	// is acknowledged, not dropped (its count is durable already).
	m.l.mu.Lock()
	delete(m.l.held, m.seq)
	m.l.dealt.add(m.seq)
	m.l.mu.Unlock()
	return m.Msg.Ack()
}

// Nak hands the message back: its redelivery is counted.
func (m heldMsg) Nak() error {
	m.l.mu.Lock()
	delete(m.l.held, m.seq) // before: its redelivery may come at once
	m.l.mu.Unlock()
	return m.Msg.Nak()
}

// wanted returns the lanes this sidecar should be consuming now.
func (c *JetStreamConsumer) wanted(paused bool) []int {
	switch {
	case paused:
		return nil
	case c.jcfg.Partitions == 0:
		return []int{0}
	case !c.jcfg.Owner.Settled():
		return nil // listen to the fleet before claiming its partitions
	}
	return c.jcfg.Owner.Owned(c.jcfg.Partitions)
}

func (c *JetStreamConsumer) changes() <-chan struct{} {
	if c.jcfg.Owner == nil {
		return nil
	}
	return c.jcfg.Owner.Changed()
}

// follow starts the lanes wanted and stops the others. A lane given up
// while not paused is handed over (another sidecar owns it now): what
// nats.go already holds goes through the handler, then the pin is given up
// so that the new owner receives at once. Paused lanes are stopped (see
// Run). A hand-over stops waiting when limit ends (RunWithin).
func (c *JetStreamConsumer) follow(ctx, limit context.Context, paused bool) {
	want := make(map[int]bool)
	for _, p := range c.wanted(paused) {
		want[p] = true
	}
	for p, l := range c.lanes {
		if want[p] || l.cc == nil {
			continue
		}
		if paused {
			l.cc.Stop()
			<-l.cc.Closed()
		} else {
			c.handOver(limit, p, l)
		}
		l.cc = nil
	}
	for p := range want {
		l := c.lanes[p]
		if l == nil {
			var err error
			if l, err = c.bindPartition(ctx, p); err != nil {
				c.sampled.Warn("cannot bind partition consumer; retrying", zap.Int("partition", p), zap.Error(err))
				continue
			}
			c.lanes[p] = l
		}
		if l.cc != nil {
			continue
		}
		cc, err := c.consume(ctx, l)
		if err != nil {
			c.sampled.Warn("consume", zap.Int("partition", p), zap.Error(err))
			continue
		}
		l.cc = cc
		if c.jcfg.Partitions > 0 {
			c.log.Info("partition claimed", zap.Int("partition", p))
		}
	}
	if c.jcfg.Partitions > 0 {
		n := 0
		for _, l := range c.lanes {
			if l.cc != nil {
				n++
			}
		}
		c.metrics.partitions.Set(float64(n))
	}
}

// handOver stops pulling partition p, hands what nats.go holds of it to
// the window (flushed and acknowledged by this sidecar as usual, its
// keep-alive included: the new owner never receives those messages unless
// this sidecar dies), then unpins it for the new owner. Bounded by the
// drain timeout and the unpin's, and cut short when limit ends.
func (c *JetStreamConsumer) handOver(limit context.Context, p int, l *lane) {
	l.cc.Drain()
	t := time.NewTimer(c.cfg.DrainTimeout)
	defer t.Stop()
	select {
	case <-l.cc.Closed():
	case <-t.C:
		l.cc.Stop() // the rest is redelivered to the new owner after --ack-wait
	case <-limit.Done():
		l.cc.Stop() // likewise
	}
	c.unpinAll(limit, l)
	c.metrics.handovers.Inc()
	c.log.Info("partition handed over", zap.Int("partition", p))
}

// consume starts pulling from l's consumer into the handler.
func (c *JetStreamConsumer) consume(ctx context.Context, l *lane) (jetstream.ConsumeContext, error) {
	opts := []jetstream.PullConsumeOpt{
		jetstream.PullMaxMessages(c.batch()),
		jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) {
			// Missed heartbeats and the like during a NATS restart:
			// nats.go pulls again by itself once the connection is back.
			// A partition pinned to another sidecar answers its pulls
			// with errors too, until the pin moves.
			c.sampled.Warn("consume", zap.Error(err))
		}),
	}
	if c.jcfg.Partitions == 0 {
		return l.cons.Consume(func(msg jetstream.Msg) { c.handle(ctx, l, msg) }, opts...)
	}
	opts = append(opts, jetstream.PullPriorityGroup(pinGroup), jetstream.PullExpiry(pinExpiry))
	l.suspect() // (re)claimed: what another sidecar held may come first
	return l.cons.Consume(func(msg jetstream.Msg) {
		if id := msg.Headers().Get("Nats-Pin-Id"); id != "" {
			if prev, _ := l.pin.Swap(id).(string); prev != id {
				l.suspect() // a new pin: the consumer's leader may have changed
			}
		}
		c.handle(ctx, l, msg)
	}, opts...)
}

// batch is how many messages one pull asks for: pullBatch for the shared
// consumer, shared out among the partitions this sidecar may own so that
// what nats.go buffers stays about the same.
func (c *JetStreamConsumer) batch() int {
	if c.jcfg.Partitions == 0 {
		return pullBatch
	}
	return max(pullBatch/8, 10)
}

// drainAll stops pulling on every lane; what nats.go already holds goes
// through the handler, so that the final flush writes and acknowledges it.
// The drain is bounded by the drain timeout, the unpins after it by
// unpinTimeout, and both are cut short when limit ends (RunWithin).
func (c *JetStreamConsumer) drainAll(limit context.Context) error {
	var running []jetstream.ConsumeContext
	for _, l := range c.lanes {
		if l.cc != nil {
			l.cc.Drain()
			running = append(running, l.cc)
		}
	}
	t := time.NewTimer(c.cfg.DrainTimeout)
	defer t.Stop()
	for i, cc := range running {
		select {
		case <-cc.Closed():
			continue // drained: not cut off, even with limit ended too
		default:
		}
		var why string
		select {
		case <-cc.Closed():
			continue
		case <-t.C:
			why = fmt.Sprintf("timed out after %s", c.cfg.DrainTimeout)
		case <-limit.Done():
			why = "cut off at the shutdown's deadline"
		}
		for _, cc := range running[i:] {
			cc.Stop()
		}
		return fmt.Errorf("ingest: drain %s; undelivered messages will be redelivered", why)
	}
	c.log.Info("drained")
	if c.jcfg.Partitions > 0 {
		// What was drained is this sidecar's to flush and acknowledge;
		// new messages are the next owner's at once, not after the pin
		// lapses.
		var drained []*lane
		for _, l := range c.lanes {
			if l.cc != nil {
				drained = append(drained, l)
			}
		}
		c.unpinAll(limit, drained...)
	}
	return nil
}

// unpinAll unpins the lanes' partitions (unpin) all at once, under one
// bound, unpinTimeout, cut short when limit ends. One after another, each
// with a bound of its own, 16 partitions against a NATS server that does
// not answer took over a minute, past the whole shutdown budget. A pin not
// given up only delays the next owner by pinnedTTL.
func (c *JetStreamConsumer) unpinAll(limit context.Context, lanes ...*lane) {
	ctx, cancel := context.WithTimeout(limit, unpinTimeout)
	defer cancel()
	var wg sync.WaitGroup
	var late atomic.Int32
	for _, l := range lanes {
		wg.Go(func() {
			if !c.unpin(ctx, l) {
				late.Add(1)
			}
		})
	}
	wg.Wait()
	if n := late.Load(); n > 0 {
		c.log.Warn("partitions not unpinned in time: their next owners wait for the pins to lapse",
			zap.Int("partitions", int(n)), zap.Duration("pinned_ttl", pinnedTTL), zap.Error(context.Cause(ctx)))
	}
}

// unpin gives up partition p's pin, if this sidecar holds it, so that the
// next owner's pulls are answered at once. A pin held by another sidecar
// (this one claimed p from a different view of the fleet and never won
// it) is left alone. A failure only delays the next owner by pinnedTTL.
// It gives up when ctx ends, and then returns false (unpinAll logs that
// once for all the lanes).
func (c *JetStreamConsumer) unpin(ctx context.Context, l *lane) (inTime bool) {
	mine, _ := l.pin.Load().(string)
	if mine == "" {
		return true // never received anything: the pin is someone else's, or none
	}
	info, err := l.cons.Info(ctx)
	if err == nil {
		for _, g := range info.PriorityGroups {
			if g.Group == pinGroup && g.PinnedClientID != mine {
				return true
			}
		}
		err = l.stream.UnpinConsumer(ctx, c.jcfg.Consumer, pinGroup)
	}
	switch {
	case err == nil:
	case ctx.Err() != nil:
		return false
	default:
		c.sampled.Warn("unpin partition", zap.Int("partition", l.p), zap.Error(err))
	}
	return true
}

// Partitioned mode's names and timings.
const (
	// pinGroup is the priority group every partition consumer pins.
	pinGroup = "hotcount"
	// pinnedTTL is how long a partition stays pinned to a sidecar that
	// stopped pulling (it died) before another may take it. The server
	// renews a pin only when its holder pulls again, so it must outlast
	// pinExpiry, the longest a pull waits before the next is sent, with
	// room for a slow round trip: otherwise a quiet partition's pin lapses
	// and a sidecar with a different view of the fleet takes it.
	pinnedTTL = 15 * time.Second
	// pinExpiry bounds how long one pull waits for messages.
	pinExpiry = 5 * time.Second
	// unpinTimeout bounds the unpins of a drain or a hand-over, all of
	// them together: two round trips each, sent at once.
	unpinTimeout = 2 * time.Second
)

// checkPartitioned waits until the partition streams are there as this
// sidecar expects them (streams.Check), retrying with backoff until ctx
// ends (false then). What is missing is logged, with what to run.
func (c *JetStreamConsumer) checkPartitioned(ctx context.Context) bool {
	_, err := backoff.Retry(ctx, func() (struct{}, error) {
		err := streams.Check(ctx, c.js, c.layout)
		if err != nil && ctx.Err() == nil {
			c.log.Warn("cannot consume the partition streams; retrying", zap.Error(err))
		}
		return struct{}{}, err
	}, untilDone()...)
	return err == nil
}

// bindPartition creates or updates the durable consumer of partition p's
// stream: the whole stream, no filter, pinned to one puller at a time.
func (c *JetStreamConsumer) bindPartition(ctx context.Context, p int) (*lane, error) {
	bctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	s, err := c.js.Stream(bctx, c.layout.Name(p))
	if err != nil {
		return nil, err
	}
	cons, err := s.CreateOrUpdateConsumer(bctx, jetstream.ConsumerConfig{
		Durable:     c.jcfg.Consumer,
		Description: fmt.Sprintf("hotcount sidecars: partition %d of %d", p, c.jcfg.Partitions),
		AckPolicy:   jetstream.AckExplicitPolicy,
		AckWait:     c.jcfg.AckWait,
		// Per partition, not shared out: messages are acknowledged after
		// the flush, so a partition's bound is its topics' rate per flush
		// interval, and a partition holds the hottest topics whole.
		MaxAckPending:  c.jcfg.MaxAckPending,
		MaxDeliver:     -1,
		DeliverPolicy:  jetstream.DeliverAllPolicy,
		PriorityGroups: []string{pinGroup},
		PriorityPolicy: jetstream.PriorityPolicyPinned,
		PinnedTTL:      pinnedTTL,
	})
	if err != nil {
		return nil, err
	}
	return &lane{p: p, stream: s, cons: cons}, nil
}

func (c *JetStreamConsumer) handle(ctx context.Context, l *lane, msg jetstream.Msg) {
	md, err := msg.Metadata()
	if err != nil {
		c.sampled.Warn("message without JetStream metadata; handed back", zap.Error(err))
		msg.Nak() //nolint:errcheck // redelivered either way
		return
	}
	if msg.Headers().Get(streams.ProbeHeader) != "" {
		// `hotcount stream create`'s check of the routing: no mention.
		msg.Ack() //nolint:errcheck // redelivered and acknowledged again at worst
		return
	}
	seq := streams.At(l.p, md.Sequence.Stream)
	pinned := c.jcfg.Partitions > 0
	if c.dealtWith(ctx, l, msg, md, pinned) {
		return
	}
	subject := msg.Subject()
	if c.jcfg.Partitions > 0 {
		subject = streams.Unstored(subject)
	}
	// An "at" is judged against the publication time, which a redelivery
	// keeps: a message is refused or taken the same way every time.
	topic, delta, at, reason := c.check(subject, msg.Data(), msg.Headers(), md.Timestamp)
	if reason != "" {
		// Terminated, never redelivered: a bad message stays bad.
		if err := msg.TermWithReason(reason); err != nil {
			c.sampled.Warn("terminate rejected message", zap.Error(err))
		}
		if pinned {
			l.done(md.Sequence.Stream)
		}
		return
	}
	if at.IsZero() {
		at = md.Timestamp
	}
	var acker aggregator.Acker = msg
	if pinned {
		acker = l.hold(msg, md.Sequence.Stream)
	}
	c.sink.AddAcked(topic, delta, acker, seq, at)
	c.accepted(delta)
}

// dealtWith says whether a delivery needs no counting, having dealt with
// it: a second delivery of a message a partition lane holds (dropped), or
// one already counted here or by a dead writer's journal entry
// (acknowledged uncounted), or one whose journal cannot be read (handed
// back). A redelivery, or in a lane's first seconds any delivery, is
// looked up in the journal.
func (c *JetStreamConsumer) dealtWith(ctx context.Context, l *lane, msg jetstream.Msg, md *jetstream.MsgMetadata, pinned bool) bool {
	if pinned {
		switch l.seen(md.Sequence.Stream) {
		case holding:
			c.metrics.redelivered.Inc()
			return true
		case settled:
			c.metrics.redelivered.Inc()
			c.metrics.journaled.Inc()
			if err := msg.Ack(); err != nil {
				c.sampled.Warn("ack settled redelivery", zap.Error(err))
			}
			return true
		}
	}
	if md.NumDelivered > 1 || pinned && l.suspicious() {
		if md.NumDelivered > 1 {
			c.log.Debug("redelivered", zap.String("subject", msg.Subject()), zap.Uint64("delivered", md.NumDelivered), zap.Uint64("seq", md.Sequence.Stream), zap.Time("ts", md.Timestamp), zap.String("consumer", md.Consumer))
			c.metrics.redelivered.Inc()
		}
		if c.journal != nil {
			jctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			covered, err := c.journal.Covered(jctx, streams.At(l.p, md.Sequence.Stream))
			cancel()
			switch {
			case err != nil:
				// Cannot tell whether it was counted: neither count nor
				// drop it; it comes back in a second.
				c.sampled.Warn("journal unreadable; redelivered message handed back", zap.Error(err))
				msg.NakWithDelay(time.Second) //nolint:errcheck // redelivered either way
				return true
			case covered:
				// Its count is in a dead writer's journal entry, which is
				// replayed: counting it again would count it twice.
				c.metrics.journaled.Inc()
				if err := msg.Ack(); err != nil {
					c.sampled.Warn("ack journaled redelivery", zap.Error(err))
				}
				if pinned {
					l.done(md.Sequence.Stream)
				}
				return true
			}
		}
	}
	return false
}

// bind creates or updates the durable consumer, retrying with backoff until
// it succeeds or ctx ends (nil then). All replicas bind the same consumer.
func (c *JetStreamConsumer) bind(ctx context.Context) jetstream.Consumer {
	cons, err := backoff.Retry(ctx, func() (jetstream.Consumer, error) {
		// The previous release's partitioned stream stores mentions under
		// <partition>.<subject>: a consumer of <subject> would bind and
		// receive nothing, silently.
		if s, err := c.js.Stream(ctx, c.jcfg.Stream); err == nil && s.CachedInfo().Config.SubjectTransform != nil {
			c.log.Error("the stream is the previous release's partitioned stream: see deploy/README.md, \"Moving to partition streams\"; retrying",
				zap.String("stream", c.jcfg.Stream), zap.String("transform", s.CachedInfo().Config.SubjectTransform.Destination))
			return nil, backoff.RetryAfter(5) // seconds; the backoff starts over after it
		}
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
			return cons, nil
		}
		if ctx.Err() == nil {
			hint := ""
			if errors.Is(err, jetstream.ErrStreamNotFound) {
				hint = "create it with `hotcount stream create`"
			}
			c.log.Warn("cannot bind consumer; retrying", zap.String("stream", c.jcfg.Stream),
				zap.String("consumer", c.jcfg.Consumer), zap.String("hint", hint), zap.Error(err))
		}
		return nil, err
	}, untilDone()...)
	if err != nil {
		return nil // ctx ended
	}
	return cons
}

// untilDone are the retry options of bind and checkPartitioned: waits from
// 100 ms doubling to 5 s, without jitter, until ctx ends (no limit on the
// elapsed time, which backoff.Retry otherwise puts at 15 minutes); a wait
// ends at once when ctx does.
func untilDone() []backoff.RetryOption {
	b := &backoff.ExponentialBackOff{InitialInterval: 100 * time.Millisecond, Multiplier: 2, MaxInterval: 5 * time.Second}
	return []backoff.RetryOption{backoff.WithBackOff(b), backoff.WithMaxElapsedTime(0)}
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

// StreamOptions shape the stream of mentions; zero fields take the
// defaults.
type StreamOptions struct {
	MaxAge   time.Duration
	MaxBytes int64
	// Replicas is the stream's replication factor in a NATS cluster
	// (default 1; 3 keeps it through the loss of a node).
	Replicas int
}

// ErrLegacyStream is EnsureStream's error for a stream of the name that is
// the previous release's partitioned stream (one stream, a partitioning
// transform), which jetstream mode cannot consume.
var ErrLegacyStream = errors.New("the previous release's partitioned stream")

// EnsureStream creates the stream of mentions (subjects: subject; file
// storage; a duplicate window for Nats-Msg-Id de-duplication; limits, by
// default DefaultStreamMaxAge and DefaultStreamMaxBytes, past which new
// publishes are refused) unless a stream of that name exists, which is then
// used as it is.
func EnsureStream(ctx context.Context, nc *nats.Conn, name, subject string, duplicates time.Duration, limits ...StreamOptions) (created bool, err error) {
	var lim StreamOptions
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
	if s, err := js.Stream(ctx, name); err == nil {
		if tr := s.CachedInfo().Config.SubjectTransform; tr != nil {
			return false, fmt.Errorf("ingest: stream %s exists and is %w (%s): see deploy/README.md, \"Moving to partition streams\"", name, ErrLegacyStream, tr.Destination)
		}
		return false, nil
	} else if !errors.Is(err, jetstream.ErrStreamNotFound) {
		return false, fmt.Errorf("ingest: look up stream %s: %w", name, err)
	}
	sc := jetstream.StreamConfig{
		Name:        name,
		Description: "mentions for hotcount",
		Subjects:    []string{subject},
		Storage:     jetstream.FileStorage,
		Retention:   jetstream.LimitsPolicy,
		Duplicates:  duplicates,
		MaxAge:      lim.MaxAge,
		MaxBytes:    lim.MaxBytes,
		Discard:     jetstream.DiscardNew,
		Replicas:    max(lim.Replicas, 1),
	}
	_, err = js.CreateStream(ctx, sc)
	if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
		return false, nil // another replica created it first
	}
	if err != nil {
		return false, fmt.Errorf("ingest: create stream %s: %w", name, err)
	}
	return true, nil
}
