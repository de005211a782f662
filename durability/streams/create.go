package streams

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/hotcount/hotcount/mention"
)

// What Ensure, Check and Probe find wrong, for errors.Is: each of their
// errors of these kinds says in its message what it found and what to do.
var (
	// ErrNotPartition: a stream of a partition stream's name takes another
	// subject than the partition's.
	ErrNotPartition = errors.New("streams: a stream of a partition stream's name is not that partition's")
	// ErrMissing: partition streams are missing.
	ErrMissing = errors.New("streams: partition streams missing")
	// ErrLegacy: the partition streams are missing and the previous
	// release's partitioned layout (Legacy) is there instead.
	ErrLegacy = errors.New("streams: the previous release's partitioned layout")
	// ErrTooMany: a stream past the last partition's exists; the
	// streams were made for more partitions.
	ErrTooMany = errors.New("streams: more partition streams than partitions")
	// ErrMisrouted: the server did not route a probe into its partition's
	// stream; the message names the mapping it needs.
	ErrMisrouted = errors.New("streams: the server does not route into the partition streams")
)

// layoutError is an error of one of the kinds above (errors.Is), with its
// own message.
type layoutError struct {
	kind error
	msg  string
}

func (e *layoutError) Error() string { return e.msg }
func (e *layoutError) Unwrap() error { return e.kind }

// fail is an error of kind, its message format's.
func fail(kind error, format string, args ...any) error {
	return &layoutError{kind: kind, msg: fmt.Sprintf(format, args...)}
}

// Options are the partition streams' limits, `hotcount stream create`'s.
type Options struct {
	// MaxAge is how long a stream keeps a message.
	MaxAge time.Duration
	// MaxBytes bounds all the partition streams together: each takes an
	// equal share, and a partition whose share is full refuses new
	// publishes (a hot partition fills first). A share, not the whole, per
	// stream, because JetStream reserves a stream's MaxBytes on its
	// servers' disks when it creates it.
	MaxBytes int64
	// Duplicates is the window for Nats-Msg-Id de-duplication.
	Duplicates time.Duration
	// Replicas is each stream's replication factor (3 keeps every stored
	// mention through the loss of a node).
	Replicas int
}

// share is one partition stream's part of MaxBytes.
func (l Layout) share(o Options) int64 {
	return (o.MaxBytes + int64(l.Partitions) - 1) / int64(l.Partitions)
}

// Ensure creates the partition streams that do not exist and checks those
// that do: each must take its partition's subject (Stored) alone. It
// returns how many it created.
func Ensure(ctx context.Context, js jetstream.JetStream, l Layout, o Options) (created int, err error) {
	for p := range l.Partitions {
		s, err := js.Stream(ctx, l.Name(p))
		if err == nil {
			if err := l.check(p, s.CachedInfo().Config); err != nil {
				return created, err
			}
			continue
		}
		if !errors.Is(err, jetstream.ErrStreamNotFound) {
			return created, fmt.Errorf("streams: look up %s: %w", l.Name(p), err)
		}
		_, err = js.CreateStream(ctx, l.config(p, o))
		switch {
		case errors.Is(err, jetstream.ErrStreamNameAlreadyInUse):
			// Another `stream create` made it first.
		case err != nil:
			return created, fmt.Errorf("streams: create %s: %w", l.Name(p), err)
		default:
			created++
		}
	}
	return created, nil
}

func (l Layout) config(p int, o Options) jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:        l.Name(p),
		Description: fmt.Sprintf("mentions for hotcount: partition %d of %d", p, l.Partitions),
		Subjects:    []string{l.Stored(p), RulesSubject(l.Name(p))},
		Storage:     jetstream.FileStorage,
		Retention:   jetstream.LimitsPolicy,
		Duplicates:  o.Duplicates,
		MaxAge:      o.MaxAge,
		MaxBytes:    l.share(o),
		Discard:     jetstream.DiscardNew,
		Replicas:    max(o.Replicas, 1),
	}
}

// check says whether an existing stream is partition p's as l lays it out.
func (l Layout) check(p int, c jetstream.StreamConfig) error {
	// A stream made before the rules existed takes its rules subject
	// from its first reader on (package rules).
	mine := []string{l.Stored(p), RulesSubject(l.Name(p))}
	if !slices.Equal(c.Subjects, mine) && !slices.Equal(c.Subjects, mine[:1]) {
		return fail(ErrNotPartition, "streams: stream %s exists and takes %v, not %s: it is not partition %d of this layout; delete it or pick another --stream", c.Name, c.Subjects, l.Stored(p), p)
	}
	return nil
}

// Check says whether the partition streams are there, as the sidecars need
// them: all Partitions of them and no more. The error names what is
// missing and what to run; a stream of the previous release's layout is
// recognised and explained (see Legacy).
func Check(ctx context.Context, js jetstream.JetStream, l Layout) error {
	var missing []string
	for p := range l.Partitions {
		s, err := js.Stream(ctx, l.Name(p))
		switch {
		case errors.Is(err, jetstream.ErrStreamNotFound):
			missing = append(missing, l.Name(p))
			continue
		case err != nil:
			return fmt.Errorf("streams: look up %s: %w", l.Name(p), err)
		}
		if err := l.check(p, s.CachedInfo().Config); err != nil {
			return err
		}
	}
	if len(missing) > 0 {
		if legacy, err := Legacy(ctx, js, l); err == nil && legacy != "" {
			return fail(ErrLegacy, "streams: stream %s is the previous release's partitioned layout (%s); this release reads %d partition streams (%s..%s) fed by an account mapping: see deploy/README.md, \"Moving to partition streams\"", l.Stream, legacy, l.Partitions, l.Name(0), l.Name(l.Partitions-1))
		}
		return fail(ErrMissing, "streams: %d of %d partition streams missing (%s): run `hotcount stream create --nats-mode partitioned --partitions %d`", len(missing), l.Partitions, abbreviate(missing), l.Partitions)
	}
	// One more than expected: the streams were made for more partitions,
	// and the mapping may send topics to streams nobody reads.
	if _, err := js.Stream(ctx, l.Name(l.Partitions)); err == nil {
		return fail(ErrTooMany, "streams: stream %s exists: the partition streams were made for more than --partitions %d; use their count (`hotcount stream status`)", l.Name(l.Partitions), l.Partitions)
	}
	return nil
}

