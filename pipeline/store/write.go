package store

import (
	"crypto/rand"
	"encoding/base32"
	"errors"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/hotcount/hotcount/schema"
)

// Exactly-once increments. ADD is not idempotent: an UpdateItem that
// DynamoDB applied but whose answer was lost (a 500, a reset, a timeout)
// would count twice if simply sent again. So every increment carries an
// identity, its writer and a sequence number, and leaves a mark on the shard
// item, the attribute w_<writer> = <seq>. The write is conditional:
//
//	(attribute_not_exists(w_W) AND (attribute_not_exists(wfloor) OR wfloor < :seq))
//	OR w_W < :seq
//
// A retry is the same write (same item, delta, writer and seq): if an
// earlier attempt applied it, the mark is there and the condition fails,
// which the store reads as "already applied". Three rules keep that sound:
//
//   - A writer has at most one unresolved write per item, and sends no newer
//     seq to an item while an older write of its own there is unresolved
//     (the flusher holds the topic back), so a mark >= seq means applied.
//   - Sequences grow strictly per writer and follow the clock
//     (microseconds), so marks can be aged.
//   - Marks are bounded: any writer that sees, in the item it just wrote,
//     more than MaxMarks marks, removes the oldest of them that are older
//     than MarkMinAge in a conditional trim and raises wfloor to the
//     largest seq removed. A write whose mark was trimmed is still refused
//     (its seq <= wfloor): trimming never turns an applied write into one
//     that applies again. Marks are never trimmed by age alone: an item
//     with few writers keeps them all, so a write in doubt through an
//     outage of any length still settles.
//
// The item stays one write unit (under 1 KB): MaxMarks marks of about 20
// bytes each. What trimming can still cost, and when, is in docs/SEMANTICS.md.
const (
	// AttrFloor is the largest seq of a trimmed mark: a write at or below
	// it whose own mark is gone is refused.
	AttrFloor = "wfloor"
	// MarkPrefix starts a writer's mark attribute, w_<writer id>.
	MarkPrefix = "w_"
	// MaxMarks is how many marks an item keeps before the oldest, once
	// older than MarkMinAge, are trimmed.
	MaxMarks = 24
	// MarkMinAge protects young marks from trimming by count: a writer
	// that still has a write in doubt on the item (a retry pending, or a
	// quarantine replay cut off) has a mark at most this old.
	MarkMinAge = 2 * time.Minute
)

// ErrAmbiguous marks a write whose outcome is unknown: it was sent and no
// answer says whether it was applied (a reset, a timeout, a 5xx). Send the
// same Write again, with Retry set, until it resolves; never fold its delta
// into another write.
var ErrAmbiguous = errors.New("store: write outcome unknown")

// ErrUnresolvable marks a retried write refused because its seq is at or
// below the item's floor while its mark is gone: it stayed in doubt for
// longer than MarkMinAge while more than MaxMarks other writers wrote the
// item and trimmed the older marks. Whether
// it was applied can no longer be told; the store counts it as applied
// (hotcount_store_resolved_total{outcome="unresolvable"}) rather than risk
// counting it twice.
var ErrUnresolvable = errors.New("store: write outcome can no longer be told")

// Write is one idempotent increment: Delta added to one shard of Counter,
// identified by Writer and Seq, or by its Span.
type Write struct {
	// Counter is what it counts in: a topic's total or one of its time
	// buckets.
	Counter schema.Counter
	Shard   int
	Delta   int64
	Writer  string // a writer id (NewWriterID)
	Seq     int64  // from the writer's Sequencer: strictly increasing
	// Retry says an earlier attempt may have been applied (it ended in
	// ErrAmbiguous). It changes nothing in the request, only how its
	// outcome is read and counted.
	Retry bool
	// Replay says another process may have applied it (a quarantine
	// replay under this identity, cut off): a refusal by the mark then means applied,
	// as for Retry, but it was never in doubt here and is not counted in
	// the doubt metrics.
	Replay bool
	// Span, when set, makes the write idempotent by the stream positions
	// it covers (position.go) rather than by Writer and Seq: it applies
	// only past the position the item records for Span.Stream, and
	// leaves no mark. nil: the marks.
	Span *Span
}

// Key is the write's item key: a shard of its counter (Counter.Key).
func (w Write) Key() string { return w.Counter.Key(w.Shard) }

// NewWriterID returns a fresh random writer id: 8 base32 characters (40
// bits), unique for every process that ever writes. Ids are never reused,
// so a dead writer's marks can only age out, and a write refused under
// its id can be replayed with no live process competing.
func NewWriterID() string {
	var b [5]byte
	rand.Read(b[:]) //nolint:errcheck // crypto/rand.Read never fails (Go 1.24+)
	return strings.ToLower(base32.StdEncoding.EncodeToString(b[:]))
}

// Sequencer hands out a writer's sequence numbers: microseconds since the
// Unix epoch, strictly increasing even when the clock stalls or steps back.
// It is safe for concurrent use.
type Sequencer struct {
	now  func() time.Time
	last atomic.Int64
}

// NewSequencer returns a sequencer on clock now.
func NewSequencer(now func() time.Time) *Sequencer { return &Sequencer{now: now} }

// Next returns the next sequence number.
func (s *Sequencer) Next() int64 {
	for {
		last := s.last.Load()
		n := max(s.now().UnixMicro(), last+1)
		if s.last.CompareAndSwap(last, n) {
			return n
		}
	}
}

// mark is one writer's mark on an item.
type mark struct {
	writer string
	seq    int64
}

// toTrim picks the marks to remove from an item at now: past MaxMarks, the
// oldest of those older than MarkMinAge. It returns them and the floor they
// raise the item to (0 when none).
func toTrim(marks []mark, now time.Time) (trim []mark, floor int64) {
	over := len(marks) - MaxMarks
	if over <= 0 {
		return nil, 0
	}
	slices.SortFunc(marks, func(a, b mark) int { return int(sign(a.seq - b.seq)) })
	young := now.Add(-MarkMinAge).UnixMicro()
	for i, m := range marks {
		if i < over && m.seq < young {
			trim = append(trim, m)
			floor = max(floor, m.seq)
		}
	}
	return trim, floor
}

func sign(x int64) int64 {
	switch {
	case x < 0:
		return -1
	case x > 0:
		return 1
	}
	return 0
}

// Raise makes every later seq greater than v: a writer whose clock is
// behind an item's floor (FloorError) catches up with it.
func (s *Sequencer) Raise(v int64) {
	for {
		last := s.last.Load()
		if last >= v || s.last.CompareAndSwap(last, v) {
			return
		}
	}
}
