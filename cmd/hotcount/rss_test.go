package main

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/hotcount/hotcount/internal/testtools/testenv"
)

// rssKiB reads a process's resident set size.
func rssKiB(pid int) (int64, error) { return statusKiB(pid, "VmRSS") }

// statusKiB reads one of the kB lines of a process's /proc status (VmRSS,
// RssAnon, RssFile).
func statusKiB(pid int, field string) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			return strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		}
	}
	return 0, fmt.Errorf("no %s for pid %d", field, pid)
}

// BenchmarkSidecarRSS is the memory of a real `hotcount run` process (core
// mode, embedded store): its RSS at idle, and the most it reaches while it
// takes b.N mentions over 1,000 topics from a full-speed publisher and
// flushes them. Run with a large -benchtime Nx (make bench: 1000000x).
func BenchmarkSidecarRSS(b *testing.B) {
	ns := testenv.NATS(b)
	child := startChild(b, "--store", "bolt", "--data-dir", b.TempDir(), "--nats-url", ns.ClientURL(), "--log-level", "warn")
	defer func() { child.cmd.Process.Kill(); child.cmd.Wait() }() //nolint:errcheck // killed
	time.Sleep(time.Second)                                       // settle: the idle figure is the point
	idle, err := rssKiB(child.cmd.Process.Pid)
	if err != nil {
		b.Fatal(err)
	}
	var peak atomic.Int64
	var wg sync.WaitGroup
	stop := make(chan struct{})
	wg.Go(func() {
		for {
			if r, err := rssKiB(child.cmd.Process.Pid); err == nil && r > peak.Load() {
				peak.Store(r)
			}
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	})
	pub, err := nats.Connect(ns.ClientURL())
	if err != nil {
		b.Fatal(err)
	}
	defer pub.Close()
	subjects := make([]string, 1000)
	for i := range subjects {
		subjects[i] = "mentions.topic-" + strconv.Itoa(i)
	}
	b.ResetTimer()
	for i := range b.N {
		pub.Publish(subjects[i%len(subjects)], nil) //nolint:errcheck // flushed below
	}
	pub.Flush() //nolint:errcheck // checked by the count
	testenv.EventuallyEvery(b, 2*time.Minute, 10*time.Millisecond, func() error {
		body, err := child.get("/metrics")
		if err != nil {
			return err
		}
		// Prometheus' text format writes floats as strconv's 'g' does.
		want := "hotcount_flusher_flushed_mentions_total " + strconv.FormatFloat(float64(b.N), 'g', -1, 64) + "\n"
		if !strings.Contains(body, want) {
			return fmt.Errorf("not all %d flushed yet", b.N)
		}
		return nil
	})
	b.StopTimer()
	close(stop)
	wg.Wait()
	b.ReportMetric(float64(idle)/1024, "idle-RSS-MiB")
	b.ReportMetric(float64(peak.Load())/1024, "peak-RSS-MiB")
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "mentions/s")
}

// sampleRSS samples pid's RSS every 20 ms until the returned stop, which
// gives the peak.
func sampleRSS(pid int) (stop func() (peakKiB int64)) {
	var peak atomic.Int64
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			if r, err := rssKiB(pid); err == nil && r > peak.Load() {
				peak.Store(r)
			}
			select {
			case <-done:
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	})
	return func() int64 { close(done); wg.Wait(); return peak.Load() }
}

// BenchmarkOutageRSS is a real `hotcount run` process (core mode) whose
// DynamoDB is unreachable (nothing listens at its endpoint) taking b.N
// mentions of b.N distinct topics (make bench: 2,000,000). "spill" runs
// with the manifests' 256 MiB memory limit and the default budget: the
// window goes to the spill folder and the peak RSS must stay under the
// limit. "memory" runs with no limit and no spill, everything in memory:
// its B/topic is the peak RSS over the idle one per buffered topic, beyond
// the topic's own bytes. Both must take every mention (no slow-consumer
// drop, nothing shed).
func BenchmarkOutageRSS(b *testing.B) {
	for _, mode := range []struct {
		name string
		args []string
	}{
		{"spill", []string{"--memory-limit", "256Mi"}},
		{"memory", []string{"--memory-limit", "none", "--buffer-memory", "none", "--spill-max-bytes", "0"}},
	} {
		b.Run(mode.name, func(b *testing.B) {
			ns := testenv.NATS(b)
			b.Setenv("AWS_ACCESS_KEY_ID", "x")
			b.Setenv("AWS_SECRET_ACCESS_KEY", "x")
			b.Setenv("AWS_REGION", "us-east-1")
			args := append([]string{"--dynamodb-endpoint", "http://" + freeAddr(b), "--data-dir", b.TempDir(),
				"--nats-url", ns.ClientURL(), "--log-level", "error"}, mode.args...)
			child := startChild(b, args...)
			defer func() { child.cmd.Process.Kill(); child.cmd.Wait() }() //nolint:errcheck // killed
			time.Sleep(time.Second)
			idle, err := rssKiB(child.cmd.Process.Pid)
			if err != nil {
				b.Fatal(err)
			}
			peak := sampleRSS(child.cmd.Process.Pid)
			pub, err := nats.Connect(ns.ClientURL())
			if err != nil {
				b.Fatal(err)
			}
			defer pub.Close()
			one := []byte(`{"count":1}`) // what producers send
			b.ResetTimer()
			var topicBytes int64
			for i := range b.N {
				topic := "topic-" + strconv.Itoa(i)
				topicBytes += int64(len(topic))
				pub.Publish("mentions."+topic, one) //nolint:errcheck // flushed below
				if i%10_000 == 9_999 {
					// A steady 100-200k new topics a second: a long tail,
					// not a burst that only measures NATS's buffers.
					pub.Flush() //nolint:errcheck // checked by the count
					time.Sleep(50 * time.Millisecond)
				}
			}
			pub.Flush() //nolint:errcheck // checked by the count
			var body string
			testenv.Eventually(b, 2*time.Minute, func() error {
				body, err = child.get("/metrics")
				if err != nil {
					return err
				}
				if !strings.Contains(body, "hotcount_ingest_mentions_total "+strconv.FormatFloat(float64(b.N), 'g', -1, 64)+"\n") {
					return fmt.Errorf("not all %d taken yet", b.N)
				}
				return nil
			})
			// A few failed flushes (and spills) more: the peak is what the
			// outage holds, not only what taking the mentions did.
			const failedFlushes = `hotcount_flusher_flushes_total{result="error"}`
			before := child.metric(b, failedFlushes)
			testenv.Eventually(b, time.Minute, func() error {
				if n := child.metric(b, failedFlushes) - before; n < 3 {
					return fmt.Errorf("%v failed flushes since every mention was taken", n)
				}
				return nil
			})
			b.StopTimer()
			top := peak()
			for _, lost := range []string{`hotcount_ingest_dropped_total{cause="slow_consumer"} 0`, "hotcount_aggregator_shed_mentions_total 0"} {
				if !strings.Contains(body, lost+"\n") {
					b.Errorf("mentions lost: want %s", lost)
				}
			}
			b.ReportMetric(float64(top)/1024, "peak-RSS-MiB")
			b.ReportMetric(float64(idle)/1024, "idle-RSS-MiB")
			b.ReportMetric(float64((top-idle)*1024-topicBytes)/float64(b.N), "B/topic")
			if mode.name == "spill" && top > 256*1024 {
				b.Errorf("peak RSS %d KiB, past the 256 MiB limit", top)
			}
		})
	}
}
