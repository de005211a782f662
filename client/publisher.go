package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"

	"github.com/hotcount/hotcount/internal/waits"
	"github.com/hotcount/hotcount/mention"
)

// Defaults of the Publisher's options.
const (
	// DefaultSubjectPrefix is where a sidecar takes mentions by default
	// (its --subject is mentions.>).
	DefaultSubjectPrefix = "mentions."
	// DefaultLinger is how long a mention waits in the batch for more of
	// its topic. A sidecar writes every --flush-interval (1s by default),
	// so this adds little to the time a mention takes to reach a total.
	DefaultLinger = 100 * time.Millisecond
	// DefaultMaxBatch bounds the messages a batch holds (one per topic,
	// while coalescing): a full batch is sent at once, and Mention waits
	// while the next one is full too.
	DefaultMaxBatch = 1000
	// DefaultMaxInFlight bounds the messages being published at once:
	// JetStream publishes waiting for their acknowledgement.
	DefaultMaxInFlight = 64
	// DefaultPublishTimeout bounds one attempt to publish a message: how
	// long to wait for the stream's acknowledgement before trying again.
	DefaultPublishTimeout = 5 * time.Second
	// DefaultRetryFor bounds the retries of one message: half the
	// stream's default duplicate window (mention.DefaultDuplicateWindow,
	// which `hotcount stream create` sets), so that every retry reaches the
	// stream while it still remembers the message's id.
	DefaultRetryFor = mention.DefaultDuplicateWindow / 2
)

// Errors that callers branch on.
var (
	// ErrInvalidTopic wraps a topic the sidecar would refuse (empty, too
	// long, not UTF-8, control characters) or that cannot end a NATS
	// subject (an empty part between dots, a wildcard, a space).
	ErrInvalidTopic = errors.New("client: invalid topic")
	// ErrInvalidBy wraps a contributor id the sidecar would refuse: empty,
	// longer than mention.MaxByBytes, not UTF-8, control characters.
	ErrInvalidBy = errors.New("client: invalid contributor")
	// ErrInvalidCount wraps a count outside 1..max-count: the sidecar
	// takes nothing else in one message.
	ErrInvalidCount = errors.New("client: invalid count")
	// ErrClosed is returned by a Publisher's methods once Close was called.
	ErrClosed = errors.New("client: publisher closed")
)

// PublisherOption changes a Publisher's defaults.
type PublisherOption func(*publisherOptions)

type publisherOptions struct {
	prefix        string
	core          bool
	linger        time.Duration
	maxBatch      int
	maxInFlight   int
	timeout       time.Duration
	retryFor      time.Duration
	maxCount      int64
	maxTopicBytes int
	onDone        func(topic string, count int64, err error)
}

// WithSubjectPrefix publishes to prefix+topic; prefix is the sidecar's
// --subject without its final ">" (default DefaultSubjectPrefix).
func WithSubjectPrefix(prefix string) PublisherOption {
	return func(o *publisherOptions) { o.prefix = prefix }
}

// WithCoreNATS publishes plain core NATS messages, for a NATS server
// without JetStream. That is at-most-once: no acknowledgement, no
// de-duplication; a message is done once it is written to the connection,
// and Flush and Close then wait for the server to have read it. A
// subscriber that is absent or too slow when it arrives never sees it.
func WithCoreNATS() PublisherOption {
	return func(o *publisherOptions) { o.core = true }
}

// WithLinger sets how long a mention waits in the batch for more of its
// topic (default DefaultLinger). 0 turns coalescing off: every Mention is
// a message of its own, sent as soon as a sender is free, as a load
// generator wants.
func WithLinger(d time.Duration) PublisherOption {
	return func(o *publisherOptions) { o.linger = d }
}

// WithMaxBatch bounds the messages one batch holds (default
// DefaultMaxBatch).
func WithMaxBatch(n int) PublisherOption {
	return func(o *publisherOptions) { o.maxBatch = n }
}

// WithMaxInFlight bounds the JetStream publishes waiting for their
// acknowledgement at once (default DefaultMaxInFlight). Core NATS
// publishes wait for nothing.
func WithMaxInFlight(n int) PublisherOption {
	return func(o *publisherOptions) { o.maxInFlight = n }
}

