package sidecar_test

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/hotcount/hotcount/config"
	"github.com/hotcount/hotcount/internal/testtools/ddbfault"
	"github.com/hotcount/hotcount/internal/testtools/testenv"
	"github.com/hotcount/hotcount/pipeline/flusher"
	"github.com/hotcount/hotcount/pipeline/store"
	"github.com/hotcount/hotcount/schema"
	"github.com/hotcount/hotcount/tools/loadgen"
)

// The reliability suite: the sidecar against dynalite behind the fault
// emulator. Each test is bounded in time and ends by comparing the table
// with what was published.

func exact(t *testing.T, e *env, reps ...loadgen.Report) {
	t.Helper()
	want := map[string]int64{}
	var total int64
	for _, r := range reps {
		for topic, n := range r.PerTopic {
			want[topic] += n
		}
		total += r.Mentions
	}
	got, _ := tableCounts(t, e.dyn, e.cfg.Table)
	for topic, n := range want {
		if got[topic] != n {
			t.Errorf("topic %s: table %d, published %d", topic, got[topic], n)
		}
	}
	if sum(got) != total {
		t.Errorf("table holds %d mentions, published %d", sum(got), total)
	}
	exactBuckets(t, e, want)
}

// exactBuckets checks that, with time buckets on, each topic's minute
// buckets and its hour buckets each add up to want, its mentions.
func exactBuckets(t testing.TB, e *env, want map[string]int64) {
	t.Helper()
	minutes, hours := e.cfg.Buckets()
	if !minutes && !hours {
		return
	}
	buckets, _ := e.dyn.Buckets(t, e.cfg.Table)
	for g, on := range map[schema.Granularity]bool{schema.Minute: minutes, schema.Hour: hours} {
		per := make(map[string]int64)
		for b, n := range buckets {
			if b.G == g {
				per[b.Topic] += n
			}
		}
		bad := 0
		for topic, n := range want {
			if on && per[topic] != n {
				if bad++; bad <= 5 {
					t.Errorf("topic %s: its %s buckets hold %d, published %d", topic, g, per[topic], n)
				}
			}
		}
		if bad > 5 {
			t.Errorf("... and %d more topics whose %s buckets are off", bad-5, g)
		}
		if on && len(per) != len(want) {
			t.Errorf("%s buckets of %d topics, published %d", g, len(per), len(want))
		}
	}
}

