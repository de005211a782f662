package durable

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/hotcount/hotcount/durability/rules"
	"github.com/hotcount/hotcount/pipeline/store"
	"github.com/hotcount/hotcount/schema"
)

// DefaultCheckpointBucket is the JetStream key-value bucket of the
// partitions' checkpoints.
const DefaultCheckpointBucket = "hotcount_checkpoints"

// checkpoints keeps, per partition stream, its record: the sequence
// below which every mention is in the store or held in the record (the
// quarantine: writes the store refused for good), and those held entries.
// A reader that takes a partition over starts after the sequence and
// sends its held counters' mentions to the record too. The sequence is a
// hint for speed, not the truth about what is counted (the items'
// positions are): one too low costs a re-read that the items' conditions
// refuse, and it only ever moves forward, so one claimed by a sidecar
// that froze and woke up cannot move it back. Sequence and held entries
// change together, by compare-and-set on one key: a reader that sees a
// sequence sees every entry held below it.
type checkpoints struct {
	kv jetstream.KeyValue
}

// record is one stream's checkpoint.
type record struct {
	store.Position
	// held are the quarantined counters of the stream, by counter name:
	// each holds every mention of its counter at sequences first..last.
	held map[string]heldEntry
	// Gen is the record's generation: each rewind (Rewind) raises it, and
	// a reader that began under an older one never moves the record nor
	// writes what it read (the fence). Table, set by a rewind, is the
	// table the record is for: a reader of another table starts from the
	// stream's first message and never moves it. "": the fleet's table
	// (a record no rewind made).
	Gen   uint64
	Table string
}

// meta is a record's second line once a rewind has made it: its
// generation, its table and its held counters. The previous release
// cannot read it, and so cannot move a rewound checkpoint forward.
type meta struct {
	V     int                  `json:"v"`
	Gen   uint64               `json:"gen"`
	Table string               `json:"table"`
	Held  map[string]heldEntry `json:"held,omitempty"`
}

// heldEntry is a counter's mentions that the store refused for good
// (store.Denied) for Config.QuarantineAfter: all of them at sequences
// First..Last of the record's stream, kept until a write takes them.
type heldEntry struct {
	Topic  string      `json:"topic"`
	Kind   schema.Kind `json:"kind"`
	Index  int64       `json:"index,omitempty"`
	Delta  int64       `json:"delta"`
	First  uint64      `json:"first"`
	Last   uint64      `json:"last"`
	Reason string      `json:"reason"`
	Since  time.Time   `json:"since"`
}

func (h heldEntry) counter() schema.Counter {
	return schema.Counter{Topic: h.Topic, Kind: h.Kind, Index: h.Index}
}

func (h heldEntry) entry() entry { return entry{delta: h.Delta, first: h.First, last: h.Last} }

// openCheckpoints opens (creating if absent) the bucket. Replicas is the
// bucket's replication in a cluster (1 outside one).
func openCheckpoints(ctx context.Context, js jetstream.JetStream, bucket string, replicas int) (*checkpoints, error) {
	kv, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket:      bucket,
		Description: "hotcount: per partition stream, the sequence below which every mention is in the store or held here",
		History:     1,
		Replicas:    max(replicas, 1),
	})
	if err != nil {
		return nil, fmt.Errorf("durable: checkpoint bucket %s: %w", bucket, err)
	}
	return &checkpoints{kv: kv}, nil
}

// load returns stream's record: zero when it has none.
func (c *checkpoints) load(ctx context.Context, name string) (record, uint64, error) {
	e, err := c.kv.Get(ctx, name)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return record{}, 0, nil
	}
	if err != nil {
		return record{}, 0, fmt.Errorf("durable: checkpoint of %s: %w", name, err)
	}
	r, err := parseRecord(e.Value())
	if err != nil {
		return record{}, 0, fmt.Errorf("durable: checkpoint of %s: %w", name, err)
	}
	return r, e.Revision(), nil
}

