// Package admin serves the sidecar's health, readiness and metrics on the
// admin listener, for the kubelet's probes and Prometheus.
package admin

import (
	"context"
	"encoding/json"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// DefaultAddr is the admin listener's default address: all interfaces, so
// that the kubelet and Prometheus reach it.
const DefaultAddr = ":9091"

// checkTimeout bounds one health or readiness check.
const checkTimeout = 2 * time.Second

// Check reports a problem, or nil when all is well.
type Check func(ctx context.Context) error

// Handler serves:
//
//	GET /healthz  200 while live, 503 with the reason when not (liveness)
//	GET /readyz   200 while ready, 503 with the reason when not (readiness)
//	GET /metrics  Prometheus metrics from g
func Handler(g prometheus.Gatherer, health, ready Check) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /healthz", probe(health))
	mux.Handle("GET /readyz", probe(ready))
	mux.Handle("GET /metrics", promhttp.HandlerFor(g, promhttp.HandlerOpts{}))
	return mux
}

func probe(check Check) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), checkTimeout)
		defer cancel()
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		if err := check(ctx); err != nil {
			w.WriteHeader(http.StatusServiceUnavailable)
			json.NewEncoder(w).Encode(map[string]string{"status": "fail", "error": err.Error()}) //nolint:errcheck // client gone
			return
		}
		json.NewEncoder(w).Encode(map[string]string{"status": "ok"}) //nolint:errcheck // client gone
	}
}
