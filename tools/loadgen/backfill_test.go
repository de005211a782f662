package loadgen_test

import (
	"context"
	"fmt"
	"maps"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/hotcount/hotcount/client"
	"github.com/hotcount/hotcount/config"
	"github.com/hotcount/hotcount/internal/testtools/testenv"
	"github.com/hotcount/hotcount/internal/testtools/testenv/sidecartest"
	"github.com/hotcount/hotcount/mention"
	"github.com/hotcount/hotcount/pipeline/ingest"
	"github.com/hotcount/hotcount/schema"
	"github.com/hotcount/hotcount/sidecar"
	"github.com/hotcount/hotcount/tools/loadgen"
)

// startSidecar starts a sidecar in mode on the NATS server at url, writing
// to a new table of d with minute and hour buckets, flushing every 50 ms,
// and waits until it takes mentions. It stops when the test ends.
func startSidecar(t *testing.T, url, mode string, d *testenv.Dynalite) (*sidecar.Sidecar, string) {
	t.Helper()
	testenv.AWSEnv(t)
	cfg := config.Default()
	cfg.NATSURL, cfg.NATSMode = url, mode
	cfg.DynamoDBEndpoint, cfg.Table = d.Endpoint, d.Table(t, "hotcount-"+mode)
	cfg.HTTPAddr, cfg.AdminAddr = "127.0.0.1:0", "127.0.0.1:0"
	cfg.FlushInterval = 50 * time.Millisecond
	cfg.DataDir = t.TempDir()
	cfg.Windows = config.DevWindows
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	if cfg.Durable() {
		if _, err := ingest.EnsureStream(context.Background(), testenv.Connect(t, url), cfg.Stream, cfg.Subject, mention.DefaultDuplicateWindow); err != nil {
			t.Fatal(err)
		}
	}
	sc := sidecartest.Run(t, cfg, zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel)))
	return sc.Sidecar, cfg.Table
}

// flushed waits until sc has written n mentions, and no more.
func flushed(t *testing.T, sc *sidecar.Sidecar, n int64) {
	t.Helper()
	testenv.Eventually(t, 30*time.Second, func() error {
		if got := testenv.Metric(t, sc.Registry(), "hotcount_flusher_flushed_mentions_total"); got != float64(n) {
			return fmt.Errorf("%v of %d mentions written", got, n)
		}
		return nil
	})
}

// buckets is what a topic's minute and hour buckets should hold.
type buckets map[testenv.Bucket]int64

func (b buckets) add(topic string, at time.Time, n int64) {
	b[testenv.Bucket{Topic: topic, G: schema.Minute, Index: schema.Minute.Index(at)}] += n
	b[testenv.Bucket{Topic: topic, G: schema.Hour, Index: schema.Hour.Index(at)}] += n
}

// TestMentionsAtLandInTheirBuckets: mentions published with an "at" (Unix
// milliseconds from the Go client, RFC 3339 strings from a bare NATS
// publish) are counted in exactly the minute and hour buckets of their
// time, however old within --max-lateness, and in their totals; an "at"
// past the bound (too old, too far ahead) or not a time is refused:
// counted under reason "at", dead-lettered with that reason, and in no
// count. Core mode judges "at" against the arrival, JetStream mode against
// the publication.
func TestMentionsAtLandInTheirBuckets(t *testing.T) {
	d := testenv.StartDynalite(t)
	for _, mode := range []string{config.ModeCore, config.ModeJetStream} {
		t.Run(mode, func(t *testing.T) {
			ns := testenv.NATS(t)
			sc, table := startSidecar(t, ns.ClientURL(), mode, d)
			nc := testenv.Connect(t, ns.ClientURL())
			dlq, err := nc.SubscribeSync(ingest.DefaultDeadLetterSubject)
			if err != nil {
				t.Fatal(err)
			}
			opts := []client.PublisherOption{}
			if mode == config.ModeCore {
				opts = append(opts, client.WithCoreNATS())
			}
			pub, err := client.NewPublisher(nc, opts...)
			if err != nil {
				t.Fatal(err)
			}

			now := time.Now()
			want := buckets{}
			totals := map[string]int64{}
			ctx := context.Background()
			for i, ago := range []time.Duration{23 * time.Hour, 3*time.Hour + 17*time.Minute, 61 * time.Minute, 59 * time.Second, 0, -30 * time.Second} {
				at := now.Add(-ago)
				for k := range 3 { // the same time three times: one message (of 6)
					topic := fmt.Sprint("at-", i%2)
					if err := pub.MentionAt(ctx, topic, int64(k+1), at); err != nil {
						t.Fatal(err)
					}
					want.add(topic, at, int64(k+1))
					totals[topic] += int64(k + 1)
				}
			}
			if err := pub.Close(ctx); err != nil {
				t.Fatal(err)
			}
			// RFC 3339, with a fraction and a zone, and null: no "at".
			publish := func(subject, payload string) {
				t.Helper()
				if mode == config.ModeCore {
					err = nc.Publish(subject, []byte(payload))
				} else {
					_, err = nc.Request(subject, []byte(payload), 5*time.Second) // the stream's acknowledgement
				}
				if err != nil {
					t.Fatal(err)
				}
			}
			rfc := now.Add(-90 * time.Minute).Truncate(time.Millisecond)
			publish("mentions.rfc", fmt.Sprintf(`{"count": 4, "at": %q}`, rfc.In(time.FixedZone("", 5*3600+1800)).Format(time.RFC3339Nano)))
			want.add("rfc", rfc, 4)
			totals["rfc"] += 4
			before := time.Now()
			publish("mentions.untimed", `{"count": 2, "at": null}`)
			publish("mentions.untimed", ``)
			totals["untimed"] += 3
			// Refused: too old, too far ahead, not a time.
			for _, payload := range []string{
				fmt.Sprintf(`{"count": 5, "at": %d}`, now.Add(-mention.DefaultMaxLateness-time.Minute).UnixMilli()),
				fmt.Sprintf(`{"count": 5, "at": %q}`, now.Add(mention.MaxAhead+time.Minute).Format(time.RFC3339)),
				`{"count": 5, "at": "yesterday"}`,
			} {
				publish("mentions.refused", payload)
			}
			if err := nc.Flush(); err != nil {
				t.Fatal(err)
			}
			var sum int64
			for _, n := range totals {
				sum += n
			}
			flushed(t, sc, sum)
			after := time.Now()

			for range 3 {
				m, err := dlq.NextMsg(10 * time.Second)
				if err != nil {
					t.Fatalf("dead letters: %v", err)
				}
				if m.Header.Get(ingest.ErrorHeader) != mention.ReasonAt || m.Header.Get(ingest.SubjectHeader) != "mentions.refused" {
					t.Errorf("dead letter %s with headers %v, want reason %q", m.Data, m.Header, mention.ReasonAt)
				}
			}
			if n := testenv.MetricWith(t, sc.Registry(), "hotcount_ingest_invalid_total", "reason", mention.ReasonAt); n != 3 {
				t.Errorf("%v messages rejected for their at, want 3", n)
			}

			// A flush counts its mentions flushed when their totals are
			// written; a bucket's write of the same flush may still be on
			// its way (a retry): wait for the table, not the metric.
			testenv.Eventually(t, 10*time.Second, func() error {
				got, _ := d.Buckets(t, table)
				// The untimed mentions are in the minute of their
				// publication or arrival: one between before and after.
				for b, n := range got {
					if b.Topic != "untimed" {
						continue
					}
					delete(got, b)
					lo, hi := b.G.Index(before), b.G.Index(after)
					if b.Index < lo || b.Index > hi || n != 3 {
						return fmt.Errorf("untimed: bucket %+v holds %d, want 3 in %d..%d", b, n, lo, hi)
					}
				}
				if !maps.Equal(got, map[testenv.Bucket]int64(want)) {
					return fmt.Errorf("buckets:\n got %v\nwant %v", got, want)
				}
				return nil
			})
			gotTotals, _ := d.Counts(t, table)
			if !maps.Equal(gotTotals, totals) {
				t.Errorf("totals %v, want %v", gotTotals, totals)
			}
		})
	}
}

