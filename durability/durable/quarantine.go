package durable

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/hotcount/hotcount/pipeline/store"
	"github.com/hotcount/hotcount/schema"
)

// The quarantine of the position engine. A counter whose writes the store
// refuses for good (store.Denied: an IAM condition on its keys, an
// overflow) for Config.QuarantineAfter is held: its mentions move from the
// window into its stream's checkpoint record (record.held), in the same
// compare-and-set that moves the checkpoint past them, so that they hold
// back neither the checkpoint nor the stream's retention, and no reader
// that starts at that checkpoint can miss them: it reads the held
// counters with it and sends their later mentions to the record too.
// Every replayInterval a flush writes each held entry by its positions,
// like any other write (a lost answer, another reader's write of the same
// mentions: the item's condition settles both), and takes it out of the
// record once the store has it. The argument is in docs/SEMANTICS.md
// ("Writes the store refuses").

// maxHeld bounds the held counters of one stream: the record is one
// key-value entry, at most about 700 KB at the bound (a 256-byte topic
// twice and a reason cut to maxReason each), under NATS's default
// 1 MB payload. Past it a refused counter stays in the window and holds
// the checkpoint, as with no quarantine.
const (
	maxHeld   = 1000
	maxReason = 120
)

// brief is a refusal's reason cut to its last maxReason bytes, where an
// AWS error says what it is ("api error AccessDeniedException: ...").
func brief(reason string) string {
	if len(reason) <= maxReason {
		return reason
	}
	return "..." + strings.ToValidUTF8(reason[len(reason)-maxReason+3:], "")
}

// replayInterval is how often the held counters are tried again.
const replayInterval = 10 * time.Second

// heldSet is the counters this process knows to be held: their mentions
// go to the record, not to the store. The readers add to it as they
// start (the record they start from), the flush as it holds and releases.
type heldSet struct {
	mu   sync.Mutex
	keys map[key]bool
	per  map[string]int // by stream name: what Engine.Held reports
	// gauge is how many (hotcount_durable_held_counters), most how many in
	// the fullest stream's record (…_fullest_stream), against maxHeld.
	gauge, most prometheus.Gauge
}

func (h *heldSet) has(k key) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.keys[k]
}

func (h *heldSet) set(k key, on bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	switch {
	case on && !h.keys[k]:
		h.keys[k] = true
		h.per[k.s.name]++
	case !on && h.keys[k]:
		delete(h.keys, k)
		if h.per[k.s.name]--; h.per[k.s.name] == 0 {
			delete(h.per, k.s.name)
		}
	}
	most := 0
	for _, n := range h.per {
		most = max(most, n)
	}
	h.gauge.Set(float64(len(h.keys)))
	h.most.Set(float64(most))
}

// Held is, by stream, how many counters the quarantine holds now in the
// checkpoint records of the streams this sidecar reads (none: empty), and
// the most one record holds: past it a refused counter holds back its
// stream's checkpoint. For /healthz's body.
func (e *Engine) Held() (perStream map[string]int, limit int) {
	e.held.mu.Lock()
	defer e.held.mu.Unlock()
	return maps.Clone(e.held.per), maxHeld
}

// streams are the streams with held counters.
func (h *heldSet) streams() []stream {
	h.mu.Lock()
	defer h.mu.Unlock()
	seen := make(map[stream]bool)
	var out []stream
	for k := range h.keys {
		if !seen[k.s] {
			seen[k.s] = true
			out = append(out, k.s)
		}
	}
	return out
}

// adopt marks the counters r holds for s: a reader starting from r sends
// their mentions to the record.
func (e *Engine) adopt(s stream, r record) {
	if r.Epoch != s.epoch {
		return
	}
	for _, h := range r.held {
		e.held.set(key{s, h.counter()}, true)
	}
}

