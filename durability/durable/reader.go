package durable

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/hotcount/hotcount/durability/rules"
	"github.com/hotcount/hotcount/durability/streams"
	"github.com/hotcount/hotcount/internal/waits"
	"github.com/hotcount/hotcount/pipeline/ingest"
	"github.com/hotcount/hotcount/pipeline/store"
	"github.com/hotcount/hotcount/schema"
)

// pullBatch is how many messages a reader's pull asks for, and
// pullExpiry how long a pull waits (its heartbeats come every half).
const (
	pullBatch  = 1000
	pullExpiry = 5 * time.Second
)

// errRestart ends a reading that must start again from what the window
// holds: the consumer skipped a message, or the stream is not the one it
// was (deleted and created again).
var errRestart = errors.New("durable: reading restarts")

// epochOf is a stream's identity beside its name: its creation time.
func epochOf(info *jetstream.StreamInfo) int64 { return store.EpochOf(info.Created) }

// read reads partition p from where this process, or else the
// checkpoint, says its mentions are not yet in the store, until ctx ends.
// Any trouble (NATS gone, the consumer lost, a gap, the stream recreated)
// ends one reading; the next starts where the window says, after a pause.
func (e *Engine) read(ctx context.Context, p int) {
	defer func() { // not this sidecar's to report any more
		e.unread.Delete(e.streamName(p))
		e.ages.Delete(e.streamName(p))
	}()
	pause := waits.Reconnect()
	for {
		err := e.readOnce(ctx, p)
		if ctx.Err() != nil {
			return
		}
		if errors.Is(err, errRefused) {
			e.log.Error("nothing to read under this sidecar's settings; stopping", zap.String("stream", e.streamName(p)), zap.Error(err))
			e.refuse(err)
			return
		}
		var wait time.Duration // at once after a restart: nothing is wrong with NATS
		if errors.Is(err, errRestart) {
			pause.Reset()
		} else {
			wait = pause.NextBackOff()
			e.sampled.Warn("reading a partition stream; trying again", zap.String("stream", e.streamName(p)), zap.Error(err))
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
	}
}

// readOnce is one reading of p: one consumer, in order, with no
// acknowledgements: what this reader has taken is its window's, and what
// is in the store the items record.
func (e *Engine) readOnce(ctx context.Context, p int) error {
	s, from, j, err := e.start(ctx, p)
	if err != nil {
		return err
	}
	st, err := e.js.Stream(ctx, s.name)
	if err != nil {
		return err
	}
	// jetstream mode reads --subject of a stream that may take more (a
	// user's own): the rest is not mentions, neither counted nor
	// dead-lettered. A partition stream holds mentions and its rules only.
	var filter []string
	if e.cfg.Partitions == 0 && !onlyMentions(st.CachedInfo().Config, e.cfg.Subject) {
		filter = []string{e.cfg.Subject, rules.Subject(s.name)}
	}
	cons, err := st.CreateConsumer(ctx, jetstream.ConsumerConfig{
		AckPolicy:         jetstream.AckNonePolicy,
		DeliverPolicy:     jetstream.DeliverByStartSequencePolicy,
		OptStartSeq:       from,
		FilterSubjects:    filter,
		MemoryStorage:     true,
		InactiveThreshold: time.Minute, // the server removes it if this process is gone
	})
	if err != nil {
		return err
	}
	defer e.removeConsumer(st, cons)
	// The consumer belongs to the stream it was made on: if that is
	// still the stream the epoch names, every message it delivers is.
	if info, err := st.Info(ctx); err != nil {
		return err
	} else if epochOf(info) != s.epoch {
		return errRestart
	}
	return e.consume(ctx, st, cons, s, from, j, filter != nil)
}

// onlyMentions says whether a stream of configuration c takes only
// subject and its rules.
func onlyMentions(c jetstream.StreamConfig, subject string) bool {
	for _, s := range c.Subjects {
		if s != subject && s != rules.Subject(c.Name) {
			return false
		}
	}
	return true
}

// consume takes cons's messages of s from sequence from, in a reading
// run by Consume's callback on the subscription's goroutine (the
// Messages iterator cost a timer and a channel hop per message), until
// ctx ends, the reading fails or the library stops (a terminal error:
// the consumer deleted, the connection closed). It returns only once no
// callback runs or will run: the reading is this call's alone.
func (e *Engine) consume(ctx context.Context, st jetstream.Stream, cons jetstream.Consumer, s stream, from uint64, j judgement, filtered bool) error {
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	r := newReading(rctx, e, st, s, from)
	r.j = j
	if filtered {
		r.limits = &st.CachedInfo().Config
	}
	// A short expiry brings heartbeats every 2.5 s: a consumer lost with
	// its server (a restart, a node gone) is noticed in seconds, where the
	// default (30 s) stalled reading for half a minute.
	cc, err := cons.Consume(r.handle, jetstream.PullMaxMessages(pullBatch), jetstream.PullExpiry(pullExpiry),
		jetstream.ConsumeErrHandler(r.trouble))
	if err != nil {
		return err
	}
	closed := cc.Closed()
	defer func() {
		cancel() // a callback paused, or asking the stream's info, returns
		cc.Stop()
		<-closed // the last callback has returned
	}()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case err := <-r.failed:
		return err
	case <-closed:
		return r.stopped()
	}
}

