// Package ddbfault is a DynamoDB fault and partition-ceiling emulator: an
// HTTP proxy between the aws-sdk-go-v2 client and a DynamoDB API (dynalite
// in the tests) that makes the API behave like DynamoDB under load. It reads
// the operation (X-Amz-Target) and the partition keys of each request and
// can:
//
//   - enforce a per-partition-key ceiling (writes 1,000 units/s, reads 3,000,
//     each with a burst), answering over it as DynamoDB does: HTTP 400 with
//     __type ...#ProvisionedThroughputExceededException, so the SDK's own
//     retries and error classification run as in production;
//   - add latency, answer HTTP 500 or 503, reset connections, or fail
//     everything for a period (an outage);
//   - make a write ambiguous: forward it, let the store apply it, then drop
//     the response by resetting the connection, so the client retries a
//     write that already happened.
//
// It counts what it did, per kind and per key, for tests to assert on.
package ddbfault

import (
	"bytes"
	"encoding/json"
	"fmt"
	"hash/crc32"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// DynamoDB's per-partition limits, the defaults of Config.
const (
	DefaultWriteUnits = 1000 // write units per second per partition key
	DefaultReadUnits  = 3000 // read units per second per partition key
)

// Config sets the ceilings. A zero rate turns a ceiling off.
type Config struct {
	// Upstream is the DynamoDB API to forward to.
	Upstream string
	// WriteUnits and WriteBurst: write units per second per key, and the
	// burst a key may spend at once. Each UpdateItem, PutItem or DeleteItem
	// is one unit (hotcount's items are far below 1 KB).
	WriteUnits float64
	WriteBurst int
	// ReadUnits and ReadBurst: read units per second per key; each key of a
	// BatchGetItem or GetItem is one unit.
	ReadUnits float64
	ReadBurst int
}

// Kinds of what the proxy did, the keys of Stats.Did.
const (
	Forwarded = "forwarded" // passed through
	Throttled = "throttled" // refused for the ceiling, not applied
	Failed    = "failed"    // answered 500/503, not applied
	Reset     = "reset"     // connection reset before forwarding, not applied
	Outage    = "outage"    // refused during an outage, not applied
	Ambiguous = "ambiguous" // applied upstream, response dropped
	Latency   = "latency"   // delayed
)

// Stats is what the proxy did.
type Stats struct {
	// Did counts requests by kind.
	Did map[string]int
	// ThrottledKeys counts throttled requests by partition key.
	ThrottledKeys map[string]int
	// AmbiguousDelta is the sum of the :delta values of the UpdateItem
	// calls made ambiguous: what a client that retries them over-counts.
	AmbiguousDelta int64
	// Writes counts forwarded writes by partition key.
	Writes map[string]int
}

// Proxy is the emulator. It is safe for concurrent use; the fault setters
// may be called while it serves.
type Proxy struct {
	cfg    Config
	client *http.Client

	mu        sync.Mutex
	writeLim  map[string]*rate.Limiter
	readLim   map[string]*rate.Limiter
	latency   time.Duration
	outageEnd time.Time
	failNext  int
	failCode  int
	resetNext int
	ambigNext int
	stats     Stats
}

// New returns a proxy to cfg.Upstream.
func New(cfg Config) *Proxy {
	return &Proxy{
		cfg:      cfg,
		client:   &http.Client{Timeout: 30 * time.Second},
		writeLim: map[string]*rate.Limiter{},
		readLim:  map[string]*rate.Limiter{},
		stats:    Stats{Did: map[string]int{}, ThrottledKeys: map[string]int{}, Writes: map[string]int{}},
	}
}

// SetLatency delays every request by d from now on (0: none).
func (p *Proxy) SetLatency(d time.Duration) { p.mu.Lock(); p.latency = d; p.mu.Unlock() }

// SetOutage makes every request fail with a connection reset for d.
func (p *Proxy) SetOutage(d time.Duration) {
	p.mu.Lock()
	p.outageEnd = time.Now().Add(d)
	p.mu.Unlock()
}

// EndOutage ends an outage now.
func (p *Proxy) EndOutage() { p.mu.Lock(); p.outageEnd = time.Time{}; p.mu.Unlock() }

// FailNext answers the next n requests with status (500 or 503).
func (p *Proxy) FailNext(n, status int) {
	p.mu.Lock()
	p.failNext, p.failCode = n, status
	p.mu.Unlock()
}

// ResetNext resets the connection of the next n requests before forwarding.
func (p *Proxy) ResetNext(n int) { p.mu.Lock(); p.resetNext = n; p.mu.Unlock() }

// AmbiguousNext makes the next n UpdateItem calls (the counting writes)
// ambiguous: applied upstream, then the response dropped.
func (p *Proxy) AmbiguousNext(n int) { p.mu.Lock(); p.ambigNext = n; p.mu.Unlock() }

// Stats returns a copy of what the proxy did so far.
func (p *Proxy) Stats() Stats {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := Stats{Did: map[string]int{}, ThrottledKeys: map[string]int{}, Writes: map[string]int{}, AmbiguousDelta: p.stats.AmbiguousDelta}
	for k, v := range p.stats.Did {
		s.Did[k] = v
	}
	for k, v := range p.stats.ThrottledKeys {
		s.ThrottledKeys[k] = v
	}
	for k, v := range p.stats.Writes {
		s.Writes[k] = v
	}
	return s
}

// request is what the proxy reads of a DynamoDB call.
type request struct {
	op    string   // UpdateItem, BatchGetItem, ...
	keys  []string // partition key values (the pk attribute)
	write bool
	delta int64 // UpdateItem's :delta, if any
}

type attr struct {
	S string `json:"S"`
	N string `json:"N"`
}

func parse(target string, body []byte) request {
	op := target[strings.LastIndexByte(target, '.')+1:]
	r := request{op: op}
	switch op {
	case "UpdateItem", "PutItem", "DeleteItem", "GetItem":
		var b struct {
			Key    map[string]attr
			Item   map[string]attr
			Values map[string]attr `json:"ExpressionAttributeValues"`
		}
		json.Unmarshal(body, &b) //nolint:errcheck // a body it cannot read is forwarded as it is
		for _, m := range []map[string]attr{b.Key, b.Item} {
			if pk, ok := m["pk"]; ok {
				r.keys = append(r.keys, pk.S)
			}
		}
		r.write = op != "GetItem"
		if d, ok := b.Values[":delta"]; ok {
			r.delta, _ = strconv.ParseInt(d.N, 10, 64)
		}
	case "BatchGetItem":
		var b struct {
			RequestItems map[string]struct{ Keys []map[string]attr }
		}
		json.Unmarshal(body, &b) //nolint:errcheck // as above
		for _, t := range b.RequestItems {
			for _, k := range t.Keys {
				r.keys = append(r.keys, k["pk"].S)
			}
		}
	}
	return r
}

// ServeHTTP applies the faults and ceilings, then forwards.
func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	req := parse(r.Header.Get("X-Amz-Target"), body)

	p.mu.Lock()
	latency := p.latency
	var verdict string
	switch {
	case time.Now().Before(p.outageEnd):
		verdict = Outage
	case p.resetNext > 0:
		p.resetNext--
		verdict = Reset
	case p.failNext > 0:
		p.failNext--
		verdict = Failed
	case !p.allow(req):
		verdict = Throttled
	case req.op == "UpdateItem" && p.ambigNext > 0:
		p.ambigNext--
		verdict = Ambiguous
		p.stats.AmbiguousDelta += req.delta
	default:
		verdict = Forwarded
	}
	p.stats.Did[verdict]++
	if latency > 0 {
		p.stats.Did[Latency]++
	}
	if verdict == Throttled {
		for _, k := range req.keys {
			p.stats.ThrottledKeys[k]++
		}
	}
	if req.write && (verdict == Forwarded || verdict == Ambiguous) {
		for _, k := range req.keys {
			p.stats.Writes[k]++
		}
	}
	failCode := p.failCode
	p.mu.Unlock()

	time.Sleep(latency)
	switch verdict {
	case Outage, Reset:
		reset(w)
		return
	case Failed:
		awsError(w, failCode, "InternalServerError", "injected failure")
		return
	case Throttled:
		awsError(w, http.StatusBadRequest, "ProvisionedThroughputExceededException",
			"The level of configured provisioned throughput for one or more global secondary indexes of the table was exceeded.")
		return
	}
	resp, err := p.forward(r, body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	defer resp.Body.Close()
	if verdict == Ambiguous {
		io.Copy(io.Discard, resp.Body) //nolint:errcheck // applied upstream: that is the point
		reset(w)
		return
	}
	for k, vs := range resp.Header {
		w.Header()[k] = vs
	}
	w.WriteHeader(resp.StatusCode)
	io.Copy(w, resp.Body) //nolint:errcheck // the client may have gone
}

// allow takes the request's units from each key's bucket; with mu held.
func (p *Proxy) allow(req request) bool {
	lims, units, burst := p.readLim, p.cfg.ReadUnits, p.cfg.ReadBurst
	if req.write {
		lims, units, burst = p.writeLim, p.cfg.WriteUnits, p.cfg.WriteBurst
	}
	if units <= 0 || len(req.keys) == 0 {
		return true
	}
	now := time.Now()
	// All or nothing: check every key before taking from any.
	var rs []*rate.Reservation
	for _, k := range req.keys {
		l, ok := lims[k]
		if !ok {
			l = rate.NewLimiter(rate.Limit(units), max(burst, 1))
			lims[k] = l
		}
		res := l.ReserveN(now, 1)
		if !res.OK() || res.DelayFrom(now) > 0 {
			res.CancelAt(now)
			for _, r := range rs {
				r.CancelAt(now)
			}
			return false
		}
		rs = append(rs, res)
	}
	return true
}

func (p *Proxy) forward(r *http.Request, body []byte) (*http.Response, error) {
	out, err := http.NewRequestWithContext(r.Context(), r.Method, strings.TrimSuffix(p.cfg.Upstream, "/")+r.URL.RequestURI(), bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	out.Header = r.Header.Clone()
	return p.client.Do(out)
}

// reset closes the client's connection with a TCP RST and no response.
func reset(w http.ResponseWriter) {
	conn, _, err := http.NewResponseController(w).Hijack()
	if err != nil {
		// Not HTTP/1 (net/http's HTTP/1 server always hijacks): the
		// nearest thing to no answer is a gateway error.
		w.WriteHeader(http.StatusBadGateway)
		return
	}
	if tc, ok := conn.(*net.TCPConn); ok {
		tc.SetLinger(0) //nolint:errcheck // best effort: a FIN is a reset too for the client
	}
	conn.Close()
}

// awsError answers as DynamoDB does: the error type in __type, and the
// CRC32 of the body, which the SDK checks.
func awsError(w http.ResponseWriter, status int, typ, msg string) {
	body := fmt.Sprintf(`{"__type":"com.amazonaws.dynamodb.v20120810#%s","message":%q}`, typ, msg)
	w.Header().Set("Content-Type", "application/x-amz-json-1.0")
	w.Header().Set("X-Amzn-Requestid", "ddbfault")
	w.Header().Set("X-Amz-Crc32", strconv.FormatUint(uint64(crc32.ChecksumIEEE([]byte(body))), 10))
	w.WriteHeader(status)
	io.WriteString(w, body) //nolint:errcheck // the client may have gone
}

// Serve listens on addr (127.0.0.1:0 for a free port) and serves until the
// returned stop is called. It returns the proxy's URL, for
// --dynamodb-endpoint.
func (p *Proxy) Serve(addr string) (url string, stop func() error, err error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return "", nil, fmt.Errorf("ddbfault: listen %s: %w", addr, err)
	}
	srv := &http.Server{Handler: p, ReadHeaderTimeout: 10 * time.Second}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	return "http://" + ln.Addr().String(), func() error {
		err := srv.Close()
		<-done
		return err
	}, nil
}
