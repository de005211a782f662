// Package ddbfault is a DynamoDB fault and partition-ceiling emulator: an
// HTTP proxy between the aws-sdk-go-v2 client and a DynamoDB API (dynalite
// in the tests) that makes the API behave like DynamoDB under load. It reads
// the operation (X-Amz-Target) and the partition keys of each request and
// can:
//
//   - enforce a per-partition-key ceiling with a burst (DynamoDB's are
//     1,000 write and 3,000 read units/s), answering over it as DynamoDB
//     does: HTTP 400 with __type ...#ProvisionedThroughputExceededException,
//     so the SDK's own retries and error classification run as in
//     production;
//   - add latency, answer HTTP 500 or 503, refuse writes, or fail
//     everything for a period (an outage: connections reset);
//   - deny chosen keys (Deny; TopicKeys: every item of one topic) until
//     Allow: their writes, and if asked their reads, answered with a
//     definite error of the caller's choosing, AccessDeniedException by
//     default, as a fine-grained IAM policy refuses them, applying nothing;
//   - lose the answer to a counting write (UpdateItem) after the store
//     applied it, as DynamoDB can, so that the client, not knowing, may
//     retry a write that already happened. Three ways, each its own kind:
//     Ambiguous resets the connection; Ambiguous500 answers HTTP 500
//     InternalServerError; AmbiguousHang holds the connection unanswered
//     (30s by default, longer than any client timeout) until the client
//     gives up, then resets it; AmbiguousCut answers 200 with half the body
//     and resets (the SDK then fails to read an answer that said
//     "applied"). AmbiguousNext makes the next n UpdateItem
//     calls Ambiguous; LoseAnswers makes a random share of them one of the
//     kinds.
//
// A request is forwarded, and its answer read whole, on the proxy's own
// context, whatever the client does meanwhile: dynalite crashes when a
// request to it is aborted mid-body, and a write the proxy decided to
// forward completes, as it would in DynamoDB.
//
// It counts what it did, per kind and per key, for tests to assert on.
package ddbfault

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"hash/crc32"
	"io"
	"maps"
	"math/rand/v2"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hotcount/hotcount/schema"
	"github.com/hotcount/hotcount/tools/ceiling"
)

// DefaultHang is how long AmbiguousHang holds a connection unless SetHang
// says otherwise: longer than any client timeout.
const DefaultHang = 30 * time.Second

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
	Outage    = "outage"    // refused during an outage, not applied
	Refused   = "refused"   // UpdateItem answered 400 ResourceNotFoundException (SetWriteFailure), not applied
	Denied    = "denied"    // a request on keys Deny refuses, answered with its error, not applied
	Latency   = "latency"   // delayed

	// The lost answers: applied upstream, then the answer lost.
	Ambiguous     = "ambiguous"      // connection reset
	Ambiguous500  = "ambiguous_500"  // answered HTTP 500 InternalServerError
	AmbiguousHang = "ambiguous_hang" // connection held unanswered, then reset
	AmbiguousCut  = "ambiguous_cut"  // 200 and half the body, then reset
)

// lostKinds are the kinds of lost answer, LoseAnswers' default.
var lostKinds = []string{Ambiguous, Ambiguous500, AmbiguousHang, AmbiguousCut}

// Stats is what the proxy did.
type Stats struct {
	// Did counts requests by kind.
	Did map[string]int
	// ThrottledKeys counts throttled requests by partition key.
	ThrottledKeys map[string]int
	// Writes counts forwarded writes by partition key.
	Writes map[string]int
	// DeniedKeys counts denied requests by partition key: every key of
	// the request (a denied BatchGetItem reads none of its keys).
	DeniedKeys map[string]int
}

// Lost is the number of requests whose answer was lost after the store
// applied them: the ambiguous kinds together.
func (s Stats) Lost() int {
	return s.Did[Ambiguous] + s.Did[Ambiguous500] + s.Did[AmbiguousHang] + s.Did[AmbiguousCut]
}

// Proxy is the emulator. It is safe for concurrent use; the fault setters
// may be called while it serves.
type Proxy struct {
	cfg    Config
	client *http.Client

	mu sync.Mutex
	// writes and reads are the per-key ceilings (nil: none).
	writes, reads *ceiling.Keys
	latency       time.Duration
	outageEnd     time.Time
	failNext      int
	refuseWrites  bool
	denial        *Denial // nil: none
	failCode      int
	ambigNext     int
	loseRate      float64  // share of UpdateItem calls whose answer is lost
	loseKinds     []string // how, chosen uniformly
	hang          time.Duration
	stats         Stats

	hanging atomic.Int64 // AmbiguousHang connections held now
}