// WithRetry sets how long one attempt may wait for its acknowledgement
// (default DefaultPublishTimeout) and for how long after its first
// attempt a message is retried, with backoff (default DefaultRetryFor; 0
// is no retry). Keep retryFor plus the timeout inside the stream's
// duplicate window: an attempt after it may count twice.
func WithRetry(timeout, retryFor time.Duration) PublisherOption {
	return func(o *publisherOptions) { o.timeout, o.retryFor = timeout, retryFor }
}

// WithLimits sets the sidecar's --max-count and --max-topic-bytes, when
// it runs with others than its defaults (mention.DefaultMaxCount and
// mention.DefaultMaxTopicBytes).
func WithLimits(maxCount int64, maxTopicBytes int) PublisherOption {
	return func(o *publisherOptions) { o.maxCount, o.maxTopicBytes = maxCount, maxTopicBytes }
}

// WithOnDone has fn called once for every message the Publisher sends,
// with its topic, its count and its outcome: nil once the stream
// acknowledged it (JetStream) or it was written to the connection (core
// NATS); else the error that ended its retries. A message that failed
// after an attempt timed out may still have been stored. fn runs on a
// goroutine of the Publisher's, one call at a time, and holds back the
// messages behind it: it must be quick. Flush and Close return after fn
// has run for every message they waited for.
func WithOnDone(fn func(topic string, count int64, err error)) PublisherOption {
	return func(o *publisherOptions) { o.onDone = fn }
}

// Publisher publishes mentions to the sidecars. It is safe for concurrent
// use. NewPublisher starts its goroutines (a batcher, a sender and, with
// JetStream, one that awaits acknowledgements), so that a producer needs
// nothing but Mention; Close stops them and waits for them. The NATS
// connection stays the caller's: Close leaves it open.
//
// The stream remembers each message's id for its duplicate window, about
// 120 bytes of the NATS server's memory per message: coalescing (the
// default linger) keeps that to a message per topic per linger.
type Publisher struct {
	nc *nats.Conn
	js jetstream.JetStream // nil in core mode
	o  publisherOptions

	// ctx is cancelled when Close gives up: the senders then stop
	// retrying and fail what is left without sending it.
	ctx    context.Context
	cancel context.CancelFunc

	mu      sync.Mutex
	room    *sync.Cond      // the batch was taken, or Close was called
	drained *sync.Cond      // every message of some batch is done
	batch   []message       // held, not yet handed to the senders
	open    map[openKey]int // topic (and time) -> index in batch of its message still taking mentions
	gen     uint64          // the batch being filled
	undone  map[uint64]int  // messages not yet done, by batch
	failed  PublishError    // given up since the last Flush or Close
	closed  bool

	begun   chan struct{}   // a batch began: start its linger
	sealNow chan struct{}   // send the batch now: full, Flush, Close, no linger
	queue   chan []message  // batches for the sender
	acks    chan publishing // JetStream: publishes sent, in order, awaiting their acknowledgement
	wg      sync.WaitGroup
}

// publishing is a JetStream message sent asynchronously: its future, or
// the error that kept it from being sent.
type publishing struct {
	m    message
	msg  *nats.Msg
	sent time.Time // the first attempt
	ack  jetstream.PubAckFuture
	err  error
}

// message is one message to publish: count mentions of topic, from batch
// gen, that happened at at (Unix milliseconds) when timed.
type message struct {
	topic string
	count int64
	gen   uint64
	at    int64
	timed bool
	by    string // who mentioned it ("" for no one in particular)
}

// openKey is what mentions share to add up into one message: the topic,
// for MentionAt's the time, and for MentionBy's the contributor.
type openKey struct {
	topic string
	at    int64
	timed bool
	by    string
}