// replays are the held entries to try again this flush: those of every
// stream with held counters, every replayInterval.
func (e *Engine) replays(ctx context.Context) []job {
	if e.now().Sub(e.replayed) < replayInterval {
		return nil
	}
	e.replayed = e.now()
	var jobs []job
	for _, s := range e.held.streams() {
		r, _, err := e.ckpt.load(ctx, s.name)
		if err != nil {
			e.sampled.Warn("held counters not read; tried again later", zap.String("stream", s.name), zap.Error(err))
			continue
		}
		if r.Epoch != s.epoch {
			continue
		}
		for _, h := range r.held {
			held := h
			jobs = append(jobs, job{k: key{s, h.counter()}, e: h.entry(), replay: &held})
		}
	}
	return jobs
}

// refused notes a failed write of k and says whether to hold it: its
// writes have been refused for good for QuarantineAfter.
func (e *Engine) refused(k key, err error) bool {
	if e.cfg.QuarantineAfter <= 0 || !store.Denied(err) {
		delete(e.denied, k)
		return false
	}
	since, ok := e.denied[k]
	if !ok {
		e.denied[k] = e.now()
		return false
	}
	return e.now().Sub(since) >= e.cfg.QuarantineAfter
}

// changes is what one flush changes in one stream's record.
type changes struct {
	hold     map[key]*entry               // entries to hold, with their refusal
	reasons  map[key]string               // why each was refused
	released map[schema.Counter]heldEntry // held entries the store now has, as they were sent
}

// apply changes r: the held entries the store took go (unless another
// reader held more of the counter since: that stays, and its next replay
// recounts it past the item's position), the entries to hold join theirs.
// It reports an entry it could not hold (the record full, an overflow):
// that entry goes back to the window.
func (e *Engine) apply(ctx context.Context, r *record, c changes) (kept map[key]*entry) {
	if r.held == nil {
		r.held = make(map[string]heldEntry)
	}
	for counter, sent := range c.released {
		if cur, ok := r.held[counter.Name()]; ok && cur.First == sent.First && cur.Last == sent.Last && cur.Delta == sent.Delta {
			delete(r.held, counter.Name())
		}
	}
	kept = make(map[key]*entry)
	for k, ent := range c.hold {
		name := k.c.Name()
		cur, ok := r.held[name]
		if !ok && len(r.held) >= maxHeld {
			kept[k] = ent
			continue
		}
		if !ok {
			r.held[name] = heldEntry{Topic: k.c.Topic, Kind: k.c.Kind, Index: k.c.Index, Delta: ent.delta, First: ent.first, Last: ent.last,
				Reason: brief(c.reasons[k]), Since: e.now().UTC()}
			continue
		}
		next, err := e.join(ctx, k, cur, *ent)
		if err != nil {
			e.sampled.Warn("a refused write not held; it stays in the window", zap.String("topic", k.c.Topic), zap.Error(err))
			kept[k] = ent
			continue
		}
		r.held[name] = next
	}
	return kept
}

// join adds ent, every mention of a counter at sequences ent.first..last,
// to cur, every one at cur.First..Last: positions decide, as at an item.
// Mentions of the counter between two spans that neither holds are in
// the store already (a reader that wrote them directly), where the
// replay's condition finds them.
func (e *Engine) join(ctx context.Context, k key, cur heldEntry, ent entry) (heldEntry, error) {
	switch {
	case ent.first >= cur.First && ent.last <= cur.Last: // held already
		return cur, nil
	case ent.first <= cur.First && ent.last >= cur.Last: // holds cur and more
		cur.Delta, cur.First, cur.Last = ent.delta, ent.first, ent.last
		return cur, nil
	case ent.first > cur.Last || ent.last < cur.First: // apart
		sum, saturated := schema.SatAdd(cur.Delta, ent.delta)
		if saturated {
			return cur, store.ErrOverflow
		}
		cur.Delta, cur.First, cur.Last = sum, min(cur.First, ent.first), max(cur.Last, ent.last)
		return cur, nil
	}
	// Overlapping at one end: the other end's part is counted again.
	from, to, base := cur.Last+1, ent.last, cur.Delta
	if ent.first < cur.First {
		from, to, base = ent.last+1, cur.Last, ent.delta
	}
	rest, err := e.recount(ctx, k, from, to)
	if err != nil {
		return cur, err
	}
	sum, saturated := schema.SatAdd(base, rest.delta)
	if saturated {
		return cur, store.ErrOverflow
	}
	cur.Delta, cur.First, cur.Last = sum, min(cur.First, ent.first), max(cur.Last, ent.last)
	return cur, nil
}

