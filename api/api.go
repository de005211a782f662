// Package api holds the OpenAPI 3.1 description of hotcount's HTTP APIs,
// the lookup listener's and the admin listener's (openapi.yaml in this
// folder), and serves it.
//
// The document describes the answers as they are: the tests validate the
// real answers of a running sidecar against it (internal/apitest), so that
// it cannot drift from the code. A team calling the API from another
// language generates or checks its client from it; the sidecar serves it
// at GET /openapi.yaml on the lookup listener, so what a client reads is
// the document of the sidecar it talks to.
package api

import (
	_ "embed"
	"net/http"
)

// OpenAPI is the document, openapi.yaml, as YAML.
//
//go:embed openapi.yaml
var OpenAPI []byte

// Path is where the lookup listener serves the document.
const Path = "/openapi.yaml"

// ContentType is the document's media type (RFC 9512).
const ContentType = "application/yaml"

// Handler serves the document (GET /openapi.yaml). A client revalidates
// it (no-cache): it changes with the sidecar's version.
func Handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		h := w.Header()
		h.Set("Content-Type", ContentType)
		h.Set("Cache-Control", "no-cache")
		w.Write(OpenAPI) //nolint:errcheck // nothing to do about a client that left
	})
}
