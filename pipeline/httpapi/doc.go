// Package httpapi is hotcount's HTTP API: the lookup listener's handler
// (Lookup: totals, batches, shards, hot topics, windowed counts, series,
// trending; RequireToken guards it), the admin listener's (Admin: health,
// readiness, metrics), and the OpenAPI 3.1 document of both
// (openapi.yaml in this folder, served at GET /openapi.yaml on the lookup
// listener).
//
// It reads the totals through Lookups, the few methods of
// lookup.Service it calls; the lookup package is the cached read path and
// serves nothing itself. The listeners are the sidecar's (sidecar/http.go).
package httpapi