// Held is one counter held in a stream's checkpoint record, for
// `hotcount quarantine list`.
type Held struct {
	Stream  string    `json:"stream"`
	Counter string    `json:"counter"` // schema.Counter.Name
	Topic   string    `json:"topic"`
	Delta   int64     `json:"delta"`
	First   uint64    `json:"first"`
	Last    uint64    `json:"last"`
	Reason  string    `json:"reason"`
	Since   time.Time `json:"since"`
}

// HeldIn lists the counters held in the checkpoint records of streams
// (bucket "": the default), by stream.
func HeldIn(ctx context.Context, js jetstream.JetStream, bucket string, streams []string) ([]Held, error) {
	var out []Held
	err := records(ctx, js, bucket, streams, func(name string, r record) {
		for _, h := range slices.SortedFunc(maps.Values(r.held), func(a, b heldEntry) int { return a.Since.Compare(b.Since) }) {
			out = append(out, Held{Stream: name, Counter: h.counter().Name(), Topic: h.Topic, Delta: h.Delta,
				First: h.First, Last: h.Last, Reason: h.Reason, Since: h.Since})
		}
	})
	return out, err
}

// Checkpoint is a stream's checkpoint record as `hotcount stream status`
// shows it: its epoch and sequence (0, 0: none) and its held counters.
type Checkpoint struct {
	Epoch int64  `json:"epoch"`
	Seq   uint64 `json:"sequence"`
	Held  int    `json:"held"`
}

// CheckpointsOf reads the checkpoint records of streams (bucket "": the
// default).
func CheckpointsOf(ctx context.Context, js jetstream.JetStream, bucket string, streams []string) (map[string]Checkpoint, error) {
	out := make(map[string]Checkpoint, len(streams))
	err := records(ctx, js, bucket, streams, func(name string, r record) {
		out[name] = Checkpoint{Epoch: r.Epoch, Seq: r.Seq, Held: len(r.held)}
	})
	return out, err
}

// records calls each with the record of every stream in streams that has
// one; a bucket not there yet holds none.
func records(ctx context.Context, js jetstream.JetStream, bucket string, streams []string, each func(string, record)) error {
	if bucket == "" {
		bucket = DefaultCheckpointBucket
	}
	kv, err := js.KeyValue(ctx, bucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return nil // no engine has run
	}
	if err != nil {
		return fmt.Errorf("durable: checkpoint bucket %s: %w", bucket, err)
	}
	c := &checkpoints{kv: kv}
	for _, name := range streams {
		r, rev, err := c.load(ctx, name)
		if err != nil {
			return err
		}
		if rev > 0 {
			each(name, r)
		}
	}
	return nil
}

// Checkpoints reads the streams' checkpoint records for `hotcount audit`
// (audit.Checkpoints).
type Checkpoints struct {
	js     jetstream.JetStream
	bucket string
}

// NewCheckpoints reads the records in bucket ("": the default) through js.
func NewCheckpoints(js jetstream.JetStream, bucket string) *Checkpoints {
	return &Checkpoints{js: js, bucket: bucket}
}

// Checkpoint is stream's checkpoint, the sequence at and below which
// every mention is in the items or held, and the counters held, if its
// record is of the stream created at created; a record of an earlier
// stream of the same name says nothing of this one: 0.
func (c *Checkpoints) Checkpoint(ctx context.Context, stream string, created time.Time) (seq uint64, held []schema.Counter, err error) {
	err = records(ctx, c.js, c.bucket, []string{stream}, func(_ string, r record) {
		if r.Epoch != created.UnixMicro() { // as epochOf
			return
		}
		seq = r.Seq
		for _, h := range r.held {
			held = append(held, h.counter())
		}
	})
	return seq, held, err
}
