package httpapi

import (
	_ "embed"
	"net/http"
)

// The OpenAPI document describes the answers as they are: the tests
// validate the real answers of the handlers and of a running sidecar
// against it (internal/testtools/apitest), so that it cannot drift from the code. A
// team calling the API from another language generates or checks its
// client from it; the sidecar serves it at GET /openapi.yaml on the lookup
// listener, so what a client reads is the document of the sidecar it talks
// to.

// OpenAPI is the document, openapi.yaml, as YAML.
//
//go:embed openapi.yaml
var OpenAPI []byte

// OpenAPIPath is where the lookup listener serves the document.
const OpenAPIPath = "/openapi.yaml"

// OpenAPIContentType is the document's media type (RFC 9512).
const OpenAPIContentType = "application/yaml"

// OpenAPIHandler serves the document (GET /openapi.yaml). A client
// revalidates it (no-cache): it changes with the sidecar's version.
func OpenAPIHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		h := w.Header()
		h.Set("Content-Type", OpenAPIContentType)
		h.Set("Cache-Control", "no-cache")
		w.Write(OpenAPI) //nolint:errcheck // nothing to do about a client that left
	})
}
