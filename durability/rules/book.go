package rules

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/user"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/hotcount/hotcount/durability/streams"
	"github.com/hotcount/hotcount/pipeline/store"
)

// Subject is the subject of stream's rules messages: outside every
// mention subject, taken by the stream besides its mentions.
func Subject(stream string) string { return streams.RulesSubject(stream) }

// IsRules says whether subject is a rules message's.
func IsRules(subject string) bool { return strings.HasPrefix(subject, streams.RulesPrefix) }

// ErrRolledBack is Open's error for a stream whose rules went back: the
// history names a change that the stream no longer holds at its sequence
// (a stream restored from a backup keeps its creation time, and its
// sequences are written again).
var ErrRolledBack = errors.New("rules: the stream's rules went back")

// ErrNone is Current's error for a stream with no rules recorded yet.
var ErrNone = errors.New("rules: none recorded")

// Book keeps the streams' rules: each change a message in its stream, and
// the whole history of each stream in one key of a key-value bucket (the
// checkpoints'), changed by compare-and-set.
type Book struct {
	js jetstream.JetStream
	kv jetstream.KeyValue
}

// NewBook returns a book on js whose histories are kept in kv.
func NewBook(js jetstream.JetStream, kv jetstream.KeyValue) *Book { return &Book{js: js, kv: kv} }

// KV is the bucket the book keeps the histories in.
func (b *Book) KV() jetstream.KeyValue { return b.kv }

// historyKey is the key of stream's history in the bucket.
func historyKey(stream string) string { return "rules." + stream }

// Take adds the rules subject to st's subjects unless it has it: streams
// made before the rules existed take it from the first reader on.
func Take(ctx context.Context, js jetstream.JetStream, st jetstream.Stream) (jetstream.Stream, error) {
	c := st.CachedInfo().Config
	subj := Subject(c.Name)
	if slices.Contains(c.Subjects, subj) {
		return st, nil
	}
	c.Subjects = append(c.Subjects, subj)
	if _, err := js.UpdateStream(ctx, c); err != nil {
		return nil, fmt.Errorf("rules: add %s to stream %s: %w", subj, c.Name, err)
	}
	return js.Stream(ctx, c.Name)
}

// Open returns stream's history, first making sure that the stream takes
// its rules subject, that the history has the stream's last change, and
// that the stream's creation has rules: if it has none, own are recorded
// as its first (or, for a stream created again, the rules of its earlier
// creation), which judge every message of the creation until a change.
// The first rules are a change at sequence 0, kept in the bucket only:
// its compare-and-set keeps the first record, so of two first readers
// with different settings one records and both follow it. Open refuses
// (ErrRolledBack) a stream whose last change the history has and the
// stream does not.
func (b *Book) Open(ctx context.Context, name string, own Rules) (History, error) {
	h, epoch, err := b.current(ctx, name)
	if err != nil {
		return nil, err
	}
	if _, ok := h.latestOf(epoch); ok {
		return h, b.keep(ctx, name, h)
	}
	first := Change{Epoch: epoch, At: time.Now().UTC(), By: Who(), Why: "first rules of this creation of the stream, from the settings of the sidecar that read it first", Rules: own}
	if prev, ok := h.Latest(); ok {
		first.Rules, first.Why = prev.Rules, "carried from the stream's earlier creation"
	}
	if err := b.keep(ctx, name, h.With(first)); err != nil {
		return nil, err
	}
	stored, _, err := b.load(ctx, name) // another reader's first rules, if it recorded first
	if err != nil {
		return nil, err
	}
	for _, c := range h {
		stored = stored.With(c)
	}
	return stored, nil
}

// ErrChanged is Set's error when the stream's rules are not the ones the
// change was made from any more: another change came first.
var ErrChanged = errors.New("rules: the stream's rules changed meanwhile")