// NewPublisher returns a Publisher on nc, a connection the caller owns and
// closes after the Publisher. nats.go reconnects it by itself; its
// reconnect buffer (nats.ReconnectBufSize) holds what is published while
// it is away.
func NewPublisher(nc *nats.Conn, opts ...PublisherOption) (*Publisher, error) {
	o := publisherOptions{
		prefix:        DefaultSubjectPrefix,
		linger:        DefaultLinger,
		maxBatch:      DefaultMaxBatch,
		maxInFlight:   DefaultMaxInFlight,
		timeout:       DefaultPublishTimeout,
		retryFor:      DefaultRetryFor,
		maxCount:      mention.DefaultMaxCount,
		maxTopicBytes: mention.DefaultMaxTopicBytes,
	}
	for _, opt := range opts {
		opt(&o)
	}
	if nc == nil {
		return nil, errors.New("client: no NATS connection")
	}
	// The sidecar's own check of its --subject: a prefix it can take.
	if _, err := mention.Prefix(o.prefix + ">"); err != nil {
		return nil, fmt.Errorf("client: subject prefix %q must be a literal subject ending with a dot (like %q)", o.prefix, DefaultSubjectPrefix)
	}
	switch {
	case o.linger < 0:
		return nil, fmt.Errorf("client: linger %s is negative", o.linger)
	case o.maxBatch < 1, o.maxInFlight < 1:
		return nil, fmt.Errorf("client: max batch %d and max in flight %d must be at least 1", o.maxBatch, o.maxInFlight)
	case o.timeout <= 0 || o.retryFor < 0:
		return nil, fmt.Errorf("client: publish timeout %s must be positive and retry time %s not negative", o.timeout, o.retryFor)
	case o.maxCount < 1 || o.maxTopicBytes < 1:
		return nil, fmt.Errorf("client: max count %d and max topic bytes %d must be at least 1", o.maxCount, o.maxTopicBytes)
	}
	p := &Publisher{
		nc:      nc,
		o:       o,
		open:    make(map[openKey]int),
		undone:  make(map[uint64]int),
		begun:   make(chan struct{}, 1),
		sealNow: make(chan struct{}, 1),
		queue:   make(chan []message),
	}
	p.room, p.drained = sync.NewCond(&p.mu), sync.NewCond(&p.mu)
	p.ctx, p.cancel = context.WithCancel(context.Background())
	if o.core {
		p.wg.Go(p.sendCore)
	} else {
		// nats.go bounds the acknowledgements outstanding, and fails one
		// that does not come within the timeout (or when the connection
		// drops), so that it is retried.
		js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(o.maxInFlight), jetstream.WithPublishAsyncTimeout(o.timeout))
		if err != nil {
			return nil, fmt.Errorf("client: %w", err)
		}
		p.js = js
		p.acks = make(chan publishing, o.maxInFlight)
		p.wg.Go(p.sendJetStream)
		p.wg.Go(p.awaitAcks)
	}
	p.wg.Go(p.batcher)
	return p, nil
}

// Mention adds n mentions of topic. It returns once the Publisher holds
// them: nil means they are accepted and will be published (Flush and
// Close report any that could not be). It waits while the batch is full
// and every sender busy (backpressure), until ctx ends. An error means
// nothing was accepted: ErrInvalidTopic, ErrInvalidCount, ErrClosed, or
// ctx's error.
//
// Mentions of one topic add up into one message, up to the max count;
// past it the topic's next message begins, so a count never overflows
// and the sidecar never refuses one.
func (p *Publisher) Mention(ctx context.Context, topic string, n int64) error {
	return p.mention(ctx, message{topic: topic, count: n})
}

// MentionAt is Mention for mentions that happened at a time of their own
// (a backfill after an outage, say): their message carries `"at"` (Unix
// milliseconds), which counts them in that time's minute and hour buckets
// instead of those of their publication; totals count them as ever. The
// sidecar refuses, to its dead-letter subject, an at older than its
// --max-lateness (a day by default) before the message's publication, or
// more than a minute after it. Mentions add up into one message only with
// others of their topic at the same millisecond. A zero at is Mention.
func (p *Publisher) MentionAt(ctx context.Context, topic string, n int64, at time.Time) error {
	if at.IsZero() {
		return p.Mention(ctx, topic, n)
	}
	return p.mention(ctx, message{topic: topic, count: n, at: at.UnixMilli(), timed: true})
}

