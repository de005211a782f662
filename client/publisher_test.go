package client_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/hotcount/hotcount/client"
	"github.com/hotcount/hotcount/config"
	"github.com/hotcount/hotcount/internal/embeddednats"
	"github.com/hotcount/hotcount/internal/testtools/testenv"
	"github.com/hotcount/hotcount/mention"
	"github.com/hotcount/hotcount/pipeline/ingest"
)

// TestDefaultsAreTheSidecars: the Publisher's defaults are the sidecar's.
func TestDefaultsAreTheSidecars(t *testing.T) {
	prefix, err := mention.Prefix(config.Default().Subject)
	if err != nil {
		t.Fatal(err)
	}
	if client.DefaultSubjectPrefix != prefix {
		t.Errorf("DefaultSubjectPrefix %q, the sidecar takes %q", client.DefaultSubjectPrefix, prefix)
	}
	if want := "http://" + config.Default().HTTPAddr; client.DefaultURL != want {
		t.Errorf("DefaultURL %q, the sidecar serves %q", client.DefaultURL, want)
	}
	if client.DefaultRetryFor+client.DefaultPublishTimeout >= mention.DefaultDuplicateWindow {
		t.Errorf("retries (%s + %s) outlast the stream's duplicate window %s", client.DefaultRetryFor, client.DefaultPublishTimeout, mention.DefaultDuplicateWindow)
	}
}

// spy subscribes to every mention subject and records what arrives.
type spy struct {
	mu    sync.Mutex
	msgs  []*nats.Msg
	syncs int // sentinels seen
}

// sentinel is the subject of sync's messages: a barrier, outside the
// stream of mentions.
const sentinel = "spy.sync"

func newSpy(t *testing.T, url string) *spy {
	t.Helper()
	s := &spy{}
	nc := testenv.Connect(t, url)
	// One subscription for both, so that they are handled in order.
	if _, err := nc.Subscribe(">", func(m *nats.Msg) {
		s.mu.Lock()
		defer s.mu.Unlock()
		switch {
		case m.Subject == sentinel:
			s.syncs++
		case strings.HasPrefix(m.Subject, "mentions."):
			s.msgs = append(s.msgs, m)
		}
	}); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return s
}

// sync waits until everything published on nc so far has reached the spy:
// NATS delivers one connection's messages in order, so a sentinel
// published after them arrives after them.
func (s *spy) sync(t *testing.T, nc *nats.Conn) {
	t.Helper()
	s.mu.Lock()
	want := s.syncs + 1
	s.mu.Unlock()
	if err := nc.Publish(sentinel, nil); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 5*time.Second, func() error {
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.syncs < want {
			return errors.New("the sentinel has not arrived")
		}
		return nil
	})
}

// received returns the messages so far.
func (s *spy) received() []*nats.Msg {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]*nats.Msg(nil), s.msgs...)
}

// counts adds up what the messages so far carry, by topic, the way the
// sidecar reads them.
func (s *spy) counts(t *testing.T) (map[string]int64, int) {
	t.Helper()
	msgs := s.received()
	out := make(map[string]int64)
	for _, m := range msgs {
		n, err := mention.Count(m.Data, math.MaxInt64)
		if err != nil {
			t.Fatalf("%s %q: the sidecar would refuse it: %v", m.Subject, m.Data, err)
		}
		out[strings.TrimPrefix(m.Subject, "mentions.")] += n
	}
	return out, len(msgs)
}

