package ownwrites

import (
	"context"
	"strconv"
	"testing"
	"time"
)

var noon = time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)

// clock is a time the test sets.
type clock struct{ t time.Time }

func (c *clock) now() time.Time { return c.t }

func newTestView(c *clock, buffered map[string]int64) *View {
	v := New(Config{Keep: time.Minute, Topics: 10}, c.now)
	v.Attach(func(topic string) int64 { return buffered[topic] })
	return v
}

func pendingAt(v *View, topic string, at time.Time) int64 {
	_, p, _ := v.Read(topic, Gather{At: at})
	return p
}

func heldOf(m map[string]int64) func() func(string) int64 {
	return func() func(string) int64 { return func(topic string) int64 { return m[topic] } }
}

// TestViewFollowsAWrite: a mention is counted once by a reader whatever
// its write's state: held by the flush, on its way (for a total gathered
// before it was sent), in doubt between two sends, or landed (added to a
// total gathered before it was sent, and to none gathered after it
// landed).
func TestViewFollowsAWrite(t *testing.T) {
	c := &clock{noon}
	v := newTestView(c, map[string]int64{"golang": 2})
	before, sent := noon, noon.Add(time.Second)
	after := sent.Add(time.Second)
	mark := v.Mark("golang")
	v.Move(heldOf(map[string]int64{"golang": 5}))
	if n := pendingAt(v, "golang", before); n != 7 {
		t.Errorf("held by the flush: %d, want 7", n)
	}
	c.t = sent
	v.Sent("golang")
	if !v.OnItsWay("golang") || pendingAt(v, "golang", before) != 7 || pendingAt(v, "golang", after) != 2 {
		t.Errorf("on its way: %v, %d before, %d after; want true, 7, 2", v.OnItsWay("golang"), pendingAt(v, "golang", before), pendingAt(v, "golang", after))
	}
	if _, _, ok := v.Read("golang", Gather{Mark: mark, Started: before, At: after}); ok {
		t.Error("on its way, for a total gathered after it was sent: ok, want gathered again (it may or may not hold it)")
	}
	v.Answered([]Answer{{Topic: "golang", Delta: 5, Sent: sent, Outcome: InDoubt}})
	if v.OnItsWay("golang") || pendingAt(v, "golang", before) != 7 || pendingAt(v, "golang", after) != 2 {
		t.Errorf("in doubt: %v, %d before, %d after; want false, 7, 2", v.OnItsWay("golang"), pendingAt(v, "golang", before), pendingAt(v, "golang", after))
	}
	v.Move(func() func(string) int64 { return nil }) // the flush ends: the doubt stays
	v.Resent("golang")
	if !v.OnItsWay("golang") {
		t.Error("sent again: not on its way")
	}
	c.t = after.Add(time.Second)
	v.Answered([]Answer{{Topic: "golang", Delta: 5, Outcome: Applied, Retry: true}})
	if v.OnItsWay("golang") || pendingAt(v, "golang", before) != 2 {
		t.Errorf("landed: %v, %d pending; want false, 2", v.OnItsWay("golang"), pendingAt(v, "golang", before))
	}
	early := Gather{Mark: mark, Started: before.Add(-time.Second), At: before}
	if add, _, ok := v.Landed(early); !ok || add != 5 {
		t.Errorf("landed, for a total gathered before it was first sent: %d (ok %v), want 5", add, ok)
	}
	late := Gather{Mark: mark, Started: c.t.Add(time.Second), At: c.t.Add(2 * time.Second)}
	if add, _, ok := v.Landed(late); !ok || add != 0 {
		t.Errorf("landed, for a total gathered after it landed: %d (ok %v), want 0", add, ok)
	}
	racing := Gather{Mark: mark, Started: before, At: after}
	if _, _, ok := v.Landed(racing); ok {
		t.Error("landed during a gather that ended after it was sent: counted, want gathered again")
	}
	if add, _, ok := v.Landed(Gather{Mark: mark, Started: before, At: after, Peer: true}); !ok || add != 0 {
		t.Errorf("landed during another sidecar's total: %d (ok %v), want 0: the total stands", add, ok)
	}
}

