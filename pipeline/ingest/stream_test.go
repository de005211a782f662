package ingest_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/hotcount/hotcount/internal/testtools/testenv"
	"github.com/hotcount/hotcount/pipeline/ingest"
)

// TestEnsureStream: EnsureStream creates the stream of mentions with the
// subject, the duplicate window and the default limits, and leaves a
// stream of that name as it is, saying so.
func TestEnsureStream(t *testing.T) {
	nc := testenv.Connect(t, testenv.NATS(t).ClientURL())
	ctx := context.Background()
	created, err := ingest.EnsureStream(ctx, nc, "MENTIONS", "mentions.>", time.Minute)
	if err != nil || !created {
		t.Fatalf("EnsureStream = %v, %v; want created", created, err)
	}
	if created, err := ingest.EnsureStream(ctx, nc, "MENTIONS", "mentions.>", time.Hour, ingest.StreamOptions{MaxAge: time.Hour}); err != nil || created {
		t.Fatalf("second EnsureStream = %v, %v; want it left as it is", created, err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	s, err := js.Stream(ctx, "MENTIONS")
	if err != nil {
		t.Fatal(err)
	}
	c := s.CachedInfo().Config
	if len(c.Subjects) != 1 || c.Subjects[0] != "mentions.>" || c.Duplicates != time.Minute ||
		c.MaxAge != ingest.DefaultStreamMaxAge || c.MaxBytes != ingest.DefaultStreamMaxBytes || c.Discard != jetstream.DiscardNew {
		t.Errorf("stream config %+v: want mentions.>, a minute's duplicate window, the default limits, new publishes refused when full", c)
	}
}

// TestEnsureStreamRefusesTheLegacyStream: the previous release's
// partitioned stream (one stream, a partitioning transform) is not taken
// for jetstream mode's stream, where sidecars would consume nothing from
// it: EnsureStream refuses it with ErrLegacyStream, its message naming the
// way out.
func TestEnsureStreamRefusesTheLegacyStream(t *testing.T) {
	nc := testenv.Connect(t, testenv.NATS(t).ClientURL())
	ctx := context.Background()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "MENTIONS", Subjects: []string{"mentions.>"},
		SubjectTransform: &jetstream.SubjectTransformConfig{Source: "mentions.>", Destination: "{{partition(8)}}.mentions.>"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := ingest.EnsureStream(ctx, nc, "MENTIONS", "mentions.>", time.Minute); !errors.Is(err, ingest.ErrLegacyStream) {
		t.Errorf("EnsureStream on the legacy stream = %v, want ErrLegacyStream", err)
	}
}
