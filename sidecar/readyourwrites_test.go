package sidecar_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/hotcount/hotcount/config"
	"github.com/hotcount/hotcount/internal/testtools/ddbfault"
	"github.com/hotcount/hotcount/internal/testtools/testenv"
	"github.com/hotcount/hotcount/pipeline/store"
	"github.com/hotcount/hotcount/schema"
	"github.com/hotcount/hotcount/tools/loadgen"
)

// TestReadYourWritesNeverGoesBack, in core and JetStream mode:
// a reader polls
// GET /v1/topics/topic-0?include=pending next to a publisher of that topic
// (2,000 mentions/s), through flushes every 50 ms, a shard raise by another
// writer and a store blip. No answer is lower than the one before. Each is
// at least what this sidecar (the only one) had accepted before the read,
// except during the blip and while a write is unsettled (in doubt,
// hotcount_flusher_pending_writes): until it settles the answer
// holds at the one before, as docs/API.md says of include=pending. A load
// that overlaps one of this sidecar's writes on its way waits for the write
// to land and reads again, so it needs no such allowance.
func TestReadYourWritesNeverGoesBack(t *testing.T) {
	for _, mode := range []string{config.ModeCore, config.ModeJetStream} {
		t.Run(mode, func(t *testing.T) { readYourWrites(t, mode) })
	}
}

func readYourWrites(t *testing.T, mode string) {
	e := newFaultEnv(t, &ddbfault.Config{}, func(c *config.Config) {
		c.NATSMode = mode
		c.FlushInterval = 50 * time.Millisecond
		c.CacheTTL = 100 * time.Millisecond
		c.FlushTimeout, c.WriteTimeout = time.Second, time.Second
	})
	url := "http://" + e.sc.HTTPAddr() + "/v1/topics/topic-0?include=pending"
	var lastBody string
	read := func() (int64, error) {
		resp, err := http.Get(url)
		if err != nil {
			return 0, err
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return 0, fmt.Errorf("status %s", resp.Status)
		}
		raw, err := io.ReadAll(resp.Body)
		if err != nil {
			return 0, err
		}
		var body struct {
			Count int64 `json:"count"`
		}
		err = json.Unmarshal(raw, &body)
		lastBody = string(raw)
		return body.Count, err
	}

	var wg sync.WaitGroup
	published := make(chan loadgen.Report, 1)
	var publishing atomic.Bool // the publisher still runs
	publishing.Store(true)
	wg.Go(func() {
		defer publishing.Store(false)
		// JetStream publishes report what the stream stored.
		published <- publish(t, e.nats, loadgen.Config{Prefix: "mentions.", Topics: 1, Rate: 2000, Duration: 4 * time.Second, Count: 1, Seed: 70, JetStream: mode == config.ModeJetStream})
	})
	wg.Go(func() { // another writer raises the topic to 4 shards mid-run
		if err := testenv.Poll(10*time.Second, func() error { // once about a second of mentions is in
			if n := testenv.Metric(t, e.sc.Registry(), "hotcount_ingest_mentions_total"); n < 2000 {
				return fmt.Errorf("%v mentions accepted before the raise, want 2000", n)
			}
			return nil
		}); err != nil {
			t.Error(err)
			return
		}
		st := store.NewDynamoDB(e.dyn.Client(), e.cfg.Table, store.NewMetrics(prometheus.NewRegistry()))
		if err := st.SetMeta(context.Background(), "topic-0", schema.Meta{}, schema.Meta{}.With(4)); err != nil {
			t.Errorf("raise: %v", err)
		}
	})
	blipFrom := time.Now().Add(2 * time.Second)
	var blipEnded atomic.Int64 // when the outage ended (Unix ns; 0: not yet)
	wg.Go(func() {             // and the store drops out for a moment
		// The blip is on the clock the reads below check against, and its
		// length is what it tests: the point of the test is the wait.
		time.Sleep(time.Until(blipFrom))
		e.fault.SetOutage(time.Hour)
		time.Sleep(300 * time.Millisecond)
		e.fault.EndOutage()
		blipEnded.Store(time.Now().UnixNano())
	})
	// A read overlaps the blip if it was served between the outage's start
	// and half a second after its end (time for doubts to settle), as the
	// outage really ran: on a loaded machine it ends late.
	inBlip := func(start, end time.Time) bool {
		to := time.Now().Add(time.Hour)
		if n := blipEnded.Load(); n != 0 {
			to = time.Unix(0, n).Add(500 * time.Millisecond)
		}
		return !end.Before(blipFrom) && !start.After(to)
	}

	var last int64
	reads, blips := 0, 0
	// Reads served while mentions were being published, and reads tried
	// while the store was away (served or failed): the run must have both.
	whilePublishing, overBlip := 0, 0
	// Reads for 5 s, over the publishing and the blip, and on until 100
	// reads are in (a loaded machine served 31 in the 5 s): each later one
	// checks the same, against a count the flushes still raise.
	deadline, enough := time.Now().Add(5*time.Second), time.Now().Add(time.Minute)
	// A write whose answer was lost holds the answer at its last value
	// until it settles (docs/API.md, include=pending): reads while one is
	// unsettled may be below what was accepted, never below the last.
	unsettled := func() bool {
		return testenv.Metric(t, e.sc.Registry(), "hotcount_flusher_pending_writes") > 0
	}
	for time.Now().Before(deadline) || reads < 100 && time.Now().Before(enough) {
		accepted := int64(testenv.Metric(t, e.sc.Registry(), "hotcount_ingest_mentions_total"))
		doubtBefore := unsettled()
		start, wasPublishing := time.Now(), publishing.Load()
		got, err := read()
		blip := inBlip(start, time.Now())
		if blip {
			overBlip++
		}
		if err != nil {
			blips++ // a miss while the store is away may fail; a cached total does not
			continue
		}
		reads++
		if wasPublishing {
			whilePublishing++
		}
		if got < accepted && !blip && !doubtBefore && !unsettled() {
			t.Errorf("read %d: %d, but %d mentions were accepted before it: %s", reads, got, accepted, lastBody)
			break // not Fatal: the publisher and the blip still run, and wg.Wait below waits for them
		}
		if got < last {
			t.Errorf("read %d: %d after %d: the count went back: %s", reads, got, last, lastBody)
			break
		}
		last = got
	}
	wg.Wait()
	rep := <-published
	if reads < 100 || whilePublishing < 10 || overBlip == 0 {
		t.Errorf("%d reads, %d while publishing (want 100 and 10), %d during the store's blip (want one)", reads, whilePublishing, overBlip)
	}
	// Once everything is written the answer is exactly what was
	// published: no read along the way held an over-count.
	testenv.Eventually(t, 10*time.Second, func() error {
		got, err := read()
		if err != nil {
			return err
		}
		if got != rep.Mentions {
			return fmt.Errorf("reads %d, published %d", got, rep.Mentions)
		}
		return nil
	})
	if err := e.stop(); err != nil {
		t.Fatalf("shutdown: %v", err)
	}
	exact(t, e, rep)
	t.Logf("%d reads (%d while publishing, %d failed during the blip), last %d of %d published", reads, whilePublishing, blips, last, rep.Mentions)
}
