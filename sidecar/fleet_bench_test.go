package sidecar_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/hotcount/hotcount/config"
	"github.com/hotcount/hotcount/internal/testtools/ddbfault"
	"github.com/hotcount/hotcount/internal/testtools/testenv"
	"github.com/hotcount/hotcount/tools/loadgen"
)

// BenchmarkFleetWrites: 4 sidecars on one NATS server and one table take
// b.N mentions over 1,000 Zipf topics at 400 a second (a rate dynalite's
// writes keep up with in every mode: the store's own limit is not what is
// measured; each sidecar still sees the hottest topic every interval; run
// it with -benchtime 4000x for 10 s, 20 intervals), in each mode that
// shares the stream: queue (core NATS queue group), jetstream (one durable
// consumer shared by all) and partitioned (each topic's partition consumed
// by one sidecar). It reports the UpdateItem calls the table took while the
// mentions streamed in (counted at the table by the fault emulator, with no
// fault set): for the hottest topic per flush interval, and in total per
// second (intervals: one sidecar's flushes in that time). Shared modes
// write a hot topic once per interval per sidecar
// (about 4); partitioned mode about once for the whole fleet (target: at
// most 1.2).
func BenchmarkFleetWrites(b *testing.B) {
	const (
		sidecars = 4
		rate     = 400
		interval = 500 * time.Millisecond
	)
	for _, mode := range []string{config.ModeCore, config.ModeJetStream, config.ModePartitioned} {
		name := mode
		if mode == config.ModeCore {
			name = "queue"
		}
		b.Run(name, func(b *testing.B) {
			tune := func(c *config.Config) {
				c.NATSMode = mode
				c.FlushInterval = interval
				c.Partitions = 16
			}
			first := newFaultEnv(b, &ddbfault.Config{}, tune)
			fleet := []*env{first}
			for range sidecars - 1 {
				fleet = append(fleet, newEnvOn(b, first, func(c *config.Config) { tune(c); c.DataDir = b.TempDir() }))
			}
			if mode == config.ModePartitioned {
				waitOwned(b, fleet, 16)
			}
			flushes := func() float64 { return testenv.Metric(b, first.sc.Registry(), "hotcount_flusher_flushes_total") }
			before, flushedBefore := first.fault.Stats().Writes, flushes()
			b.ResetTimer()
			rep := publish(b, first.nats, loadgen.Config{Prefix: "mentions.", Topics: 1000, Zipf: 1.1, Messages: int64(b.N), Rate: rate, Count: 1, Seed: 31, JetStream: mode != config.ModeCore})
			b.StopTimer()
			elapsed := b.Elapsed()
			after, flushed := first.fault.Stats().Writes, flushes()-flushedBefore

			hottest, hotCount := "", int64(0)
			for topic, n := range rep.PerTopic {
				if n > hotCount {
					hottest, hotCount = topic, n
				}
			}
			var hot, total int
			for key, n := range after {
				n -= before[key]
				total += n
				if strings.HasPrefix(key, "TREND#"+hottest+"#") {
					hot += n
				}
			}
			// One sidecar's flushes in the window are the intervals (the
			// fleet flushes at the same rate, each on its own jittered
			// clock).
			b.ReportMetric(float64(hot)/flushed, "hot-writes/interval")
			b.ReportMetric(float64(total)/elapsed.Seconds(), "writes/s")
			b.ReportMetric(float64(hot)/elapsed.Seconds(), "hot-writes/s")
		})
	}
}

// waitOwned waits until the fleet consumes all n partitions.
func waitOwned(tb testing.TB, fleet []*env, n int) {
	testenv.Eventually(tb, 30*time.Second, func() error {
		var total float64
		for _, e := range fleet {
			total += testenv.Metric(tb, e.sc.Registry(), "hotcount_ingest_partitions_owned")
		}
		if int(total) != n {
			return fmt.Errorf("the fleet owns %v of %d partitions", total, n)
		}
		return nil
	})
}