// MentionBy is Mention for mentions by one contributor, by: an opaque id
// the caller chooses (a hash of a user id, say) of 1..mention.MaxByBytes
// bytes of UTF-8 without control characters. Counts are the same; with
// --trending-by contributors the sidecars rank trending topics by how many
// distinct contributors mention them, each once a minute, so that a few
// accounts flooding a topic cannot put it on top. Mentions add up into one
// message only with others of their topic by the same contributor. A
// non-zero at is MentionAt's. An invalid by is ErrInvalidBy.
func (p *Publisher) MentionBy(ctx context.Context, topic, by string, n int64, at time.Time) error {
	if err := mention.ValidateBy([]byte(by)); err != nil {
		var ie *mention.InvalidError
		msg := err.Error()
		if errors.As(err, &ie) {
			msg = ie.Msg
		}
		return fmt.Errorf("%w %.64q: %s", ErrInvalidBy, by, msg)
	}
	m := message{topic: topic, count: n, by: by}
	if !at.IsZero() {
		m.at, m.timed = at.UnixMilli(), true
	}
	return p.mention(ctx, m)
}

func (p *Publisher) mention(ctx context.Context, m message) error {
	if err := p.check(m.topic, m.count); err != nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for {
		if p.closed {
			return ErrClosed
		}
		if p.add(m) {
			return nil
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		// No kick here: add kicked the batcher when the batch filled, and
		// a second one, left pending after the batcher took the full
		// batch, sealed the next batch with one message in it.
		stop := context.AfterFunc(ctx, func() { p.broadcast(p.room) })
		p.room.Wait()
		stop()
	}
}

// check applies the sidecar's rules for one message to a mention.
func (p *Publisher) check(topic string, n int64) error {
	if n < 1 || n > p.o.maxCount {
		return fmt.Errorf("%w: %d mentions of %.64q: one message carries 1..%d (the sidecar's --max-count)", ErrInvalidCount, n, topic, p.o.maxCount)
	}
	if err := validTopic(topic, p.o.maxTopicBytes); err != nil {
		return err
	}
	// NATS's rules for what follows the prefix in a subject a publish
	// may use; nats.go checks only for spaces.
	for tok := range strings.SplitSeq(topic, ".") {
		if tok == "" || tok == "*" || tok == ">" || strings.ContainsAny(tok, " \t\r\n") {
			return fmt.Errorf("%w %.64q: a NATS subject cannot hold it (an empty part between dots, a wildcard or a space)", ErrInvalidTopic, topic)
		}
	}
	return nil
}

// validTopic applies the sidecar's topic rules (mention.ValidateTopic).
func validTopic(topic string, maxBytes int) error {
	if err := mention.ValidateTopic(topic, maxBytes); err != nil {
		msg := err.Error()
		var ie *mention.InvalidError
		if errors.As(err, &ie) {
			msg = ie.Msg
		}
		return fmt.Errorf("%w %.64q: %s", ErrInvalidTopic, topic, msg)
	}
	return nil
}

// add puts m's mentions into the batch: into the open message of its topic
// (and time) while that stays within the max count, else into a new
// message while the batch has room. It reports whether it did. p.mu is
// held.
func (p *Publisher) add(m message) bool {
	key := openKey{m.topic, m.at, m.timed, m.by}
	if i, ok := p.open[key]; ok && p.batch[i].count <= p.o.maxCount-m.count {
		p.batch[i].count += m.count
		return true
	}
	if len(p.batch) >= p.o.maxBatch {
		return false
	}
	if p.o.linger > 0 {
		p.open[key] = len(p.batch)
	}
	m.gen = p.gen
	p.batch = append(p.batch, m)
	p.undone[p.gen]++
	// One wake-up per batch: the batcher takes the whole batch when it
	// comes (without linger, what came while the sender was busy).
	switch {
	case len(p.batch) == p.o.maxBatch || (len(p.batch) == 1 && p.o.linger == 0):
		kick(p.sealNow)
	case len(p.batch) == 1:
		kick(p.begun)
	}
	return true
}

// kick wakes the batcher; a wake-up already pending is enough.
func kick(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// broadcast wakes the waiters of c. Taking the lock first means a waiter
// between its check and its Wait cannot miss it.
func (p *Publisher) broadcast(c *sync.Cond) {
	p.mu.Lock()
	c.Broadcast()
	p.mu.Unlock()
}

// batcher hands batches to the sender: when a batch's linger is over, or
// at once when asked (a full batch, Flush, Close, no linger). It is the
// only writer of the queue, and closes it after the batch it takes once
// Close was called.
func (p *Publisher) batcher() {
	defer close(p.queue)
	var linger <-chan time.Time // nil while no batch waits for its linger
	for {
		select {
		case <-p.begun:
			if linger == nil {
				linger = time.After(p.o.linger)
			}
			continue
		case <-linger:
		case <-p.sealNow:
		}
		linger = nil
		batch, closed := p.take()
		if len(batch) > 0 {
			p.queue <- batch // waits while the sender is busy: backpressure
		}
		if closed {
			return
		}
	}
}

// take empties the batch and says whether Close was called before.
func (p *Publisher) take() ([]message, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	batch := p.batch
	p.batch = make([]message, 0, len(batch)) // the next is likely as large
	clear(p.open)
	p.gen++
	p.room.Broadcast()
	return batch, p.closed
}

// sendCore publishes batches to core NATS: a publish only writes to the
// connection's buffer, so one goroutine sends them all.
func (p *Publisher) sendCore() {
	for batch := range p.queue {
		var failed PublishError
		for _, m := range batch {
			p.report(m, p.send(p.message(m)), &failed)
		}
		p.done(batch[0].gen, len(batch), failed)
	}
}

// sendJetStream publishes batches to JetStream asynchronously and hands
// each publish to awaitAcks, in order. It waits while the acknowledgements
// outstanding are at their bound (WithMaxInFlight).
func (p *Publisher) sendJetStream() {
	defer close(p.acks)
	for batch := range p.queue {
		for _, m := range batch {
			x := publishing{m: m, msg: p.message(m), sent: time.Now()}
			if x.err = p.ctx.Err(); x.err == nil { // Close gave up: send nothing more
				x.ack, x.err = p.js.PublishMsgAsync(x.msg, jetstream.WithStallWait(p.o.timeout))
			}
			p.acks <- x
		}
	}
}

// awaitAcks waits for each publish's acknowledgement in the order sent (the
// stream answers in about that order) and retries one that failed: as the
// same message, with the same id, synchronously and with backoff, which
// holds back the rest while, say, the NATS server restarts.
func (p *Publisher) awaitAcks() {
	for x := range p.acks {
		err := x.err
		if x.ack != nil {
			select {
			case <-x.ack.Ok():
			case err = <-x.ack.Err():
			case <-p.ctx.Done():
				err = p.ctx.Err()
			}
		}
		if err != nil && !final(err) {
			err = p.retry(x.msg, x.sent, err)
		} else {
			err = published(x.msg, err)
		}
		var failed PublishError
		p.report(x.m, err, &failed)
		p.done(x.m.gen, 1, failed)
	}
}

// message is m as a NATS message. A JetStream message gets its id here,
// once: whichever attempt reaches the stream first is stored, and the
// others, within the stream's duplicate window, are acknowledged as
// duplicates.
func (p *Publisher) message(m message) *nats.Msg {
	msg := &nats.Msg{Subject: p.o.prefix + m.topic, Data: payload(m)}
	if p.js != nil {
		msg.Header = nats.Header{jetstream.MsgIDHeader: []string{nuid.Next()}}
	}
	return msg
}

// report passes m's outcome to the WithOnDone function and adds a failure
// to failed.
func (p *Publisher) report(m message, err error, failed *PublishError) {
	if p.o.onDone != nil {
		p.o.onDone(m.topic, m.count, err)
	}
	if err != nil {
		failed.Messages++
		failed.Mentions += m.count
		failed.Err = err
	}
}

// done marks n messages of batch gen done, with their failures.
func (p *Publisher) done(gen uint64, n int, failed PublishError) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if failed.Messages > 0 {
		p.failed.Messages += failed.Messages
		p.failed.Mentions += failed.Mentions
		p.failed.Err = failed.Err
	}
	if p.undone[gen] -= n; p.undone[gen] == 0 {
		delete(p.undone, gen)
		p.drained.Broadcast()
	}
}

// send sends msg once, and retries it when that failed.
func (p *Publisher) send(msg *nats.Msg) error {
	sent := time.Now()
	err := p.attempt(msg)
	if err != nil && !final(err) {
		return p.retry(msg, sent, err)
	}
	return published(msg, err)
}

// retry sends msg, whose first attempt was sent and failed with err,
// again until it is published (acknowledged, with JetStream), an error
// that retrying cannot pass, or the retry time after the first attempt is
// over, with backoff between attempts. No attempt starts later than that:
// every attempt reaches the stream within its duplicate window of the
// first, so a first attempt that was stored keeps the others out.
func (p *Publisher) retry(msg *nats.Msg, sent time.Time, err error) error {
	if left := p.o.retryFor - time.Since(sent); left > 0 {
		b := waits.Reconnect()
		_, err = backoff.Retry(p.ctx, func() (struct{}, error) {
			err := p.attempt(msg)
			switch {
			case err != nil && final(err):
				return struct{}{}, backoff.Permanent(err)
			case errors.Is(err, jetstream.ErrNoStreamResponse) && time.Since(sent) > noStreamGrace:
				// No stream answers: a restarting server has its streams
				// back well within the grace; past it, none takes the
				// subject, and waiting out the retry time helps nobody.
				return struct{}{}, backoff.Permanent(fmt.Errorf("%w: no JetStream stream takes %s (create one with `hotcount stream create`, or publish with WithCoreNATS)", err, msg.Subject))
			}
			return struct{}{}, err
		}, backoff.WithBackOff(b), backoff.WithMaxElapsedTime(left))
	}
	return published(msg, err)
}

// noStreamGrace is how long a message is retried while no stream answers
// for its subject, before that is taken as final.
const noStreamGrace = 5 * time.Second

// published is the outcome of publishing msg: nil, or err saying where.
func published(msg *nats.Msg, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("client: publish to %s: %w", msg.Subject, err)
}

// attempt sends msg once.
func (p *Publisher) attempt(msg *nats.Msg) error {
	if err := p.ctx.Err(); err != nil {
		return err // Close gave up: send nothing more
	}
	if p.js == nil {
		return p.nc.PublishMsg(msg)
	}
	if !p.nc.IsConnected() {
		// nats.go would keep it in its reconnect buffer and send it once
		// reconnected, maybe past the duplicate window of an earlier
		// attempt that was stored: wait for the connection instead.
		return nats.ErrDisconnected
	}
	ctx, cancel := context.WithTimeout(p.ctx, p.o.timeout)
	defer cancel()
	_, err := p.js.PublishMsg(ctx, msg)
	return err
}

// final says whether retrying cannot get err past: the connection is
// closed or draining, the message can never be sent as it is, or the
// stream answered with a refusal (then it stored nothing; "temporarily
// unavailable", 503, is retried). Everything else (a timeout, no
// responders while the server restarts, a dropped connection, a full
// reconnect buffer) is.
func final(err error) bool {
	var api *jetstream.APIError
	if errors.As(err, &api) {
		return api.Code != http.StatusServiceUnavailable
	}
	for _, f := range []error{nats.ErrConnectionClosed, nats.ErrConnectionDraining, nats.ErrInvalidConnection,
		nats.ErrBadSubject, nats.ErrMaxPayload, nats.ErrHeadersNotSupported, context.Canceled} {
		if errors.Is(err, f) {
			return true
		}
	}
	return false
}

// payload is a message's body: empty for one mention (the sidecar reads
// it as 1, and it is the cheapest), else {"count":n}, with a time
// {"count":n,"at":<Unix ms>}, and with a contributor "by" last.
func payload(m message) []byte {
	if m.count == 1 && !m.timed && m.by == "" {
		return nil
	}
	b := strconv.AppendInt([]byte(`{"count":`), m.count, 10)
	if m.timed {
		b = strconv.AppendInt(append(b, `,"at":`...), m.at, 10)
	}
	if m.by != "" {
		by, _ := json.Marshal(m.by) // a string: cannot fail
		b = append(append(b, `,"by":`...), by...)
	}
	return append(b, '}')
}

// Flush sends what is held now and waits until every message accepted
// before the call is done, or ctx ends. In core mode it then waits for the
// server to have read them (a round trip). It returns a *PublishError for
// the messages given up since the last Flush or Close, or ctx's error.
func (p *Publisher) Flush(ctx context.Context) error {
	p.mu.Lock()
	gen := p.gen
	p.mu.Unlock()
	kick(p.sealNow)
	if err := p.wait(ctx, gen); err != nil {
		return fmt.Errorf("client: flush: %w", err)
	}
	if err := p.roundTrip(ctx); err != nil {
		return err
	}
	return p.failures()
}

// Close stops taking mentions, publishes everything it accepted (retrying
// as Mention's messages are), waits until all of it is done, and stops the
// Publisher's goroutines. Nothing accepted is dropped while ctx lasts; if
// ctx ends first, what is still unacknowledged is given up. It returns a
// *PublishError alone when messages were given up and nothing else went
// wrong, ctx's error (with the *PublishError) when it ended first, and
// ErrClosed when called again.
func (p *Publisher) Close(ctx context.Context) error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return ErrClosed
	}
	p.closed = true
	gen := p.gen
	p.room.Broadcast() // a Mention waiting for room returns ErrClosed
	p.mu.Unlock()
	kick(p.sealNow)
	var err error
	if werr := p.wait(ctx, gen); werr != nil {
		err = fmt.Errorf("client: close: %w", werr)
	}
	p.cancel() // after a timeout: the senders fail what is left at once
	p.wg.Wait()
	err = errors.Join(err, p.roundTrip(ctx))
	if failed := p.failures(); failed != nil {
		if err == nil {
			return failed
		}
		return errors.Join(err, failed)
	}
	return err
}

