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

	"github.com/hotcount/hotcount/internal/testenv"
)

// rssKiB reads a process's resident set size.
func rssKiB(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			return strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		}
	}
	return 0, fmt.Errorf("no VmRSS for pid %d", pid)
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
	testenv.Eventually(b, 2*time.Minute, func() error {
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