// reading is one reading's state, which Consume's callback keeps: the
// consumer's sequence and the stream's it has delivered.
type reading struct {
	e   *Engine
	ctx context.Context // ends when the reading does
	st  jetstream.Stream
	s   stream
	// delivered and last are the callback's alone (one goroutine, one
	// message at a time). last starts below the first sequence asked
	// for, so that messages the stream's limits drop between start's
	// look and the first delivery are seen as a jump, counted, not
	// skipped.
	delivered, last uint64
	lastAt          time.Time // when the message at last was published
	// j is how messages are judged: the stream's rules in force at the
	// next sequence. A rules message changes it.
	j judgement
	// fence is the engine's fences when the reading began: a rewind
	// since restarts it (its stream may be the rewound one).
	fence uint64
	// limits are the stream's, when the reading is filtered (jetstream
	// mode on a stream of more than --subject): a gap in its sequences is
	// then mostly other subjects, and asked about only when the stream
	// could have dropped mentions in it (dropRisk). nil: every gap is
	// asked about.
	limits      *jetstream.StreamConfig
	done        bool       // the callback failed: it takes nothing more
	failed      chan error // the reading's first failure
	mu          sync.Mutex
	lastTrouble error // the library's last error report (under mu)
}

func newReading(ctx context.Context, e *Engine, st jetstream.Stream, s stream, from uint64) *reading {
	return &reading{ctx: ctx, e: e, st: st, s: s, last: from - 1, failed: make(chan error, 1), fence: e.fences.Load()}
}

// handle is Consume's callback: it takes msg, or ends the reading on the
// first message it cannot take in order.
func (r *reading) handle(msg jetstream.Msg) {
	if r.done || r.ctx.Err() != nil {
		return // delivered before the stop took effect: the next reading reads it
	}
	if err := r.take(msg); err != nil {
		r.done = true
		r.fail(err)
	}
}

// fail ends the reading with err; the first failure is the reading's.
func (r *reading) fail(err error) {
	select {
	case r.failed <- err:
	default:
	}
}

// take is one message of the reading: after any pause, it must be the
// consumer's next (else errRestart), and a jump of the stream sequence
// is checked for mentions the stream dropped.
func (r *reading) take(msg jetstream.Msg) error {
	if err := r.e.whilePaused(r.ctx); err != nil {
		return err
	}
	if r.e.fences.Load() != r.fence {
		return errRestart // a rewind: start again from the record
	}
	d, err := parseDelivery(msg.Reply())
	if err != nil {
		return err
	}
	if d.consumerSeq != r.delivered+1 {
		return errRestart // a message skipped: read again after what the window holds
	}
	r.delivered = d.consumerSeq
	if seq := d.streamSeq; r.last > 0 && seq > r.last+1 && (r.limits == nil || dropRisk(*r.limits, r.lastAt, time.Now())) {
		if err := r.e.jumped(r.ctx, r.st, r.s, r.last, seq); err != nil {
			return err
		}
		// A change of the rules may have gone with what the stream
		// dropped: the rules of this sequence are the history's.
		r.j = r.e.judgementAt(r.s, seq)
	}
	r.last, r.lastAt = d.streamSeq, d.published
	if rules.IsRules(msg.Subject()) {
		if err := r.e.changed(r, msg); err != nil {
			return err
		}
	} else {
		r.e.take(r.s, r.last, msg, d.published, &r.j)
	}
	if d.pending == 0 || r.delivered%256 == 0 { // the gauge needs no more, and a store per message allocates
		r.e.behind(r.s, d.pending, d.published)
	}
	return nil
}