// TestBackfillStampsTheRun: a backfill publishes its run at once, each
// message stamped with its time in the Duration before the start: every
// minute bucket holds the mentions the run's pace puts in it, and the
// totals are the report.
func TestBackfillStampsTheRun(t *testing.T) {
	d := testenv.StartDynalite(t)
	ns := testenv.NATS(t)
	sc, table := startSidecar(t, ns.ClientURL(), config.ModeJetStream, d)
	cfg := loadgen.Config{Prefix: "mentions.", Topics: 20, Rate: 50, Duration: 3 * time.Minute, Count: 2, Seed: 3,
		Surge: "surge", SurgeRate: 20, SurgeAfter: 2 * time.Minute, JetStream: true, Backfill: true}
	start := time.Now()
	rep, err := loadgen.Run(context.Background(), testenv.Connect(t, ns.ClientURL()), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > cfg.Duration/2 {
		t.Errorf("a backfill of %s took %s", cfg.Duration, took)
	}
	if rep.To.Sub(rep.From) != cfg.Duration || rep.To.Before(start) || rep.To.After(time.Now()) {
		t.Errorf("stamped from %s to %s, want the %s before the run's start", rep.From, rep.To, cfg.Duration)
	}
	flushed(t, sc, rep.Mentions)

	// The run's pace: up to a slot's end, int(rate × elapsed) messages (and
	// the surge's after it starts), each stamped with its slot's end.
	want := map[int64]int64{} // minute -> mentions
	surgeWant := map[int64]int64{}
	var sent, surged int64
	for e := 10 * time.Millisecond; e <= cfg.Duration; e += 10 * time.Millisecond {
		m := schema.Minute.Index(rep.From.Add(e))
		if e > cfg.SurgeAfter {
			n := int64(float64(cfg.SurgeRate)*(e-cfg.SurgeAfter).Seconds()) - surged
			surged += n
			surgeWant[m] += n * cfg.Count
		}
		n := int64(float64(cfg.Rate)*e.Seconds()) - sent
		sent += n
		want[m] += n * cfg.Count
	}
	got := map[int64]int64{}
	gotSurge := map[int64]int64{}
	perTopic := map[string]int64{}
	buckets, _ := d.Buckets(t, table)
	for b, n := range buckets {
		switch {
		case b.G == schema.Hour:
			continue
		case b.Topic == "surge":
			gotSurge[b.Index] += n
		default:
			got[b.Index] += n
		}
		perTopic[b.Topic] += n
	}
	if !maps.Equal(got, want) {
		t.Errorf("steady topics' mentions by minute: got %v, want %v", got, want)
	}
	if !maps.Equal(gotSurge, surgeWant) {
		t.Errorf("surge by minute: got %v, want %v", gotSurge, surgeWant)
	}
	if !maps.Equal(perTopic, rep.PerTopic) {
		t.Errorf("minute buckets by topic %v, the report %v", perTopic, rep.PerTopic)
	}
	totals, _ := d.Counts(t, table)
	if !maps.Equal(totals, rep.PerTopic) {
		t.Errorf("totals %v, the report %v", totals, rep.PerTopic)
	}
}
