// Package apitest is a test tool: it holds real HTTP exchanges with a
// sidecar to the OpenAPI document (httpapi.OpenAPI) with kin-openapi: the
// request against the operation's parameters, the answer against its
// documented statuses, headers and bodies, errors included. Tests of the
// HTTP API and of the sidecar use it so that the document cannot drift
// from the answers; it is internal because nothing outside the module's
// tests needs it.
package apitest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"strings"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/gorillamux"
)

// Servers of the document, as it names the listeners at their default
// addresses; Load moves them to a test's.
const (
	LookupServer = "http://127.0.0.1:8080"
	AdminServer  = "http://127.0.0.1:9091"
)

// The console is a page: its body is checked as text.
func init() { openapi3filter.RegisterBodyDecoder("text/html", openapi3filter.PlainBodyDecoder) }

// Doc is a loaded, valid document with a router over the listeners of a
// test.
type Doc struct {
	T      *openapi3.T
	router routers.Router
}

// Parse loads and validates a document: OpenAPI 3.1, every $ref resolved,
// every schema a valid JSON Schema 2020-12 schema, every example valid
// against its schema.
func Parse(ctx context.Context, data []byte) (*openapi3.T, error) {
	loader := openapi3.NewLoader()
	loader.Context = ctx
	doc, err := loader.LoadFromData(data)
	if err != nil {
		return nil, fmt.Errorf("load: %w", err)
	}
	if !doc.IsOpenAPI31OrLater() {
		return nil, fmt.Errorf("openapi %q: want 3.1", doc.OpenAPI)
	}
	if err := doc.Validate(ctx, openapi3.EnableExamplesValidation()); err != nil {
		return nil, fmt.Errorf("validate: %w", err)
	}
	// kin-openapi checks 3.0's example and the Example Objects of
	// parameters and media types, not a 3.1 schema's examples: these.
	seen := map[*openapi3.Schema]bool{}
	for _, name := range slices.Sorted(maps.Keys(doc.Components.Schemas)) {
		if err := checkExamples("#/components/schemas/"+name, doc.Components.Schemas[name], seen); err != nil {
			return nil, fmt.Errorf("validate: %w", err)
		}
	}
	for _, name := range slices.Sorted(maps.Keys(doc.Components.Parameters)) {
		if p := doc.Components.Parameters[name].Value; p != nil {
			if err := checkExamples("#/components/parameters/"+name+"/schema", p.Schema, seen); err != nil {
				return nil, fmt.Errorf("validate: %w", err)
			}
		}
	}
	return doc, nil
}

// checkExamples checks each of a schema's examples, and its properties'
// and items', against it.
func checkExamples(at string, ref *openapi3.SchemaRef, seen map[*openapi3.Schema]bool) error {
	if ref == nil || ref.Value == nil || seen[ref.Value] {
		return nil
	}
	s := ref.Value
	seen[s] = true
	for i, ex := range s.Examples {
		if err := s.VisitJSON(ex, openapi3.EnableJSONSchema2020()); err != nil {
			return fmt.Errorf("%s: example %d: %w", at, i, err)
		}
	}
	for _, name := range slices.Sorted(maps.Keys(s.Properties)) {
		if err := checkExamples(at+"/properties/"+name, s.Properties[name], seen); err != nil {
			return err
		}
	}
	return checkExamples(at+"/items", s.Items, seen)
}

// Load parses data (httpapi.OpenAPI, or a copy a test changed) and routes
// requests to its operations at the test's listeners: lookup and admin
// are base URLs (http://127.0.0.1:port) that replace LookupServer and
// AdminServer.
func Load(ctx context.Context, data []byte, lookup, admin string) (*Doc, error) {
	doc, err := Parse(ctx, data)
	if err != nil {
		return nil, err
	}
	move := func(servers openapi3.Servers) error {
		for _, s := range servers {
			switch s.URL {
			case LookupServer:
				s.URL = lookup
			case AdminServer:
				s.URL = admin
			default:
				return fmt.Errorf("server %s is neither %s nor %s", s.URL, LookupServer, AdminServer)
			}
		}
		return nil
	}
	if err := move(doc.Servers); err != nil {
		return nil, err
	}
	for _, item := range doc.Paths.Map() {
		if err := move(item.Servers); err != nil {
			return nil, err
		}
	}
	router, err := gorillamux.NewRouter(doc)
	if err != nil {
		return nil, fmt.Errorf("router: %w", err)
	}
	return &Doc{T: doc, router: router}, nil
}

// Exchange is one request and its answer, held to the document.
type Exchange struct {
	Request *http.Request
	Status  int
	Header  http.Header
	Body    []byte
	// Operation is the operation the request routes to ("" for none).
	Operation string
	// RequestErr says why the document refuses the request: a path or
	// method it does not have, a bad parameter. Nil when it allows it.
	RequestErr error
	// ResponseErr says why the document does not describe the answer
	// (an undocumented status, header or body): nil when it does.
	ResponseErr error
}

func (e *Exchange) String() string {
	body := bytes.TrimSpace(e.Body)
	if len(body) > 300 {
		body = append(body[:300:300], "..."...)
	}
	return fmt.Sprintf("%s %s: %d %s", e.Request.Method, e.Request.URL.RequestURI(), e.Status, body)
}

