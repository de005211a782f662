// Package quarantine keeps the writes that the store refuses for good (an
// IAM condition on some keys, a ValidationException, an overflow) out of
// the way of everything else, durably and exactly: the flusher holds a
// refused write here instead of sending it forever, which would hold its
// topic's later counts and its messages with it.
// `hotcount quarantine list` shows what is held and why; `hotcount
// quarantine replay` writes it once the cause is fixed.
//
// A held write was never applied: the flusher quarantines only writes
// whose every answer said so (never one in doubt). A replay must not apply
// it twice either, even when the replay itself loses an answer or is cut
// off. So a replay gives each entry an identity of its own, a writer id no
// one else uses and a fresh seq, records it in the entry first, and only
// then sends the write under it: a second replay sends the same write, and
// the store's mark reads "already applied" if the first one landed
// (store.Write.Replay). The entry is removed once the store has it.
package quarantine

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/hotcount/hotcount/pipeline/store"
	"github.com/hotcount/hotcount/schema"
)

// Entry is one quarantined write.
type Entry struct {
	// Counter is the write's counter's name (schema.Counter.Name): a
	// topic's total or one of its time buckets.
	Counter string `json:"counter"`
	// Topic is the counter's topic, for people.
	Topic  string `json:"topic"`
	Shard  int    `json:"shard"`
	Delta  int64  `json:"delta"`
	Writer string `json:"writer"` // the identity the write was refused under
	Seq    int64  `json:"seq"`
	// Reason is the store's last refusal.
	Reason string `json:"reason"`
	// Since is the first refusal; At when the write was quarantined.
	Since time.Time `json:"since"`
	At    time.Time `json:"at"`
	// Replay is the identity a replay sends the write under, recorded
	// before the first send; nil until a replay starts.
	Replay *Identity `json:"replay,omitempty"`
}

// Identity is a write's writer id and seq.
type Identity struct {
	Writer string `json:"writer"`
	Seq    int64  `json:"seq"`
}

// Key is the entry's key in a Store: its writer and seq, which no other
// write shares.
func (e Entry) Key() string { return e.Writer + "." + strconv.FormatInt(e.Seq, 10) }

// Of returns the entry that holds w, refused with reason since since.
func Of(w store.Write, reason string, since, at time.Time) Entry {
	return Entry{Counter: w.Counter.Name(), Topic: w.Counter.Topic, Shard: w.Shard, Delta: w.Delta,
		Writer: w.Writer, Seq: w.Seq, Reason: reason, Since: since, At: at}
}

// Store keeps entries durably: files in core mode's data directory
// (Dir). The durable modes hold a refused counter in its stream's
// checkpoint record instead, with the span of sequences it carries.
type Store interface {
	// Put adds an entry; once it returns nil the entry survives a
	// restart.
	Put(ctx context.Context, e Entry) error
	// List returns every entry held, oldest first.
	List(ctx context.Context) ([]Entry, error)
	// Delete removes an entry (its write is in the store).
	Delete(ctx context.Context, e Entry) error
}

// Writer is the store as a replay writes to it (store.DynamoDB, store.Bolt).
type Writer interface {
	Add(ctx context.Context, w store.Write, now time.Time) error
}

// Result is what a replay did.
type Result struct {
	// Written are the entries now in the store and removed.
	Written []Entry `json:"written"`
	// Left are the entries still held, with the error of each.
	Left []Failed `json:"left,omitempty"`
}

// Failed is an entry a replay could not write.
type Failed struct {
	Entry
	Error string `json:"error"`
}

// Mentions is how many mentions the written entries carried (their
// totals; a time bucket's delta repeats its total's).
func (r Result) Mentions() int64 {
	var n int64
	for _, e := range r.Written {
		if c, ok := schema.ParseName(e.Counter); ok && c.CountsMentions() {
			n += e.Delta
		}
	}
	return n
}

// Replay writes every entry of q to w, exactly once (see the package
// comment), and removes the entries written. seq hands out the replay
// seqs; ids new writer ids (store.NewWriterID). An entry it cannot write
// stays, with its error in Result.Left; the returned error is about q
// itself.
//
// The first send of an identity minted in this run goes as a new write:
// a definite refusal then proves nothing applied, and the identity is
// dropped, so the next run sends under a fresh seq (an identity kept
// across runs while refused would fall below the item's floor as other
// writers trim their marks, and its refusal would read as "can no longer
// tell"). An identity whose send ended in doubt is kept, and sent again
// as a replay until it settles.
func Replay(ctx context.Context, q Store, w Writer, seq *store.Sequencer, ids func() string, now func() time.Time) (Result, error) {
	var r Result
	entries, err := q.List(ctx)
	if err != nil {
		return r, err
	}
	for _, e := range entries {
		if err := ctx.Err(); err != nil {
			return r, err
		}
		c, ok := schema.ParseName(e.Counter)
		if !ok {
			r.Left = append(r.Left, Failed{e, fmt.Sprintf("counter %q is not a counter name", e.Counter)})
			continue
		}
		minted := e.Replay == nil
		if minted {
			// The identity goes into the entry before the write goes out:
			// a replay cut off after the send finds it and sends the same.
			e.Replay = &Identity{Writer: ids(), Seq: seq.Next()}
			if err := q.Put(ctx, e); err != nil {
				return r, fmt.Errorf("quarantine: record the replay of %s: %w", e.Key(), err)
			}
		}
		err := w.Add(ctx, store.Write{Counter: c, Shard: e.Shard, Delta: e.Delta, Writer: e.Replay.Writer, Seq: e.Replay.Seq, Replay: !minted}, now())
		switch {
		case err == nil:
		case errors.Is(err, store.ErrUnresolvable):
			// Sent before and in doubt, and its mark since trimmed: the
			// store counts it as applied, as it does its own writes
			// (hotcount_store_resolved_total{outcome="unresolvable"}).
		case minted && !errors.Is(err, store.ErrAmbiguous):
			// Its only send was refused with an answer: nothing applied.
			var floor *store.FloorError
			if errors.As(err, &floor) {
				seq.Raise(floor.Floor) // this clock is behind the item's writers
			}
			e.Replay = nil
			if perr := q.Put(ctx, e); perr != nil {
				return r, fmt.Errorf("quarantine: drop the refused identity of %s: %w", e.Key(), perr)
			}
			fallthrough
		default:
			r.Left = append(r.Left, Failed{e, err.Error()})
			continue
		}
		if err := q.Delete(ctx, e); err != nil {
			// Written, still listed: the next replay finds the mark and
			// only removes it.
			return r, fmt.Errorf("quarantine: %s written, not removed: %w", e.Key(), err)
		}
		r.Written = append(r.Written, e)
	}
	return r, nil
}