// dropRisk says whether a stream with limits c may have dropped, by now,
// messages published after t (the last one a reading took before a gap):
// a stream that discards old messages for its size may drop any at any
// time; one that only ages them out, none younger than its max age (half
// of it here, for clocks and a slow reading). Streams that keep their
// messages by size only with DiscardNew refuse new ones instead.
func dropRisk(c jetstream.StreamConfig, t, now time.Time) bool {
	if c.Discard == jetstream.DiscardOld && (c.MaxMsgs > 0 || c.MaxBytes > 0) || c.MaxMsgsPerSubject > 0 {
		return true
	}
	return c.MaxAge > 0 && now.Sub(t) > c.MaxAge/2
}

// trouble is Consume's error handler: the library reports there what it
// handles itself and, before it stops, why it stops. Missed heartbeats
// end the reading, as the Messages iterator did: Consume would pull
// again from a consumer that may be gone with its server (a memory
// consumer across a restart) for as long as it is gone.
func (r *reading) trouble(_ jetstream.ConsumeContext, err error) {
	r.mu.Lock()
	r.lastTrouble = err
	r.mu.Unlock()
	if errors.Is(err, jetstream.ErrNoHeartbeat) {
		r.fail(err)
	}
}

// stopped is why the library stopped consuming: its last report.
func (r *reading) stopped() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.lastTrouble == nil {
		return errors.New("durable: consuming stopped")
	}
	return fmt.Errorf("durable: consuming stopped: %w", r.lastTrouble)
}

// start finds p's stream as it is now and the first sequence to read: the
// one after what this process has read of it, or after its checkpoint.
// Mentions the stream dropped before they were read (its limits) are
// counted and logged: they are lost.
func (e *Engine) start(ctx context.Context, p int) (stream, uint64, judgement, error) {
	name := e.streamName(p)
	h, err := e.book.Open(ctx, name, e.Own())
	if errors.Is(err, rules.ErrRolledBack) {
		e.metrics.backwards.Inc()
	}
	if err != nil {
		return stream{}, 0, judgement{}, err
	}
	e.histMu.Lock()
	e.hist[name] = h
	e.histMu.Unlock()
	s, next, err := e.begin(ctx, p, h)
	if err != nil {
		return stream{}, 0, judgement{}, err
	}
	// The rules of the first message this reading judges (a change at
	// next itself is in force after it).
	r, ok := h.In(s.epoch, next+1)
	if !ok {
		return stream{}, 0, judgement{}, errRestart // created again since its rules were read
	}
	if err := e.agree(ctx, s.name, r); err != nil {
		return stream{}, 0, judgement{}, err
	}
	return s, next, judgementOf(r), nil
}