// update changes stream's record by change, which returns false to leave
// it as it is. Two sidecars changing it at once are settled by the
// bucket's compare-and-set: the loser reads again and changes that.
func (c *checkpoints) update(ctx context.Context, name string, change func(*record) (bool, error)) error {
	for range 5 {
		cur, rev, err := c.load(ctx, name)
		if err != nil {
			return err
		}
		if ok, err := change(&cur); err != nil || !ok {
			return err
		}
		v, err := formatRecord(cur)
		if err != nil {
			return err
		}
		if rev == 0 {
			_, err = c.kv.Create(ctx, name, v)
		} else {
			_, err = c.kv.Update(ctx, name, v, rev)
		}
		if err == nil || !errors.Is(err, jetstream.ErrKeyExists) && !isWrongSequence(err) {
			return err
		}
	}
	return fmt.Errorf("durable: checkpoint of %s: changed under every try", name)
}

// advance moves stream's checkpoint to p if p is past it (a newer epoch,
// or a higher sequence in the same one).
func (c *checkpoints) advance(ctx context.Context, name string, p store.Position) error {
	return c.update(ctx, name, func(r *record) (bool, error) {
		if !after(p, r.Position) {
			return false, nil
		}
		if p.Epoch != r.Epoch {
			r.held = nil // the stream they were read from is gone
		}
		r.Position = p
		return true, nil
	})
}

// isWrongSequence says whether err is a compare-and-set that lost.
func isWrongSequence(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && (apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
		apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant)
}

// after says whether a is past b: a newer epoch, or the same and a higher
// sequence.
func after(a, b store.Position) bool {
	return a.Epoch > b.Epoch || a.Epoch == b.Epoch && a.Seq > b.Seq
}

// moved says whether checkpoint p is news after prev, the last one stored
// of its stream's name: a later sequence of the same creation, or another
// creation, whichever epoch is larger (a server clock set back can give a
// stream created again the smaller one; which creation is live the server
// says when the record is stored).
func moved(p, prev store.Position) bool {
	return p.Epoch != prev.Epoch || p.Seq > prev.Seq
}

// formatRecord is a record as the bucket keeps it: "<epoch>:<sequence>",
// then, when counters are held, a line of their JSON, or once a rewind
// made it, a line of its meta.
func formatRecord(r record) ([]byte, error) {
	v := []byte(formatPosition(r.Position))
	if r.Gen > 0 || r.Table != "" {
		m, err := json.Marshal(meta{V: 2, Gen: r.Gen, Table: r.Table, Held: r.held})
		if err != nil {
			return nil, err
		}
		return append(append(v, '\n'), m...), nil
	}
	if len(r.held) == 0 {
		return v, nil
	}
	held, err := json.Marshal(r.held)
	if err != nil {
		return nil, err
	}
	return append(append(v, '\n'), held...), nil
}

func parseRecord(v []byte) (record, error) {
	first, rest, _ := bytes.Cut(v, []byte{'\n'})
	p, err := parsePosition(string(first))
	if err != nil {
		return record{}, err
	}
	r := record{Position: p}
	if bytes.HasPrefix(rest, []byte(`{"v":2`)) {
		var m meta
		if err := json.Unmarshal(rest, &m); err != nil {
			return record{}, fmt.Errorf("record: %w", err)
		}
		r.held, r.Gen, r.Table = m.Held, m.Gen, m.Table
		return r, nil
	}
	if len(rest) > 0 {
		if err := json.Unmarshal(rest, &r.held); err != nil {
			return record{}, fmt.Errorf("held counters: %w", err)
		}
	}
	return r, nil
}

func formatPosition(p store.Position) string {
	return strconv.FormatInt(p.Epoch, 10) + ":" + strconv.FormatUint(p.Seq, 10)
}

func parsePosition(s string) (store.Position, error) {
	e, q, ok := strings.Cut(s, ":")
	epoch, err1 := strconv.ParseInt(e, 10, 64)
	seq, err2 := strconv.ParseUint(q, 10, 64)
	if !ok || err1 != nil || err2 != nil {
		return store.Position{}, fmt.Errorf("%q is not <epoch>:<sequence>", s)
	}
	return store.Position{Epoch: epoch, Seq: seq}, nil
}

