package flusher

import (
	"context"
	"testing"
	"time"

	"github.com/cenkalti/backoff/v5"
)

// TestFinalPace: after failed flushes Final waits 50 ms doubling to 1 s;
// while the spill comes back it goes on at once without growing the
// wait; and it stops when the wait and the room a retry needs no longer
// fit before the deadline.
func TestFinalPace(t *testing.T) {
	none := func() time.Duration { return 0 }
	p := newFinalPace(context.Background(), none)
	p.Reset()
	var got []time.Duration
	for range 7 {
		got = append(got, p.NextBackOff())
	}
	want := []time.Duration{50, 100, 200, 400, 800, 1000, 1000}
	for i := range want {
		if got[i] != want[i]*time.Millisecond {
			t.Fatalf("waits %v, want %v ms", got, want)
		}
	}

	p.Reset()
	p.spilling = true
	if w := p.NextBackOff(); w != 0 {
		t.Errorf("spilling: wait %v, want 0", w)
	}
	p.spilling = false
	if w := p.NextBackOff(); w != 50*time.Millisecond {
		t.Errorf("after the spill: wait %v, want the first back-off, 50ms", w)
	}

	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	p = newFinalPace(ctx, none)
	p.room = 59 * time.Minute
	if w := p.NextBackOff(); w != 50*time.Millisecond {
		t.Errorf("room before the deadline: wait %v, want 50ms", w)
	}
	p.room = time.Hour
	if w := p.NextBackOff(); w != backoff.Stop {
		t.Errorf("no room before the deadline: wait %v, want Stop", w)
	}

	// The window's spill needs 30 minutes: a retry needing 59 no longer
	// fits, one needing 29 does, and a flush ends 30 minutes early.
	p = newFinalPace(ctx, func() time.Duration { return 30 * time.Minute })
	p.room = 59 * time.Minute
	if w := p.NextBackOff(); w != backoff.Stop {
		t.Errorf("no room before the spill must start: wait %v, want Stop", w)
	}
	p.room = 29 * time.Minute
	p.Reset()
	if w := p.NextBackOff(); w != 50*time.Millisecond {
		t.Errorf("room before the spill must start: wait %v, want 50ms", w)
	}
	fctx, cancelFlush := p.flushContext(ctx)
	defer cancelFlush()
	d, _ := ctx.Deadline()
	if fd, _ := fctx.Deadline(); !fd.Equal(d.Add(-30 * time.Minute)) {
		t.Errorf("a flush's deadline is %s before ctx's, want 30m", d.Sub(fd))
	}
}