// Legacy describes the stream of the previous release's partitioned layout
// (one stream named Stream, its transform putting the partition first) if
// there is one, "" if not.
func Legacy(ctx context.Context, js jetstream.JetStream, l Layout) (string, error) {
	s, err := js.Stream(ctx, l.Stream)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	tr := s.CachedInfo().Config.SubjectTransform
	if tr == nil || !strings.Contains(tr.Destination, "{{partition(") {
		return "", nil
	}
	return fmt.Sprintf("one stream, transform %s -> %s, %d messages", tr.Source, tr.Destination, s.CachedInfo().State.Msgs), nil
}

func abbreviate(names []string) string {
	if len(names) <= 3 {
		return strings.Join(names, ", ")
	}
	return fmt.Sprintf("%s and %d more", strings.Join(names[:3], ", "), len(names)-3)
}

// ProbeHeader marks Probe's messages (mention.ProbeHeader).
const ProbeHeader = mention.ProbeHeader

// probes is how many subjects Probe publishes: a mapping into another
// number of partitions sends one of them elsewhere for most counts, not
// all (83 and 166 agree on these 16, for one); the sidecars' start-up
// check of the streams' count catches more.
const probes = 16

// Probe checks that the server routes producers' subjects into the
// partition streams as l lays them out: it publishes messages marked with
// ProbeHeader to subjects of Subject and checks which stream stored each.
// The error names the missing piece: the mapping (nothing stored the probe,
// or a stream of Subject itself did) or its partition count (the probe
// landed in another partition). The probes are deleted afterwards; the
// answer is their sequences, per stream, which the deletions leave as
// holes (Probed).
func Probe(ctx context.Context, js jetstream.JetStream, l Layout) (Probed, error) {
	prefix := strings.TrimSuffix(l.Subject, ">")
	from, to := l.Mapping()
	fix := fmt.Sprintf("the NATS server must map %q to %q in the producers' account (deploy/nats/hotcount.conf)", from, to)
	var landed []*jetstream.PubAck
	probed := Probed{}
	defer func() { unprobe(context.WithoutCancel(ctx), js, landed) }()
	for i := range probes {
		subject := fmt.Sprintf("%shotcount-probe.%d", prefix, i)
		want := l.Of(subject)
		msg := nats.NewMsg(subject)
		msg.Header.Set(ProbeHeader, "stream create")
		// Stored by that stream or by none: a probe routed elsewhere (the
		// previous release's stream, whose sidecars do not know the
		// header) is refused, not counted there.
		ack, err := js.PublishMsg(ctx, msg, jetstream.WithExpectStream(l.Name(want)))
		var apiErr *jetstream.APIError
		switch {
		case errors.Is(err, jetstream.ErrNoStreamResponse), errors.Is(err, nats.ErrNoResponders):
			return nil, fail(ErrMisrouted, "streams: a probe published to %s was stored by no stream: %s", subject, fix)
		case errors.As(err, &apiErr):
			return nil, fail(ErrMisrouted, "streams: a probe published to %s reached a stream other than %s, partition %d of %d (%v): %s", subject, l.Name(want), want, l.Partitions, err, fix)
		case err != nil:
			return nil, fmt.Errorf("streams: probe %s: %w", subject, err)
		}
		landed = append(landed, ack)
		probed[ack.Stream] = append(probed[ack.Stream], ack.Sequence)
		if ack.Stream != l.Name(want) {
			return nil, fail(ErrMisrouted, "streams: a probe published to %s was stored by stream %s, not %s (partition %d of %d): %s", subject, ack.Stream, l.Name(want), want, l.Partitions, fix)
		}
	}
	return probed, nil
}

// Probed is the sequences of Probe's messages, per stream.
type Probed map[string][]uint64

// Front is how far the probes of stream make up its front: the n such
// that every one of the sequences 1..n is a probe's and n+1 is not. A
// stream whose first message is at n+1 lost nothing before it.
func (p Probed) Front(stream string) uint64 {
	seqs := slices.Sorted(slices.Values(p[stream]))
	var n uint64
	for _, s := range seqs {
		if s != n+1 {
			break
		}
		n = s
	}
	return n
}

// unprobe deletes the probes, so that neither the sidecars nor an audit
// meet them. Best effort: a probe left behind is skipped uncounted.
func unprobe(ctx context.Context, js jetstream.JetStream, acks []*jetstream.PubAck) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	for _, a := range acks {
		if s, err := js.Stream(ctx, a.Stream); err == nil {
			s.DeleteMsg(ctx, a.Sequence) //nolint:errcheck // best effort, see above
		}
	}
}