// Advance gives stream a checkpoint at seq in its current epoch, unless
// it has one as far already: `hotcount stream create` says so of the
// probes it stored and deleted, which are no mentions lost. bucket is the
// checkpoints' bucket ("": the default), created on the stream's replicas
// if absent.
func Advance(ctx context.Context, js jetstream.JetStream, stream, bucket string, seq uint64) error {
	st, err := js.Stream(ctx, stream)
	if err != nil {
		return fmt.Errorf("durable: advance %s: %w", stream, err)
	}
	info := st.CachedInfo()
	if bucket == "" {
		bucket = DefaultCheckpointBucket
	}
	c, err := openCheckpoints(ctx, js, bucket, info.Config.Replicas)
	if err != nil {
		return err
	}
	return c.advance(ctx, stream, store.Position{Epoch: epochOf(info), Seq: seq})
}

// OpenRules returns the book of the streams' rules (package rules), whose
// histories are kept in the checkpoint bucket ("": the default) as it is;
// absent, it is created on as many replicas as stream (the first stream
// of the mode) has, as the sidecars create it.
func OpenRules(ctx context.Context, js jetstream.JetStream, bucket, stream string) (*rules.Book, error) {
	if bucket == "" {
		bucket = DefaultCheckpointBucket
	}
	kv, err := js.KeyValue(ctx, bucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		replicas := 1
		if st, err := js.Stream(ctx, stream); err == nil {
			replicas = st.CachedInfo().Config.Replicas
		}
		c, err := openCheckpoints(ctx, js, bucket, replicas)
		if err != nil {
			return nil, err
		}
		kv = c.kv
	} else if err != nil {
		return nil, fmt.Errorf("durable: checkpoint bucket %s: %w", bucket, err)
	}
	return rules.NewBook(js, kv), nil
}

