package sidecar

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.uber.org/zap"
)

// TestShutdownReserveSurvivesASlowDrain makes the drain take longer than
// the reserve, and the final flush run until its context ends (a store
// that never answers): the phases after it (leaving the journal, the
// acknowledgements, the HTTP shutdown) must still start on a live context
// with the reserve ahead of them, and the whole shutdown must end within
// the budget. The reserve used to be counted from after the drain, so a
// drain longer than it handed the final flush the whole budget.
func TestShutdownReserveSurvivesASlowDrain(t *testing.T) {
	const (
		budget  = 2 * time.Second
		reserve = 500 * time.Millisecond
		drain   = 700 * time.Millisecond // longer than the reserve
	)
	start := time.Now()
	end := start.Add(budget)
	var finalDeadline time.Time
	type seen struct {
		name string
		left time.Duration
		err  error
	}
	var after []seen
	record := func(name string) phase {
		return phase{name: name, run: func(ctx context.Context) error {
			d, _ := ctx.Deadline()
			after = append(after, seen{name, time.Until(d), ctx.Err()})
			return nil
		}}
	}
	err := shutdown{
		budget:  budget,
		reserve: reserve,
		stop: func() error {
			<-time.After(drain) // the drain is slow: the point of the test
			return nil
		},
		final: func(ctx context.Context) error {
			finalDeadline, _ = ctx.Deadline()
			<-ctx.Done() // retries until its deadline, as against a dead store
			return ctx.Err()
		},
		after: []phase{record("leave the journal"), record("flush acknowledgements"), record("stop HTTP")},
	}.run(zap.NewNop())
	took := time.Since(start)

	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("shutdown returned %v, want the final flush's deadline", err)
	}
	// run starts its clock a moment after start: the deadline is no
	// earlier than want, and later only by that moment.
	if want := end.Add(-reserve); finalDeadline.Before(want) || finalDeadline.After(want.Add(200*time.Millisecond)) {
		t.Errorf("final flush's deadline %s after the start, want %s (the budget's end less the reserve)", finalDeadline.Sub(start), want.Sub(start))
	}
	if len(after) != 3 {
		t.Fatalf("%d phases ran after the final flush, want 3", len(after))
	}
	for _, p := range after {
		if p.err != nil {
			t.Errorf("%s ran on an ended context: %v", p.name, p.err)
		}
	}
	// The first phase after the final flush starts with about the reserve
	// left: the scheduler may take a little of it.
	if first := after[0]; first.left < reserve/2 {
		t.Errorf("%s started with %s of the budget left, want about the reserve (%s)", first.name, first.left, reserve)
	}
	if took > budget+100*time.Millisecond {
		t.Errorf("shutdown took %s, more than its budget %s", took, budget)
	}
}

// TestReserve keeps the reserve a tenth of the budget, at most a second.
func TestReserve(t *testing.T) {
	for _, c := range []struct{ budget, want time.Duration }{
		{time.Second, 100 * time.Millisecond},
		{5 * time.Second, 500 * time.Millisecond},
		{25 * time.Second, time.Second},
		{10 * time.Minute, time.Second},
	} {
		if got := reserveOf(c.budget); got != c.want {
			t.Errorf("reserveOf(%s) = %s, want %s", c.budget, got, c.want)
		}
	}
}
