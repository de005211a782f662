package loadgen_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/hotcount/hotcount/internal/testtools/testenv"
	"github.com/hotcount/hotcount/mention"
	"github.com/hotcount/hotcount/pipeline/ingest"
	"github.com/hotcount/hotcount/tools/loadgen"
)

// TestLoadJetStreamReportIsWhatTheStreamStored: with JetStream the report
// is exactly what the stream holds, subject by subject, one message per
// event with the count asked for.
func TestLoadJetStreamReportIsWhatTheStreamStored(t *testing.T) {
	ns := testenv.NATS(t)
	nc := testenv.Connect(t, ns.ClientURL())
	if _, err := ingest.EnsureStream(context.Background(), nc, ingest.DefaultStream, "mentions.>", mention.DefaultDuplicateWindow); err != nil {
		t.Fatal(err)
	}
	rep, err := loadgen.Run(context.Background(), nc, loadgen.Config{Prefix: "mentions.", Topics: 50, Zipf: 1.3, Messages: 5_000, Count: 3, Seed: 1, JetStream: true})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Messages != 5_000 || rep.Mentions != 15_000 || rep.Unacknowledged != 0 {
		t.Fatalf("report: %d messages, %d mentions, %d unacknowledged; want 5000, 15000, 0", rep.Messages, rep.Mentions, rep.Unacknowledged)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	s, err := js.Stream(context.Background(), ingest.DefaultStream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(context.Background(), jetstream.WithSubjectFilter("mentions.>"))
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != 5_000 {
		t.Errorf("stream holds %d messages, the report says 5000", info.State.Msgs)
	}
	for subject, n := range info.State.Subjects {
		topic := strings.TrimPrefix(subject, "mentions.")
		if int64(n)*3 != rep.PerTopic[topic] {
			t.Errorf("%s: stream %d messages of 3, report %d mentions", subject, n, rep.PerTopic[topic])
		}
	}
	if len(info.State.Subjects) != len(rep.PerTopic) {
		t.Errorf("stream has %d subjects, report %d topics", len(info.State.Subjects), len(rep.PerTopic))
	}
}

// TestLoadCoreReportIsWhatTheServerReceived: in core NATS the report is
// what the server confirmed reading, and a subscriber that keeps up
// receives exactly that, topic by topic.
func TestLoadCoreReportIsWhatTheServerReceived(t *testing.T) {
	ns := testenv.NATS(t)
	tally := testenv.NewTally(t, ns.ClientURL(), "mentions.>", "mentions.")
	rep, err := loadgen.Run(context.Background(), testenv.Connect(t, ns.ClientURL()),
		loadgen.Config{Prefix: "mentions.", Topics: 30, Messages: 3_000, Rate: 30_000, Count: 1, Seed: 2})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Messages != 3_000 || rep.Mentions != 3_000 {
		t.Fatalf("report: %d messages, %d mentions; want 3000 of each", rep.Messages, rep.Mentions)
	}
	testenv.Eventually(t, 10*time.Second, func() error { return tally.Is(rep.PerTopic) })
}

// TestLoadNamesContributors: with Contributors, each message names one of
// that many ids, as the sidecar reads "by", and the run draws them all.
func TestLoadNamesContributors(t *testing.T) {
	ns := testenv.NATS(t)
	nc := testenv.Connect(t, ns.ClientURL())
	var mu sync.Mutex
	who := map[string]int{}
	bad := 0
	sub, err := nc.Subscribe("mentions.>", func(m *nats.Msg) {
		p, err := mention.ParsePayload(m.Data, mention.DefaultMaxCount)
		mu.Lock()
		defer mu.Unlock()
		if err != nil || p.By == nil {
			bad++
			return
		}
		who[string(p.By)]++
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe() //nolint:errcheck // test teardown
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	rep, err := loadgen.Run(context.Background(), testenv.Connect(t, ns.ClientURL()),
		loadgen.Config{Prefix: "mentions.", Topics: 5, Messages: 2_000, Count: 1, Seed: 4, Contributors: 20})
	if err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, func() error {
		mu.Lock()
		defer mu.Unlock()
		n := bad
		for _, k := range who {
			n += k
		}
		if int64(n) != rep.Messages {
			return fmt.Errorf("%d of %d messages received", n, rep.Messages)
		}
		return nil
	})
	mu.Lock()
	defer mu.Unlock()
	if bad != 0 || len(who) != 20 {
		t.Errorf("%d messages without a contributor; contributors %v, want c0..c19", bad, who)
	}
	for id := range who {
		if n, err := strconv.Atoi(strings.TrimPrefix(id, "c")); err != nil || n < 0 || n >= 20 {
			t.Errorf("contributor %q is not one of c0..c19", id)
		}
	}
}