// TestReliabilityOutage: the store unreachable (every connection reset) for
// seconds while mentions keep arriving: the sidecar stays up and ready (the
// lookup API can answer), hotcount_dependency_up{dependency="store"} is 0,
// /healthz fails only once the last complete flush is older than
// --health-flush-age, the buffer keeps merging, and after recovery the
// table holds every mention.
func TestReliabilityOutage(t *testing.T) {
	e := newFaultEnv(t, &ddbfault.Config{}, func(c *config.Config) {
		c.HealthFlushAge = 1500 * time.Millisecond
	})
	first := publish(t, e.nats, loadgen.Config{Prefix: "mentions.", Topics: 50, Messages: 2_000, Count: 1, Seed: 21})
	testenv.Eventually(t, 10*time.Second, func() error {
		if f := testenv.Metric(t, e.sc.Registry(), "hotcount_flusher_flushed_mentions_total"); f != float64(first.Mentions) {
			return fmt.Errorf("%v of %d flushed", f, first.Mentions)
		}
		return nil
	})

	outageStart := time.Now()
	e.fault.SetOutage(time.Hour)
	var during []loadgen.Report
	// The store reads as up for a while after its last answer (pingFresh)
	// unless a call fails: a read of a topic nobody asked for goes to the
	// store, fails, and says so at once.
	misses := 0
	testenv.Eventually(t, 10*time.Second, func() error {
		misses++
		if resp, err := http.Get(fmt.Sprintf("http://%s/v1/topics/outage-miss-%d", e.sc.HTTPAddr(), misses)); err == nil {
			resp.Body.Close()
		}
		if e.probe("/readyz") != nil {
			return errors.New("not ready while the store is down: the lookup API can still answer")
		}
		if testenv.MetricWith(t, e.sc.Registry(), "hotcount_dependency_up", "dependency", "store") != 0 {
			return errors.New("the store reads as up while it is down")
		}
		return nil
	})
	if err := e.probe("/healthz"); err != nil && time.Since(outageStart) < e.cfg.HealthFlushAge {
		t.Errorf("unhealthy %s into the outage, before --health-flush-age %s: %v", time.Since(outageStart), e.cfg.HealthFlushAge, err)
	}
	// failedFlushes counts the flushes that ended in an error (none yet:
	// no such series).
	failedFlushes := func() float64 {
		mfs, err := e.sc.Registry().Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() != "hotcount_flusher_flushes_total" {
				continue
			}
			for _, m := range mf.GetMetric() {
				for _, l := range m.GetLabel() {
					if l.GetName() == "result" && l.GetValue() == "error" {
						return m.GetCounter().GetValue()
					}
				}
			}
		}
		return 0
	}
	accepted := int64(first.Mentions)
	for i := range 3 { // mentions keep arriving
		rep := publish(t, e.nats, loadgen.Config{Prefix: "mentions.", Topics: 50, Messages: 1_000, Count: 2, Seed: uint64(22 + i)})
		during = append(during, rep)
		accepted += rep.Mentions
		// Spread over several flushes: this batch is buffered, and a
		// flush begun after that has failed.
		failed := -1.0
		testenv.Eventually(t, 10*time.Second, func() error {
			if n := testenv.Metric(t, e.sc.Registry(), "hotcount_ingest_mentions_total"); n < float64(accepted) {
				return fmt.Errorf("%v of %d mentions accepted", n, accepted)
			}
			if failed < 0 {
				failed = failedFlushes()
			}
			if n := failedFlushes(); n < failed+2 {
				return fmt.Errorf("%v failed flushes since batch %d was buffered, want 2", n-failed, i+1)
			}
			return nil
		})
	}
	testenv.Eventually(t, 10*time.Second, func() error {
		if e.probe("/healthz") == nil {
			return errors.New("healthy though no flush has succeeded")
		}
		return nil
	})
	if unhealthyAfter := time.Since(outageStart); unhealthyAfter < e.cfg.HealthFlushAge {
		t.Errorf("unhealthy after %s, before --health-flush-age", unhealthyAfter)
	}
	if n := testenv.Metric(t, e.sc.Registry(), "hotcount_flusher_requeued_mentions_total"); n == 0 {
		t.Error("no failed write put its delta back during the outage")
	}

	e.fault.EndOutage()
	testenv.Eventually(t, 30*time.Second, func() error {
		if err := e.probe("/readyz"); err != nil {
			return err
		}
		return e.probe("/healthz")
	})
	if err := e.stop(); err != nil {
		t.Fatalf("shutdown: %v", err)
	}
	exact(t, e, append(during, first)...)
	if o := e.fault.Stats().Did[ddbfault.Outage]; o == 0 {
		t.Error("the emulator refused nothing")
	}
}

// TestReliabilityThrottling: one hot topic pushed past one key's ceiling:
// throttled writes move to other shards, every mention lands, and the
// throttles show in hotcount_store_throttled_total.
func TestReliabilityThrottling(t *testing.T) {
	// 5 writes/s per key, no burst beyond one; a steady stream for 1.5 s and
	// a flush every 10 ms write the hot topic about 100 times a second, over
	// 8 shards: twice the shards' ceiling.
	e := newFaultEnv(t, &ddbfault.Config{WriteUnits: 5, WriteBurst: 1}, func(c *config.Config) {
		c.FlushInterval = 10 * time.Millisecond
		c.Shards = 8
	})
	reps := []loadgen.Report{publish(t, e.nats, loadgen.Config{Prefix: "mentions.", Topics: 1, Rate: 2000, Duration: 1500 * time.Millisecond, Count: 1, Seed: 30})}
	if err := e.stop(); err != nil {
		t.Fatalf("shutdown: %v", err)
	}
	exact(t, e, reps...)
	st := e.fault.Stats()
	if st.Did[ddbfault.Throttled] == 0 {
		t.Fatal("the emulator throttled nothing: the test did not reach the ceiling")
	}
	if n := testenv.Metric(t, e.sc.Registry(), "hotcount_store_throttled_total"); n == 0 {
		t.Error("hotcount_store_throttled_total = 0")
	}
	if n := testenv.Metric(t, e.sc.Registry(), "hotcount_flusher_rerouted_total"); n == 0 {
		t.Error("no throttled write moved to another shard")
	}
	written := 0
	for key := range st.Writes {
		if strings.HasPrefix(key, schema.KeyPrefix+"topic-0#") {
			written++
		}
	}
	t.Logf("throttled %d requests (%v by key), writes landed on %d of 8 shards", st.Did[ddbfault.Throttled], st.ThrottledKeys, written)
	if written < 4 {
		t.Errorf("writes landed on %d shards, want them spread", written)
	}
}