// TestMentionRefusesWhatTheSidecarWould: a mention the sidecar would
// reject, or that NATS cannot carry, is an error at the call and nothing
// is published; the limits are the sidecar's, and WithLimits moves them.
func TestMentionRefusesWhatTheSidecarWould(t *testing.T) {
	ns := testenv.NATS(t)
	sp := newSpy(t, ns.ClientURL())
	tests := []struct {
		name  string
		opts  []client.PublisherOption
		topic string
		n     int64
		want  error // nil: accepted
	}{
		{"plain", nil, "golang", 1, nil},
		{"dotted", nil, "eu.west.k8s", 2, nil},
		{"slash and unicode", nil, "a/b-é", 3, nil},
		{"longest", nil, strings.Repeat("x", mention.DefaultMaxTopicBytes), 4, nil},
		{"max count", nil, "max", mention.DefaultMaxCount, nil},
		{"empty", nil, "", 1, client.ErrInvalidTopic},
		{"too long", nil, strings.Repeat("x", mention.DefaultMaxTopicBytes+1), 1, client.ErrInvalidTopic},
		{"not UTF-8", nil, "a\xffb", 1, client.ErrInvalidTopic},
		{"control character", nil, "a\x01b", 1, client.ErrInvalidTopic},
		{"empty part", nil, "a..b", 1, client.ErrInvalidTopic},
		{"leading dot", nil, ".a", 1, client.ErrInvalidTopic},
		{"trailing dot", nil, "a.", 1, client.ErrInvalidTopic},
		{"wildcard", nil, "a.*", 1, client.ErrInvalidTopic},
		{"full wildcard", nil, ">", 1, client.ErrInvalidTopic},
		{"space", nil, "a b", 1, client.ErrInvalidTopic},
		{"zero", nil, "golang", 0, client.ErrInvalidCount},
		{"negative", nil, "golang", -5, client.ErrInvalidCount},
		{"past max count", nil, "golang", mention.DefaultMaxCount + 1, client.ErrInvalidCount},
		{"raised limits", []client.PublisherOption{client.WithLimits(2*mention.DefaultMaxCount, 300)}, strings.Repeat("y", 300), 2 * mention.DefaultMaxCount, nil},
		{"lowered count", []client.PublisherOption{client.WithLimits(10, 300)}, "golang", 11, client.ErrInvalidCount},
	}
	nc := testenv.Connect(t, ns.ClientURL())
	want := make(map[string]int64)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pub, err := client.NewPublisher(nc, append(tt.opts, client.WithCoreNATS())...)
			if err != nil {
				t.Fatal(err)
			}
			err = pub.Mention(context.Background(), tt.topic, tt.n)
			if !errors.Is(err, tt.want) || (tt.want == nil) != (err == nil) {
				t.Errorf("Mention(%.20q, %d) = %v, want %v", tt.topic, tt.n, err, tt.want)
			}
			if err == nil {
				want[tt.topic] += tt.n
			}
			if err := pub.Close(context.Background()); err != nil {
				t.Fatal(err)
			}
		})
	}
	sp.sync(t, nc)
	if got, _ := sp.counts(t); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("published %v, want %v", got, want)
	}
}

// TestNewPublisherChecksItsOptions: options out of range are refused.
func TestNewPublisherChecksItsOptions(t *testing.T) {
	nc := testenv.Connect(t, testenv.NATS(t).ClientURL())
	for _, opt := range []client.PublisherOption{
		client.WithSubjectPrefix("mentions"), client.WithSubjectPrefix("mentions.*."), client.WithSubjectPrefix(""),
		client.WithLinger(-time.Second), client.WithMaxBatch(0), client.WithMaxInFlight(0),
		client.WithRetry(0, time.Second), client.WithRetry(time.Second, -1), client.WithLimits(0, 10),
	} {
		if _, err := client.NewPublisher(nc, opt); err == nil {
			t.Errorf("an option out of range was taken")
		}
	}
	if _, err := client.NewPublisher(nil); err == nil {
		t.Error("no connection was taken")
	}
}

// TestPublisherCoalesces: within a linger, mentions of a topic become one
// message per topic carrying their sum (empty for a sum of 1, as the
// sidecar reads it), on the prefix given.
func TestPublisherCoalesces(t *testing.T) {
	ns := testenv.NATS(t)
	sp := newSpy(t, ns.ClientURL())
	nc := testenv.Connect(t, ns.ClientURL())
	pub, err := client.NewPublisher(nc, client.WithCoreNATS(),
		client.WithLinger(time.Hour), client.WithSubjectPrefix("mentions.eu."))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	want := map[string]int64{"eu.golang": 0, "eu.rust": 0, "eu.once": 1}
	for i := range 1000 {
		for topic, n := range map[string]int64{"golang": 1, "rust": int64(i%7 + 1)} {
			if err := pub.Mention(ctx, topic, n); err != nil {
				t.Fatal(err)
			}
			want["eu."+topic] += n
		}
	}
	if err := pub.Mention(ctx, "once", 1); err != nil {
		t.Fatal(err)
	}
	sp.sync(t, nc)
	if got, _ := sp.counts(t); len(got) != 0 {
		t.Fatalf("published before the linger or a Flush: %v", got)
	}
	if err := pub.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	sp.sync(t, nc)
	if got, msgs := sp.counts(t); msgs != 3 || fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("%d messages carrying %v, want 3 carrying %v", msgs, got, want)
	}
	for _, m := range sp.received() {
		if m.Subject == "mentions.eu.once" && len(m.Data) != 0 {
			t.Errorf("a single mention is published as %q, not empty", m.Data)
		}
	}
	if err := pub.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if err := pub.Close(ctx); !errors.Is(err, client.ErrClosed) {
		t.Errorf("second Close: %v, want ErrClosed", err)
	}
	if err := pub.Mention(ctx, "golang", 1); !errors.Is(err, client.ErrClosed) {
		t.Errorf("Mention after Close: %v, want ErrClosed", err)
	}
}