// New returns a proxy to cfg.Upstream.
func New(cfg Config) *Proxy {
	return &Proxy{
		cfg:    cfg,
		client: &http.Client{Timeout: 30 * time.Second},
		writes: ceiling.New(cfg.WriteUnits, cfg.WriteBurst),
		reads:  ceiling.New(cfg.ReadUnits, cfg.ReadBurst),
		hang:   DefaultHang,
		stats:  newStats(),
	}
}

func newStats() Stats {
	return Stats{Did: map[string]int{}, ThrottledKeys: map[string]int{}, Writes: map[string]int{}, DeniedKeys: map[string]int{}}
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

// AmbiguousNext makes the next n UpdateItem calls (the counting writes)
// ambiguous: applied upstream, then the response dropped.
func (p *Proxy) AmbiguousNext(n int) { p.mu.Lock(); p.ambigNext = n; p.mu.Unlock() }

// LoseAnswers makes, from now on, each UpdateItem call that would be
// forwarded (not in an outage, failed, refused, throttled, or taken by
// AmbiguousNext) lose its answer after the store applied it, with
// probability rate, in one of kinds chosen uniformly at random:
// Ambiguous, Ambiguous500, AmbiguousHang or AmbiguousCut; no kinds is all
// of them. A rate of 0 or less turns it off, 1 or more loses every answer.
// A kind that is not one of them panics.
func (p *Proxy) LoseAnswers(rate float64, kinds ...string) {
	if len(kinds) == 0 {
		kinds = lostKinds
	}
	for _, k := range kinds {
		if !slices.Contains(lostKinds, k) {
			panic(fmt.Sprintf("ddbfault: LoseAnswers: %q is not one of %v", k, lostKinds))
		}
	}
	p.mu.Lock()
	p.loseRate, p.loseKinds = rate, slices.Clone(kinds)
	p.mu.Unlock()
}

// SetWriteFailure makes every UpdateItem (the counting writes) answer 400
// ResourceNotFoundException (the whole table refusing, not some keys for
// good: see Deny), applying nothing, while on; reads still work.
func (p *Proxy) SetWriteFailure(on bool) { p.mu.Lock(); p.refuseWrites = on; p.mu.Unlock() }

// Denial refuses the requests on chosen partition keys with a definite
// error, as DynamoDB does when a fine-grained IAM policy (a
// dynamodb:LeadingKeys condition) denies them: a 4xx answer, nothing
// applied, which the SDK does not retry. Writes (UpdateItem, PutItem,
// DeleteItem) on a matching key are refused; reads only if Reads says so.
// Requests whose keys the proxy does not read (Query, Scan, the table
// calls) always pass.
type Denial struct {
	// Keys says which partition keys are denied (TopicKeys: every item of
	// one topic). It is called with the proxy's lock held: it must not
	// call the proxy. Required.
	Keys func(pk string) bool
	// Status is the HTTP status of the answer, 400 to 499; 0 is 400,
	// DynamoDB's for AccessDeniedException as for ValidationException.
	Status int
	// Type is the error type, the SDK APIError's ErrorCode():
	// "AccessDeniedException" (the default, when empty),
	// "ValidationException", ...
	Type string
	// Reads denies reads of the keys too: a GetItem of one, and a
	// BatchGetItem with any of them among its keys, whole, as IAM refuses
	// it. Off, every read passes.
	Reads bool
}

// Deny refuses, from now on until Allow, the requests d says, each
// answered with d's error (see Denial). It replaces any denial before.
// A Denial without Keys, or with a Status that is not 4xx, panics: any
// other answer would not be definite.
func (p *Proxy) Deny(d Denial) {
	if d.Keys == nil {
		panic("ddbfault: Deny: a Denial needs Keys")
	}
	if d.Status == 0 {
		d.Status = http.StatusBadRequest
	}
	if d.Status < 400 || d.Status > 499 {
		panic(fmt.Sprintf("ddbfault: Deny: status %d is not 4xx", d.Status))
	}
	if d.Type == "" {
		d.Type = "AccessDeniedException"
	}
	p.mu.Lock()
	p.denial = &d
	p.mu.Unlock()
}

// Allow ends Deny's denial: every key is served again.
func (p *Proxy) Allow() { p.mu.Lock(); p.denial = nil; p.mu.Unlock() }

// TopicKeys matches the partition key of every item of topic, for
// Denial.Keys: its shards (TREND#<topic>#<shard>), its minute and hour
// buckets (MINUTE#<topic>#<minute>#<shard>, HOUR#<topic>#<hour>#<shard>)
// and its metadata item (TREND#<topic>#meta); no other topic's, though
// topics may hold '#'.
func TopicKeys(topic string) func(pk string) bool {
	meta := schema.MetaKey(topic)
	return func(pk string) bool {
		if pk == meta {
			return true
		}
		if t, _, err := schema.ParseShardKey(pk); err == nil {
			return t == topic
		}
		t, _, _, _, err := schema.ParseBucketKey(pk)
		return err == nil && t == topic
	}
}

// SetHang sets how long AmbiguousHang holds a connection unanswered before
// resetting it, unless the client goes away or the proxy stops first
// (DefaultHang; d <= 0 restores it).
func (p *Proxy) SetHang(d time.Duration) {
	if d <= 0 {
		d = DefaultHang
	}
	p.mu.Lock()
	p.hang = d
	p.mu.Unlock()
}

// Hanging is the number of connections AmbiguousHang holds unanswered now.
func (p *Proxy) Hanging() int { return int(p.hanging.Load()) }

// Stats returns a copy of what the proxy did so far.
func (p *Proxy) Stats() Stats {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := newStats()
	maps.Copy(s.Did, p.stats.Did)
	maps.Copy(s.ThrottledKeys, p.stats.ThrottledKeys)
	maps.Copy(s.Writes, p.stats.Writes)
	maps.Copy(s.DeniedKeys, p.stats.DeniedKeys)
	return s
}

// request is what the proxy reads of a DynamoDB call.
type request struct {
	op    string   // UpdateItem, BatchGetItem, ...
	keys  []string // partition key values (the pk attribute)
	write bool
	read  bool // GetItem or BatchGetItem
}

type attr struct {
	S string `json:"S"`
}

func parse(target string, body []byte) request {
	op := target[strings.LastIndexByte(target, '.')+1:]
	r := request{op: op}
	switch op {
	case "UpdateItem", "PutItem", "DeleteItem", "GetItem":
		var b struct {
			Key  map[string]attr
			Item map[string]attr
		}
		json.Unmarshal(body, &b) //nolint:errcheck // a body it cannot read is forwarded as it is
		for _, m := range []map[string]attr{b.Key, b.Item} {
			if pk, ok := m["pk"]; ok {
				r.keys = append(r.keys, pk.S)
			}
		}
		r.write = op != "GetItem"
		r.read = !r.write
	case "BatchGetItem":
		r.read = true
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
	d := p.decide(parse(r.Header.Get("X-Amz-Target"), body))
	if d.latency > 0 && !delay(r.Context(), d.latency) {
		reset(w)
		return
	}
	if refuse(w, d) {
		return
	}
	resp, err := p.forward(r, body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	p.reply(w, r, d, resp)
}

// decision is what the proxy does with one request, and the settings it
// does it with, as they were when it decided.
type decision struct {
	verdict  string // one of the kinds
	latency  time.Duration
	failCode int
	hang     time.Duration
	denial   *Denial // the denial, when the verdict is Denied
	deniedOp string  // and what it refused: the operation and
	deniedPK string  // the first key it matched
}

// decide picks req's verdict and counts it, under one lock so that the
// settings and the counts agree.
func (p *Proxy) decide(req request) decision {
	p.mu.Lock()
	defer p.mu.Unlock()
	d := decision{latency: p.latency, failCode: p.failCode, hang: p.hang}
	d.verdict = p.verdict(req, &d)
	p.count(req, d)
	return d
}

// verdict is the kind of what the proxy does with req, the faults taking
// their turn in order; with mu held. It spends what it uses: one of
// FailNext's or AmbiguousNext's calls, the ceilings' units. A denial is
// decided before the ceilings, as IAM refuses a request before DynamoDB
// spends capacity on it; it notes itself in d.
func (p *Proxy) verdict(req request, d *decision) string {
	switch {
	case time.Now().Before(p.outageEnd):
		return Outage
	case p.failNext > 0:
		p.failNext--
		return Failed
	case p.denies(req, d):
		return Denied
	case p.refuseWrites && req.op == "UpdateItem":
		return Refused
	case !p.allow(req):
		return Throttled
	case req.op == "UpdateItem" && p.ambigNext > 0:
		p.ambigNext--
		return Ambiguous
	case req.op == "UpdateItem" && p.loseRate > 0 && rand.Float64() < p.loseRate:
		return p.loseKinds[rand.IntN(len(p.loseKinds))]
	default:
		return Forwarded
	}
}

// denies says whether the denial refuses req and, if so, notes in d what
// it refused; with mu held.
func (p *Proxy) denies(req request, d *decision) bool {
	den := p.denial
	if den == nil || !(req.write || den.Reads && req.read) {
		return false
	}
	for _, k := range req.keys {
		if den.Keys(k) {
			d.denial, d.deniedOp, d.deniedPK = den, req.op, k
			return true
		}
	}
	return false
}

// count adds the decision to the stats; with mu held. A write counts as
// written when it reaches the store, whether or not its answer is lost.
func (p *Proxy) count(req request, d decision) {
	p.stats.Did[d.verdict]++
	if d.latency > 0 {
		p.stats.Did[Latency]++
	}
	switch d.verdict {
	case Throttled:
		for _, k := range req.keys {
			p.stats.ThrottledKeys[k]++
		}
	case Denied:
		for _, k := range req.keys {
			p.stats.DeniedKeys[k]++
		}
	}
	lost := slices.Contains(lostKinds, d.verdict)
	if req.write && (d.verdict == Forwarded || lost) {
		for _, k := range req.keys {
			p.stats.Writes[k]++
		}
	}
}

// delay waits d before a request goes on. Only the proxy stopping cuts it
// short (false); a client that goes away meanwhile does not: the request
// is still forwarded (see forward).
func delay(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	select {
	case <-t.C:
		return true
	case <-stopping(ctx):
		t.Stop()
		return false
	}
}

// refuse answers the verdicts that never reach the store, and says whether
// it did.
func refuse(w http.ResponseWriter, d decision) bool {
	switch d.verdict {
	case Outage:
		reset(w)
	case Failed:
		awsError(w, d.failCode, "InternalServerError", "injected failure")
	case Refused:
		// A refusal of the whole table (as while it is being restored),
		// not one for good of some keys (Deny): the store is down.
		awsError(w, http.StatusBadRequest, "ResourceNotFoundException", "injected: writes refused")
	case Denied:
		awsError(w, d.denial.Status, d.denial.Type,
			fmt.Sprintf("injected (ddbfault): dynamodb:%s denied on key %s", d.deniedOp, d.deniedPK))
	case Throttled:
		awsError(w, http.StatusBadRequest, "ProvisionedThroughputExceededException",
			"The level of configured provisioned throughput for one or more global secondary indexes of the table was exceeded.")
	default:
		return false
	}
	return true
}

// reply gives the client the store's answer, or loses it in the way the
// verdict says.
func (p *Proxy) reply(w http.ResponseWriter, r *http.Request, d decision, resp Answer) {
	switch d.verdict {
	case Ambiguous:
		reset(w)
	case Ambiguous500:
		awsError(w, http.StatusInternalServerError, "InternalServerError", "Internal server error (injected after the write was applied)")
	case AmbiguousCut:
		writeHeader(w, resp)
		w.Write(resp.Body[:len(resp.Body)/2]) //nolint:errcheck // then cut off
		http.NewResponseController(w).Flush() //nolint:errcheck // best effort
		reset(w)
	case AmbiguousHang:
		p.hangUp(r.Context(), w, d.hang)
	default:
		writeHeader(w, resp)
		w.Write(resp.Body) //nolint:errcheck // the client may have gone
	}
}

// writeHeader sends the store's status and headers.
func writeHeader(w http.ResponseWriter, resp Answer) {
	for k, vs := range resp.Header {
		w.Header()[k] = vs
	}
	w.WriteHeader(resp.Status)
}

// hangUp holds the connection unanswered for d, then resets it; sooner if
// the client goes away or the proxy stops (both end ctx). Hanging counts it
// until the reset is done.
func (p *Proxy) hangUp(ctx context.Context, w http.ResponseWriter, d time.Duration) {
	p.hanging.Add(1)
	defer p.hanging.Add(-1)
	t := time.NewTimer(d)
	select {
	case <-t.C:
	case <-ctx.Done():
		t.Stop()
	}
	reset(w)
}

// allow takes the request's units from each key's bucket, all or
// nothing (tools/ceiling).
func (p *Proxy) allow(req request) bool {
	if req.write {
		return p.writes.Take(time.Now(), req.keys...)
	}
	return p.reads.Take(time.Now(), req.keys...)
}

// Answer is an upstream answer, read whole.
type Answer struct {
	Status int
	Header http.Header
	Body   []byte
}

// forward sends the request upstream on the proxy's own context, not the
// client's (see Forward); p.client's timeout bounds it.
func (p *Proxy) forward(r *http.Request, body []byte) (Answer, error) {
	return Forward(context.WithoutCancel(r.Context()), p.client, r, strings.TrimSuffix(p.cfg.Upstream, "/"), body)
}

// Forward sends r, with body, to upstream (a base URL) on ctx and reads
// the whole answer. Callers pass a context of their own, not the client's:
// a client that goes away must neither abort dynalite's request mid-body
// (which crashes it) nor undo a write the proxy decided to forward.
func Forward(ctx context.Context, client *http.Client, r *http.Request, upstream string, body []byte) (Answer, error) {
	out, err := http.NewRequestWithContext(ctx, r.Method, upstream+r.URL.RequestURI(), bytes.NewReader(body))
	if err != nil {
		return Answer{}, err
	}
	out.Header = r.Header.Clone()
	resp, err := client.Do(out)
	if err != nil {
		return Answer{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return Answer{}, err
	}
	return Answer{Status: resp.StatusCode, Header: resp.Header, Body: b}, nil
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

// errorNamespaces are the namespaces DynamoDB gives in __type to the error
// types that are not its own but its service framework's, raised before
// DynamoDB proper sees the request; its own are
// com.amazonaws.dynamodb.v20120810's. The SDK reads only what follows '#'.
var errorNamespaces = map[string]string{
	"AccessDeniedException": "com.amazon.coral.service",
	"ValidationException":   "com.amazon.coral.validate",
}

// awsError answers as DynamoDB does: the error type in __type, in its
// namespace, and the CRC32 of the body, which the SDK checks.
func awsError(w http.ResponseWriter, status int, typ, msg string) {
	ns, msgKey := errorNamespaces[typ], "message"
	if ns == "" {
		ns = "com.amazonaws.dynamodb.v20120810"
	}
	if ns == "com.amazon.coral.service" {
		msgKey = "Message" // the framework's spelling
	}
	t, _ := json.Marshal(ns + "#" + typ) // strings: no error
	m, _ := json.Marshal(msg)
	body := fmt.Sprintf(`{"__type":%s,%q:%s}`, t, msgKey, m)
	w.Header().Set("Content-Type", "application/x-amz-json-1.0")
	w.Header().Set("X-Amzn-Requestid", "ddbfault")
	w.Header().Set("X-Amz-Crc32", strconv.FormatUint(uint64(crc32.ChecksumIEEE([]byte(body))), 10))
	w.WriteHeader(status)
	io.WriteString(w, body) //nolint:errcheck // the client may have gone
}

// stopKey is the context key of the channel Serve closes when it stops.
type stopKey struct{}

// stopping is closed when the Serve that serves ctx's request stops; nil
// (never ready) outside Serve.
func stopping(ctx context.Context) <-chan struct{} {
	c, _ := ctx.Value(stopKey{}).(<-chan struct{})
	return c
}

// Serve listens on addr (127.0.0.1:0 for a free port) and serves until the
// returned stop is called. It returns the proxy's URL, for
// --dynamodb-endpoint.
//
// stop closes every connection, ends hangs and latencies in progress, and
// returns once every request has finished: at most the time an upstream
// request in flight takes to complete (see forward), since those are not
// cut. Calling it again does nothing more.
func (p *Proxy) Serve(addr string) (url string, stop func() error, err error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return "", nil, fmt.Errorf("ddbfault: listen %s: %w", addr, err)
	}
	stopCh := make(chan struct{})
	base, cancel := context.WithCancel(context.WithValue(context.Background(), stopKey{}, (<-chan struct{})(stopCh)))
	var (
		mu       sync.Mutex
		closed   bool
		handlers sync.WaitGroup // requests in ServeHTTP
	)
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		if closed {
			mu.Unlock()
			reset(w)
			return
		}
		handlers.Add(1)
		mu.Unlock()
		defer handlers.Done()
		p.ServeHTTP(w, r)
	})
	srv := &http.Server{
		Handler:           handler,
		ReadHeaderTimeout: 10 * time.Second,
		BaseContext:       func(net.Listener) context.Context { return base },
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	var (
		once    sync.Once
		stopErr error
	)
	return "http://" + ln.Addr().String(), func() error {
		once.Do(func() {
			mu.Lock()
			closed = true
			mu.Unlock()
			close(stopCh)
			cancel() // every request's context: ends the hangs
			stopErr = srv.Close()
			<-done
			handlers.Wait()
			p.client.CloseIdleConnections()
		})
		return stopErr
	}, nil
}