// TestReliabilityLostAnswers: the store applies 8% of the writes and
// loses their answers (a reset, a 500, a hang past --write-timeout, a 200
// cut short; one kind per phase), while hot keys are throttled and the
// store is down until it has refused a few requests. In core and in
// JetStream mode the table holds exactly what was published, topic by
// topic, and every write in doubt was settled.
func TestReliabilityLostAnswers(t *testing.T) {
	for _, mode := range []string{config.ModeCore, config.ModeJetStream} {
		t.Run(mode, func(t *testing.T) {
			// One write a second per item: under load a flush can take
			// longer than a ceiling of 3 takes to refill, and none was
			// throttled (seen on one loaded core).
			e := newFaultEnv(t, &ddbfault.Config{WriteUnits: 1, WriteBurst: 1}, func(c *config.Config) {
				c.NATSMode = mode
				c.FlushInterval = 50 * time.Millisecond
				// Longer than a write takes on a loaded machine: under
				// --write-timeout=300ms and a third of a core, every
				// write ran out, each retry too, and nothing was written
				// for a minute (CI saw it). A hang still outlasts it.
				c.WriteTimeout = 2 * time.Second
			})
			e.fault.SetHang(5 * time.Second)
			js := mode == config.ModeJetStream
			var reps []loadgen.Report
			// One phase per kind of lost answer, so that each is exercised.
			kinds := []string{ddbfault.Ambiguous, ddbfault.Ambiguous500, ddbfault.AmbiguousHang, ddbfault.AmbiguousCut}
			for i, kind := range kinds {
				e.fault.LoseAnswers(0.08, kind)
				// Mentions keep coming until this kind has lost at least
				// three answers, and in the last phase until a write was
				// throttled (bounded: 30 rounds of 300 ms).
				done := func() bool {
					st := e.fault.Stats()
					return st.Did[kind] >= 3 && (i < len(kinds)-1 || st.Did[ddbfault.Throttled] > 0)
				}
				for round := 0; round < 30 && !done(); round++ {
					reps = append(reps, publish(t, e.nats, loadgen.Config{Prefix: "mentions.", Topics: 40, Zipf: 1.5, Rate: 4000,
						Duration: 300 * time.Millisecond, Count: int64(i + 1), Seed: uint64(40 + 100*i + round), JetStream: js}))
					if i == 1 && round == 0 {
						// The store is down until it has refused a few
						// requests, not for a set time: a second in
						// which no flush happened to write tested no
						// outage (CI saw one).
						e.fault.SetOutage(time.Hour)
						testenv.Eventually(t, 30*time.Second, func() error {
							if n := e.fault.Stats().Did[ddbfault.Outage]; n < 3 {
								return fmt.Errorf("%d requests refused by the outage", n)
							}
							return nil
						})
						e.fault.EndOutage()
					}
				}
			}
			var published int64
			for _, r := range reps {
				published += r.Mentions
			}
			testenv.Eventually(t, 60*time.Second, func() error {
				if f := testenv.Metric(t, e.sc.Registry(), "hotcount_flusher_flushed_mentions_total"); f < float64(published) {
					return fmt.Errorf("%v of %d flushed", f, published)
				}
				return nil
			})
			if err := e.stop(); err != nil {
				t.Fatalf("shutdown: %v", err)
			}
			exact(t, e, reps...)

			st := e.fault.Stats()
			reg := e.sc.Registry()
			amb := testenv.Metric(t, reg, "hotcount_store_ambiguous_total")
			applied := testenv.MetricWith(t, reg, "hotcount_store_resolved_total", "outcome", store.ResolvedApplied)
			notApplied := testenv.MetricWith(t, reg, "hotcount_store_resolved_total", "outcome", store.ResolvedNotApplied)
			lost := testenv.MetricWith(t, reg, "hotcount_store_resolved_total", "outcome", store.ResolvedUnresolvable)
			t.Logf("published %d; lost answers %d (500 %d, reset %d, hang %d, cut %d), throttled %d, outage refusals %d; in doubt %v, settled applied %v, not applied %v",
				published, st.Lost(), st.Did[ddbfault.Ambiguous500], st.Did[ddbfault.Ambiguous], st.Did[ddbfault.AmbiguousHang], st.Did[ddbfault.AmbiguousCut],
				st.Did[ddbfault.Throttled], st.Did[ddbfault.Outage], amb, applied, notApplied)
			for _, kind := range kinds {
				if st.Did[kind] == 0 {
					t.Errorf("the emulator lost no answer as %s: the test did not exercise it", kind)
				}
			}
			if st.Did[ddbfault.Throttled] == 0 || st.Did[ddbfault.Outage] == 0 {
				t.Errorf("no throttle (%d) or no outage refusal (%d)", st.Did[ddbfault.Throttled], st.Did[ddbfault.Outage])
			}
			if amb < float64(st.Lost())/3 || applied == 0 {
				t.Errorf("hotcount_store_ambiguous_total %v, settled as applied %v, for %d lost answers", amb, applied, st.Lost())
			}
			if applied+notApplied != amb || lost != 0 {
				t.Errorf("in doubt %v, settled %v + %v, unresolvable %v: every write in doubt must settle", amb, applied, notApplied, lost)
			}
			// What the sidecar says it wrote is what it wrote: a write
			// whose lost answer the SDK's retry settled counts too.
			if f := testenv.Metric(t, reg, "hotcount_flusher_flushed_mentions_total"); f != float64(published) {
				t.Errorf("hotcount_flusher_flushed_mentions_total = %v, want the %d published and in the table", f, published)
			}
		})
	}
}