// TestLingerAndBatchBound: a batch goes out when its linger ends, or at
// once when it is full, without a Flush.
func TestLingerAndBatchBound(t *testing.T) {
	ns := testenv.NATS(t)
	sp := newSpy(t, ns.ClientURL())
	nc := testenv.Connect(t, ns.ClientURL())
	ctx := context.Background()

	full, err := client.NewPublisher(nc, client.WithCoreNATS(), client.WithLinger(time.Hour), client.WithMaxBatch(2))
	if err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		if err := full.Mention(ctx, fmt.Sprint("full-", i), 1); err != nil {
			t.Fatal(err)
		}
	}
	testenv.Eventually(t, 5*time.Second, func() error {
		if _, n := sp.counts(t); n != 4 {
			return fmt.Errorf("%d messages of two full batches", n)
		}
		return nil
	})

	lingering, err := client.NewPublisher(nc, client.WithCoreNATS(), client.WithLinger(20*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	if err := lingering.Mention(ctx, "lingered", 7); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 5*time.Second, func() error {
		if got, _ := sp.counts(t); got["lingered"] != 7 {
			return fmt.Errorf("lingered: %d", got["lingered"])
		}
		return nil
	})
	for _, p := range []*client.Publisher{full, lingering} {
		if err := p.Close(ctx); err != nil {
			t.Fatal(err)
		}
	}
	sp.sync(t, nc)
	if got, n := sp.counts(t); n != 6 || got["full-4"] != 1 {
		t.Errorf("after Close: %d messages, %v", n, got)
	}
}

// TestCountsNeverOverflow: mentions of a topic add up to the max count in
// one message; past it the next message begins, so no message carries
// more than the sidecar takes, and the sum is exact.
func TestCountsNeverOverflow(t *testing.T) {
	ns := testenv.NATS(t)
	sp := newSpy(t, ns.ClientURL())
	nc := testenv.Connect(t, ns.ClientURL())
	pub, err := client.NewPublisher(nc, client.WithCoreNATS(),
		client.WithLinger(time.Hour), client.WithLimits(10, mention.DefaultMaxTopicBytes))
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []int64{7, 7, 3, 10, 1} { // 7 | 7+3 | 10 | 1
		if err := pub.Mention(context.Background(), "golang", n); err != nil {
			t.Fatal(err)
		}
	}
	if err := pub.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	sp.sync(t, nc)
	var counts []int64
	for _, m := range sp.received() {
		n, err := mention.Count(m.Data, 10)
		if err != nil {
			t.Fatalf("%q is past the max count: %v", m.Data, err)
		}
		counts = append(counts, n)
	}
	if fmt.Sprint(counts) != "[7 10 10 1]" {
		t.Errorf("messages carry %v, want [7 10 10 1]", counts)
	}
}

