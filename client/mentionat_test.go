package client_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/hotcount/hotcount/client"
	"github.com/hotcount/hotcount/internal/testtools/testenv"
	"github.com/hotcount/hotcount/mention"
)

// TestMentionAtCarriesItsTime: MentionAt's messages carry "at", in Unix
// milliseconds as the sidecar reads it; mentions add up into one message
// only with those of their topic at the same millisecond, and never with
// Mention's, whose messages stay as they were (empty for one mention).
func TestMentionAtCarriesItsTime(t *testing.T) {
	ns := testenv.NATS(t)
	sp := newSpy(t, ns.ClientURL())
	nc := testenv.Connect(t, ns.ClientURL())
	pub, err := client.NewPublisher(nc, client.WithCoreNATS(), client.WithLinger(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	for _, m := range []struct {
		n  int64
		at time.Time
	}{{2, t0}, {3, t0.Add(500 * time.Microsecond)}, {1, t0.Add(time.Millisecond)}, {1, time.Time{}}, {4, t0}} {
		if err := pub.MentionAt(ctx, "golang", m.n, m.at); err != nil {
			t.Fatal(err)
		}
	}
	if err := pub.Close(ctx); err != nil {
		t.Fatal(err)
	}
	sp.sync(t, nc)
	var got []string
	for _, m := range sp.received() {
		p, err := mention.ParsePayload(m.Data, mention.DefaultMaxCount)
		if err != nil {
			t.Fatalf("%q: %v", m.Data, err)
		}
		if p.HasAt {
			got = append(got, fmt.Sprintf("%d@%d", p.Count, p.At-t0.UnixMilli()))
		} else {
			got = append(got, fmt.Sprintf("%d@none(%q)", p.Count, m.Data))
		}
	}
	if want := `[9@0 1@1 1@none("")]`; fmt.Sprint(got) != want {
		t.Errorf("messages %v, want %s", got, want)
	}
}

// TestMentionByCarriesItsContributor: MentionBy's messages carry "by" as
// the sidecar reads it (any UTF-8 id, quoted as JSON); mentions add up
// into one message only with those of their topic by the same
// contributor; an id the sidecar would refuse is refused here, and
// nothing of it is sent.
func TestMentionByCarriesItsContributor(t *testing.T) {
	ns := testenv.NATS(t)
	sp := newSpy(t, ns.ClientURL())
	nc := testenv.Connect(t, ns.ClientURL())
	pub, err := client.NewPublisher(nc, client.WithCoreNATS(), client.WithLinger(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, m := range []struct {
		by string
		n  int64
	}{{"u1", 2}, {"u2", 1}, {"u1", 3}, {`"quoted" \ café`, 1}} {
		if err := pub.MentionBy(ctx, "golang", m.by, m.n, time.Time{}); err != nil {
			t.Fatal(err)
		}
	}
	for _, bad := range []string{"", strings.Repeat("x", mention.MaxByBytes+1), "a\nb"} {
		if err := pub.MentionBy(ctx, "golang", bad, 1, time.Time{}); !errors.Is(err, client.ErrInvalidBy) {
			t.Errorf("MentionBy(%q) = %v, want ErrInvalidBy", bad, err)
		}
	}
	if err := pub.Close(ctx); err != nil {
		t.Fatal(err)
	}
	sp.sync(t, nc)
	var got []string
	for _, m := range sp.received() {
		p, err := mention.ParsePayload(m.Data, mention.DefaultMaxCount)
		if err != nil {
			t.Fatalf("%q: %v", m.Data, err)
		}
		got = append(got, fmt.Sprintf("%d by %s", p.Count, p.By))
	}
	if want := `[5 by u1 1 by u2 1 by "quoted" \ café]`; fmt.Sprint(got) != want {
		t.Errorf("messages %v, want %s", got, want)
	}
}
