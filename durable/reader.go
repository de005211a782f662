package durable

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/hotcount/hotcount/store"
	"github.com/hotcount/hotcount/streams"
)

// pullBatch is how many messages a reader's pull asks for.
const pullBatch = 500

// errRestart ends a reading that must start again from what the window
// holds: the consumer skipped a message, or the stream is not the one it
// was (deleted and created again).
var errRestart = errors.New("durable: reading restarts")

// epochOf is a stream's identity beside its name: its creation time.
func epochOf(info *jetstream.StreamInfo) int64 { return info.Created.UnixMicro() }

// read reads partition p from where this process, or else the
// checkpoint, says its mentions are not yet in the store, until ctx ends.
// Any trouble (NATS gone, the consumer lost, a gap, the stream recreated)
// ends one reading; the next starts where the window says, after a pause.
func (e *Engine) read(ctx context.Context, p int) {
	for wait := time.Duration(0); ; wait = min(2*wait+100*time.Millisecond, 5*time.Second) {
		err := e.readOnce(ctx, p)
		if ctx.Err() != nil {
			return
		}
		if errors.Is(err, errRestart) {
			wait = 0 // at once: nothing is wrong with NATS
		} else {
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
	s, from, err := e.start(ctx, p)
	if err != nil {
		return err
	}
	st, err := e.js.Stream(ctx, s.name)
	if err != nil {
		return err
	}
	cons, err := st.CreateConsumer(ctx, jetstream.ConsumerConfig{
		AckPolicy:         jetstream.AckNonePolicy,
		DeliverPolicy:     jetstream.DeliverByStartSequencePolicy,
		OptStartSeq:       from,
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
	it, err := cons.Messages(jetstream.PullMaxMessages(pullBatch))
	if err != nil {
		return err
	}
	stop := context.AfterFunc(ctx, it.Stop)
	defer stop()
	defer it.Stop()
	var delivered uint64
	for {
		if err := e.whilePaused(ctx); err != nil {
			return err
		}
		msg, err := it.Next()
		if err != nil {
			return err
		}
		md, err := msg.Metadata()
		if err != nil {
			return err
		}
		if md.Sequence.Consumer != delivered+1 {
			return errRestart // a message skipped: read again after what the window holds
		}
		delivered = md.Sequence.Consumer
		e.take(s, md.Sequence.Stream, msg, md.Timestamp)
	}
}

// start finds p's stream as it is now and the first sequence to read: the
// one after what this process has read of it, or after its checkpoint.
// Mentions the stream dropped before they were read (its limits) are
// counted and logged: they are lost.
func (e *Engine) start(ctx context.Context, p int) (stream, uint64, error) {
	st, err := e.js.Stream(ctx, e.streamName(p))
	if err != nil {
		return stream{}, 0, err
	}
	info := st.CachedInfo()
	s := stream{p: p, name: info.Config.Name, epoch: epochOf(info)}
	next := e.win.resume(s) + 1
	if next == 1 {
		cp, _, err := e.ckpt.load(ctx, s.name)
		if err != nil {
			return stream{}, 0, err
		}
		if cp.Epoch == s.epoch {
			next = cp.Seq + 1
		}
	}
	if first := info.State.FirstSeq; next < first && info.State.Msgs > 0 {
		lost := first - next
		e.metrics.retentionLost.Add(float64(lost))
		e.log.Error("the stream dropped mentions before they were counted (its limits: max age, bytes or messages)",
			zap.String("stream", s.name), zap.Uint64("from", next), zap.Uint64("to", first-1))
		e.win.skip(s, first-1)
		next = first
	}
	return s, next, nil
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
// function of the message and its stream timestamp alone, so any reader
// of the same sequence, at any time, makes the same counts of it.
func (e *Engine) take(s stream, seq uint64, msg jetstream.Msg, published time.Time) {
	subject := msg.Subject()
	if e.cfg.Partitions > 0 {
		subject = streams.Unstored(subject)
	}
	topic, delta, at, ok := e.check.Check(subject, msg.Data(), msg.Headers(), published)
	if !ok {
		e.win.skip(s, seq)
		return
	}
	e.win.add(s, seq, delta, e.counters(topic, at)...)
	e.check.Accepted(delta)
}

// counters are the counters a mention of topic at at counts in: its
// total, and with time buckets on its minute and its hour.
func (e *Engine) counters(topic string, at time.Time) []store.Counter {
	cs := []store.Counter{store.TotalOf(topic)}
	if e.cfg.Minutes {
		cs = append(cs, store.BucketOf(topic, store.Minute, store.Minute.Index(at)))
	}
	if e.cfg.Hours {
		cs = append(cs, store.BucketOf(topic, store.Hour, store.Hour.Index(at)))
	}
	return cs
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
