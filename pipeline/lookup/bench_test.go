package lookup_test

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/hotcount/hotcount/pipeline/lookup"
)

// BenchmarkLookupCached is a cached lookup without HTTP: the service's own
// cost and allocations.
func BenchmarkLookupCached(b *testing.B) {
	st, bolt := newStore(b)
	add(b, bolt, "golang", 1, 1500)
	svc := lookup.New(lookup.Config{Shards: 4, CacheTTL: time.Hour, CacheStale: time.Hour, CacheSize: 1000, MaxTopicBytes: 256}, st, prometheus.NewRegistry(), time.Now)
	defer svc.Close()
	ctx := context.Background()
	if _, err := svc.Lookup(ctx, "golang", lookup.Cached); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := svc.Lookup(ctx, "golang", lookup.Cached); err != nil {
			b.Fatal(err)
		}
	}
}
