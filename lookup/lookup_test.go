package lookup_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap/zaptest"

	"github.com/hotcount/hotcount/internal/testenv"
	"github.com/hotcount/hotcount/lookup"
	"github.com/hotcount/hotcount/store"
)

// counting wraps the real embedded store, counting gathers and optionally
// failing them.
type counting struct {
	*store.Bolt
	gathers atomic.Int64
	fail    atomic.Bool
	delay   time.Duration
}

func (c *counting) Gather(ctx context.Context, topic string, n int, consistent bool) ([]store.Shard, error) {
	c.gathers.Add(1)
	time.Sleep(c.delay) // hold the gather open so that readers pile up on it
	if c.fail.Load() {
		return nil, errors.New("injected: store down")
	}
	return c.Bolt.Gather(ctx, topic, n, consistent)
}

func newStore(t *testing.T) *counting {
	b, err := store.OpenBolt(t.TempDir(), store.NewMetrics(prometheus.NewRegistry()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return &counting{Bolt: b}
}

func newService(t *testing.T, st lookup.Store, ttl time.Duration) (*lookup.Service, *prometheus.Registry) {
	reg := prometheus.NewRegistry()
	return lookup.New(lookup.Config{Shards: 4, CacheTTL: ttl, CacheSize: 100, MaxTopicBytes: 32}, st, reg, time.Now), reg
}

// TestCacheAbsorbsConcurrentReads: 64 readers × 200 lookups of one topic
// within one TTL cost one gather, and all see the right total.
func TestCacheAbsorbsConcurrentReads(t *testing.T) {
	st := newStore(t)
	st.delay = 20 * time.Millisecond
	ctx := context.Background()
	for shard, n := range []int64{3, 0, 5, 2} {
		if err := st.Add(ctx, "golang", shard, n, time.Now()); err != nil {
			t.Fatal(err)
		}
	}
	svc, reg := newService(t, st, time.Minute)
	var wg sync.WaitGroup
	for range 64 {
		wg.Go(func() {
			for range 200 {
				got, err := svc.Total(ctx, "golang")
				if err != nil || got.Count != 10 {
					t.Errorf("Total = %+v, %v; want count 10", got, err)
					return
				}
			}
		})
	}
	wg.Wait()
	if g := st.gathers.Load(); g != 1 {
		t.Errorf("%d gathers for 12800 concurrent lookups in one TTL, want 1", g)
	}
	hits := testenv.MetricWith(t, reg, "hotcount_cache_requests_total", "result", "hit")
	misses := testenv.MetricWith(t, reg, "hotcount_cache_requests_total", "result", "miss")
	if hits+misses != 64*200 || misses < 1 {
		t.Errorf("hits %v + misses %v, want 12800 with at least one miss", hits, misses)
	}
}

// TestCacheExpires: after the TTL the next lookup gathers again and sees
// new counts; an unknown topic is cached as zero like any other.
func TestCacheExpires(t *testing.T) {
	st := newStore(t)
	svc, _ := newService(t, st, 50*time.Millisecond)
	ctx := context.Background()
	first, err := svc.Total(ctx, "new")
	if err != nil || first.Count != 0 || first.Source != "store" {
		t.Fatalf("Total(new) = %+v, %v; want 0 from store", first, err)
	}
	if again, _ := svc.Total(ctx, "new"); again.Source != "cache" {
		t.Errorf("second lookup came from %s, want cache", again.Source)
	}
	if err := st.Add(ctx, "new", 1, 9, time.Now()); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 5*time.Second, func() error {
		got, err := svc.Total(ctx, "new")
		if err != nil {
			return err
		}
		if got.Count != 9 {
			return errors.New("still the cached total")
		}
		return nil
	})
	if g := st.gathers.Load(); g != 2 {
		t.Errorf("%d gathers, want 2 (one per TTL)", g)
	}
}

func TestHTTP(t *testing.T) {
	st := newStore(t)
	ctx := context.Background()
	if err := st.Add(ctx, "eu.west.k8s", 2, 42, time.UnixMilli(1796198815543)); err != nil {
		t.Fatal(err)
	}
	svc, _ := newService(t, st, time.Minute)
	srv := httptest.NewServer(svc.Handler(zaptest.NewLogger(t)))
	defer srv.Close()

	tests := []struct {
		name   string
		path   string
		status int
		want   string // a fragment of the body
	}{
		{"total", "/v1/topics/eu.west.k8s", 200, `"count":42`},
		{"unknown is zero", "/v1/topics/nobody", 200, `"count":0`},
		{"escaped", "/v1/topics/caf%C3%A9", 200, `"topic":"café"`},
		{"shards", "/v1/topics/eu.west.k8s/shards", 200, `{"shard":2,"count":42,"updatedAt":1796198815543}`},
		{"shards include zeros", "/v1/topics/eu.west.k8s/shards", 200, `{"shard":0,"count":0,"updatedAt":0}`},
		{"invalid utf8", "/v1/topics/a%FFb", 400, `"error":"topic is not valid UTF-8"`},
		{"control character", "/v1/topics/a%01b", 400, `"error":"topic contains control character U+0001"`},
		{"too long", "/v1/topics/" + strings.Repeat("x", 33), 400, `longer than 32`},
		{"no such path", "/v2/whatever", 404, `"error":"no such endpoint`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp, err := http.Get(srv.URL + tt.path)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tt.status || !strings.Contains(string(body), tt.want) {
				t.Errorf("GET %s = %d %s, want %d containing %s", tt.path, resp.StatusCode, body, tt.status, tt.want)
			}
			if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
				t.Errorf("Content-Type = %q", ct)
			}
			if !json.Valid(body) {
				t.Errorf("body is not JSON: %s", body)
			}
		})
	}

	st.fail.Store(true)
	resp, err := http.Get(srv.URL + "/v1/topics/uncached")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 503 || !strings.Contains(string(body), "injected: store down") {
		t.Errorf("store failure: %d %s, want 503 with the reason", resp.StatusCode, body)
	}
}

// FuzzTopicPath: no path makes the handler panic or answer 5xx, and every
// answer but the mux's redirect of an unclean path (like "..") is JSON.
func FuzzTopicPath(f *testing.F) {
	for _, s := range []string{"golang", "a%FFb", "%00", "a/b", "..", "%2F", strings.Repeat("x", 40)} {
		f.Add(s)
	}
	b, err := store.OpenBolt(f.TempDir(), store.NewMetrics(prometheus.NewRegistry()))
	if err != nil {
		f.Fatal(err)
	}
	defer b.Close()
	svc := lookup.New(lookup.Config{Shards: 2, CacheTTL: time.Second, CacheSize: 10, MaxTopicBytes: 32}, b, prometheus.NewRegistry(), time.Now)
	h := svc.Handler(zaptest.NewLogger(f))
	f.Fuzz(func(t *testing.T, topic string) {
		req, err := http.NewRequest("GET", "http://x/v1/topics/"+topic, nil)
		if err != nil {
			return // not a URL at all: never reaches a handler
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		redirect := w.Code >= 300 && w.Code < 400
		if w.Code >= 500 || (!redirect && !json.Valid(w.Body.Bytes())) {
			t.Fatalf("GET /v1/topics/%q = %d %s", topic, w.Code, w.Body.Bytes())
		}
	})
}