// begin is start's look at p's stream and its checkpoint, whose rules'
// history is h.
func (e *Engine) begin(ctx context.Context, p int, h rules.History) (stream, uint64, error) {
	st, err := e.js.Stream(ctx, e.streamName(p))
	if err != nil {
		return stream{}, 0, err
	}
	info := st.CachedInfo()
	if info.Config.Retention != jetstream.LimitsPolicy {
		// Interest and work-queue streams delete a message once it is
		// delivered: a reader that takes a partition over could not read
		// again what the last one had not written.
		return stream{}, 0, fmt.Errorf("stream %s has %s retention; the position engine reads mentions again after a crash or a hand-over and needs limits retention (hotcount stream create makes such streams)",
			info.Config.Name, info.Config.Retention)
	}
	s := stream{p: p, name: info.Config.Name, epoch: epochOf(info)}
	e.maxAge(s, info.Config.MaxAge)
	cp, _, err := e.ckpt.load(ctx, s.name)
	if err != nil {
		return stream{}, 0, err
	}
	s.gen = e.raise(s.name, cp.Gen)
	if err := e.sameMessages(ctx, st, s, info.State); err != nil {
		return stream{}, 0, err
	}
	if e.foreign(cp, s, h) {
		// The record is another table's (a rewind made it for one, or the
		// rules named another table at its sequence): nothing says what
		// this one holds, so read what the stream has; the items refuse
		// what they hold.
		e.log.Warn("the stream's checkpoint is another table's; reading the stream from its first message",
			zap.String("stream", s.name), zap.String("record_table", cp.Table), zap.String("table", e.cfg.Table))
		next := max(e.win.resume(s)+1, info.State.FirstSeq)
		return s, next, nil
	}
	if cp.Epoch == s.epoch && cp.Seq > info.State.LastSeq {
		// A stream restored from a backup keeps its creation time while
		// its sequences go back below what the items record: its new
		// mentions would be refused as counted. Reading it would lose
		// them silently; not reading it keeps them in the stream.
		e.metrics.backwards.Inc()
		return stream{}, 0, fmt.Errorf("stream %s's sequences went back (last %d, below the checkpoint %d in the same epoch): restored from a backup? Its new mentions would read as counted; not reading it (docs/SEMANTICS.md, \"A stream created again\")",
			s.name, info.State.LastSeq, cp.Seq)
	}
	e.adopt(s, cp)
	next := e.win.resume(s) + 1
	if next == 1 && cp.Epoch == s.epoch {
		next = cp.Seq + 1
	}
	if first := info.State.FirstSeq; next < first {
		// What is at or below the checkpoint is in the items (a partition
		// taken back after the others moved it): the stream dropping it
		// is no loss. The window still starts at first.
		if lost := next; cp.Epoch != s.epoch || cp.Seq < first-1 {
			if cp.Epoch == s.epoch {
				lost = max(lost, cp.Seq+1)
			}
			e.dropped(s, lost, first)
		}
		e.win.skip(s, first-1)
		next = first
	}
	return s, next, nil
}

// foreign says whether record cp of s is another table's: a rewind made
// it for one, or the stream's rules named another table at its sequence
// (the table changed with no rewind: a restored or new table holds
// nothing the checkpoint says).
func (e *Engine) foreign(cp record, s stream, h rules.History) bool {
	if cp.Table != "" {
		return cp.Table != e.cfg.Table
	}
	if cp.Epoch != s.epoch || cp.Seq == 0 {
		return false
	}
	r, ok := h.In(s.epoch, cp.Seq+1) // the table of what follows the checkpoint
	return ok && r.Table != e.cfg.Table
}

// dropped counts and logs the mentions at from..to-1 of s, which the
// stream dropped by its limits before any reader here read them, and
// moves the window past them.
func (e *Engine) dropped(s stream, from, to uint64) {
	e.metrics.retentionLost.Add(float64(to - from))
	e.log.Error("the stream dropped mentions before they were counted (its limits: max age, bytes or messages)",
		zap.String("stream", s.name), zap.Uint64("from", from), zap.Uint64("to", to-1))
	e.win.skip(s, to-1)
}

// jumped checks a jump of the stream sequence from last to seq in one
// reading: messages the stream dropped under a reader that fell behind
// (paused while the store was down) are counted as lost, not passed over
// in silence.
func (e *Engine) jumped(ctx context.Context, st jetstream.Stream, s stream, last, seq uint64) error {
	info, err := st.Info(ctx)
	if err != nil {
		return err
	}
	if first := info.State.FirstSeq; first > last+1 {
		e.dropped(s, last+1, min(first, seq))
	}
	return nil
}

