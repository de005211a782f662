package sidecar

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"go.uber.org/zap"
)

// TestShutdownReserveSurvivesASlowDrain makes the drain take longer than
// the reserve, and the final flush run until its context ends (a store
// that never answers): the phases after it (leaving the fleet, the
// checkpoints, the HTTP shutdown) must still start on a live context
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
	var finalDeadline, stopDeadline time.Time
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
		stop: func(ctx context.Context) error {
			stopDeadline, _ = ctx.Deadline()
			<-time.After(drain) // the drain is slow: the point of the test
			return nil
		},
		final: func(ctx context.Context) error {
			finalDeadline, _ = ctx.Deadline()
			<-ctx.Done() // retries until its deadline, as against a dead store
			return ctx.Err()
		},
		after: []phase{record("leave the fleet"), record("store checkpoints"), record("stop HTTP")},
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
	if !stopDeadline.Equal(finalDeadline) {
		t.Errorf("the drain's deadline %s after the start, want the final flush's, %s", stopDeadline.Sub(start), finalDeadline.Sub(start))
	}
	if len(after) != 3 {
		t.Fatalf("%d phases ran after the final flush, want 3", len(after))
	}
	for _, p := range after {
		if p.err != nil {
			t.Errorf("%s ran on an ended context: %v", p.name, p.err)
		}
	}
	// Each phase after the final flush starts with about its slice of
	// the reserve (a third) ahead of it: the scheduler may take a little
	// of it, and what the phases before it left unused adds to it.
	for _, p := range after {
		if slice := reserve / 3; p.left < slice/2 {
			t.Errorf("%s started with %s of its deadline left, want about its slice of the reserve (%s)", p.name, p.left, slice)
		}
	}
	if took > budget+100*time.Millisecond {
		t.Errorf("shutdown took %s, more than its budget %s", took, budget)
	}
}

// TestOverrunningDrainKeepsTheReserve: a drain that would run past the
// final flush's deadline is cut off there (the flush in progress stops
// starting writes): the phases after the final flush keep their reserve.
func TestOverrunningDrainKeepsTheReserve(t *testing.T) {
	const budget, reserve = 2 * time.Second, 500 * time.Millisecond
	var left time.Duration
	err := shutdown{
		budget:  budget,
		reserve: reserve,
		stop: func(ctx context.Context) error {
			<-ctx.Done() // a drain and a flush that would go on and on
			return ctx.Err()
		},
		final: func(ctx context.Context) error { return ctx.Err() },
		after: []phase{{"leave the fleet", func(ctx context.Context) error {
			d, _ := ctx.Deadline()
			left = time.Until(d)
			return ctx.Err()
		}}},
	}.run(zap.NewNop())
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("shutdown returned %v, want the deadline the drain ran into", err)
	}
	if left < reserve/2 {
		t.Errorf("the phase after the final flush started with %s left, want about the reserve (%s)", left, reserve)
	}
}

