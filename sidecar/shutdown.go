package sidecar

import (
	"context"
	"errors"
	"time"

	"go.uber.org/zap"
)

// phase is one step after the final flush. It must return by its
// context's deadline.
type phase struct {
	name string
	run  func(ctx context.Context) error
}

// shutdown is the ordered stop of a running sidecar within one budget
// (--shutdown-timeout). Every deadline is taken from the budget's end, not
// from when a phase starts, so that a slow drain eats into the final
// flush, never into the reserve kept for the phases after it: a final
// flush that ran on would leave the publishes unflushed and NATS and the
// listeners unclosed when the pod is killed.
type shutdown struct {
	budget  time.Duration
	reserve time.Duration
	// stop stops taking messages and returns once the pipeline's
	// goroutines have: the NATS drain (at most --drain-timeout, which
	// config keeps under the budget less the reserve), the flush loop or
	// the durable engine (its flush in progress), the console's loop; then, in partitioned mode, it
	// leaves the fleet (see runMembers). It returns by ctx's deadline
	// (pipelineStop). ctx ends where the final flush must: the budget's
	// end less the reserve.
	stop func(ctx context.Context) error
	// final writes what is buffered, retrying until its deadline: the
	// budget's end less the reserve.
	final func(ctx context.Context) error
	// after run in order once final returns, on what is left of the
	// budget: at least the reserve, whatever stop and final took. Each
	// has its own slice of the reserve, an equal share, which a phase
	// that runs to its deadline cannot take from the ones after it;
	// what a phase leaves unused goes to the next.
	after []phase
}

// run carries out the shutdown from now and returns what stop and final
// failed with; the after phases' errors are logged.
func (s shutdown) run(log *zap.Logger) error {
	end := time.Now().Add(s.budget)
	budget, cancel := context.WithDeadline(context.Background(), end)
	defer cancel()

	finalCtx, cancelFinal := context.WithDeadline(budget, end.Add(-s.reserve))
	stopErr := s.stop(finalCtx)
	finalErr := s.final(finalCtx)
	cancelFinal()
	if finalErr == nil {
		log.Info("final flush done")
	}
	for i, p := range s.after {
		ctx, cancel := context.WithDeadline(budget, phaseEnd(end, s.reserve, i, len(s.after)))
		if err := p.run(ctx); err != nil {
			log.Warn("shutdown: "+p.name, zap.Error(err))
		}
		cancel()
	}
	return errors.Join(stopErr, finalErr)
}

// pipelineStop is a shutdown's stop for a pipeline run by goAll.
type pipelineStop struct {
	// stop ends the pipeline's context: its loops take no more work.
	stop func()
	// endBy tells the flush loop the final flush's deadline
	// (flusher.Flusher.EndBy).
	endBy func(time.Time)
	// cut ends what the pipeline's loops still wait for after their
	// context has ended (parts.cut): the flush in progress, the
	// JetStream drain and its unpins.
	cut func()
	// wait returns once the pipeline's loops have.
	wait func() error
	// leave leaves the fleet, waiting at most until its context ends
	// (runMembers).
	leave func(context.Context)
}

// run stops the pipeline and returns by ctx's deadline, whatever the
// store and NATS do: what its loops would still wait for is cut off
// there, so that the phases after the final flush keep their reserve.
// Against a NATS server that does not answer, a drain and its unpins
// could otherwise run past the whole budget.
func (s pipelineStop) run(ctx context.Context) error {
	s.stop()
	// The flush in progress finishes, but not past the final flush's
	// deadline: it starts no write it could not finish by then.
	if d, ok := ctx.Deadline(); ok {
		s.endBy(d)
	}
	defer context.AfterFunc(ctx, s.cut)()
	err := s.wait()
	// The drain has unpinned this sidecar's partitions (unless it was
	// cut off): the others take them now rather than after fleet.Expiry
	// intervals, while the final flush writes what this one holds.
	s.leave(ctx)
	return err
}

// phaseEnd is the deadline of the i-th of n phases after the final flush:
// the final flush's deadline (end less the reserve) plus i+1 equal slices
// of the reserve. The last ends with the budget.
func phaseEnd(end time.Time, reserve time.Duration, i, n int) time.Time {
	return end.Add(-reserve + reserve*time.Duration(i+1)/time.Duration(n))
}
