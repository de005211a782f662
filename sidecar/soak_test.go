package sidecar_test

import (
	"context"
	"flag"
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/hotcount/hotcount/config"
	"github.com/hotcount/hotcount/internal/testtools/testenv"
	"github.com/hotcount/hotcount/tools/loadgen"
)

// soak is how long TestSoak runs; 0 (the default, as in make test) does not
// run it. make soak sets it.
var soak = flag.Duration("soak", 0, "run TestSoak for this long (make soak)")

// TestSoak publishes at a bounded rate (5,000 mentions/s over 1,000
// Zipf-skewed topics) for -soak, sampling the heap after GC every 5 s: the
// heap must stay flat (the last sample within 1.5× + 4 MiB of the first
// after warm-up) and the table must hold every mention.
func TestSoak(t *testing.T) {
	if *soak == 0 {
		t.Skip("a long run, not part of make test: make soak (go test -run TestSoak ./sidecar/ -soak=60s)")
	}
	e := newEnv(t, func(c *config.Config) { c.FlushInterval = 500 * time.Millisecond })
	nc := testenv.Connect(t, e.nats)
	sent := make(chan loadgen.Report, 1)
	go func() { // it stops by itself after -soak
		rep, err := loadgen.Run(context.Background(), nc, loadgen.Config{Prefix: "mentions.", Topics: 1000, Zipf: 1.1, Rate: 5000, Duration: *soak, Count: 1, Seed: 60})
		if err != nil {
			t.Error(err)
		}
		sent <- rep
	}()
	heap := func() uint64 {
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	var samples []uint64
	tick := time.NewTicker(5 * time.Second)
	defer tick.Stop()
	var rep loadgen.Report
	for done := false; !done; {
		select {
		case rep = <-sent:
			done = true
		case <-tick.C:
			samples = append(samples, heap())
		}
	}
	if err := e.stop(); err != nil {
		t.Fatal(err)
	}
	exact(t, e, rep)
	t.Logf("soak %s: %d mentions, heap samples (MiB) %v", *soak, rep.Mentions, mib(samples))
	if len(samples) >= 3 {
		first, last := samples[1], samples[len(samples)-1] // samples[0] is warm-up
		if float64(last) > 1.5*float64(first)+4<<20 {
			t.Errorf("heap grew from %d to %d bytes", first, last)
		}
	}
}

func mib(s []uint64) []string {
	out := make([]string, len(s))
	for i, v := range s {
		out[i] = fmt.Sprintf("%.1f", float64(v)/(1<<20))
	}
	return out
}