// ReadRules returns stream's rules history, changing nothing: none when
// the checkpoint bucket ("": the default) is not there and the stream
// holds no rules.
func ReadRules(ctx context.Context, js jetstream.JetStream, bucket, stream string) (rules.History, error) {
	if bucket == "" {
		bucket = DefaultCheckpointBucket
	}
	kv, err := js.KeyValue(ctx, bucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return rules.NewBook(js, kv).History(ctx, stream)
}

// raise notes generation g of name's record and returns the highest seen.
// A higher one than known restarts every reading (fences): a rewind.
func (e *Engine) raise(name string, g uint64) uint64 {
	e.genMu.Lock()
	defer e.genMu.Unlock()
	old, known := e.gens[name]
	if !known {
		e.gens[name] = g
		return g // the first look: no reading began under an older one
	}
	if g > old {
		e.gens[name] = g
		e.fences.Add(1)
		e.log.Warn("the stream was rewound: reading it again from its checkpoint; what was read before is not written",
			zap.String("stream", name), zap.Uint64("generation", g))
	}
	return e.gens[name]
}

// stale says whether s was read under an older generation of its record
// than the highest seen: its spans assumed a checkpoint a rewind has
// since moved back, and are never written.
func (e *Engine) stale(s stream) bool {
	e.genMu.Lock()
	defer e.genMu.Unlock()
	return s.gen < e.gens[s.name]
}

// Rewound is what Rewind did to one stream's record.
type Rewound struct {
	// From is the checkpoint before (0: none in the stream's creation),
	// To the sequence reading starts at now.
	From, To uint64
	// Gen is the record's new generation, Table the table it is for.
	Gen   uint64
	Table string
	// Kept and Dropped count the held counters: those wholly before To
	// stay held; the others are read again (and held again if the store
	// still refuses them).
	Kept, Dropped int
}

// Rewind moves the checkpoint of stream's current creation back so that
// its readers read again from sequence to on, into table, with the fleet
// running: the record's generation goes up, and a reader that began under
// an older one (running, frozen, waking) never moves the record again nor
// writes what it had read; it reads again from the record. The items'
// positions refuse what they already hold, so a table restored from a
// backup, or a new one, comes out exact from what the stream retains.
// With dryRun it changes nothing and says what it would do.
func Rewind(ctx context.Context, js jetstream.JetStream, bucket, stream string, to uint64, table string, dryRun bool) (Rewound, error) {
	st, err := js.Stream(ctx, stream)
	if err != nil {
		return Rewound{}, fmt.Errorf("durable: rewind %s: %w", stream, err)
	}
	info := st.CachedInfo()
	if bucket == "" {
		bucket = DefaultCheckpointBucket
	}
	book, err := OpenRules(ctx, js, bucket, stream) // the bucket as it is, or made as the sidecars make it
	if err != nil {
		return Rewound{}, err
	}
	c := &checkpoints{kv: book.KV()}
	epoch := epochOf(info)
	fleetTable := "" // the table a record no rewind made is for: the rules'
	if latest, ok, err := book.Latest(ctx, stream); err != nil {
		return Rewound{}, err
	} else if ok {
		fleetTable = latest.Rules.Table
	}
	if fleetTable != "" && fleetTable != table {
		return Rewound{}, fmt.Errorf("durable: rewind %s for table %s: the stream's rules name table %s; change them first (hotcount stream rules set --table %s), so that no sidecar of %s takes the rewound checkpoint for its own", stream, table, fleetTable, table, fleetTable)
	}
	var out Rewound
	change := func(r *record) (bool, error) {
		from := max(to, 1)
		out = Rewound{Table: table, Gen: r.Gen + 1}
		if r.Epoch == epoch {
			out.From = r.Seq
		} else {
			r.held = nil // another creation's
		}
		recordTable := r.Table
		if recordTable == "" {
			recordTable = fleetTable
		}
		if r.Epoch == epoch && recordTable == table && from-1 > r.Seq {
			// Forward, for the table the checkpoint is for: the readers'
			// windows would be dropped and what lies between never read.
			return false, fmt.Errorf("durable: rewind %s: the checkpoint for table %s is at %d, before sequence %d: a rewind only moves back", stream, table, r.Seq, from)
		}
		// A held counter whose mentions straddle the new start would be
		// neither held nor read again: start at its first instead, until
		// none does.
		// (One whose first the stream no longer holds stays held: what the
		// reading sends of it joins the record's.)
		firstHeld := info.State.FirstSeq
		for lowered := true; lowered; {
			lowered = false
			for _, h := range r.held {
				if h.First < from && h.Last >= from && h.First >= firstHeld {
					from, lowered = h.First, true
				}
			}
		}
		out.To = from
		held := make(map[string]heldEntry)
		for name, h := range r.held {
			if h.Last < from || h.First < firstHeld {
				held[name] = h
				out.Kept++
			} else {
				out.Dropped++
			}
		}
		if dryRun {
			return false, nil
		}
		*r = record{Position: store.Position{Epoch: epoch, Seq: from - 1}, held: held, Gen: out.Gen, Table: table}
		return true, nil
	}
	if err := c.update(ctx, stream, change); err != nil {
		return Rewound{}, err
	}
	return out, nil
}

// fence reads, before a flush writes, the generation of the record of
// each stream it has something to write of: a rewind since its reading began makes
// what it read stale (never written; plan drops it) and restarts the
// readings. It returns the streams whose record it could not read: their
// entries wait for the next flush.
func (e *Engine) fence(ctx context.Context, counters map[key]*entry) map[string]bool {
	blocked := make(map[string]bool)
	names := make(map[string]bool)
	for k := range counters {
		names[k.s.name] = true
	}
	for k := range e.doubt {
		names[k.s.name] = true
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	for name := range names {
		r, _, err := e.ckpt.load(ctx, name)
		if err != nil {
			e.sampled.Warn("the checkpoint's generation not read; the stream's writes wait for the next flush", zap.String("stream", name), zap.Error(err))
			blocked[name] = true
			continue
		}
		e.raise(name, r.Gen)
	}
	return blocked
}

// A high-water mark is the last sequence of a stream's creation that any
// write may have recorded on an item, and the publication (Unix ns) of
// its message, stored (key "hw.<stream>") before any item passes it. A
// stream restored from a backup keeps its creation time and writes its
// sequences again: the message at the mark is then another, or none,
// and the items' positions would refuse new mentions as counted. A
// reader that finds so refuses the stream (sameMessages).
type highWater struct {
	store.Position
	At int64
}

func hwKey(name string) string { return "hw." + name }

func (c *checkpoints) highWater(ctx context.Context, name string) (highWater, uint64, error) {
	e, err := c.kv.Get(ctx, hwKey(name))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return highWater{}, 0, nil
	}
	if err != nil {
		return highWater{}, 0, err
	}
	v := string(e.Value())
	i := strings.LastIndexByte(v, ':')
	p, err1 := parsePosition(v[:max(i, 0)])
	at, err2 := strconv.ParseInt(v[i+1:], 10, 64)
	if i < 0 || err1 != nil || err2 != nil {
		return highWater{}, 0, fmt.Errorf("durable: high-water mark of %s: %q", name, v)
	}
	return highWater{Position: p, At: at}, e.Revision(), nil
}

// raiseHighWater stores h as name's mark unless the stored one is as far
// (the same creation, a sequence at or past h's), by compare-and-set.
func (c *checkpoints) raiseHighWater(ctx context.Context, name string, h highWater) error {
	for range 5 {
		cur, rev, err := c.highWater(ctx, name)
		if err != nil {
			return err
		}
		if cur.Epoch > h.Epoch || cur.Epoch == h.Epoch && cur.Seq >= h.Seq {
			return nil // as far, or a newer creation's
		}
		v := []byte(formatPosition(h.Position) + ":" + strconv.FormatInt(h.At, 10))
		if rev == 0 {
			_, err = c.kv.Create(ctx, hwKey(name), v)
		} else {
			_, err = c.kv.Update(ctx, hwKey(name), v, rev)
		}
		if err == nil || !errors.Is(err, jetstream.ErrKeyExists) && !isWrongSequence(err) {
			return err
		}
	}
	return fmt.Errorf("durable: high-water mark of %s: changed under every try", name)
}

// marks stores, before a flush writes, each stream's high-water mark: the
// last sequence it counted, which no write of the flush passes. A stream
// whose mark could not be stored joins blocked: its entries wait for the
// next flush.
func (e *Engine) marks(ctx context.Context, ms map[stream]mark, blocked map[string]bool) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	for s, m := range ms {
		if m.seq == 0 || e.stale(s) || blocked[s.name] {
			continue
		}
		h := highWater{Position: store.Position{Epoch: s.epoch, Seq: m.seq}, At: m.at}
		if prev, ok := e.hw[s.name]; ok && (prev.Epoch > h.Epoch || prev.Epoch == h.Epoch && prev.Seq >= h.Seq) {
			continue // as far, or a newer creation's: this one's stream is gone
		}
		if err := e.ckpt.raiseHighWater(ctx, s.name, h); err != nil {
			e.sampled.Warn("high-water mark not stored; the stream's writes wait for the next flush", zap.String("stream", s.name), zap.Error(err))
			blocked[s.name] = true
			continue
		}
		e.hw[s.name] = h
	}
}

