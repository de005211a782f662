package ceiling_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/hotcount/hotcount/pipeline/store"
	"github.com/hotcount/hotcount/schema"
	"github.com/hotcount/hotcount/tools/ceiling"
)

// TestTake: a key spends its burst at once, then its rate; a request over
// several keys is refused whole when one is over, taking nothing from the
// others; no ceiling takes everything.
func TestTake(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	k := ceiling.New(10, 2) // 10 a second, 2 at once
	for i := range 2 {
		if !k.Take(now, "a") {
			t.Fatalf("a's unit %d of its burst of 2 refused", i+1)
		}
	}
	if k.Take(now, "a") {
		t.Error("a's third unit at once taken: over the burst")
	}
	if !k.Take(now.Add(100*time.Millisecond), "a") {
		t.Error("a's unit after 100 ms (10 a second) refused")
	}
	// b has its burst, a none left: the pair is refused, and b keeps both.
	if k.Take(now.Add(100*time.Millisecond), "b", "a") {
		t.Error("a request over a and b taken while a is over")
	}
	if !k.Take(now.Add(100*time.Millisecond), "b", "b") {
		t.Error("b's burst was spent by a refused request")
	}
	// A take at an earlier time (a caller that read its clock before
	// another queued ahead of it) is a take at the latest: it grants no
	// time twice. 10 a second from a spent bucket at t: 10 more by t+1s,
	// however the calls interleave their clocks.
	c := ceiling.New(10, 1)
	t0 := now.Add(time.Hour)
	c.Take(t0, "c")
	granted := 0
	for i := range 100 {
		at := t0.Add(time.Duration(i) * 10 * time.Millisecond) // 0..990 ms
		if i%2 == 1 {
			at = at.Add(-200 * time.Millisecond) // late readers of the clock
		}
		if c.Take(at, "c") {
			granted++
		}
	}
	if granted > 10 {
		t.Errorf("%d takes granted within a second at 10 a second, clocks read out of order: time granted twice", granted)
	}
	none := ceiling.New(0, 0)
	for range 1000 {
		if !none.Take(now, "a") {
			t.Fatal("no ceiling refused a unit")
		}
	}
}

// TestStore: writes past an item's ceiling are refused as DynamoDB's
// throttles are (store.ErrThrottled), applied nowhere, and counted.
func TestStore(t *testing.T) {
	var applied int64
	next := adder(func(w store.Write) error { applied += w.Delta; return nil })
	s := ceiling.NewStore(ceiling.New(1, 3), next)
	now := time.Now()
	var throttled int
	for range 5 {
		err := s.Add(context.Background(), store.Write{Counter: schema.TotalOf("golang"), Delta: 2}, now)
		if errors.Is(err, store.ErrThrottled) {
			throttled++
		} else if err != nil {
			t.Fatal(err)
		}
	}
	if c := s.Counts(); throttled != 2 || applied != 6 || c != (ceiling.Counts{Mentions: 6, Writes: 3, Throttled: 2}) {
		t.Errorf("5 writes at once against a burst of 3: %d throttled, %d applied, counts %+v; want 2, 6 and {6 3 2}", throttled, applied, c)
	}
}

type adder func(store.Write) error

func (a adder) Add(_ context.Context, w store.Write, _ time.Time) error { return a(w) }