// wait waits until the messages of batch gen and of the batches before it
// are done, or ctx ends.
func (p *Publisher) wait(ctx context.Context, gen uint64) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	stop := context.AfterFunc(ctx, func() { p.broadcast(p.drained) })
	defer stop()
	for p.undoneUpTo(gen) {
		if err := ctx.Err(); err != nil {
			return err
		}
		p.drained.Wait()
	}
	return nil
}

// undoneUpTo says whether a message of batch gen or before is not done.
// p.mu is held.
func (p *Publisher) undoneUpTo(gen uint64) bool {
	for g := range p.undone {
		if g <= gen {
			return true
		}
	}
	return false
}

// roundTrip waits, in core mode, until the NATS server has read what was
// written to the connection: it answers a PING only after. A JetStream
// publish is a round trip already.
func (p *Publisher) roundTrip(ctx context.Context) error {
	if p.js != nil {
		return nil
	}
	if _, ok := ctx.Deadline(); !ok { // nats.go insists on one
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, p.o.timeout)
		defer cancel()
	}
	if err := p.nc.FlushWithContext(ctx); err != nil {
		return fmt.Errorf("client: round trip to the NATS server: %w", err)
	}
	return nil
}

// failures returns the messages given up since it was last called, as a
// *PublishError, or nil.
func (p *Publisher) failures() error {
	p.mu.Lock()
	f := p.failed
	p.failed = PublishError{}
	p.mu.Unlock()
	if f.Messages == 0 {
		return nil
	}
	return &f
}

// PublishError reports messages the Publisher gave up: the stream refused
// them, their retries ran out, or Close's context ended first. One whose
// attempt timed out may still be in the stream (once): it is in doubt,
// not lost for sure. Each was passed to the WithOnDone function with its
// own error.
type PublishError struct {
	// Messages and Mentions are how many messages were given up, and the
	// mentions they carried.
	Messages int
	Mentions int64
	// Err is the error of the last of them.
	Err error
}

func (e *PublishError) Error() string {
	return fmt.Sprintf("client: %d messages (%d mentions) not acknowledged; the last: %v", e.Messages, e.Mentions, e.Err)
}

// Unwrap returns the last message's error.
func (e *PublishError) Unwrap() error { return e.Err }
