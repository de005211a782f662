package durable

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/hotcount/hotcount/durability/streams"
	"github.com/hotcount/hotcount/pipeline/ingest"
	"github.com/hotcount/hotcount/schema"
)

// maxRecounts is how many recounts run at once (Engine.recounting).
const maxRecounts = 4

// recount reads again, from k's stream, the mentions of k's counter at
// sequences from..to, and returns their entry: the rare path of two
// readers whose spans overlap (a frozen reader that woke up, a hand-over),
// where the item holds the first part of a span and the rest must be
// counted exactly. It reads only the topic's subject. A stream that is not
// the one the entry was read from any more (deleted and created again)
// has nothing to add: the rest of the span went with it, counted as lost
// and logged.
func (e *Engine) recount(ctx context.Context, k key, from, to uint64) (entry, error) {
	select {
	case e.recounting <- struct{}{}:
		defer func() { <-e.recounting }()
	case <-ctx.Done():
		return entry{}, fmt.Errorf("durable: recount %s: %w", k.s.name, ctx.Err())
	}
	e.metrics.recounts.Inc()
	rest := entry{first: from, last: to}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	st, err := e.js.Stream(ctx, k.s.name)
	if err != nil {
		return entry{}, fmt.Errorf("durable: recount %s: %w", k.s.name, err)
	}
	if epochOf(st.CachedInfo()) != k.s.epoch {
		// How many of the span's messages were this counter's, nothing
		// can say any more: the metric takes them all, an upper bound.
		e.metrics.retentionLost.Add(float64(to - from + 1))
		e.log.Error("the stream was deleted and created again before a recount read mentions of it: they went with it",
			zap.String("stream", k.s.name), zap.String("topic", k.c.Topic), zap.Uint64("from", from), zap.Uint64("to", to))
		return rest, nil
	}
	if first := st.CachedInfo().State.FirstSeq; first > from {
		// The stream's limits dropped the front of the span before this
		// recount: the counter's mentions there are lost. How many of the
		// dropped messages were its, nothing says: the metric takes them
		// all, an upper bound.
		e.metrics.retentionLost.Add(float64(min(first, to+1) - from))
		e.log.Error("the stream dropped mentions before a recount read them (its limits: max age, bytes or messages)",
			zap.String("stream", k.s.name), zap.String("topic", k.c.Topic), zap.Uint64("from", from), zap.Uint64("to", min(first-1, to)))
	}
	cons, err := st.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{e.storedSubject(k.s.p, k.c.Topic)},
		DeliverPolicy:  jetstream.DeliverByStartSequencePolicy,
		OptStartSeq:    from,
		// Gone soon after the recount: a hand-over may recount hundreds
		// of counters.
		InactiveThreshold: 5 * time.Second,
	})
	if err != nil {
		return entry{}, fmt.Errorf("durable: recount %s: %w", k.s.name, err)
	}
	// The recount ends at to, a mention of this counter the reader read,
	// never where the consumer's server runs out: on a replica that is
	// behind (a leader elected a moment ago), running out early would
	// claim mentions it never saw.
	for {
		batch, err := cons.Fetch(pullBatch, jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			return entry{}, fmt.Errorf("durable: recount %s: %w", k.s.name, err)
		}
		for msg := range batch.Messages() {
			md, err := msg.Metadata()
			if err != nil {
				return entry{}, fmt.Errorf("durable: recount %s: %w", k.s.name, err)
			}
			if md.Sequence.Stream > to {
				return e.still(ctx, st, k, rest)
			}
			rest.delta += e.counts(e.judgementAt(k.s, md.Sequence.Stream), k.c, msg, md.Timestamp)
			if md.Sequence.Stream == to {
				return e.still(ctx, st, k, rest)
			}
		}
		if err := batch.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) {
			return entry{}, fmt.Errorf("durable: recount %s: %w", k.s.name, err)
		}
		if ctx.Err() != nil {
			return e.gone(st, k, rest, to)
		}
	}
}

// counts is what msg adds to counter c: the reader's judgement (take),
// made again.
func (e *Engine) counts(j judgement, c schema.Counter, msg jetstream.Msg, published time.Time) int64 {
	subject := msg.Subject()
	if e.cfg.Partitions > 0 {
		subject = streams.Unstored(subject)
	}
	topic, delta, at, err := ingest.Judge(e.prefix, subject, msg.Data(), published, j.limits)
	if err != nil || ingest.Probe(msg.Headers()) || !countsIn(j, c, topic, at) {
		return 0
	}
	return delta
}

// still returns rest if k's stream is still the one it was read from:
// the ordered consumer makes a new consumer by the stream's name when it
// loses one, so a stream deleted and created during a recount could have
// given it the new stream's messages. Else the entry has nothing to add.
func (e *Engine) still(ctx context.Context, st jetstream.Stream, k key, rest entry) (entry, error) {
	info, err := st.Info(ctx)
	if err != nil {
		return entry{}, fmt.Errorf("durable: recount %s: %w", k.s.name, err)
	}
	if epochOf(info) != k.s.epoch {
		return entry{first: rest.first, last: rest.last}, nil
	}
	return rest, nil
}

// gone ends a recount that did not reach to in time: a replica far
// behind, which the next flush tries again, or a stream that dropped or
// deleted to before the recount read it, which no flush would get past:
// the rest of the span is lost, and counted and logged as such.
func (e *Engine) gone(st jetstream.Stream, k key, rest entry, to uint64) (entry, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	info, err := st.Info(ctx)
	if err != nil {
		return entry{}, fmt.Errorf("durable: recount %s: the stream delivered nothing up to %d in time", k.s.name, to)
	}
	if info.State.FirstSeq <= to { // to may have been deleted from the middle (nats stream rmm, a per-subject limit)
		if _, err := st.GetMsg(ctx, to); !errors.Is(err, jetstream.ErrMsgNotFound) {
			return entry{}, fmt.Errorf("durable: recount %s: the stream delivered nothing up to %d in time", k.s.name, to)
		}
	}
	e.metrics.retentionLost.Inc() // at least the mention at to; how many more of the span, nothing says
	e.log.Error("the stream dropped mentions before a recount read them (its limits: max age, bytes or messages)",
		zap.String("stream", k.s.name), zap.String("topic", k.c.Topic), zap.Uint64("from", rest.first), zap.Uint64("to", to))
	return rest, nil
}
