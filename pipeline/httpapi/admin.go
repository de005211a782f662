package httpapi

import (
	"context"
	"encoding/json"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// checkTimeout bounds one health or readiness check.
const checkTimeout = 2 * time.Second

// Check reports a problem, or nil when all is well.
type Check func(ctx context.Context) error

// Dependencies reports the state of each dependency by name: "ok" or the
// problem.
type Dependencies func(ctx context.Context) map[string]string

// Status is more of /healthz's body: state that does not fail liveness
// (a restart would not mend it) but that an operator reads there, such as
// the counters the durable quarantine holds. nil: none.
type Status func() map[string]any

// Admin is the admin listener's handler, the sidecar's health, readiness
// and metrics for the kubelet's probes and Prometheus. It serves:
//
//	GET /healthz  200 while live, 503 with the reason when not (liveness);
//	              either way the body names each dependency's state, and
//	              status's fields
//	GET /readyz   200 while ready, 503 with the reason when not (readiness)
//	GET /metrics  Prometheus metrics from g
func Admin(g prometheus.Gatherer, health, ready Check, deps Dependencies, status Status) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /healthz", probe(health, deps, status))
	mux.Handle("GET /readyz", probe(ready, nil, nil))
	mux.Handle("GET /metrics", promhttp.HandlerFor(g, promhttp.HandlerOpts{}))
	return mux
}

func probe(check Check, deps Dependencies, status Status) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), checkTimeout)
		defer cancel()
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		body := map[string]any{}
		if status != nil {
			for k, v := range status() {
				body[k] = v
			}
		}
		body["status"] = "ok"
		if deps != nil {
			body["dependencies"] = deps(ctx)
		}
		if err := check(ctx); err != nil {
			w.WriteHeader(http.StatusServiceUnavailable)
			body["status"], body["error"] = "fail", err.Error()
		}
		json.NewEncoder(w).Encode(body) //nolint:errcheck // client gone
	}
}