// Set records r as stream's rules from its next message on, if the rules
// in force are still from: the change an operator made r from (Latest).
// The compare-and-set is the stream's own (the expected last sequence of
// the rules subject), so of two changes made from the same rules one is
// recorded and the other refused (ErrChanged). why is kept in the
// history.
func (b *Book) Set(ctx context.Context, name string, r Rules, why string, from Change) (Change, error) {
	for range 5 {
		h, epoch, last, err := b.readLast(ctx, name, true)
		if err != nil {
			return Change{}, err
		}
		now, ok := h.latestOf(epoch)
		if !ok {
			return Change{}, fmt.Errorf("%w: stream %s has no rules for its creation (created again?); look again", ErrChanged, name)
		}
		if now.Epoch != from.Epoch || now.Seq != from.Seq {
			return Change{}, fmt.Errorf("%w: stream %s: by %s at %s (%s); look again and change them again", ErrChanged, name, now.By, now.At.Format(time.RFC3339), now.Why)
		}
		c, err := b.publish(ctx, name, epoch, last, Change{At: time.Now().UTC(), By: Who(), Why: why, Rules: r})
		if isWrongLast(err) {
			continue // published meanwhile: the next look finds it, and refuses
		}
		if err != nil {
			return Change{}, err
		}
		return c, b.keep(ctx, name, h.With(c))
	}
	return Change{}, fmt.Errorf("rules: stream %s: its rules changed under every try", name)
}

// Latest is the change in force for stream's current creation (ok false:
// none recorded yet for it).
func (b *Book) Latest(ctx context.Context, name string) (Change, bool, error) {
	h, epoch, err := b.read(ctx, name, false)
	if err != nil {
		return Change{}, false, err
	}
	c, ok := h.latestOf(epoch)
	return c, ok, nil
}

// History returns stream's history as the bucket keeps it, with the
// stream's last change added if the bucket lacks it; it changes nothing.
func (b *Book) History(ctx context.Context, name string) (History, error) {
	h, _, err := b.read(ctx, name, false)
	return h, err
}

// current is read for a change: the stream takes its rules subject first.
func (b *Book) current(ctx context.Context, name string) (History, int64, error) {
	return b.read(ctx, name, true)
}

// read reads stream's history and the stream's creation, and adds the
// stream's last rules message to the history if it lacks it (a change
// published by a process that stopped before it kept it). With take, the
// stream takes its rules subject first.
func (b *Book) read(ctx context.Context, name string, take bool) (History, int64, error) {
	h, epoch, _, err := b.readLast(ctx, name, take)
	return h, epoch, err
}

// readLast is read, with the sequence of the last rules message the
// stream held (0: none): a change made from what was read expects it.
func (b *Book) readLast(ctx context.Context, name string, take bool) (History, int64, uint64, error) {
	st, err := b.js.Stream(ctx, name)
	if err != nil {
		return nil, 0, 0, fmt.Errorf("rules: stream %s: %w", name, err)
	}
	if take {
		if st, err = Take(ctx, b.js, st); err != nil {
			return nil, 0, 0, err
		}
	}
	info := st.CachedInfo()
	epoch := store.EpochOf(info.Created)
	h, _, err := b.load(ctx, name)
	if err != nil {
		return nil, 0, 0, err
	}
	var last uint64
	msg, err := st.GetLastMsgForSubject(ctx, Subject(name))
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
	case err != nil:
		return nil, 0, 0, fmt.Errorf("rules: stream %s: %w", name, err)
	default:
		c, err := Parse(msg.Data, epoch, msg.Sequence)
		if err != nil {
			return nil, 0, 0, err
		}
		h, last = h.With(c), msg.Sequence
	}
	// The stream as it is now, after what was read of it: a change
	// published meanwhile is within it, never past its end.
	now, err := st.Info(ctx)
	if err != nil {
		return nil, 0, 0, fmt.Errorf("rules: stream %s: %w", name, err)
	}
	if store.EpochOf(now.Created) != epoch {
		return nil, 0, 0, fmt.Errorf("rules: stream %s was created again while its rules were read; try again", name)
	}
	if err := b.intact(ctx, st, h, epoch); err != nil {
		return nil, 0, 0, err
	}
	return h, epoch, last, nil
}