// TestViewRefusedWrite: a refused write's delta is the flush's again,
// pending for every reader; a covered one (in the store by another
// writer) leaves the view without a landing.
func TestViewRefusedWrite(t *testing.T) {
	c := &clock{noon}
	v := newTestView(c, nil)
	mark := v.Mark("x")
	v.Move(heldOf(map[string]int64{"x": 3, "y": 4}))
	v.Sent("x")
	v.Sent("y")
	v.Answered([]Answer{{Topic: "x", Delta: 3, Sent: noon, Outcome: Refused}, {Topic: "y", Delta: 4, Sent: noon, Outcome: Covered}})
	if v.OnItsWay("x") || pendingAt(v, "x", noon.Add(time.Hour)) != 3 {
		t.Errorf("refused: %v, pending %d; want false, 3", v.OnItsWay("x"), pendingAt(v, "x", noon.Add(time.Hour)))
	}
	if v.OnItsWay("y") || pendingAt(v, "y", noon.Add(time.Hour)) != 0 {
		t.Errorf("covered: %v, pending %d; want false, 0 (in the store, by another writer)", v.OnItsWay("y"), pendingAt(v, "y", noon.Add(time.Hour)))
	}
	if _, now, _ := v.Landed(Gather{Mark: mark}); now != mark {
		t.Error("a refused write landed")
	}
}

// TestViewCoveredRetry: a write in doubt that the store, sent again,
// finds covered landed at its first send: a total gathered before that
// is raised by it.
func TestViewCoveredRetry(t *testing.T) {
	c := &clock{noon}
	v := newTestView(c, nil)
	g := Gather{Mark: v.Mark("z"), Started: noon, At: noon}
	v.Move(heldOf(map[string]int64{"z": 6}))
	c.t = noon.Add(time.Second)
	v.Sent("z")
	v.Answered([]Answer{{Topic: "z", Delta: 6, Sent: noon.Add(time.Second), Outcome: InDoubt}})
	v.Move(func() func(string) int64 { return nil })
	v.Resent("z")
	c.t = noon.Add(time.Minute)
	v.Answered([]Answer{{Topic: "z", Delta: 6, Outcome: Covered, Retry: true}})
	if add, _, ok := v.Landed(g); !ok || add != 6 {
		t.Errorf("a covered retry, for a total gathered before its first send: %d (ok %v), want 6", add, ok)
	}
	if n := pendingAt(v, "z", noon); n != 0 {
		t.Errorf("a covered retry: pending %d, want 0", n)
	}
}

// TestViewForgetsSafely: a total whose landings the view no longer keeps
// (its topic dropped past Topics, or more landings than it keeps) is
// gathered again, never raised wrong.
func TestViewForgetsSafely(t *testing.T) {
	c := &clock{noon}
	v := New(Config{Keep: time.Minute, Topics: 1}, c.now)
	g := Gather{Mark: v.Mark("a"), Started: noon, At: noon}
	for i := range maxLandings + 1 {
		c.t = noon.Add(time.Duration(i+1) * time.Second)
		v.Answered([]Answer{{Topic: "a", Delta: 1, Sent: c.t, Outcome: Applied}})
	}
	if _, _, ok := v.Landed(g); ok {
		t.Errorf("%d landings since a total: raised, want gathered again (%d kept)", maxLandings+1, maxLandings)
	}
	// b's track goes in a sweep (unmarked for longer than twice Keep) while
	// a total of b is still served: its next landing is not recorded, and
	// the total must be gathered again, not served short of it.
	g = Gather{Mark: v.Mark("b"), Started: c.t, At: c.t}
	c.t = c.t.Add(3 * time.Minute)
	for i := range v.tracks.limit {
		v.Mark("c" + strconv.Itoa(i))
	}
	c.t = c.t.Add(time.Second)
	v.Answered([]Answer{{Topic: "b", Delta: 1, Sent: c.t, Outcome: Applied}})
	if add, _, ok := v.Landed(g); ok {
		t.Errorf("a landing after its topic's track was swept: raised by %d, want gathered again", add)
	}
	if _, _, ok := v.Read("b", g); ok {
		t.Error("Read of a swept track: ok, want gathered again")
	}
}

