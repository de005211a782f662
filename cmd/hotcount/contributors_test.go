package main

import (
	"encoding/json"
	"fmt"
	"math"
	"net"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/hotcount/hotcount/internal/testtools/crowds"
	"github.com/hotcount/hotcount/internal/testtools/testenv"
	"github.com/hotcount/hotcount/pipeline/trend"
)

// TestTrendingByContributors is issue 38 tried as a new user would, with
// `hotcount dev`: over a steady background of 40 topics from 1,000
// contributors, three contributors flood one topic with 30,000 mentions
// while 400 contributors mention another twice each (package crowds).
// Ranked by mentions (the default) the flood is first and the organic
// topic second, as before; with --trending-by contributors the organic
// topic is first and the flood is not listed at all (3 contributors, under
// --trending-min-contributors' 5). Either way, both topics' windowed
// counts are exact, and the organic topic's contributors are 400 within
// the sketch's error.
func TestTrendingByContributors(t *testing.T) {
	for _, by := range []string{"mentions", "contributors"} {
		t.Run(by, func(t *testing.T) {
			_, natsPort, _ := net.SplitHostPort(freeAddr(t))
			httpAddr, adminAddr := freeAddr(t), freeAddr(t)
			stop := startDev(t, t.TempDir(), natsPort, httpAddr, adminAddr, "--trending-by", by)
			defer stop()

			nc := testenv.Connect(t, "nats://127.0.0.1:"+natsPort)
			sent, err := crowds.Script(nc.Publish, "mentions.", time.Now())
			if err != nil {
				t.Fatal(err)
			}
			if err := nc.Flush(); err != nil {
				t.Fatal(err)
			}
			get := func(path string, v any) error {
				resp, err := http.Get("http://" + httpAddr + path)
				if err != nil {
					return err
				}
				defer resp.Body.Close()
				if resp.StatusCode != 200 {
					return fmt.Errorf("GET %s: %s", path, resp.Status)
				}
				return json.NewDecoder(resp.Body).Decode(v)
			}
			// The script's last 5 minutes are in the window: the flood and the
			// organic topic entirely.
			for _, topic := range []string{crowds.Flood, crowds.Organic} {
				testenv.Eventually(t, 30*time.Second, func() error {
					var c trend.Count
					if err := get("/v1/topics/"+topic+"?window=5m", &c); err != nil {
						return err
					}
					if c.Count != sent[topic] {
						return fmt.Errorf("%s over 5m: %d, %d published", topic, c.Count, sent[topic])
					}
					return nil
				})
			}
			var list trend.Trending
			testenv.Eventually(t, 30*time.Second, func() error {
				if err := get("/v1/trending?window=5m&limit=10", &list); err != nil {
					return err
				}
				if len(list.Topics) < 2 {
					return fmt.Errorf("trending: %+v (%s)", list.Topics, list.Note)
				}
				return nil
			})
			t.Logf("trending by %s: %+v", by, list.Topics)
			names := make([]string, len(list.Topics))
			for i, e := range list.Topics {
				names[i] = e.Topic
			}
			organic := list.Topics[slices.Index(names, crowds.Organic)]
			if by == "mentions" {
				if names[0] != crowds.Flood || names[1] != crowds.Organic {
					t.Fatalf("by mentions the list is %v, want the flood first and the organic topic second", names)
				}
			} else {
				if names[0] != crowds.Organic {
					t.Fatalf("by contributors the list is %v, want the organic topic first", names)
				}
				if slices.Contains(names[:min(5, len(names))], crowds.Flood) {
					t.Fatalf("by contributors the flood is in the top 5: %v", names)
				}
			}
			if organic.Count != sent[crowds.Organic] {
				t.Errorf("organic: count %d in the list, %d published", organic.Count, sent[crowds.Organic])
			}
			// Three standard errors of the sketch.
			if d := math.Abs(float64(organic.Contributors - crowds.OrganicContributors)); d > 3*trend.StandardError*crowds.OrganicContributors {
				t.Errorf("organic: %d contributors, %d mentioned it", organic.Contributors, crowds.OrganicContributors)
			}
		})
	}
}
