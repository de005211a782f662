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
// flush that ran on would leave acknowledgements unsent (their messages
// redelivered) and the journal not left (its entries replayed only after
// the lease).
type shutdown struct {
	budget  time.Duration
	reserve time.Duration
	// stop stops taking messages and returns once the pipeline's
	// goroutines have: the NATS drain (at most --drain-timeout, which
	// config keeps under the budget less the reserve), the flush loop
	// (its flush in progress, cut off at ctx's deadline), the journal's
	// and console's loops; then, in partitioned mode, it leaves the fleet
	// (see runMembers), waiting at most until ctx's deadline. ctx ends
	// where the final flush must: the budget's end less the reserve.
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

// phaseEnd is the deadline of the i-th of n phases after the final flush:
// the final flush's deadline (end less the reserve) plus i+1 equal slices
// of the reserve. The last ends with the budget.
func phaseEnd(end time.Time, reserve time.Duration, i, n int) time.Time {
	return end.Add(-reserve + reserve*time.Duration(i+1)/time.Duration(n))
}
