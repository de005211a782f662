package flusher

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap/zaptest"

	"github.com/hotcount/hotcount/aggregator"
	"github.com/hotcount/hotcount/journal"
	"github.com/hotcount/hotcount/store"
)

// entries is a journal that records each Record as one entry, those of
// topics in lost unconfirmed, and remembers what was retired.
type entries struct {
	n       int
	lost    map[string]bool
	retired []string
}

func (j *entries) Record(_ context.Context, ws []store.Write, _ map[string][]int64) ([]journal.Recorded, error) {
	j.n++
	r := journal.Recorded{Key: fmt.Sprint("e", j.n)}
	for _, w := range ws {
		r.Counters = append(r.Counters, w.Counter)
		r.Unconfirmed = r.Unconfirmed || j.lost[w.Counter.Topic]
	}
	return []journal.Recorded{r}, nil
}
func (j *entries) Confirm(context.Context, string) (bool, error)               { return true, nil }
func (j *entries) Rewrite(context.Context, string, store.Counter, int64) error { return nil }
func (j *entries) MaybeReplayed(time.Time) bool                                { return false }
func (j *entries) Quarantine(context.Context, string, store.Counter) error     { return nil }
func (j *entries) Settled(_ context.Context, key string) error {
	j.retired = append(j.retired, key)
	return nil
}

func testLedger(t *testing.T, j Journal) *ledger {
	return newLedger(j, store.NewSequencer(time.Now), 0, zaptest.NewLogger(t), NewMetrics(prometheus.NewRegistry()), time.Now)
}

func acks(ms ...aggregator.Message) []int {
	var n []int
	for _, m := range ms {
		n = append(n, m.Msg.(*acker).acks)
	}
	return n
}

// TestAckWrittenHoldsMessagesWithTheirWrite: after the writes, a message is
// acknowledged when every count of its topic is written; one whose topic
// has a count in doubt waits with that write, and one whose topic has a
// count unwritten goes back with it.
func TestAckWrittenHoldsMessagesWithTheirWrite(t *testing.T) {
	l := testLedger(t, nil)
	written, doubted, unwritten := msg("done", 1), msg("foo", 2), msg("bar", 3)
	unsent := map[string]bool{"bar": true} // bar's minute is not written
	doubt := map[store.Counter]store.Write{hourOf("foo"): {Counter: hourOf("foo"), Delta: 1, Seq: 7}}
	back := l.ackWritten([]aggregator.Message{written, doubted, unwritten}, unsent, doubt)
	if fmt.Sprint(acks(written, doubted, unwritten)) != "[1 0 0]" {
		t.Errorf("acks %v, want the written topic's message alone", acks(written, doubted, unwritten))
	}
	if len(back) != 1 || back[0].Topic != "bar" {
		t.Errorf("back to the buffer: %v, want bar's message", back)
	}
	p := l.pending[hourOf("foo")]
	if p == nil || !p.write.Retry || len(p.msgs) != 1 || p.msgs[0].Topic != "foo" {
		t.Fatalf("foo's hour: pending %+v, want a retry holding foo's message", p)
	}
	if w := l.waiting(); !w["foo"] || len(w) != 1 {
		t.Errorf("waiting %v, want foo", w)
	}
}

// TestSettleAcksWhenTheTopicIsClear: a topic's message is acknowledged
// once none of its counts is pending any more, and a journal entry is
// retired once all its writes are in the store.
func TestSettleAcksWhenTheTopicIsClear(t *testing.T) {
	j := &entries{}
	l := testLedger(t, j)
	ws := []store.Write{{Counter: store.TotalOf("foo"), Delta: 1, Seq: 1}, {Counter: minuteOf("foo"), Delta: 1, Seq: 2}}
	m := msg("foo", 9)
	recorded, _ := l.record(context.Background(), ws, []aggregator.Message{m})
	if back := l.ackRecorded([]aggregator.Message{m}, recorded); len(back) != 0 || acks(m)[0] != 1 {
		t.Fatalf("journaled whole: %d back, %d acks; want the message acknowledged", len(back), acks(m)[0])
	}
	m2 := msg("foo", 10) // a later message, held behind foo's pending writes
	l.ackWritten([]aggregator.Message{m2}, nil, map[store.Counter]store.Write{store.TotalOf("foo"): {Counter: store.TotalOf("foo")}})
	l.settle(context.Background(), map[store.Counter]int64{store.TotalOf("foo"): 1})
	if acks(m2)[0] != 0 || len(j.retired) != 0 {
		t.Errorf("foo's minute still pending: m2 acked %d times, %v retired; want neither", acks(m2)[0], j.retired)
	}
	l.settle(context.Background(), map[store.Counter]int64{minuteOf("foo"): 1})
	if acks(m2)[0] != 1 || fmt.Sprint(j.retired) != "[e1]" || l.writes() != 0 {
		t.Errorf("all settled: m2 acked %d times, retired %v, %d pending; want 1, [e1], 0", acks(m2)[0], j.retired, l.writes())
	}
}

// TestUnconfirmedEntryWaits: an entry whose put lost its answer holds its
// messages, unacknowledged, and its writes, unsent, until confirmed; a
// topic the journal did not take goes back with its messages.
func TestUnconfirmedEntryWaits(t *testing.T) {
	l := testLedger(t, &entries{lost: map[string]bool{"foo": true}})
	m, other := msg("foo", 1), msg("bar", 2)
	recorded, _ := l.record(context.Background(), []store.Write{{Counter: store.TotalOf("foo"), Delta: 1}}, []aggregator.Message{m})
	back := l.ackRecorded([]aggregator.Message{m, other}, recorded)
	if acks(m)[0] != 0 || len(back) != 1 || back[0].Topic != "bar" {
		t.Fatalf("unconfirmed: %d acks of foo's message, back %v; want 0 and bar's", acks(m)[0], back)
	}
	for counter := range l.resendable(func() bool { return true }) {
		t.Errorf("%+v sent before its entry is confirmed", counter)
	}
	l.confirm(context.Background())
	if acks(m)[0] != 1 {
		t.Errorf("confirmed: %d acks, want 1", acks(m)[0])
	}
	var sent []store.Counter
	for c := range l.resendable(func() bool { return true }) {
		sent = append(sent, c)
	}
	if len(sent) != 1 || sent[0] != store.TotalOf("foo") {
		t.Errorf("confirmed: resendable %v, want foo's total", sent)
	}
	for counter := range l.resendable(func() bool { return false }) {
		t.Errorf("%+v yielded past the deadline", counter)
	}
}

// TestAtExit: at shutdown, pending writes are reported as in doubt or
// journaled (a bucket's mentions are its total's), and their messages
// are handed back.
func TestAtExit(t *testing.T) {
	l := testLedger(t, nil)
	m := msg("foo", 1)
	l.ackWritten([]aggregator.Message{m}, nil, map[store.Counter]store.Write{store.TotalOf("foo"): {Counter: store.TotalOf("foo"), Delta: 5}, hourOf("foo"): {Counter: hourOf("foo"), Delta: 5}})
	l.pending[store.TotalOf("bar")] = &pending{write: store.Write{Counter: store.TotalOf("bar"), Delta: 3}, entry: "e1"}
	doubt, journaled, naked := l.atExit()
	if doubt != 5 || journaled != 3 || naked != 1 || m.Msg.(*acker).naks != 1 {
		t.Errorf("doubt %d, journaled %d, handed back %d; want 5, 3, 1", doubt, journaled, naked)
	}
}
