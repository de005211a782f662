package sidecar_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/hotcount/hotcount/config"
	"github.com/hotcount/hotcount/internal/testtools/testenv"
	"github.com/hotcount/hotcount/tools/loadgen"
)

// TestFleetSharesGathers: two sidecars with --share-totals under a read
// storm on one topic (100 ms TTL, 2 s) gather it about once per TTL
// between them, not once per TTL each, and both serve the right total.
func TestFleetSharesGathers(t *testing.T) {
	tune := func(c *config.Config) {
		c.ShareTotals = "true"
		c.CacheTTL = 100 * time.Millisecond
	}
	a := newEnv(t, tune)
	b := newEnvOn(t, a, func(c *config.Config) { tune(c); c.DataDir = t.TempDir() })
	rep := publish(t, a.nats, loadgen.Config{Prefix: "mentions.", Topics: 1, Messages: 500, Count: 1, Seed: 90})
	testenv.Eventually(t, 10*time.Second, func() error {
		for _, e := range []*env{a, b} {
			if got := lookupCount(t, e); got != rep.Mentions {
				return fmt.Errorf("a sidecar reads %d, want %d", got, rep.Mentions)
			}
		}
		return nil
	})
	gathers := func() float64 {
		return testenv.Metric(t, a.sc.Registry(), "hotcount_store_gathers_total") + testenv.Metric(t, b.sc.Registry(), "hotcount_store_gathers_total")
	}
	before, begun := gathers(), time.Now()
	var wg sync.WaitGroup
	for _, e := range []*env{a, b} {
		for range 4 {
			wg.Go(func() {
				for time.Since(begun) < 2*time.Second {
					if got := lookupCount(t, e); got != rep.Mentions {
						t.Errorf("read %d during the storm, want %d", got, rep.Mentions)
						return
					}
				}
			})
		}
	}
	wg.Wait()
	ttls := float64(time.Since(begun)) / float64(a.cfg.CacheTTL)
	perTTL := (gathers() - before) / ttls
	t.Logf("%.2f gathers per TTL for the two sidecars", perTTL)
	if perTTL > 1.5 {
		t.Errorf("%.2f gathers per TTL for two sidecars sharing totals, want about 1 (at most 1.5)", perTTL)
	}
}

func lookupCount(t *testing.T, e *env) int64 {
	resp, err := http.Get("http://" + e.sc.HTTPAddr() + "/v1/topics/topic-0")
	if err != nil {
		t.Error(err)
		return -1
	}
	defer resp.Body.Close()
	var body struct {
		Count int64 `json:"count"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		t.Error(err)
		return -1
	}
	return body.Count
}
