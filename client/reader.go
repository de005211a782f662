package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/hotcount/hotcount/api"
	"github.com/hotcount/hotcount/mention"
)

// Defaults of the Reader's options.
const (
	// DefaultURL is a sidecar's lookup API by default (its --http,
	// 127.0.0.1:8080): the app in the same pod.
	DefaultURL = "http://127.0.0.1:8080"
	// DefaultTimeout bounds one request of a Reader's default HTTP client,
	// the answer's body included.
	DefaultTimeout = 5 * time.Second
)

// maxAnswerBytes bounds an answer's body: a batch of api.MaxBatch
// totals of the longest topics is well under it.
const maxAnswerBytes = 4 << 20

// Errors of the lookup API, for errors.Is on an *Error.
var (
	// ErrBadRequest is a 400: a topic or parameter the sidecar refused.
	ErrBadRequest = errors.New("client: bad request")
	// ErrUnauthorized is a 401: the sidecar runs with --http-token-file
	// and the token (WithToken) is missing or wrong.
	ErrUnauthorized = errors.New("client: unauthorized")
	// ErrNotFound is a 404: no such endpoint, so the URL is not a
	// sidecar's lookup API (the admin listener, say). An unknown topic is
	// not an error: its count is 0.
	ErrNotFound = errors.New("client: no such endpoint")
	// ErrUnavailable is a 503: the sidecar could not read the store.
	ErrUnavailable = errors.New("client: store unavailable")
)

// Error is an answer of the lookup API other than 200.
type Error struct {
	// StatusCode is the HTTP status.
	StatusCode int
	// Reason is the sidecar's explanation, its {"error": "..."}.
	Reason string
}

func (e *Error) Error() string {
	return fmt.Sprintf("client: lookup answered %d %s: %s", e.StatusCode, http.StatusText(e.StatusCode), e.Reason)
}

// Is matches the sentinel of e's status: ErrBadRequest, ErrUnauthorized,
// ErrNotFound or ErrUnavailable.
func (e *Error) Is(target error) bool {
	switch e.StatusCode {
	case http.StatusBadRequest:
		return target == ErrBadRequest
	case http.StatusUnauthorized:
		return target == ErrUnauthorized
	case http.StatusNotFound:
		return target == ErrNotFound
	case http.StatusServiceUnavailable:
		return target == ErrUnavailable
	}
	return false
}

// Total is a topic's total as a sidecar serves it.
type Total = api.Total

// Consistency is how fresh a total must be, and what it costs DynamoDB.
type Consistency string

// Consistencies, as the lookup API names them.
const (
	// Cached (the default) is served from the sidecar's cache: fresh
	// within its TTL, one gather per topic per TTL whatever the rate.
	Cached Consistency = "cached"
	// Eventual gathers now with eventually consistent reads.
	Eventual Consistency = "eventual"
	// Strong gathers now with a strongly consistent read of every shard.
	Strong Consistency = "strong"
)

// TotalOption asks for a total in a particular way.
type TotalOption func(url.Values)

// WithConsistency asks for a total as fresh as c (default Cached).
func WithConsistency(c Consistency) TotalOption {
	return func(q url.Values) { q.Set("consistency", string(c)) }
}

// WithPending adds the sidecar's own mentions not yet in the store to the
// count (include=pending): read-your-writes for the app beside it.
func WithPending() TotalOption {
	return func(q url.Values) { q.Set("include", "pending") }
}

// ReaderOption changes a Reader's defaults.
type ReaderOption func(*Reader)

// WithHTTPClient makes requests with hc instead of a client with
// DefaultTimeout.
func WithHTTPClient(hc *http.Client) ReaderOption {
	return func(r *Reader) { r.hc = hc }
}

// WithToken sends token as a bearer token: the contents of the sidecar's
// --http-token-file (surrounding space is trimmed, as the sidecar does).
func WithToken(token string) ReaderOption {
	return func(r *Reader) { r.auth = "Bearer " + strings.TrimSpace(token) }
}

// WithMaxTopicBytes sets the sidecar's --max-topic-bytes when it is not
// the default (mention.DefaultMaxTopicBytes): longer topics are refused
// before a request is made.
func WithMaxTopicBytes(n int) ReaderOption {
	return func(r *Reader) { r.maxTopicBytes = n }
}

// Reader reads totals from a sidecar's lookup API. It is safe for
// concurrent use and holds nothing to close (idle connections belong to
// its http.Client).
type Reader struct {
	base          string // the API's URL, without a trailing slash
	hc            *http.Client
	auth          string // the Authorization header, if any
	maxTopicBytes int
}

