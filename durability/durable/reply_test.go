package durable

import (
	"context"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/hotcount/hotcount/internal/testtools/testenv"
)

// TestParseDeliveryAgreesWithMetadata: for real deliveries, by servers
// that send the v1 reply subject and the v2 one (the js_ack_fc_v2
// feature flag), with a JetStream domain and without, parseDelivery reads
// what msg.Metadata() does.
func TestParseDeliveryAgreesWithMetadata(t *testing.T) {
	for _, tc := range []struct {
		name   string
		v2     bool
		domain string
	}{{"v1", false, ""}, {"v2", true, ""}, {"v2-domain", true, "hub"}} {
		t.Run(tc.name, func(t *testing.T) {
			nc := testenv.Connect(t, ackFormatServer(t, tc.v2, tc.domain).ClientURL())
			js, err := jetstream.New(nc)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			st, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "MENTIONS", Subjects: []string{"mentions.>"}})
			if err != nil {
				t.Fatal(err)
			}
			const n = 5
			for range n {
				if _, err := js.Publish(ctx, "mentions.a", nil); err != nil {
					t.Fatal(err)
				}
			}
			cons, err := st.CreateConsumer(ctx, jetstream.ConsumerConfig{AckPolicy: jetstream.AckNonePolicy, DeliverPolicy: jetstream.DeliverByStartSequencePolicy, OptStartSeq: 2})
			if err != nil {
				t.Fatal(err)
			}
			batch, err := cons.Fetch(n-1, jetstream.FetchMaxWait(5*time.Second))
			if err != nil {
				t.Fatal(err)
			}
			got := 0
			for msg := range batch.Messages() {
				got++
				md, err := msg.Metadata()
				if err != nil {
					t.Fatal(err)
				}
				if v2 := strings.Count(msg.Reply(), ".") >= v2MinTokens-1; v2 != tc.v2 {
					t.Fatalf("reply %q: not the format asked for (v2 %v)", msg.Reply(), tc.v2)
				}
				d, err := parseDelivery(msg.Reply())
				if err != nil {
					t.Fatal(err)
				}
				agree(t, msg.Reply(), d, fromMetadata(md))
			}
			if err := batch.Error(); err != nil {
				t.Fatal(err)
			}
			if got != n-1 {
				t.Fatalf("fetched %d, want %d", got, n-1)
			}
		})
	}
}

// ackFormatServer is a JetStream server sending the v2 reply subject or
// not, in domain (none: ""), until the test ends.
func ackFormatServer(t *testing.T, v2 bool, domain string) *server.Server {
	t.Helper()
	s, err := server.NewServer(&server.Options{
		Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: t.TempDir(), NoSigs: true, NoLog: true,
		JetStreamDomain: domain,
		FeatureFlags:    map[string]bool{"js_ack_fc_v2": v2},
	})
	if err != nil {
		t.Fatal(err)
	}
	s.Start()
	t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatal("NATS not ready")
	}
	return s
}

// fromMetadata is the library's reading of a delivery's reply subject.
func fromMetadata(md *jetstream.MsgMetadata) delivery {
	return delivery{consumerSeq: md.Sequence.Consumer, streamSeq: md.Sequence.Stream, published: md.Timestamp, pending: md.NumPending}
}

// fromLegacy is the same by nats.go's older JetStream API (one parser:
// nats.go's internal/parser), which reads any subject, not only a
// delivered message's.
func fromLegacy(md *nats.MsgMetadata) delivery {
	return delivery{consumerSeq: md.Sequence.Consumer, streamSeq: md.Sequence.Stream, published: md.Timestamp, pending: md.NumPending}
}

// agree fails t unless got, parseDelivery's reading of reply, is want.
func agree(t *testing.T, reply string, got, want delivery) {
	t.Helper()
	if got.consumerSeq != want.consumerSeq || got.streamSeq != want.streamSeq || !got.published.Equal(want.published) || got.pending != want.pending {
		t.Fatalf("%q: parsed %+v, the library reads %+v", reply, got, want)
	}
}

