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
	"github.com/hotcount/hotcount/pipeline/store"
)

// maxRecounts is how many recounts run at once (Engine.recounting).
const maxRecounts = 4

// recount reads again, from k's stream, the mentions of k's counter at
// sequences from..to, and returns their entry: the path of two readers
// whose spans overlap (a frozen reader that woke up, a hand-over, a
// successor of a killed reader), where the item holds the first part of a
// span and the rest must be counted exactly. It reads only the topic's
// subject, once for the topic's counters that recount the same span at
// once (its total and its buckets: the writes a killed reader made of one
// topic in one flush recorded one position). A stream that is not the one
// the entry was read from any more (deleted and created again) has
// nothing to add: the rest of the span went with it, counted as lost and
// logged.
func (e *Engine) recount(ctx context.Context, k key, from, to uint64) (entry, error) {
	id := fmt.Sprintf("%s\x00%d\x00%s\x00%d\x00%d", k.s.name, k.s.epoch, k.c.Topic, from, to)
	v, err, _ := e.rereads.Do(id, func() (any, error) { return e.reread(ctx, k, from, to) })
	if err != nil {
		return entry{}, err
	}
	rest := entry{first: from, last: to}
	for _, m := range v.([]reread) {
		if e.countsIn(k.c, k.c.Topic, m.at) {
			rest.delta, _ = store.SatAdd(rest.delta, m.delta)
		}
	}
	return rest, nil
}

// reread is one mention a recount read again: what it adds, and when.
type reread struct {
	delta int64
	at    time.Time
}

// reread reads the mentions of k's topic at sequences from..to again, as
// the reader judged them; of a stream that is not the one k's span was
// read from any more, none.
func (e *Engine) reread(ctx context.Context, k key, from, to uint64) ([]reread, error) {
	select {
	case e.recounting <- struct{}{}:
		defer func() { <-e.recounting }()
	case <-ctx.Done():
		return nil, fmt.Errorf("durable: recount %s: %w", k.s.name, ctx.Err())
	}
	e.metrics.recounts.Inc()
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	st, err := e.js.Stream(ctx, k.s.name)
	if err != nil {
		return nil, fmt.Errorf("durable: recount %s: %w", k.s.name, err)
	}
	if epochOf(st.CachedInfo()) != k.s.epoch {
		// How many of the span's messages were this topic's, nothing
		// can say any more: the metric takes them all, an upper bound.
		e.metrics.retentionLost.Add(float64(to - from + 1))
		e.log.Error("the stream was deleted and created again before a recount read mentions of it: they went with it",
			zap.String("stream", k.s.name), zap.String("topic", k.c.Topic), zap.Uint64("from", from), zap.Uint64("to", to))
		return nil, nil
	}
	if first := st.CachedInfo().State.FirstSeq; first > from {
		// The stream's limits dropped the front of the span before this
		// recount: the topic's mentions there are lost. How many of the
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
		// of topics.
		InactiveThreshold: 5 * time.Second,
	})
	if err != nil {
		return nil, fmt.Errorf("durable: recount %s: %w", k.s.name, err)
	}
	// The recount ends at to, a mention of this topic the reader read,
	// never where the consumer's server runs out: on a replica that is
	// behind (a leader elected a moment ago), running out early would
	// claim mentions it never saw.
	var read []reread
	for {
		batch, err := cons.Fetch(pullBatch, jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			return nil, fmt.Errorf("durable: recount %s: %w", k.s.name, err)
		}
		for msg := range batch.Messages() {
			md, err := msg.Metadata()
			if err != nil {
				return nil, fmt.Errorf("durable: recount %s: %w", k.s.name, err)
			}
			if md.Sequence.Stream > to {
				return e.still(ctx, st, k, read)
			}
			if m, ok := e.judge(k.c.Topic, msg, md.Timestamp); ok {
				read = append(read, m)
			}
			if md.Sequence.Stream == to {
				return e.still(ctx, st, k, read)
			}
		}
		if err := batch.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) {
			return nil, fmt.Errorf("durable: recount %s: %w", k.s.name, err)
		}
		if ctx.Err() != nil {
			return e.gone(st, k, read, from, to)
		}
	}
}

// judge is the reader's judgement of msg (take), made again: what it
// adds to topic's counters, and when; not ok if it adds nothing.
func (e *Engine) judge(topic string, msg jetstream.Msg, published time.Time) (reread, bool) {
	subject := msg.Subject()
	if e.cfg.Partitions > 0 {
		subject = streams.Unstored(subject)
	}
	t, delta, at, err := ingest.Judge(e.prefix, subject, msg.Data(), published, e.cfg.Limits)
	if err != nil || ingest.Probe(msg.Headers()) || t != topic {
		return reread{}, false
	}
	return reread{delta: delta, at: at}, true
}

// still returns read if k's stream is still the one it was read from:
// the ordered consumer makes a new consumer by the stream's name when it
// loses one, so a stream deleted and created during a recount could have
// given it the new stream's messages. Else the span has nothing to add.
func (e *Engine) still(ctx context.Context, st jetstream.Stream, k key, read []reread) ([]reread, error) {
	info, err := st.Info(ctx)
	if err != nil {
		return nil, fmt.Errorf("durable: recount %s: %w", k.s.name, err)
	}
	if epochOf(info) != k.s.epoch {
		return nil, nil
	}
	return read, nil
}

// gone ends a recount that did not reach to in time: a replica far
// behind, which the next flush tries again, or a stream that dropped or
// deleted to before the recount read it, which no flush would get past:
// the rest of the span is lost, and counted and logged as such.
func (e *Engine) gone(st jetstream.Stream, k key, read []reread, from, to uint64) ([]reread, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	info, err := st.Info(ctx)
	if err != nil {
		return nil, fmt.Errorf("durable: recount %s: the stream delivered nothing up to %d in time", k.s.name, to)
	}
	if info.State.FirstSeq <= to { // to may have been deleted from the middle (nats stream rmm, a per-subject limit)
		if _, err := st.GetMsg(ctx, to); !errors.Is(err, jetstream.ErrMsgNotFound) {
			return nil, fmt.Errorf("durable: recount %s: the stream delivered nothing up to %d in time", k.s.name, to)
		}
	}
	e.metrics.retentionLost.Inc() // at least the mention at to; how many more of the span, nothing says
	e.log.Error("the stream dropped mentions before a recount read them (its limits: max age, bytes or messages)",
		zap.String("stream", k.s.name), zap.String("topic", k.c.Topic), zap.Uint64("from", from), zap.Uint64("to", to))
	return read, nil
}
