package main

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/hotcount/hotcount/internal/testtools/testenv"
)

// longTailRate is the long tail: new topics a second, each seen once.
const longTailRate = 20_000

// BenchmarkLongTail is a real `hotcount run --store bolt` process (core
// mode, default settings otherwise) taking b.N mentions of b.N distinct
// topics, {"count":1} each, at a steady longTailRate a second (make bench:
// 3,000,000, 150 s). It reports:
//   - written-topics/s from a third of the way in to the end (mentions
//     written: each is a topic of its own), and keep-up, that over the
//     rate published in the same span (target: 1.00, keeping pace);
//   - buffered-at-end, the topics in the buffer when the load stops
//     (target: about two flush intervals' worth, 40,000), unwritten-at-end,
//     those and every other topic published and not yet written (in the
//     flush under way, on their way from NATS), and drain-s, how long they
//     take to be written;
//   - the process's anonymous RSS (its heap: the buffer, and bbolt's own
//     state) a third of the way in and the most it reached after (target:
//     flat), and its file-backed RSS at the end: the store's file, mapped
//     by bbolt, which grows with the topics it holds and which the kernel
//     may drop.
//
// Every mention must be written, none dropped.
func BenchmarkLongTail(b *testing.B) {
	ns := testenv.NATS(b)
	child := startChild(b, "--store", "bolt", "--data-dir", b.TempDir(), "--nats-url", ns.ClientURL(), "--log-level", "warn")
	defer func() { child.cmd.Process.Kill(); child.cmd.Wait() }() //nolint:errcheck // killed
	pub, err := nats.Connect(ns.ClientURL())
	if err != nil {
		b.Fatal(err)
	}
	defer pub.Close()
	peak := sampleRSS(child.cmd.Process.Pid)
	one := []byte(`{"count":1}`) // what producers send
	const tick = 10 * time.Millisecond
	perTick := longTailRate * int(tick) / int(time.Second)
	var third, maxAnon, thirdWritten float64
	var thirdAt time.Time
	thirdSent, lastSample := 0, time.Now()
	b.ResetTimer()
	start := time.Now()
	for i := 0; i < b.N; {
		for end := min(i+perTick, b.N); i < end; i++ {
			pub.Publish("mentions.tail-"+strconv.Itoa(i), one) //nolint:errcheck // checked by the count
		}
		switch {
		case i == b.N/3/perTick*perTick:
			third = rss(b, child, "RssAnon")
			thirdWritten, thirdAt, thirdSent = child.metric(b, "hotcount_flusher_flushed_mentions_total"), time.Now(), i
		case thirdSent > 0 && time.Since(lastSample) > time.Second:
			maxAnon, lastSample = max(maxAnon, rss(b, child, "RssAnon")), time.Now()
		}
		time.Sleep(time.Until(start.Add(time.Duration(i/perTick) * tick)))
	}
	pub.Flush() //nolint:errcheck // checked by the count
	loaded := time.Since(start)
	flushed := child.metric(b, "hotcount_flusher_flushed_mentions_total")
	span := time.Since(thirdAt).Seconds()
	rate, offered := (flushed-thirdWritten)/span, float64(b.N-thirdSent)/span
	unwritten := float64(b.N) - flushed
	buffered := child.metric(b, "hotcount_aggregator_buffered_topics")
	endAnon, endFile := rss(b, child, "RssAnon"), rss(b, child, "RssFile")
	maxAnon = max(maxAnon, endAnon)
	testenv.EventuallyEvery(b, 5*time.Minute, 10*time.Millisecond, func() error { // the drain's time is a figure
		if f := child.metric(b, "hotcount_flusher_flushed_mentions_total"); f < float64(b.N) {
			return fmt.Errorf("%v of %d written", f, b.N)
		}
		return nil
	})
	drain := time.Since(start) - loaded
	b.StopTimer()
	body, err := child.get("/metrics")
	if err != nil {
		b.Fatal(err)
	}
	for _, lost := range []string{`hotcount_ingest_dropped_total{cause="slow_consumer"} 0`, "hotcount_aggregator_shed_mentions_total 0"} {
		if !strings.Contains(body, lost+"\n") {
			b.Errorf("mentions lost: want %s", lost)
		}
	}
	b.ReportMetric(loaded.Seconds(), "load-s")
	b.ReportMetric(rate, "written-topics/s")
	b.ReportMetric(rate/offered, "keep-up")
	b.ReportMetric(unwritten, "unwritten-at-end")
	b.ReportMetric(buffered, "buffered-at-end")
	b.ReportMetric(drain.Seconds(), "drain-s")
	b.ReportMetric(third/1024, "third-anon-RSS-MiB")
	b.ReportMetric(maxAnon/1024, "max-anon-RSS-MiB")
	b.ReportMetric(endFile/1024, "end-file-RSS-MiB")
	b.ReportMetric(float64(peak())/1024, "peak-RSS-MiB")
}

// rss reads one of the RSS lines of the child's /proc status (RssAnon,
// RssFile), in KiB.
func rss(b *testing.B, c *child, field string) float64 {
	n, err := statusKiB(c.cmd.Process.Pid, field)
	if err != nil {
		b.Fatal(err)
	}
	return float64(n)
}