// TestReliabilityShutdownStoreDown: SIGTERM while the store fails, in core
// mode: the final flush retries while the budget leaves room, then the sidecar
// exits with an error naming what it could not write. Refused writes (an
// answer: nothing applied) are unwritten, counted in
// hotcount_flusher_unflushed_total (lost: documented); writes with no
// answer (the store unreachable) are in doubt, counted in
// hotcount_flusher_doubt_at_shutdown_total (each may or may not be in).
func TestReliabilityShutdownStoreDown(t *testing.T) {
	for _, tc := range []struct {
		name   string
		fail   func(*ddbfault.Proxy)
		heal   func(*ddbfault.Proxy)
		said   func(*flusher.ShutdownError) int64 // where the error says the mentions are
		metric string
	}{
		// Refused writes come back into the buffer, which goes to the spill
		// folder at the deadline, but the ones the deadline cuts off in
		// flight are in doubt: either may hold more.
		{"refused", func(p *ddbfault.Proxy) { p.SetWriteFailure(true) }, func(p *ddbfault.Proxy) { p.SetWriteFailure(false) }, func(e *flusher.ShutdownError) int64 { return e.Spilled }, "hotcount_aggregator_spilled_mentions_total"},
		{"unreachable", func(p *ddbfault.Proxy) { p.SetOutage(time.Hour) }, (*ddbfault.Proxy).EndOutage, func(e *flusher.ShutdownError) int64 { return e.Doubt }, "hotcount_flusher_doubt_at_shutdown_total"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newFaultEnv(t, &ddbfault.Config{}, func(c *config.Config) {
				c.FlushInterval = time.Hour
				c.DrainTimeout = time.Second
				c.ShutdownTimeout = 3 * time.Second
			})
			rep := publish(t, e.nats, loadgen.Config{Prefix: "mentions.", Topics: 10, Messages: 500, Count: 1, Seed: 50})
			testenv.Eventually(t, 5*time.Second, func() error {
				if n := testenv.Metric(t, e.sc.Registry(), "hotcount_aggregator_buffered_mentions"); n != float64(rep.Mentions) {
					return fmt.Errorf("%v of %d buffered", n, rep.Mentions)
				}
				return nil
			})
			tc.fail(e.fault)
			start := time.Now()
			err := e.stop()
			if took := time.Since(start); took > e.cfg.ShutdownTimeout+2*time.Second {
				t.Errorf("shutdown took %s, budget %s", took, e.cfg.ShutdownTimeout)
			}
			// The error says where every mention is.
			var sd *flusher.ShutdownError
			if !errors.As(err, &sd) || tc.said(sd) == 0 || sd.Mentions+sd.Doubt+sd.Spilled != rep.Mentions {
				t.Errorf("shutdown error = %v, want the deadline, with %s above 0 and all %d mentions placed", err, tc.name, rep.Mentions)
			}
			// Every mention is accounted for: spilled, unwritten, or in a
			// write in doubt (one the deadline cut off in flight is in
			// doubt too).
			reg := e.sc.Registry()
			spilled := testenv.Metric(t, reg, "hotcount_aggregator_spilled_mentions_total")
			unwritten := testenv.Metric(t, reg, "hotcount_flusher_unflushed_total")
			doubt := testenv.Metric(t, reg, "hotcount_flusher_doubt_at_shutdown_total")
			if spilled+unwritten+doubt != float64(rep.Mentions) || testenv.Metric(t, reg, tc.metric) == 0 {
				t.Errorf("spilled %v + unflushed %v + in doubt %v, want %d, with %s above 0", spilled, unwritten, doubt, rep.Mentions, tc.metric)
			}
			if unwritten != 0 {
				t.Errorf("%v mentions lost at shutdown; the spill folder should have kept them", unwritten)
			}
			if doubt > 0 {
				return // in doubt: the table may or may not hold them
			}
			// The next sidecar on the same folder writes what was spilled.
			tc.heal(e.fault)
			next := newEnvOn(t, e, nil)
			if err := next.stop(); err != nil {
				t.Fatalf("second sidecar's shutdown: %v", err)
			}
			exact(t, e, rep)
		})
	}
}

