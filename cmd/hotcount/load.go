package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/pflag"

	"github.com/hotcount/hotcount/config"
	"github.com/hotcount/hotcount/durability/streams"
	"github.com/hotcount/hotcount/mention"
	"github.com/hotcount/hotcount/tools/loadgen"
)

// streamTakes says whether a JetStream stream stores subject: one that
// takes it as configured, or (partitioned mode) one the server's mapping
// routes it to, which only a publish can tell. That publish is a probe
// (streams.ProbeHeader: sidecars skip it uncounted), deleted again.
func streamTakes(ctx context.Context, nc *nats.Conn, subject string) bool {
	js, err := jetstream.New(nc)
	if err != nil {
		return false
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if _, err := js.StreamNameBySubject(ctx, subject); err == nil {
		return true
	}
	msg := nats.NewMsg(subject)
	msg.Header.Set(streams.ProbeHeader, "load")
	ack, err := js.PublishMsg(ctx, msg)
	if err != nil {
		return false
	}
	if s, err := js.Stream(ctx, ack.Stream); err == nil {
		s.DeleteMsg(ctx, ack.Sequence) //nolint:errcheck // best effort: a probe left is skipped uncounted
	}
	return true
}

// cmdLoad publishes synthetic mentions with a client.Publisher (one
// message per event) and reports what was published: what the stream
// acknowledged, when a stream takes the subject; else what the NATS server
// confirmed reading.
func cmdLoad(ctx context.Context, args, environ []string, stdout, stderr io.Writer) error {
	cfg := config.Default()
	var o loadOptions
	fs := loadFlagSet(&cfg, &o)
	if err := parse(&cfg, fs, args, environ, stderr); err != nil {
		return err
	}
	o.lc.Prefix = cfg.Subject[:len(cfg.Subject)-1]
	if err := o.check(); err != nil {
		return err
	}
	if o.lc.Backfill && o.lc.Duration > mention.DefaultMaxLateness {
		fmt.Fprintf(stderr, "hotcount load: warning: a backfill of %s reaches past a sidecar's default --max-lateness (%s): it refuses the older mentions (reason \"at\")\n", o.lc.Duration, mention.DefaultMaxLateness)
	}
	for o.lc.Seed == 0 {
		o.lc.Seed = rand.Uint64()
	}
	// No reconnect buffer: a publish made while the connection is down
	// fails at once and is retried with its id, instead of waiting in
	// nats.go's buffer to be sent after the stream has forgotten the id.
	nc, err := connect(cfg, "hotcount-load", nats.ReconnectBufSize(-1))
	if err != nil {
		return err
	}
	defer nc.Close()
	o.lc.JetStream = o.mode == "true"
	if o.mode == "auto" {
		o.lc.JetStream = streamTakes(ctx, nc, o.lc.Prefix+loadgen.Topic(0))
	}
	fmt.Fprintf(stdout, "hotcount load: seed %d (--seed %d repeats the topic sequence)\n", o.lc.Seed, o.lc.Seed)
	rep, err := loadgen.Run(ctx, nc, o.lc)
	// The run's own error comes first; then messages left unacknowledged,
	// then a report that could not be written.
	if serr := printLoad(stdout, stderr, o.lc, rep); err == nil {
		err = serr
	}
	if o.report != "" {
		if werr := writeReport(o.report, rep); werr != nil && err == nil {
			err = werr
		}
	}
	return err
}

// loadOptions are the flags of hotcount load besides the NATS settings.
type loadOptions struct {
	lc     loadgen.Config
	report string // --report: the JSON file of the per-topic counts
	mode   string // --jetstream: auto, true or false
}

// loadFlagSet returns load's flag set: the NATS settings, bound to cfg, and
// load's own flags, bound to o.
func loadFlagSet(cfg *config.Config, o *loadOptions) *pflag.FlagSet {
	fs := cfg.FlagSet("hotcount load", natsSettings)
	publishSubjectUsage(fs)
	lc := &o.lc
	fs.IntVar(&lc.Topics, "topics", 1000, "distinct topics (topic-0, topic-1, ...)")
	fs.Float64Var(&lc.Zipf, "zipf", 1.1, "Zipf skew s of the topic distribution, > 1; 0 is uniform")
	fs.IntVar(&lc.Rate, "rate", 0, "messages per second; 0 is as fast as NATS takes them")
	fs.DurationVar(&lc.Duration, "duration", 10*time.Second, "how long to publish; 0 is until --messages")
	fs.Int64Var(&lc.Messages, "messages", 0, "stop after this many messages; 0 is no bound")
	fs.Int64Var(&lc.Count, "count", 1, `count per message: 1 sends empty payloads, more sends {"count": n}`)
	fs.StringVar(&lc.Surge, "surge", "", "a topic to publish besides the others, at --surge-rate from --surge-after: one that starts trending (see /v1/trending)")
	fs.IntVar(&lc.SurgeRate, "surge-rate", 200, "messages per second of the --surge topic")
	fs.DurationVar(&lc.SurgeAfter, "surge-after", 0, "how long into the run the --surge topic starts")
	fs.IntVar(&lc.Contributors, "contributors", 0, `name a contributor in each message ({"count": n, "by": "c<k>"}), drawn from this many; 0: none (see --trending-by contributors)`)
	fs.BoolVar(&lc.Backfill, "backfill", false, `publish the run as history, as fast as NATS takes it: --duration of mentions at --rate (and the --surge), each stamped with its time in the --duration before now ({"count": n, "at": <Unix ms>}), which the sidecar counts in that time's minute and hour buckets; a sidecar refuses mentions older than its --max-lateness (24h by default)`)
	fs.Uint64Var(&lc.Seed, "seed", 0, "seed of the topic sequence; 0 picks one at random and prints it, to repeat the run with")
	fs.StringVar(&o.report, "report", "", "write the per-topic counts published (acknowledged by the stream, or received by the NATS server) to this JSON file")
	fs.StringVar(&o.mode, "jetstream", "auto", "publish with JetStream acknowledgements and count only what the stream stored: auto (when a stream takes the subject, as with hotcount dev), true or false (core publishes: counted when the NATS server has them, which a slow subscriber may still drop)")
	return fs
}

// publishSubjectUsage rewrites --subject's help for load: the setting is
// the sidecar's subscription, and load publishes under it.
func publishSubjectUsage(fs *pflag.FlagSet) {
	f := fs.Lookup("subject")
	if f == nil {
		return
	}
	env := "" // config's " ($HOTCOUNT_SUBJECT)"
	if i := strings.LastIndex(f.Usage, " ($"); i >= 0 {
		env = f.Usage[i:]
	}
	f.Usage = "subject prefix to publish to, as <prefix>.> (the sidecar's --subject): a mention of topic T goes to <prefix>.T" + env
}

// check reports bad flags as a usage error.
func (o *loadOptions) check() error {
	if err := o.lc.Validate(); err != nil {
		return usageError{err}
	}
	switch o.mode {
	case "auto", "true", "false":
	default:
		return usageError{fmt.Errorf("--jetstream %q is not auto, true or false", o.mode)}
	}
	return nil
}

// printLoad prints what the run published, and warns about what the counts
// may miss. Its error is for messages left unacknowledged.
func printLoad(stdout, stderr io.Writer, lc loadgen.Config, rep loadgen.Report) error {
	verb := "received by the NATS server (a round trip after the last message confirmed it)"
	if lc.JetStream {
		verb = "stored (acknowledged by the stream)"
	}
	fmt.Fprintf(stdout, "%s: %d messages (%d mentions) over %d topics in %s: %.0f messages/s\n",
		verb, rep.Messages, rep.Mentions, len(rep.PerTopic), rep.Elapsed.Round(time.Millisecond),
		float64(rep.Messages)/rep.Elapsed.Seconds())
	if lc.Backfill {
		fmt.Fprintf(stdout, "backfilled: stamped from %s to %s\n", rep.From.Format(time.TimeOnly), rep.To.Format(time.TimeOnly))
	}
	var err error
	if rep.Unacknowledged > 0 {
		// Each of them may or may not be stored (an acknowledgement lost
		// with the connection): the report leaves them out, so the store
		// may hold up to that many more.
		fmt.Fprintf(stdout, "%d messages not acknowledged, each perhaps stored, perhaps not: left out of the report, so the store may hold up to %d more mentions than it says\n", rep.Unacknowledged, rep.Unacknowledged*lc.Count)
		err = fmt.Errorf("%d messages not acknowledged", rep.Unacknowledged)
	}
	if !lc.JetStream {
		fmt.Fprintln(stderr, "hotcount load: warning: core NATS is at-most-once: a subscriber that is slow or not there drops what the server received, so the store may hold fewer (--jetstream true counts only what a stream stored)")
	}
	return err
}

// writeReport writes rep to path as indented JSON, for --report.
func writeReport(path string, rep loadgen.Report) error {
	b, err := json.MarshalIndent(rep, "", "  ")
	if err == nil {
		err = os.WriteFile(path, b, 0o644)
	}
	if err != nil {
		return fmt.Errorf("write report: %w", err)
	}
	return nil
}