// Get is Do with a GET of url, with header's fields.
func (d *Doc) Get(ctx context.Context, client *http.Client, url string, header http.Header) (*Exchange, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	for k, v := range header {
		req.Header[k] = v
	}
	return d.Do(client, req)
}

// Do sends req and checks the request and its answer against the document;
// the error is the transport's.
func (d *Doc) Do(client *http.Client, req *http.Request) (*Exchange, error) {
	resp, err := client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	e := &Exchange{Request: req, Status: resp.StatusCode, Header: resp.Header, Body: body}
	e.RequestErr, e.ResponseErr = d.Check(req, resp.StatusCode, resp.Header, body)
	if route, _, err := d.router.FindRoute(req); err == nil {
		e.Operation = route.Operation.OperationID
	}
	return e, nil
}

// Check holds a request and its answer to the document. A request the
// document has no operation for must be answered as the lookup API
// answers every path it does not have: components/responses/NotFound, a
// 404 with an Error body, or, where a token is required and the request
// has none (or another), components/responses/Unauthorized.
func (d *Doc) Check(req *http.Request, status int, header http.Header, body []byte) (requestErr, responseErr error) {
	ctx := req.Context()
	route, params, err := d.router.FindRoute(req)
	if err != nil {
		return fmt.Errorf("%s %s: %w", req.Method, req.URL.Path, err), d.notFound(status, header, body)
	}
	opts := &openapi3filter.Options{
		IncludeResponseStatus: true, // an undocumented status fails
		SkipSettingDefaults:   true, // the request is as it was sent
		MultiError:            true,
		AuthenticationFunc:    bearer,
	}
	in := &openapi3filter.RequestValidationInput{Request: req, PathParams: params, Route: route, Options: opts}
	requestErr = openapi3filter.ValidateRequest(ctx, in)
	out := &openapi3filter.ResponseValidationInput{RequestValidationInput: in, Status: status, Header: header, Options: opts}
	out.SetBodyBytes(body)
	return requestErr, openapi3filter.ValidateResponse(ctx, out)
}

// notFound checks the answer to a request the document has no operation
// for against components/responses/NotFound (or Unauthorized).
func (d *Doc) notFound(status int, header http.Header, body []byte) error {
	name := "NotFound"
	switch status {
	case http.StatusNotFound:
	case http.StatusUnauthorized:
		name = "Unauthorized"
	default:
		return fmt.Errorf("status %d for a path the document does not have: want 404 (or 401)", status)
	}
	ref := d.T.Components.Responses[name]
	if ref == nil || ref.Value == nil {
		return fmt.Errorf("the document has no components/responses/%s", name)
	}
	for k, h := range ref.Value.Headers {
		if h.Value != nil && h.Value.Required && header.Get(k) == "" {
			return fmt.Errorf("no %s header, which components/responses/%s requires", k, name)
		}
		if h.Value != nil && h.Value.Schema != nil && header.Get(k) != "" {
			if err := h.Value.Schema.Value.VisitJSON(header.Get(k), openapi3.EnableJSONSchema2020()); err != nil {
				return fmt.Errorf("header %s: %w", k, err)
			}
		}
	}
	return d.CheckBody(ref.Value, header, body)
}

// CheckBody checks a body against the document's response resp: its
// media type, then its schema, as JSON Schema 2020-12.
func (d *Doc) CheckBody(resp *openapi3.Response, header http.Header, body []byte) error {
	ct := header.Get("Content-Type")
	mt := resp.Content.Get(ct)
	if mt == nil {
		return fmt.Errorf("content type %q is not the response's", ct)
	}
	if mt.Schema == nil {
		return nil
	}
	if !strings.HasPrefix(ct, "application/json") {
		return fmt.Errorf("content type %q: only JSON bodies are checked here", ct)
	}
	v, err := decodeJSON(body)
	if err != nil {
		return err
	}
	return mt.Schema.Value.VisitJSON(v, openapi3.EnableJSONSchema2020(), openapi3.VisitAsResponse())
}

// Schema checks a JSON value against components/schemas/name.
func (d *Doc) Schema(name string, body []byte) error {
	ref := d.T.Components.Schemas[name]
	if ref == nil || ref.Value == nil {
		return fmt.Errorf("the document has no components/schemas/%s", name)
	}
	v, err := decodeJSON(body)
	if err != nil {
		return err
	}
	return ref.Value.VisitJSON(v, openapi3.EnableJSONSchema2020(), openapi3.VisitAsResponse())
}

func decodeJSON(body []byte) (any, error) {
	v, err := openapi3filter.JSONBodyDecoder(bytes.NewReader(body), nil, nil, nil)
	if err != nil {
		return nil, fmt.Errorf("body is not JSON: %w", err)
	}
	return v, nil
}

// bearer is the document's bearerToken scheme as a client sees it: a
// request carries Authorization: Bearer <something>. Whether the token is
// right is the sidecar's to say (a 401, which the document describes).
func bearer(_ context.Context, in *openapi3filter.AuthenticationInput) error {
	s := in.SecurityScheme
	if s == nil || s.Type != "http" || !strings.EqualFold(s.Scheme, "bearer") {
		return fmt.Errorf("security scheme %s is not a bearer token", in.SecuritySchemeName)
	}
	if _, ok := strings.CutPrefix(in.RequestValidationInput.Request.Header.Get("Authorization"), "Bearer "); !ok {
		return errors.New("no bearer token")
	}
	return nil
}