// TestMsgIDStableAcrossRetries: a JetStream publish nobody acknowledges is
// retried with the same Nats-Msg-Id until a stream takes it, and stored
// once; another message gets another id.
func TestMsgIDStableAcrossRetries(t *testing.T) {
	ns := testenv.NATS(t)
	sp := newSpy(t, ns.ClientURL()) // receives the publishes, answers none: no stream yet
	nc := testenv.Connect(t, ns.ClientURL())
	pub, err := client.NewPublisher(nc, client.WithRetry(100*time.Millisecond, 30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := pub.Mention(ctx, "golang", 3); err != nil {
		t.Fatal(err)
	}
	flushed := make(chan error, 1)
	go func() { flushed <- pub.Flush(ctx) }()
	testenv.Eventually(t, 10*time.Second, func() error {
		if n := len(sp.received()); n < 3 {
			return fmt.Errorf("%d attempts", n)
		}
		return nil
	})
	if _, err := ingest.EnsureStream(ctx, nc, ingest.DefaultStream, "mentions.>", mention.DefaultDuplicateWindow); err != nil {
		t.Fatal(err)
	}
	if err := <-flushed; err != nil {
		t.Fatalf("Flush: %v", err)
	}
	sp.sync(t, nc)
	attempts := sp.received()
	id := attempts[0].Header.Get(jetstream.MsgIDHeader)
	for _, m := range attempts {
		if got := m.Header.Get(jetstream.MsgIDHeader); id == "" || got != id || string(m.Data) != `{"count":3}` {
			t.Fatalf("attempt %s %q has id %q, the first %q", m.Subject, m.Data, got, id)
		}
	}
	if err := pub.Mention(ctx, "golang", 4); err != nil {
		t.Fatal(err)
	}
	if err := pub.Close(ctx); err != nil {
		t.Fatal(err)
	}
	sp.sync(t, nc)
	last := sp.received()
	if next := last[len(last)-1].Header.Get(jetstream.MsgIDHeader); next == id || next == "" {
		t.Errorf("the next message has id %q, the first %q", next, id)
	}
	if n := streamMsgs(t, nc); n != 2 {
		t.Errorf("the stream holds %d messages after %d attempts of the first and one of the second, want 2", n, len(attempts))
	}
}

// streamMsgs is the number of messages in the stream of mentions.
func streamMsgs(t *testing.T, nc *nats.Conn) uint64 {
	t.Helper()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	s, err := js.Stream(context.Background(), ingest.DefaultStream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return info.State.Msgs
}

// faultyLink carries NATS connections from clients to a server, and can
// swallow what the server sends back, then break the connections: a stored
// publish whose acknowledgement is lost with its connection.
type faultyLink struct {
	ln      net.Listener
	server  string
	swallow atomic.Bool
	mu      sync.Mutex
	conns   []net.Conn
}

func newFaultyLink(t *testing.T, server string) *faultyLink {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := &faultyLink{ln: ln, server: server}
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", server)
			if err != nil {
				c.Close()
				continue
			}
			l.mu.Lock()
			l.conns = append(l.conns, c, s)
			l.mu.Unlock()
			wg.Go(func() { io.Copy(s, c) }) //nolint:errcheck // ends when either side closes
			wg.Go(func() {
				buf := make([]byte, 32<<10)
				for {
					n, err := s.Read(buf)
					if err != nil {
						return
					}
					if !l.swallow.Load() {
						if _, err := c.Write(buf[:n]); err != nil {
							return
						}
					}
				}
			})
		}
	})
	t.Cleanup(func() {
		ln.Close()
		l.breakAll()
		wg.Wait()
	})
	return l
}

func (l *faultyLink) url() string { return "nats://" + l.ln.Addr().String() }

// breakAll closes every connection the link carries.
func (l *faultyLink) breakAll() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, c := range l.conns {
		c.Close()
	}
	l.conns = nil
}