// TestUntilLandedWakesAtOnce: a reader waiting for a write to land is
// woken by the landing itself, not by its next look (an hour apart
// here); one that stops being on its way without landing is seen at the
// next look.
func TestUntilLandedWakesAtOnce(t *testing.T) {
	v := newTestView(&clock{noon}, nil)
	v.Sent("golang")
	done := make(chan bool)
	go func() { done <- v.untilLanded(context.Background(), "golang", time.Hour) }()
	v.Answered([]Answer{{Topic: "golang", Delta: 1, Sent: noon, Outcome: Applied}})
	if !<-done {
		t.Error("UntilLanded returned false for a write that landed")
	}

	v.Sent("x")
	go func() { done <- v.untilLanded(context.Background(), "x", time.Millisecond) }()
	v.Answered([]Answer{{Topic: "x", Delta: 1, Sent: noon, Outcome: Refused}})
	if !<-done {
		t.Error("UntilLanded returned false for a write that was refused")
	}

	ctx, cancel := context.WithCancel(context.Background())
	v.Sent("y")
	go func() { done <- v.untilLanded(ctx, "y", time.Hour) }()
	cancel()
	if <-done {
		t.Error("UntilLanded returned true for a write still on its way")
	}
}

// TestAnsweredFromBatches: answers sent on a channel all reach the view,
// and AnsweredFrom returns when the channel closes.
func TestAnsweredFromBatches(t *testing.T) {
	v := newTestView(&clock{noon}, nil)
	ch := make(chan Answer, 8)
	done := make(chan struct{})
	go func() { v.AnsweredFrom(ch); close(done) }()
	for i := range 100 {
		topic := string(rune('a' + i%26))
		v.Sent(topic)
		ch <- Answer{Topic: topic, Delta: 1, Sent: noon, Outcome: InDoubt}
	}
	close(ch)
	<-done
	for i := range 26 {
		if _, ok := v.doubt[string(rune('a'+i))]; !ok {
			t.Errorf("topic %c's answer did not reach the view", 'a'+i)
		}
	}
}

// TestFloor: a total served is never followed by a lower one, plain and
// with pending mentions apart.
func TestFloor(t *testing.T) {
	v := newTestView(&clock{noon}, nil)
	if got := v.Floor("a", 5, false); got != 5 {
		t.Errorf("first: %d, want 5", got)
	}
	if got := v.Floor("a", 3, false); got != 5 {
		t.Errorf("lower: %d, want 5", got)
	}
	if got := v.Floor("a", 4, true); got != 4 {
		t.Errorf("with pending, apart: %d, want 4", got)
	}
}

// TestLandedKeepsWhatARaceCannotHold: a total a landing raced must be
// gathered again (not ok), and what it is told to add meanwhile is the
// landings it certainly does not hold: those sent after it ended.
func TestLandedKeepsWhatARaceCannotHold(t *testing.T) {
	c := &clock{noon}
	v := newTestView(c, nil)
	g := Gather{Mark: v.Mark("golang"), Started: noon, At: noon.Add(time.Second)}
	c.t = noon.Add(2 * time.Second) // both land after the gather began
	v.Answered([]Answer{
		{Topic: "golang", Delta: 3, Sent: noon, Outcome: Applied},                      // sent before it ended: may be in it
		{Topic: "golang", Delta: 4, Sent: noon.Add(2 * time.Second), Outcome: Applied}, // sent after: cannot be
	})
	if add, _, ok := v.Landed(g); ok || add != 4 {
		t.Errorf("Landed: %d (ok %v), want 4 and not ok", add, ok)
	}
	if landed, _, ok := v.Read("golang", g); ok || landed != 4 {
		t.Errorf("Read: landed %d (ok %v), want 4 and not ok", landed, ok)
	}
}