// intact checks that st still holds the last change the history names of
// its creation epoch: past the stream's end, or some other message at its
// sequence, the stream went back (restored from a backup). A change the
// stream's limits aged out (below its first sequence) is only gone from
// the stream; the history keeps it.
func (b *Book) intact(ctx context.Context, st jetstream.Stream, h History, epoch int64) error {
	c, ok := h.latestOf(epoch)
	if !ok || c.Seq == 0 { // the first rules: no message
		return nil
	}
	state := st.CachedInfo().State
	name := st.CachedInfo().Config.Name
	if c.Seq > state.LastSeq {
		return fmt.Errorf("%w: stream %s ends at %d, and its rules were changed at %d of the same creation (restored from a backup?); not reading it: docs/SEMANTICS.md, \"The stream carries its rules\"", ErrRolledBack, name, state.LastSeq, c.Seq)
	}
	if c.Seq < state.FirstSeq {
		return nil
	}
	msg, err := st.GetMsg(ctx, c.Seq)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil // deleted: the history keeps it
	}
	if err != nil {
		return fmt.Errorf("rules: stream %s: %w", name, err)
	}
	if msg.Subject != Subject(name) {
		return fmt.Errorf("%w: stream %s holds a %s message at %d, where its rules were changed (restored from a backup?); not reading it: docs/SEMANTICS.md, \"The stream carries its rules\"", ErrRolledBack, name, msg.Subject, c.Seq)
	}
	return nil
}

// publish writes c into stream as its next rules message, if the last
// rules message the stream holds is at last (0: none).
func (b *Book) publish(ctx context.Context, name string, epoch int64, last uint64, c Change) (Change, error) {
	body, err := c.body()
	if err != nil {
		return Change{}, err
	}
	msg := nats.NewMsg(Subject(name))
	msg.Data = body
	ack, err := b.js.PublishMsg(ctx, msg, jetstream.WithExpectStream(name), jetstream.WithExpectLastSequencePerSubject(last))
	if err != nil {
		return Change{}, fmt.Errorf("rules: record in stream %s: %w", name, err)
	}
	c.Epoch, c.Seq = epoch, ack.Sequence
	return c, nil
}

// isWrongLast says whether err is a publish refused by its compare-and-set.
func isWrongLast(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence
}

// load reads stream's history and its revision (0: none).
func (b *Book) load(ctx context.Context, name string) (History, uint64, error) {
	e, err := b.kv.Get(ctx, historyKey(name))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, 0, nil
	}
	if err != nil {
		return nil, 0, fmt.Errorf("rules: history of %s: %w", name, err)
	}
	var h History
	if err := json.Unmarshal(e.Value(), &h); err != nil {
		return nil, 0, fmt.Errorf("rules: history of %s: %w", name, err)
	}
	return h, e.Revision(), nil
}

// keep merges h into stream's history in the bucket, by compare-and-set:
// a change is never dropped, since every writer adds to what it reads.
func (b *Book) keep(ctx context.Context, name string, h History) error {
	for range 5 {
		stored, rev, err := b.load(ctx, name)
		if err != nil {
			return err
		}
		merged := stored
		for _, c := range h {
			merged = merged.With(c)
		}
		if len(merged) == len(stored) {
			return nil
		}
		v, err := json.Marshal(merged)
		if err != nil {
			return err
		}
		if rev == 0 {
			_, err = b.kv.Create(ctx, historyKey(name), v)
		} else {
			_, err = b.kv.Update(ctx, historyKey(name), v, rev)
		}
		var apiErr *jetstream.APIError
		if errors.Is(err, jetstream.ErrKeyExists) || errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence {
			continue
		}
		if err != nil {
			return fmt.Errorf("rules: keep the history of %s: %w", name, err)
		}
		return nil
	}
	return fmt.Errorf("rules: keep the history of %s: changed under every try", name)
}

// Who names the operator or process that records a change: user@host.
func Who() string {
	host, _ := os.Hostname()
	name := "unknown"
	if u, err := user.Current(); err == nil {
		name = u.Username
	}
	return name + "@" + host
}

// Claimed returns the name of a stream that takes subject and that a
// durable fleet reads (its rules are recorded in the bucket), or "" when
// none does. A core-mode sidecar beside such a fleet would count every
// mention a second time, so it does not run.
func Claimed(ctx context.Context, js jetstream.JetStream, bucket, subject string) (string, error) {
	name, err := js.StreamNameBySubject(ctx, subject)
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound), errors.Is(err, jetstream.ErrJetStreamNotEnabled), errors.Is(err, jetstream.ErrJetStreamNotEnabledForAccount):
		return "", nil
	case err != nil:
		return "", err
	}
	kv, err := js.KeyValue(ctx, bucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	h, _, err := NewBook(js, kv).load(ctx, name)
	if err != nil || len(h) == 0 {
		return "", err
	}
	return name, nil
}