// TestParseDeliveryForms: both forms, with the v2 form's optional last
// token gone or more tokens come, as the library reads them; and what it
// refuses, parseDelivery refuses.
func TestParseDeliveryForms(t *testing.T) {
	for _, reply := range []string{
		"$JS.ACK.MENTIONS.c1.1.42.7.1700000000123456789.0",
		"$JS.ACK.MENTIONS-3.c1.2.18446744073709551615.1.1.99",
		"$JS.ACK._.ABCHASH.MENTIONS.c1.1.42.7.1700000000123456789.3.rnd",
		"$JS.ACK.hub.ABCHASH.MENTIONS.c1.1.42.7.1700000000123456789.3",
		"$JS.ACK.hub.ABCHASH.MENTIONS.c1.1.42.7.1700000000123456789.3.rnd.more",
	} {
		md, err := legacyMetadata(reply)
		if err != nil {
			t.Fatalf("%q: the library: %v", reply, err)
		}
		d, err := parseDelivery(reply)
		if err != nil {
			t.Fatalf("%q: %v", reply, err)
		}
		agree(t, reply, d, fromLegacy(md))
	}
	for _, reply := range []string{
		"",
		"_INBOX.abc",
		"$JS.ACK.MENTIONS.c1.1.42.7.1700000000123456789",     // 8 tokens
		"$JS.ACK.x.MENTIONS.c1.1.42.7.1700000000123456789.0", // 10
		"$JS.FC.MENTIONS.c1.1.42.7.1700000000123456789.0",
	} {
		if _, err := parseDelivery(reply); !errors.Is(err, errNotAcked) {
			t.Errorf("%q: %v, want errNotAcked", reply, err)
		}
		if _, err := legacyMetadata(reply); err == nil {
			t.Errorf("%q: the library reads it; parseDelivery refuses it", reply)
		}
	}
	// Where the library reads a number that is not one as 0, the reader
	// stops: a message it cannot place is not counted.
	if _, err := parseDelivery("$JS.ACK.MENTIONS.c1.1.4x2.7.1700000000123456789.0"); !errors.Is(err, errNotAcked) {
		t.Errorf("a sequence that is not a number: %v", err)
	}
}

// TestParseDeliveryAllocatesNothing is why parseDelivery is here and not
// msg.Metadata(): one read per message, none of it on the heap.
func TestParseDeliveryAllocatesNothing(t *testing.T) {
	for _, reply := range []string{
		"$JS.ACK.MENTIONS.c1.1.42.7.1700000000123456789.0",
		"$JS.ACK.hub.ABCHASH.MENTIONS.c1.1.42.7.1700000000123456789.3.rnd",
	} {
		if n := testing.AllocsPerRun(100, func() { _, _ = parseDelivery(reply) }); n != 0 {
			t.Errorf("%q: %v allocations", reply, n)
		}
	}
}

// legacyMetadata is nats.go's older API's reading of reply, on a message
// bound to a subscription as it asks.
func legacyMetadata(reply string) (*nats.MsgMetadata, error) {
	return (&nats.Msg{Subject: "mentions.a", Reply: reply, Sub: new(nats.Subscription)}).Metadata()
}

// TestDecimal: the numbers of a reply subject, and what is not one.
func TestDecimal(t *testing.T) {
	for s, want := range map[string]uint64{"0": 0, "7": 7, "1700000000123456789": 1700000000123456789, "18446744073709551615": math.MaxUint64} {
		if n, ok := decimal(s); !ok || n != want {
			t.Errorf("decimal(%q) = %d, %v; want %d", s, n, ok, want)
		}
	}
	for _, s := range []string{"", "-1", "+1", "1x", " 1", "18446744073709551616", "99999999999999999999"} {
		if n, ok := decimal(s); ok {
			t.Errorf("decimal(%q) = %d, want not a number", s, n)
		}
	}
}
