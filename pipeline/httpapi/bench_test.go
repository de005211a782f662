package httpapi_test

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/hotcount/hotcount/internal/testtools/testenv"
	"github.com/hotcount/hotcount/pipeline/httpapi"
	"github.com/hotcount/hotcount/pipeline/lookup"
	"github.com/hotcount/hotcount/pipeline/trend"
	"github.com/hotcount/hotcount/schema"
)

// BenchmarkLookupHTTP is the read storm: 16 concurrent keep-alive clients
// GET one hot topic from a real HTTP server over loopback. "bare" is a
// trivial Go handler writing a fixed JSON body of the same size; "hotcount"
// is the lookup API, cached (TTL 1 s) over the embedded store. Same server
// settings, same client, same run: the ratio of ns/op is the lookup's cost
// against net/http's own. It reports req/s, p50/p99 latency, and for
// hotcount the store gathers and shard reads against the bound
// (duration / TTL + 1) × N.
func BenchmarkLookupHTTP(b *testing.B) {
	const ttl = time.Second
	st := newStore(b)
	add(b, st, "golang", 1, 1500)
	svc := lookup.New(lookup.Config{Shards: 4, CacheTTL: ttl, CacheStale: 10 * ttl, CacheSize: 1000, MaxTopicBytes: 256}, st, prometheus.NewRegistry(), time.Now)
	defer svc.Close()
	hot := httpapi.Lookup(svc, zap.NewNop(), httpapi.Extras{})
	rec := httptest.NewRecorder()
	hot.ServeHTTP(rec, httptest.NewRequest("GET", "/v1/topics/golang", nil))
	fixed := rec.Body.Bytes()
	bare := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Write(fixed) //nolint:errcheck // benchmark
	})

	b.Run("bare", func(b *testing.B) { storm(b, bare, "/v1/topics/golang") })
	b.Run("hotcount", func(b *testing.B) {
		gathers := st.gathers.Load()
		storm(b, hot, "/v1/topics/golang")
		g := st.gathers.Load() - gathers
		bound := int64(b.Elapsed()/ttl) + 1
		b.ReportMetric(float64(g*4), "shard-reads")
		b.ReportMetric(float64(bound*4), "shard-read-bound")
		if g > bound {
			b.Errorf("%d gathers in %s, bound %d", g, b.Elapsed(), bound)
		}
	})
}

// storm runs the read storm of BenchmarkLookupHTTP against h on a real
// server over loopback, GET path from 16 keep-alive clients, and reports
// req/s and p50/p99 latency.
func storm(b *testing.B, h http.Handler, path string) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(ln) //nolint:errcheck // closed below
	defer srv.Close()
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64, DisableCompression: true}}
	url := "http://" + ln.Addr().String() + path
	var mu sync.Mutex
	var lat []time.Duration
	b.SetParallelism(8) // 16 clients on 2 cores
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		mine := make([]time.Duration, 0, 1024)
		for pb.Next() {
			t0 := time.Now()
			resp, err := client.Get(url)
			if err != nil {
				b.Error(err)
				return
			}
			io.Copy(io.Discard, resp.Body) //nolint:errcheck // benchmark
			resp.Body.Close()
			if resp.StatusCode != 200 {
				b.Errorf("status %d", resp.StatusCode)
				return
			}
			mine = append(mine, time.Since(t0))
		}
		mu.Lock()
		lat = append(lat, mine...)
		mu.Unlock()
	})
	b.StopTimer()
	slices.Sort(lat)
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "req/s")
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
}

// BenchmarkWindowLookup is BenchmarkLookupHTTP's storm on a windowed count,
// GET /v1/topics/golang?window=1h (60 minute buckets), cached for 1 s,
// against a bare handler writing the same body. It reports the windowed
// reads that went to the store against the bound duration / TTL + 1, and
// the BatchGetItem-sized batches they took.
func BenchmarkWindowLookup(b *testing.B) {
	const ttl = time.Second
	st := newStore(b)
	now := time.Now()
	for i := range int64(60) {
		c := schema.BucketOf("golang", schema.Minute, schema.Minute.Index(now)-i)
		if err := st.Add(context.Background(), testenv.Inc(c, 0, 25), now); err != nil {
			b.Fatal(err)
		}
	}
	svc := lookup.New(lookup.Config{Shards: 1, CacheTTL: ttl, CacheStale: 10 * ttl, CacheSize: 1000, MaxTopicBytes: 256}, st, prometheus.NewRegistry(), time.Now)
	defer svc.Close()
	reg := prometheus.NewRegistry()
	tr := trend.New(trend.Config{Minutes: true, Hours: true, CacheTTL: ttl, CacheSize: 1000}, st.Bolt, reg, time.Now)
	hot := httpapi.Lookup(svc, zap.NewNop(), httpapi.Extras{Trend: tr})
	const path = "/v1/topics/golang?window=1h"
	rec := httptest.NewRecorder()
	hot.ServeHTTP(rec, httptest.NewRequest("GET", path, nil))
	if rec.Code != 200 {
		b.Fatalf("%s: %d %s", path, rec.Code, rec.Body)
	}
	fixed := rec.Body.Bytes()
	bare := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Write(fixed) //nolint:errcheck // benchmark
	})
	b.Run("bare", func(b *testing.B) { storm(b, bare, path) })
	b.Run("hotcount", func(b *testing.B) {
		batches := testenv.Metric(b, reg, "hotcount_trend_bucket_batches_total")
		before := testenv.MetricWith(b, reg, "hotcount_trend_reads_total", "source", "store")
		storm(b, hot, path)
		fromStore := testenv.MetricWith(b, reg, "hotcount_trend_reads_total", "source", "store") - before
		bound := float64(b.Elapsed()/ttl) + 1
		b.ReportMetric(fromStore, "store-reads")
		b.ReportMetric(bound, "store-read-bound")
		b.ReportMetric(testenv.Metric(b, reg, "hotcount_trend_bucket_batches_total")-batches, "batches")
		if fromStore > bound {
			b.Errorf("%v windowed reads from the store in %s, bound %v", fromStore, b.Elapsed(), bound)
		}
	})
}

// BenchmarkHandler is one cached lookup through the handler with a
// recorder: allocations per request of the HTTP layer, against the bare
// handler's.
func BenchmarkHandler(b *testing.B) {
	st := newStore(b)
	add(b, st, "golang", 1, 1500)
	svc := lookup.New(lookup.Config{Shards: 4, CacheTTL: time.Hour, CacheStale: time.Hour, CacheSize: 1000, MaxTopicBytes: 256}, st, prometheus.NewRegistry(), time.Now)
	defer svc.Close()
	hot := httpapi.Lookup(svc, zap.NewNop(), httpapi.Extras{})
	req := httptest.NewRequest("GET", "/v1/topics/golang", nil)
	w := &discard{h: http.Header{}}
	hot.ServeHTTP(w, req)
	b.ReportAllocs()
	for b.Loop() {
		clear(w.h)
		hot.ServeHTTP(w, req)
	}
}

type discard struct{ h http.Header }

func (d *discard) Header() http.Header         { return d.h }
func (d *discard) Write(p []byte) (int, error) { return len(p), nil }
func (d *discard) WriteHeader(int)             {}