// TestReliabilitySpill: core mode, the store refusing every write while
// 3,000 distinct topics of 411 bytes arrive through a 1 MiB window budget
// (each takes about 480 B in its minute's counter, more once a refused
// flush has split it into its total and minute): the window goes to the
// spill folder instead of growing, and once the store takes writes again
// the table holds every mention. Long names and minute buckets only, so
// that the window passes its budget however the flushes fall (15,000
// short names stayed under it when no flush happened to split them) and
// the catch-up is some 6,000 writes, not 45,000 (dynalite takes some 500 a
// second: the catch-up is most of the test's time).
func TestReliabilitySpill(t *testing.T) {
	const budget = 1 << 20 // under the 3,000 distinct topics' 1.4 MiB at the least
	e := newFaultEnv(t, &ddbfault.Config{}, func(c *config.Config) {
		c.BufferMemory = "1Mi"
		c.FlushInterval = 200 * time.Millisecond
		c.Windows = "1m"
		c.MaxTopicBytes = 512 // the names below are 411 bytes
	})
	e.fault.SetWriteFailure(true)
	var peak float64
	stop := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for {
			peak = max(peak, testenv.Metric(t, e.sc.Registry(), "hotcount_aggregator_buffered_bytes"))
			select {
			case <-stop:
				return
			case <-time.After(10 * time.Millisecond):
			}
		}
	}()
	long := strings.Repeat("x", 400) + "." // topics xxx….topic-N
	rep := publish(t, e.nats, loadgen.Config{Prefix: "mentions." + long, Topics: 3_000, Messages: 6_000, Rate: 5_000, Count: 1, Seed: 60})
	perTopic := make(map[string]int64, len(rep.PerTopic)) // the report names topics past the prefix
	for topic, n := range rep.PerTopic {
		perTopic[long+topic] = n
	}
	rep.PerTopic = perTopic
	// Spilled at least once: a counter, not the spill folder's size, which
	// drops to 0 whenever a flush takes the spill back to try it.
	testenv.Eventually(t, 30*time.Second, func() error {
		if n := testenv.Metric(t, e.sc.Registry(), "hotcount_aggregator_spilled_mentions_total"); n == 0 {
			return fmt.Errorf("nothing spilled yet (%v bytes buffered)", testenv.Metric(t, e.sc.Registry(), "hotcount_aggregator_buffered_bytes"))
		}
		return nil
	})
	e.fault.SetWriteFailure(false)
	// Written while running, not only by the final flush.
	testenv.Eventually(t, 150*time.Second, func() error {
		if n := testenv.Metric(t, e.sc.Registry(), "hotcount_flusher_flushed_mentions_total"); n != float64(rep.Mentions) {
			return fmt.Errorf("%v of %d written", n, rep.Mentions)
		}
		return nil
	})
	close(stop)
	<-sampled
	// The window passes its budget by what arrives before the next flush
	// hands it back; at 5,000 topics a second and a 200 ms interval, that
	// is about 1,000 topics (under 0.5 MiB). Taking the spill back while
	// the store catches up never takes it past its budget.
	if peak > 2*budget {
		t.Errorf("window peaked at %.0f bytes through the outage and the catch-up, budget %d", peak, budget)
	}
	if n := testenv.Metric(t, e.sc.Registry(), "hotcount_aggregator_spill_bytes"); n != 0 {
		t.Errorf("%v bytes still spilled after everything was written", n)
	}
	if err := e.stop(); err != nil {
		t.Fatalf("shutdown: %v", err)
	}
	exact(t, e, rep)
	reg := e.sc.Registry()
	if n := testenv.Metric(t, reg, "hotcount_aggregator_shed_mentions_total"); n != 0 {
		t.Errorf("%v mentions shed", n)
	}
	t.Logf("spilled %v mentions; window peak %.0f bytes of a %d budget",
		testenv.Metric(t, reg, "hotcount_aggregator_spilled_mentions_total"), peak, budget)
}

