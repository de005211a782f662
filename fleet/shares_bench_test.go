package fleet_test

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/hotcount/hotcount/fleet"
	"github.com/hotcount/hotcount/internal/testtools/testenv"
	"github.com/hotcount/hotcount/pipeline/lookup"
	"github.com/hotcount/hotcount/pipeline/store"
	"github.com/hotcount/hotcount/schema"
)

// counted counts the topics gathered from a real store.
type counted struct {
	lookup.Store
	gathers atomic.Int64
}

func (c *counted) Gather(ctx context.Context, topic string, n int, consistent bool) ([]schema.Shard, error) {
	c.gathers.Add(1)
	return c.Store.Gather(ctx, topic, n, consistent)
}

func (c *counted) GatherMany(ctx context.Context, topics []string, n int, consistent bool) (map[string][]schema.Shard, error) {
	c.gathers.Add(int64(len(topics)))
	return c.Store.GatherMany(ctx, topics, n, consistent)
}

const (
	sidecars = 4
	topics   = 10
	ttl      = 100 * time.Millisecond
)

// BenchmarkFleetReads is a read storm on 10 hot topics from 4 sidecars on
// one NATS server and one store (the embedded one), with a 100 ms TTL:
// each iteration every sidecar looks up every topic, 1 ms apart. alone:
// each sidecar gathers for itself; shared: --share-totals. The figure is
// gathers per topic per TTL for the whole fleet (target: 1.5 or fewer
// shared, against about 4 alone).
func BenchmarkFleetReads(b *testing.B) {
	for _, share := range []bool{false, true} {
		name := "alone"
		if share {
			name = "shared"
		}
		b.Run(name, func(b *testing.B) {
			ns := testenv.NATS(b)
			bolt, err := store.OpenBolt(b.TempDir(), store.NewMetrics(prometheus.NewRegistry()))
			if err != nil {
				b.Fatal(err)
			}
			defer bolt.Close()
			names := make([]string, topics)
			for i := range names {
				names[i] = "hot-" + strconv.Itoa(i)
				if err := bolt.Add(context.Background(), testenv.W(names[i], 0, 100), time.Now()); err != nil {
					b.Fatal(err)
				}
			}
			st := &counted{Store: bolt}
			svcs := make([]*lookup.Service, sidecars)
			var shares []*fleet.Shares
			for i := range svcs {
				svcs[i] = lookup.New(lookup.Config{Shards: 1, CacheTTL: ttl, CacheStale: 10 * ttl, CacheSize: 1000, MaxTopicBytes: 64, Share: share}, st, prometheus.NewRegistry(), time.Now)
				b.Cleanup(svcs[i].Close)
				start(b, svcs[i].Run)
				if share {
					nc := testenv.Connect(b, ns.ClientURL())
					sh := fleet.NewShares(nc, fleet.DefaultSharesSubject, "sidecar-"+strconv.Itoa(i), "bench", svcs[i], prometheus.NewRegistry(), zap.NewNop())
					svcs[i].ShareWith(sh)
					shares = append(shares, sh)
				}
			}
			runShares(b, ns, shares...)
			ctx := context.Background()
			// Warm: every sidecar caches every topic, then the count starts.
			for _, svc := range svcs {
				for _, t := range names {
					if _, err := svc.Lookup(ctx, t, lookup.Cached); err != nil {
						b.Fatal(err)
					}
				}
			}
			time.Sleep(ttl)
			start := st.gathers.Load()
			b.ResetTimer()
			begun := time.Now()
			for b.Loop() {
				var wg sync.WaitGroup
				for _, svc := range svcs {
					wg.Go(func() {
						for _, t := range names {
							if _, err := svc.Lookup(ctx, t, lookup.Cached); err != nil {
								b.Error(err)
							}
						}
					})
				}
				wg.Wait()
				time.Sleep(time.Millisecond)
			}
			elapsed := time.Since(begun)
			gathers := st.gathers.Load() - start
			b.ReportMetric(float64(gathers)/topics/(float64(elapsed)/float64(ttl)), "gathers/topic/TTL")
		})
	}
}