// sameMessages refuses s when its high-water mark's message is not the
// one there now: the stream was restored from a backup (its creation
// time kept) and its sequences written again. Without the check its new
// mentions at sequences the items record would read as counted: lost.
func (e *Engine) sameMessages(ctx context.Context, st jetstream.Stream, s stream, state jetstream.StreamState) error {
	h, _, err := e.ckpt.highWater(ctx, s.name)
	if err != nil || h.Epoch != s.epoch || h.Seq < state.FirstSeq {
		return err // none, another creation's, or aged out with what it marked
	}
	if h.Seq <= state.LastSeq {
		msg, err := st.GetMsg(ctx, h.Seq)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return nil // deleted since: nothing else took its sequence
		}
		if err != nil {
			return err
		}
		if msg.Time.UnixNano() == h.At {
			return nil
		}
	}
	e.metrics.backwards.Inc()
	return fmt.Errorf("stream %s: sequence %d, which the items may record, does not hold the message it held (published %s): the stream was restored from a backup and its sequences written again (it ends at %d). Its new mentions would read as counted; not reading it (docs/SEMANTICS.md, \"Streams: created again, restored, retention\")",
		s.name, h.Seq, time.Unix(0, h.At).UTC().Format(time.RFC3339Nano), state.LastSeq)
}