// TestLostAckIsNotCountedTwice: the stream stores a publish, its
// acknowledgement is lost and the connection breaks; the Publisher sends
// it again once reconnected, with the same id, and the stream keeps one.
func TestLostAckIsNotCountedTwice(t *testing.T) {
	ns := testenv.NATS(t)
	direct := testenv.Connect(t, ns.ClientURL())
	if _, err := ingest.EnsureStream(context.Background(), direct, ingest.DefaultStream, "mentions.>", mention.DefaultDuplicateWindow); err != nil {
		t.Fatal(err)
	}
	link := newFaultyLink(t, ns.Addr().String())
	nc, err := nats.Connect(link.url(), nats.ReconnectWait(50*time.Millisecond), nats.MaxReconnects(-1))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	var acked, failed atomic.Int64
	pub, err := client.NewPublisher(nc, client.WithRetry(time.Second, 30*time.Second), client.WithOnDone(func(_ string, _ int64, err error) {
		if err != nil {
			failed.Add(1)
		} else {
			acked.Add(1)
		}
	}))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	link.swallow.Store(true)
	if err := pub.Mention(ctx, "golang", 5); err != nil {
		t.Fatal(err)
	}
	flushed := make(chan error, 1)
	go func() { flushed <- pub.Flush(ctx) }()
	testenv.Eventually(t, 10*time.Second, func() error {
		if n := streamMsgs(t, direct); n != 1 {
			return fmt.Errorf("stream holds %d messages", n)
		}
		return nil
	})
	link.swallow.Store(false)
	link.breakAll()
	if err := <-flushed; err != nil {
		t.Fatalf("Flush: %v", err)
	}
	if n := streamMsgs(t, direct); n != 1 || acked.Load() != 1 || failed.Load() != 0 {
		t.Errorf("stream holds %d messages; %d acknowledged, %d failed; want 1, 1, 0", n, acked.Load(), failed.Load())
	}
	if nc.Stats().Reconnects == 0 {
		t.Error("the connection never broke: the test proved nothing")
	}
	if err := pub.Close(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestCloseWaitsOutAnOutage: Close publishes what it accepted even when
// the NATS server is down when it is called and comes back later.
func TestCloseWaitsOutAnOutage(t *testing.T) {
	ns := testenv.NATS(t)
	var refused atomic.Int64 // reconnect attempts the absent server refused
	nc, err := nats.Connect(ns.ClientURL(), nats.ReconnectWait(50*time.Millisecond), nats.MaxReconnects(-1),
		nats.ReconnectErrHandler(func(*nats.Conn, error) { refused.Add(1) }))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if _, err := ingest.EnsureStream(context.Background(), nc, ingest.DefaultStream, "mentions.>", mention.DefaultDuplicateWindow); err != nil {
		t.Fatal(err)
	}
	pub, err := client.NewPublisher(nc, client.WithLinger(time.Hour), client.WithRetry(200*time.Millisecond, 30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	var want int64
	for i := range 500 {
		if err := pub.Mention(ctx, fmt.Sprint("topic-", i%50), int64(i%3+1)); err != nil {
			t.Fatal(err)
		}
		want += int64(i%3 + 1)
	}
	up := down(t, ns)
	sent := nc.Stats().OutMsgs
	closed := make(chan error, 1)
	go func() { closed <- pub.Close(ctx) }()
	// Close publishes against a server that is away: its messages go to
	// the connection, which holds them while it reconnects...
	testenv.Eventually(t, 10*time.Second, func() error {
		if nc.Stats().OutMsgs == sent {
			return errors.New("Close has published nothing yet")
		}
		return nil
	})
	// ... and the server stays away through a few more reconnect
	// attempts, while Close waits for the acknowledgements.
	before := refused.Load()
	testenv.Eventually(t, 10*time.Second, func() error {
		if n := refused.Load() - before; n < 3 {
			return fmt.Errorf("%d reconnect attempts refused since Close published", n)
		}
		return nil
	})
	select {
	case err := <-closed:
		t.Fatalf("Close returned while the server was down: %v", err)
	default:
	}
	ns = up()
	if err := <-closed; err != nil {
		t.Fatalf("Close: %v", err)
	}
	if got := streamTotal(t, ns.ClientURL()); got != want {
		t.Errorf("the stream holds %d mentions, %d were accepted", got, want)
	}
}

// down stops the NATS server ns, and returns the function that starts it
// again on the same port and JetStream folder.
func down(t *testing.T, ns *server.Server) (up func() *server.Server) {
	t.Helper()
	port, dir := ns.Addr().(*net.TCPAddr).Port, ns.JetStreamConfig().StoreDir
	ns.Shutdown()
	ns.WaitForShutdown()
	return func() *server.Server {
		t.Helper()
		ns, err := embeddednats.Start(port, dir, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			ns.Shutdown()
			ns.WaitForShutdown()
		})
		return ns
	}
}

// streamTotal adds up the counts of every message in the stream.
func streamTotal(t *testing.T, url string) int64 {
	t.Helper()
	js, err := jetstream.New(testenv.Connect(t, url))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cons, err := js.OrderedConsumer(ctx, ingest.DefaultStream, jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	info, err := cons.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var total int64
	for left := info.NumPending; left > 0; {
		batch, err := cons.Fetch(int(min(left, 1000)), jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		for m := range batch.Messages() {
			n, err := mention.Count(m.Data(), mention.DefaultMaxCount)
			if err != nil {
				t.Fatal(err)
			}
			total += n
			left--
		}
		if err := batch.Error(); err != nil {
			t.Fatal(err)
		}
	}
	return total
}

// TestCloseGivesUpWhenItsContextEnds: with the server gone for good, Close
// returns when its context ends and says what it could not publish.
func TestCloseGivesUpWhenItsContextEnds(t *testing.T) {
	ns := testenv.NATS(t)
	nc := testenv.Connect(t, ns.ClientURL())
	pub, err := client.NewPublisher(nc, client.WithLinger(time.Hour), client.WithRetry(100*time.Millisecond, time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	for _, topic := range []string{"a", "b", "c"} {
		if err := pub.Mention(context.Background(), topic, 2); err != nil {
			t.Fatal(err)
		}
	}
	ns.Shutdown()
	ns.WaitForShutdown()
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	start := time.Now()
	err = pub.Close(ctx)
	var given *client.PublishError
	if !errors.As(err, &given) || given.Messages != 3 || given.Mentions != 6 || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Close: %v, want the deadline and 3 messages (6 mentions) given up", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("Close took %s past its deadline", d)
	}
}

// TestMentionWaitsWhenFull: with the batch full and the sender stuck
// (the server is away), Mention waits, and an error from its context means
// the mention was not taken; what was taken is published once the server
// is back.
func TestMentionWaitsWhenFull(t *testing.T) {
	ns := testenv.NATS(t)
	nc, err := nats.Connect(ns.ClientURL(), nats.ReconnectWait(50*time.Millisecond), nats.MaxReconnects(-1))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if _, err := ingest.EnsureStream(context.Background(), nc, ingest.DefaultStream, "mentions.>", mention.DefaultDuplicateWindow); err != nil {
		t.Fatal(err)
	}
	pub, err := client.NewPublisher(nc, client.WithLinger(0), client.WithMaxBatch(1), client.WithMaxInFlight(1),
		client.WithRetry(200*time.Millisecond, 30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	up := down(t, ns)
	var accepted int64
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		err := pub.Mention(ctx, "golang", 1)
		cancel()
		if errors.Is(err, context.DeadlineExceeded) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if accepted++; accepted > 100 {
			t.Fatal("Mention never waited: the Publisher is not bounded")
		}
	}
	ns = up()
	if err := pub.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := streamTotal(t, ns.ClientURL()); got != accepted {
		t.Errorf("the stream holds %d mentions, %d were accepted", got, accepted)
	}
	t.Logf("%d mentions accepted before Mention waited", accepted)
}

// TestNoStreamFailsSoon: with no stream taking the subject (or no
// JetStream at all), a publish is refused by no one; after a short grace
// (a restarting server brings its streams back within it) the Publisher
// says so, instead of retrying for a minute.
func TestNoStreamFailsSoon(t *testing.T) {
	nc := testenv.Connect(t, testenv.NATS(t).ClientURL()) // JetStream on, no stream
	var failed atomic.Int64
	pub, err := client.NewPublisher(nc, client.WithOnDone(func(_ string, _ int64, err error) {
		if err != nil {
			failed.Add(1)
		}
	}))
	if err != nil {
		t.Fatal(err)
	}
	if err := pub.Mention(context.Background(), "golang", 1); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	err = pub.Close(context.Background())
	// Given up as a message no stream takes; the text names its subject,
	// which is what the user must create a stream for.
	var given *client.PublishError
	if !errors.As(err, &given) || given.Messages != 1 || !errors.Is(err, jetstream.ErrNoStreamResponse) ||
		!strings.Contains(err.Error(), "mentions.golang") {
		t.Errorf("Close = %v, want the message given up for want of a stream, its subject named", err)
	}
	if d := time.Since(start); d > 20*time.Second {
		t.Errorf("Close took %s, want about the 5 s grace", d)
	}
	if failed.Load() != 1 {
		t.Errorf("%d messages reported failed, want 1", failed.Load())
	}
}