// NewReader returns a Reader of the lookup API at baseURL (DefaultURL for
// a sidecar with its defaults).
func NewReader(baseURL string, opts ...ReaderOption) (*Reader, error) {
	u, err := url.Parse(baseURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.RawQuery != "" {
		return nil, fmt.Errorf("client: lookup URL %q is not http(s)://host[:port][/path]", baseURL)
	}
	r := &Reader{
		base:          strings.TrimSuffix(baseURL, "/"),
		hc:            &http.Client{Timeout: DefaultTimeout},
		maxTopicBytes: mention.DefaultMaxTopicBytes,
	}
	for _, opt := range opts {
		opt(r)
	}
	return r, nil
}

// Total returns topic's total. An unknown topic has count 0.
func (r *Reader) Total(ctx context.Context, topic string, opts ...TotalOption) (Total, error) {
	if err := validTopic(topic, r.maxTopicBytes); err != nil {
		return Total{}, err
	}
	if topic == "." || topic == ".." {
		// A path would lose them (it is cleaned, escaped or not); the
		// batch lookup's query keeps them.
		ts, err := r.Totals(ctx, []string{topic}, opts...)
		if err != nil {
			return Total{}, err
		}
		return ts[0], nil
	}
	var t Total
	err := r.get(ctx, "/v1/topics/"+url.PathEscape(topic), query(nil, opts), &t)
	return t, err
}

// Totals returns the totals of topics, in the order given. Topics go
// api.MaxBatch to a request, one request after the other.
func (r *Reader) Totals(ctx context.Context, topics []string, opts ...TotalOption) ([]Total, error) {
	for _, topic := range topics {
		if err := validTopic(topic, r.maxTopicBytes); err != nil {
			return nil, err
		}
	}
	out := make([]Total, 0, len(topics))
	for len(topics) > 0 {
		n := min(len(topics), api.MaxBatch)
		var page struct {
			Topics []Total `json:"topics"`
		}
		if err := r.get(ctx, "/v1/topics", query(topics[:n], opts), &page); err != nil {
			return nil, err
		}
		if len(page.Topics) != n {
			return nil, fmt.Errorf("client: asked for %d totals, got %d", n, len(page.Topics))
		}
		out = append(out, page.Topics...)
		topics = topics[n:]
	}
	return out, nil
}

// query is the query string of a lookup of topics (none for the single
// lookup) with opts.
func query(topics []string, opts []TotalOption) string {
	q := url.Values{}
	for _, o := range opts {
		o(q)
	}
	if len(topics) > 0 {
		q["topic"] = topics
	}
	if len(q) == 0 {
		return ""
	}
	return "?" + q.Encode()
}

// get asks the API for path+query and decodes the answer into out.
func (r *Reader) get(ctx context.Context, path, query string, out any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, r.base+path+query, nil)
	if err != nil {
		return fmt.Errorf("client: %w", err)
	}
	if r.auth != "" {
		req.Header.Set("Authorization", r.auth)
	}
	resp, err := r.hc.Do(req)
	if err != nil {
		return fmt.Errorf("client: lookup: %w", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxAnswerBytes))
	if err != nil {
		return fmt.Errorf("client: lookup: read the answer: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		var e struct {
			Error string `json:"error"`
		}
		reason := strings.TrimSpace(string(body))
		if json.Unmarshal(body, &e) == nil && e.Error != "" {
			reason = e.Error
		}
		if len(reason) > 200 { // not the sidecar's answer: a proxy's page, say
			reason = reason[:200] + "..."
		}
		return &Error{StatusCode: resp.StatusCode, Reason: reason}
	}
	if err := json.Unmarshal(body, out); err != nil {
		return fmt.Errorf("client: lookup: the answer is not a total: %w", err)
	}
	return nil
}

// Window returns topic's count over the last window ("15m", "1h", "7d":
// a whole number of minutes, hours or days) from the sidecar's time
// buckets, with the interval its buckets cover.
func (r *Reader) Window(ctx context.Context, topic, window string) (api.Count, error) {
	if err := validTopic(topic, r.maxTopicBytes); err != nil {
		return api.Count{}, err
	}
	var c api.Count
	err := r.get(ctx, "/v1/topics/"+url.PathEscape(topic), "?"+url.Values{"window": {window}}.Encode(), &c)
	return c, err
}

// Trending returns the fleet's trending topics over the last window (whole
// minutes up to an hour), at most limit (1 to 100), highest score first.
func (r *Reader) Trending(ctx context.Context, window string, limit int) (api.Trending, error) {
	var t api.Trending
	q := url.Values{"window": {window}, "limit": {strconv.Itoa(limit)}}
	err := r.get(ctx, "/v1/trending", "?"+q.Encode(), &t)
	return t, err
}
