package sidecar_test

import (
	"fmt"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/hotcount/hotcount/config"
	"github.com/hotcount/hotcount/internal/testtools/crowds"
	"github.com/hotcount/hotcount/internal/testtools/testenv"
	"github.com/hotcount/hotcount/pipeline/trend"
)

// TestTrendingByContributorsAcrossTheFleet: two sidecars that each see
// part of the contributors rank the same list by contributors, the
// organic topic first and the flood out of it, with the organic topic's
// contributors within three standard errors of the 400 who mentioned it.
// In partitioned mode each topic has one writer, so the sidecars see the
// contributors of different topics; in core mode the queue group deals
// one topic's mentions to both, so each sees about half of its
// contributors, the two halves overlapping (each mentions it twice), and
// the fleet's merge of the two sketches counts each contributor once.
func TestTrendingByContributorsAcrossTheFleet(t *testing.T) {
	for _, mode := range []string{config.ModePartitioned, config.ModeCore} {
		t.Run(mode, func(t *testing.T) {
			tune := func(c *config.Config) {
				c.TrendingBy = string(trend.ByContributors)
				c.CacheTTL = time.Millisecond
				if mode == config.ModePartitioned {
					partitioned(8)(c)
				}
			}
			a := newEnv(t, tune)
			b := newEnvOn(t, a, func(c *config.Config) { c.DataDir = t.TempDir() })
			fleet := []*env{a, b}

			nc := testenv.Connect(t, a.nats)
			publish := crowds.Publisher(nc.Publish)
			if mode == config.ModePartitioned {
				js, err := jetstream.New(nc)
				if err != nil {
					t.Fatal(err)
				}
				sent := 0
				publish = func(subject string, payload []byte) error {
					// In windows of 1,000 acknowledgements: the stream takes
					// them at its pace, not the async publisher's stall limit.
					if sent++; sent%1000 == 0 {
						select {
						case <-js.PublishAsyncComplete():
						case <-time.After(time.Minute):
							return fmt.Errorf("the stream did not acknowledge 1,000 mentions within a minute")
						}
					}
					_, err := js.PublishAsync(subject, payload)
					return err
				}
				// Every partition owned. Which sidecar owns which is a draw
				// (rendezvous hashing of random ids): one of them owns all 8
				// once in 128 runs, and the other then ranks from its
				// summaries alone, which the lists' equality below checks
				// as well.
				testenv.Eventually(t, 20*time.Second, func() error {
					if counts, total := owned(t, a, b); total != 8 {
						return fmt.Errorf("partitions owned %v, want all 8", counts)
					}
					return nil
				})
			}
			sent, err := crowds.Script(publish, "mentions.", time.Now())
			if err != nil {
				t.Fatal(err)
			}
			if mode == config.ModePartitioned {
				js, _ := jetstream.New(nc)
				select {
				case <-js.PublishAsyncComplete():
				case <-time.After(time.Minute):
					t.Fatal("the stream did not take the script within a minute")
				}
			} else if err := nc.Flush(); err != nil {
				t.Fatal(err)
			}
			var total int64
			for _, n := range sent {
				total += n
			}
			testenv.Eventually(t, time.Minute, func() error {
				var got float64
				for _, e := range fleet {
					got += testenv.Metric(t, e.sc.Registry(), "hotcount_ingest_mentions_total")
				}
				if got != float64(total) {
					return fmt.Errorf("%v of %d mentions taken", got, total)
				}
				return nil
			})

			var lists [2][]trend.Entry
			testenv.Eventually(t, 30*time.Second, func() error {
				for i, e := range fleet {
					var tr trend.Trending
					getJSON(t, e, "/v1/trending?window=5m&limit=10", &tr)
					lists[i] = tr.Topics
				}
				if len(lists[0]) == 0 || lists[0][0].Topic != crowds.Organic {
					return fmt.Errorf("sidecar 0 ranks %+v", lists[0])
				}
				if !slices.Equal(lists[0], lists[1]) {
					return fmt.Errorf("sidecar 0 ranks %+v, sidecar 1 %+v", lists[0], lists[1])
				}
				return nil
			})
			t.Logf("trending by contributors, %s: %+v", mode, lists[0])
			for _, e := range lists[0] {
				if e.Topic == crowds.Flood {
					t.Errorf("the flood is listed: %+v", lists[0])
				}
			}
			organic := lists[0][0]
			if d := math.Abs(float64(organic.Contributors - crowds.OrganicContributors)); d > 3*trend.StandardError*crowds.OrganicContributors {
				t.Errorf("organic: %d contributors, %d mentioned it", organic.Contributors, crowds.OrganicContributors)
			}
			if organic.Count != sent[crowds.Organic] {
				t.Errorf("organic: count %d, %d published", organic.Count, sent[crowds.Organic])
			}
			// Each sidecar saw part: in core mode, both saw the organic topic.
			if mode == config.ModeCore {
				for i, e := range fleet {
					if n := testenv.Metric(t, e.sc.Registry(), "hotcount_ingest_mentions_total"); n == 0 || n == float64(total) {
						t.Errorf("sidecar %d took %v of %d mentions: the queue group did not share them", i, n, total)
					}
				}
			}
		})
	}
}
