package sidecar_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/hotcount/hotcount/config"
	"github.com/hotcount/hotcount/internal/testtools/ddbfault"
	"github.com/hotcount/hotcount/internal/testtools/testenv"
	"github.com/hotcount/hotcount/pipeline/flusher"
	"github.com/hotcount/hotcount/tools/loadgen"
)

// The backlog tests stop a sidecar holding far more than a slow store
// takes within --shutdown-timeout: 2,000 topics at 200 ms a write, 16 at
// a time, are 25 s of writes against a 4 s budget (its reserve, 400 ms,
// gives each of the four phases after the final flush 100 ms). The sidecar must exit
// within its budget, and the next one must write everything the first
// accepted, exactly once.
const (
	backlogTopics  = 2_000
	backlogLatency = 200 * time.Millisecond
	backlogBudget  = 4 * time.Second
	// exitSlack is what the process may take past the budget: the
	// services' stop after the HTTP shutdown and the test's scheduling.
	exitSlack = 500 * time.Millisecond
)

func backlogConfig(c *config.Config) {
	c.FlushInterval = time.Hour // everything waits for the final flush
	c.FlushConcurrency = 16
	c.DrainTimeout = time.Second
	c.ShutdownTimeout = backlogBudget
	c.Windows = "none" // totals only: the figures above are writes of totals
}

// stopWithin stops e's sidecar and fails the test when that took longer
// than its budget and exitSlack; it returns the shutdown's report.
func stopWithin(t *testing.T, e *env) *flusher.ShutdownError {
	t.Helper()
	start := time.Now()
	err := e.stop()
	took := time.Since(start)
	if took > e.cfg.ShutdownTimeout+exitSlack {
		t.Errorf("shutdown took %s, want within --shutdown-timeout %s", took, e.cfg.ShutdownTimeout)
	}
	var sd *flusher.ShutdownError
	if !errors.As(err, &sd) {
		t.Fatalf("shutdown error = %v, want a ShutdownError: the backlog cannot be written within the budget", err)
	}
	t.Logf("shutdown took %s: %v", took, sd)
	return sd
}

// inTable waits until e's table holds n mentions in all.
func inTable(t *testing.T, e *env, n int64, timeout time.Duration) {
	t.Helper()
	testenv.Eventually(t, timeout, func() error {
		if got, _ := tableCounts(t, e.dyn, e.cfg.Table); sum(got) != n {
			return fmt.Errorf("%d of %d mentions in the table", sum(got), n)
		}
		return nil
	})
}

// TestSIGTERMWithBacklogJetStream: the first sidecar exits within its
// budget, having written part of the backlog, and says it could not write
// the rest; its checkpoint stays below what it left, and the second one
// writes exactly the rest: the table ends with every mention once.
func TestSIGTERMWithBacklogJetStream(t *testing.T) {
	e := newFaultEnv(t, &ddbfault.Config{}, func(c *config.Config) {
		backlogConfig(c)
		c.NATSMode = config.ModeJetStream
	})
	rep := publish(t, e.nats, loadgen.Config{Prefix: "mentions.", Topics: backlogTopics, Messages: backlogTopics, Count: 1, Seed: 61, JetStream: true})
	testenv.Eventually(t, 10*time.Second, func() error {
		if n := testenv.Metric(t, e.sc.Registry(), "hotcount_ingest_mentions_total"); n != float64(rep.Mentions) {
			return fmt.Errorf("%v of %d read", n, rep.Mentions)
		}
		return nil
	})
	e.fault.SetLatency(backlogLatency)
	start := time.Now()
	err := e.stop()
	if took := time.Since(start); took > e.cfg.ShutdownTimeout+exitSlack {
		t.Errorf("shutdown took %s, want within --shutdown-timeout %s", took, e.cfg.ShutdownTimeout)
	}
	if err == nil {
		t.Fatal("shutdown returned nil: the test needs a backlog the budget cannot write")
	}
	written := testenv.Metric(t, e.sc.Registry(), "hotcount_flusher_flushed_mentions_total")
	if written >= float64(rep.Mentions) {
		t.Fatalf("%v of %d written at exit: the test needs a backlog the budget cannot write", written, rep.Mentions)
	}
	e.fault.SetLatency(0)

	second := newEnvOn(t, e, func(c *config.Config) { c.FlushInterval = 100 * time.Millisecond })
	inTable(t, e, rep.Mentions, 30*time.Second)
	consumerIdle(t, e)
	if err := second.stop(); err != nil {
		t.Fatal(err)
	}
	exact(t, e, rep)
	t.Logf("the first wrote %v of %d mentions before its budget ended: %v", written, rep.Mentions, err)
}

// TestSIGTERMWithBacklogCore: in core mode what the first sidecar could
// not write goes to its spill folder before it exits, within the budget,
// and the next sidecar on the same --data-dir writes it. Either the flush
// loop is idle at SIGTERM, or one of its flushes is under way and runs on
// into the shutdown (its --flush-timeout is longer than the budget): it
// must start no write it cannot finish before the final flush's deadline
// either.
func TestSIGTERMWithBacklogCore(t *testing.T) {
	for _, tc := range []struct {
		name     string
		interval time.Duration
	}{
		{"idle", time.Hour},
		{"flushing", 100 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newFaultEnv(t, &ddbfault.Config{}, func(c *config.Config) {
				backlogConfig(c)
				c.FlushInterval = tc.interval
			})
			if tc.interval < time.Hour {
				e.fault.SetLatency(backlogLatency) // the flush that starts takes 25 s
			}
			rep := publish(t, e.nats, loadgen.Config{Prefix: "mentions.", Topics: backlogTopics, Messages: backlogTopics, Count: 1, Seed: 62})
			testenv.Eventually(t, 10*time.Second, func() error {
				if n := testenv.Metric(t, e.sc.Registry(), "hotcount_ingest_mentions_total"); n != float64(rep.Mentions) {
					return fmt.Errorf("%v of %d mentions taken", n, rep.Mentions)
				}
				if tc.interval < time.Hour && testenv.Metric(t, e.sc.Registry(), "hotcount_flusher_flushed_mentions_total") == 0 {
					return errors.New("no flush under way yet")
				}
				return nil
			})
			e.fault.SetLatency(backlogLatency)
			sd := stopWithin(t, e)
			// What is left is spilled (Persist takes it before the rest
			// is counted, so none is left unwritten), and no write is cut
			// off in flight: core mode has no journal to settle one later.
			if sd.Spilled == 0 || sd.Mentions != 0 || sd.Doubt != 0 {
				t.Fatalf("%d mentions spilled, %d left unwritten, %d in writes in doubt; want some spilled and nothing else left", sd.Spilled, sd.Mentions, sd.Doubt)
			}
			e.fault.SetLatency(0)

			second := newEnvOn(t, e, func(c *config.Config) { c.FlushInterval = 100 * time.Millisecond })
			inTable(t, e, rep.Mentions, 30*time.Second)
			if err := second.stop(); err != nil {
				t.Fatal(err)
			}
			exact(t, e, rep)
		})
	}
}