// TestOverrunningPhaseKeepsTheOthersSlices: a phase after the final flush
// that runs until its context ends (leaving the fleet against a store
// that does not answer) is cut off at the end of its slice of the
// reserve: the phases after it (the checkpoints, the HTTP shutdown)
// still run, each on a live context with its own slice ahead.
func TestOverrunningPhaseKeepsTheOthersSlices(t *testing.T) {
	const budget, reserve = time.Second, 600 * time.Millisecond
	start := time.Now()
	type seen struct {
		left time.Duration
		err  error
	}
	var later []seen
	record := phase{"later", func(ctx context.Context) error {
		d, _ := ctx.Deadline()
		later = append(later, seen{time.Until(d), ctx.Err()})
		return nil
	}}
	var hungFor time.Duration
	err := shutdown{
		budget:  budget,
		reserve: reserve,
		stop:    func(context.Context) error { return nil },
		final:   func(context.Context) error { return nil },
		after: []phase{{"leave the fleet", func(ctx context.Context) error {
			began := time.Now()
			<-ctx.Done()
			hungFor = time.Since(began)
			return ctx.Err()
		}}, record, record},
	}.run(zap.NewNop())
	if err != nil {
		t.Fatalf("shutdown returned %v, want nil: stop and final succeeded", err)
	}
	if len(later) != 2 {
		t.Fatalf("%d phases ran after the one that hung, want 2", len(later))
	}
	for i, p := range later {
		if p.err != nil {
			t.Errorf("phase %d after the hung one ran on an ended context: %v", i+1, p.err)
		}
	}
	// The hung phase had the time before the reserve (stop and final
	// took none) and its own slice, no more: the next phase starts with
	// about its own slice, and the last with its own and what the one
	// before left unused (the scheduler may take a little of each).
	if slice := reserve / 3; later[0].left < slice*3/4 || later[1].left < slice*3/2 {
		t.Errorf("the phases after the hung one started with %s and %s left, want about one slice (%s) and two", later[0].left, later[1].left, slice)
	}
	if want := budget - reserve + reserve/3; hungFor > want+100*time.Millisecond {
		t.Errorf("the hung phase ran %s, want it cut off after %s (the budget less two slices)", hungFor, want)
	}
	if took := time.Since(start); took > budget+100*time.Millisecond {
		t.Errorf("shutdown took %s, more than its budget %s", took, budget)
	}
}

// TestShutdownCutsAPipelineWaitingOnNATS: the stop phase of a pipeline whose
// ingest waits on a NATS server that does not answer (its drain, then its
// unpins), returning only when cut, returns at the final flush's deadline:
// the stop cuts it there, and the phases after the final flush keep their
// reserve. A pipeline that returns in time is not cut.
func TestShutdownCutsAPipelineWaitingOnNATS(t *testing.T) {
	const budget, reserve = 2 * time.Second, 500 * time.Millisecond
	for _, stuck := range []bool{true, false} {
		t.Run(fmt.Sprintf("stuck=%v", stuck), func(t *testing.T) {
			start := time.Now()
			stopped, cut := make(chan struct{}), make(chan struct{})
			var endBy, returned time.Time
			var left time.Duration
			var leaveErr, afterErr error
			drainErr := errors.New("ingest: drain cut off at the shutdown's deadline")
			err := shutdown{
				budget:  budget,
				reserve: reserve,
				stop: pipelineStop{
					stop:  func() { close(stopped) },
					endBy: func(d time.Time) { endBy = d },
					cut:   func() { close(cut) },
					wait: func() error {
						<-stopped
						if !stuck {
							return nil
						}
						<-cut
						returned = time.Now()
						return drainErr
					},
					leave: func(ctx context.Context) { leaveErr = ctx.Err() },
				}.run,
				final: func(context.Context) error { return nil },
				after: []phase{{"leave the fleet", func(ctx context.Context) error {
					d, _ := ctx.Deadline()
					left, afterErr = time.Until(d), ctx.Err()
					return nil
				}}},
			}.run(zap.NewNop())

			want := start.Add(budget - reserve) // the final flush's deadline
			if endBy.Before(want) || endBy.After(want.Add(200*time.Millisecond)) {
				t.Errorf("the flush loop was told to end %s after the start, want %s (the final flush's deadline)", endBy.Sub(start), want.Sub(start))
			}
			if afterErr != nil || left < reserve/2 {
				t.Errorf("the phase after the final flush started with %s left (%v), want about the reserve (%s)", left, afterErr, reserve)
			}
			if !stuck {
				if err != nil {
					t.Errorf("shutdown returned %v, want nil", err)
				}
				select {
				case <-cut:
					t.Error("a pipeline that returned in time was cut")
				default:
				}
				return
			}
			if !errors.Is(err, drainErr) {
				t.Errorf("shutdown returned %v, want the drain's error", err)
			}
			if returned.Before(endBy) || returned.After(want.Add(200*time.Millisecond)) {
				t.Errorf("the pipeline returned %s after the start, want when cut, at the final flush's deadline (%s)", returned.Sub(start), want.Sub(start))
			}
			if leaveErr == nil {
				t.Error("leaving the fleet had time left after the final flush's deadline")
			}
		})
	}
}