// removeConsumer deletes a reading's consumer, briefly: one left behind
// goes by itself after its inactive threshold.
func (e *Engine) removeConsumer(st jetstream.Stream, cons jetstream.Consumer) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_ = st.DeleteConsumer(ctx, cons.CachedInfo().Name) // best effort: see above
}

// whilePaused waits while the window is as large as it may grow: no
// message waits on an acknowledgement, so stopping is free, and the
// stream keeps the rest.
func (e *Engine) whilePaused(ctx context.Context) error {
	for e.full() {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-e.flushed.wait():
		}
	}
	return nil
}

// take counts one message into the window, or skips it when the ingest
// rejects it (counted, logged, dead-lettered there). Its judgement is a
// function of the message, its stream timestamp and the stream's rules
// at its sequence (j), so any reader of the same sequence, at any time,
// with any settings, makes the same counts of it.
func (e *Engine) take(s stream, seq uint64, msg jetstream.Msg, published time.Time, j *judgement) {
	subject := msg.Subject()
	if e.cfg.Partitions > 0 {
		subject = streams.Unstored(subject)
	}
	topic, delta, at, ok := e.check.Check(j.limits, subject, msg.Data(), msg.Headers(), published, &ingest.Origin{Stream: s.name, Epoch: s.epoch, Seq: seq})
	if !ok {
		e.win.skip(s, seq)
		return
	}
	switch {
	case j.minutes && j.hours:
		// One Fresh counter, which the flush splits: one map operation
		// per mention in the usual case.
		e.win.add(s, seq, delta, published, freshOf(topic, schema.Minute.Index(at)))
	case j.minutes:
		e.win.add(s, seq, delta, published, schema.TotalOf(topic), schema.BucketOf(topic, schema.Minute, schema.Minute.Index(at)))
	case j.hours:
		e.win.add(s, seq, delta, published, schema.TotalOf(topic), schema.BucketOf(topic, schema.Hour, schema.Hour.Index(at)))
	default:
		e.win.add(s, seq, delta, published, schema.TotalOf(topic))
	}
	e.check.Accepted(delta)
}

// countsIn says whether a mention of topic at at counts in c under j:
// its total, its minute's bucket or its hour's, as they are on.
func countsIn(j judgement, c schema.Counter, topic string, at time.Time) bool {
	if c.Topic != topic {
		return false
	}
	switch c.Kind {
	case schema.Total:
		return true
	case schema.MinuteBucket:
		return j.minutes && c.Index == schema.Minute.Index(at)
	case schema.HourBucket:
		return j.hours && c.Index == schema.Hour.Index(at)
	}
	return false
}

// streamName is partition p's stream: the one stream when not
// partitioned.
func (e *Engine) streamName(p int) string {
	if e.cfg.Partitions == 0 {
		return e.cfg.Stream
	}
	return e.layout().Name(p)
}

// storedSubject is the subject topic's mentions are stored under in p's
// stream.
func (e *Engine) storedSubject(p int, topic string) string {
	if e.cfg.Partitions == 0 {
		return e.prefix + topic
	}
	return fmt.Sprintf("%d.%s%s", p, e.prefix, topic)
}

func (e *Engine) layout() streams.Layout {
	return streams.Layout{Stream: e.cfg.Stream, Subject: e.cfg.Subject, Partitions: e.cfg.Partitions}
}

// behind notes how far a reader of s is behind its stream: while
// messages are pending after the one it just read, the oldest unread
// mention is no older than that one's publication.
func (e *Engine) behind(s stream, pending uint64, published time.Time) {
	var since int64
	if pending > 0 {
		since = published.UnixNano()
	}
	e.unread.Store(s.name, since)
}

// maxAge notes s's max age (0: none), for the retention gauge.
func (e *Engine) maxAge(s stream, d time.Duration) { e.ages.Store(s.name, d) }

// liveEpoch is the epoch of the stream named name as the server has it
// now; 0 when there is none (deleted, not yet created again).
func (e *Engine) liveEpoch(ctx context.Context, name string) (int64, error) {
	st, err := e.js.Stream(ctx, name)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	return epochOf(st.CachedInfo()), nil
}