// TestReliabilityShutdownStoreDownJetStream: the same in JetStream mode,
// with the store unreachable (writes in doubt) or refusing every write (an
// answer, nothing applied) at the final flush: the exit error says it
// could not write, the stream's checkpoint stays below what it read, and
// a second sidecar started once the store is back reads those mentions
// again and writes them: the table holds exactly what was published,
// whatever of it the first one's writes in doubt had applied.
func TestReliabilityShutdownStoreDownJetStream(t *testing.T) {
	for _, tc := range []struct {
		name       string
		fail, heal func(*ddbfault.Proxy)
	}{
		{"unreachable", func(p *ddbfault.Proxy) { p.SetOutage(time.Hour) }, (*ddbfault.Proxy).EndOutage},
		{"refused", func(p *ddbfault.Proxy) { p.SetWriteFailure(true) }, func(p *ddbfault.Proxy) { p.SetWriteFailure(false) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newFaultEnv(t, &ddbfault.Config{}, func(c *config.Config) {
				c.NATSMode = config.ModeJetStream
				c.FlushInterval = time.Hour
				c.DrainTimeout = time.Second
				c.ShutdownTimeout = 3 * time.Second
			})
			rep := publish(t, e.nats, loadgen.Config{Prefix: "mentions.", Topics: 10, Messages: 500, Count: 1, Seed: 51, JetStream: true})
			testenv.Eventually(t, 5*time.Second, func() error {
				if n := testenv.Metric(t, e.sc.Registry(), "hotcount_ingest_mentions_total"); n != float64(rep.Mentions) {
					return fmt.Errorf("%v of %d read", n, rep.Mentions)
				}
				return nil
			})
			tc.fail(e.fault)
			if err := e.stop(); err == nil {
				t.Fatal("shutdown returned nil with the store down: it claims to have written what it could not")
			}
			tc.heal(e.fault)

			second := newEnvOn(t, e, func(c *config.Config) { c.FlushInterval = 100 * time.Millisecond })
			consumerIdle(t, e)
			if err := second.stop(); err != nil {
				t.Fatal(err)
			}
			exact(t, e, rep)
		})
	}
}
