// Package quarantine keeps the writes that the store refuses for good (an
// IAM condition on some keys, a ValidationException, an overflow) out of
// the way of everything else, durably and exactly: the flusher holds a
// refused write here instead of sending it forever, which would hold its
// topic's later counts, its messages and its journal entry with it.
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
)

// Entry is one quarantined write.
type Entry struct {
	// Counter is the write's counter's name (store.Counter.Name): a
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
	// Journal is the journal entry the write was recorded in (durable
	// modes), and Released says the hand-over from it is complete: the
	// entry marks the write as the quarantine's, so that no journal
	// replay writes it too. A write goes to the quarantine first, then is
	// marked in its entry, then released here; an entry not released
	// (its sidecar stopped in between) is only replayed once its journal
	// entry shows the mark (see Replay).
	Journal  string `json:"journal,omitempty"`
	Released bool   `json:"released"`
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

// Of returns the entry that holds w, refused with reason since since,
// recorded in journal entry journal ("": none, and the entry is released
// at once).
func Of(w store.Write, journal, reason string, since, at time.Time) Entry {
	return Entry{Counter: w.Counter.Name(), Topic: w.Counter.Topic, Shard: w.Shard, Delta: w.Delta,
		Writer: w.Writer, Seq: w.Seq, Reason: reason, Since: since, At: at, Journal: journal, Released: journal == ""}
}

// Journal tells Replay where an entry not released stands in its journal
// entry (journal.Holds on the journal's bucket): found, the journal entry
// is there and holds the write; quarantined, it is marked as the
// quarantine's. A marked write's journal entry is never removed before
// the quarantine entry is released (the flusher releases it before it
// settles the write; a replay of a dead writer's entry calls Release
// first), so an entry not released whose journal entry is gone, or holds
// the write unmarked, was never the quarantine's: the journal wrote it.
type Journal func(ctx context.Context, key, counter string) (found, quarantined bool, err error)

// Store keeps entries durably: a JetStream key-value bucket in the
// durable modes (KV), files in the data directory in core mode (Dir).
type Store interface {
	// Put adds an entry; once it returns nil the entry survives a
	// restart.
	Put(ctx context.Context, e Entry) error
	// List returns every entry held, oldest first.
	List(ctx context.Context) ([]Entry, error)
	// Get returns the entry of key (Entry.Key), and whether it is there.
	Get(ctx context.Context, key string) (Entry, bool, error)
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
	// Journaled are entries never released whose journal entry is gone:
	// the journal wrote them, and they are removed, not written.
	Journaled []Entry `json:"journaled,omitempty"`
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
		if c, ok := store.ParseName(e.Counter); ok && c.CountsMentions() {
			n += e.Delta
		}
	}
	return n
}

// ErrNotReleased is Replay's reason for leaving an entry whose hand-over
// from its journal entry did not finish.
var ErrNotReleased = errors.New("quarantine: not released by its journal entry")

// Replay writes every entry of q to w, exactly once (see the package
// comment), and removes the entries written. seq hands out the replay
// seqs; ids new writer ids (store.NewWriterID); j reads the journal (nil
// in core mode). An entry it cannot write stays, with its error in
// Result.Left; the returned error is about q itself.
//
// An entry not released is the quarantine's only if its journal entry
// marks it so (then Replay releases it and writes it); while the journal
// entry holds it unmarked, the journal owns it (its sidecar, or another
// one's replay of it, writes it); and once the journal entry is gone
// without the mark, Replay cannot tell whether a journal replay wrote it,
// and removes it unwritten once the journal entry is gone without the mark
// or holds the write no more: only a journal that wrote it leaves it so
// (Result.Journaled).
//
// The first send of an identity minted in this run goes as a new write:
// a definite refusal then proves nothing applied, and the identity is
// dropped, so the next run sends under a fresh seq (an identity kept
// across runs while refused would fall below the item's floor as other
// writers trim their marks, and its refusal would read as "can no longer
// tell"). An identity whose send ended in doubt is kept, and sent again
// as a replay until it settles.
func Replay(ctx context.Context, q Store, w Writer, j Journal, seq *store.Sequencer, ids func() string, now func() time.Time) (Result, error) {
	var r Result
	entries, err := q.List(ctx)
	if err != nil {
		return r, err
	}
	for _, e := range entries {
		if err := ctx.Err(); err != nil {
			return r, err
		}
		c, ok := store.ParseName(e.Counter)
		if !ok {
			r.Left = append(r.Left, Failed{e, fmt.Sprintf("counter %q is not a counter name", e.Counter)})
			continue
		}
		if !e.Released && e.Journal != "" {
			ours, err := release(ctx, q, j, &e)
			switch {
			case err != nil:
				r.Left = append(r.Left, Failed{e, err.Error()})
				continue
			case !ours:
				if err := q.Delete(ctx, e); err != nil {
					return r, fmt.Errorf("quarantine: remove %s, which its journal wrote: %w", e.Key(), err)
				}
				r.Journaled = append(r.Journaled, e)
				continue
			}
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

// release finishes the hand-over of e from its journal entry when the
// entry marks the write as the quarantine's (ours), or says that the
// journal has it (not ours: it wrote it, or will), or why it cannot tell.
func release(ctx context.Context, q Store, j Journal, e *Entry) (ours bool, err error) {
	if j == nil {
		return false, fmt.Errorf("%w: journal entry %s cannot be read here", ErrNotReleased, e.Journal)
	}
	found, marked, err := j(ctx, e.Journal, e.Counter)
	switch {
	case err != nil:
		return false, err
	case found && !marked:
		// Its sidecar stopped before marking it, and the journal entry
		// is not replayed yet (the store may still refuse it).
		return false, fmt.Errorf("%w: journal entry %s holds the write and writes it once the store takes it; replay again after that", ErrNotReleased, e.Journal)
	case !found:
		return false, nil
	}
	e.Released = true
	return true, q.Put(ctx, *e)
}

// Release marks the entry of key released: a replay of a dead writer's
// journal entry calls it, before it finishes the entry, for each write
// the entry marks as the quarantine's. An entry not there is released
// already: the mark is only ever set after the entry is put, and the
// entry goes only once written (by a replay that found it marked).
func Release(ctx context.Context, q Store, key string) error {
	e, ok, err := q.Get(ctx, key)
	switch {
	case err != nil:
		return err
	case !ok || e.Released:
		return nil
	}
	e.Released = true
	return q.Put(ctx, e)
}
