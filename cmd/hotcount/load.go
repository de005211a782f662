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

	"github.com/hotcount/hotcount/config"
	"github.com/hotcount/hotcount/ingest"
	"github.com/hotcount/hotcount/loadgen"
)

// streamTakes says whether a JetStream stream stores subject.
func streamTakes(ctx context.Context, nc *nats.Conn, subject string) bool {
	js, err := jetstream.New(nc)
	if err != nil {
		return false
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	_, err = js.StreamNameBySubject(ctx, subject)
	return err == nil
}

// cmdLoad publishes synthetic mentions with a client.Publisher (one
// message per event) and reports what was published: what the stream
// acknowledged, when a stream takes the subject; else what the NATS server
// confirmed reading.
func cmdLoad(ctx context.Context, args, environ []string, stdout, stderr io.Writer) error {
	cfg := config.Default()
	fs := cfg.FlagSet("hotcount load", natsSettings)
	// The setting is the sidecar's subscription; load publishes under it.
	if f := fs.Lookup("subject"); f != nil {
		env := "" // config's " ($HOTCOUNT_SUBJECT)"
		if i := strings.LastIndex(f.Usage, " ($"); i >= 0 {
			env = f.Usage[i:]
		}
		f.Usage = "subject prefix to publish to, as <prefix>.> (the sidecar's --subject): a mention of topic T goes to <prefix>.T" + env
	}
	var lc loadgen.Config
	fs.IntVar(&lc.Topics, "topics", 1000, "distinct topics (topic-0, topic-1, ...)")
	fs.Float64Var(&lc.Zipf, "zipf", 1.1, "Zipf skew s of the topic distribution, > 1; 0 is uniform")
	fs.IntVar(&lc.Rate, "rate", 0, "messages per second; 0 is as fast as NATS takes them")
	fs.DurationVar(&lc.Duration, "duration", 10*time.Second, "how long to publish; 0 is until --messages")
	fs.Int64Var(&lc.Messages, "messages", 0, "stop after this many messages; 0 is no bound")
	fs.Int64Var(&lc.Count, "count", 1, `count per message: 1 sends empty payloads, more sends {"count": n}`)
	fs.StringVar(&lc.Surge, "surge", "", "a topic to publish besides the others, at --surge-rate from --surge-after: one that starts trending (see /v1/trending)")
	fs.IntVar(&lc.SurgeRate, "surge-rate", 200, "messages per second of the --surge topic")
	fs.DurationVar(&lc.SurgeAfter, "surge-after", 0, "how long into the run the --surge topic starts")
	fs.BoolVar(&lc.Backfill, "backfill", false, `publish the run as history, as fast as NATS takes it: --duration of mentions at --rate (and the --surge), each stamped with its time in the --duration before now ({"count": n, "at": <Unix ms>}), which the sidecar counts in that time's minute and hour buckets; a sidecar refuses mentions older than its --max-lateness (24h by default)`)
	fs.Uint64Var(&lc.Seed, "seed", 0, "seed of the topic sequence; 0 picks one at random and prints it, to repeat the run with")
	report := fs.String("report", "", "write the per-topic counts published (acknowledged by the stream, or received by the NATS server) to this JSON file")
	mode := fs.String("jetstream", "auto", "publish with JetStream acknowledgements and count only what the stream stored: auto (when a stream takes the subject, as with hotcount dev), true or false (core publishes: counted when the NATS server has them, which a slow subscriber may still drop)")
	if err := parse(&cfg, fs, args, environ, stderr); err != nil {
		return err
	}
	lc.Prefix = cfg.Subject[:len(cfg.Subject)-1]
	if err := lc.Validate(); err != nil {
		return usageError{err}
	}
	switch *mode {
	case "auto", "true", "false":
	default:
		return usageError{fmt.Errorf("--jetstream %q is not auto, true or false", *mode)}
	}
	if lc.Backfill && lc.Duration > ingest.DefaultMaxLateness {
		fmt.Fprintf(stderr, "hotcount load: warning: a backfill of %s reaches past a sidecar's default --max-lateness (%s): it refuses the older mentions (reason \"at\")\n", lc.Duration, ingest.DefaultMaxLateness)
	}
	for lc.Seed == 0 {
		lc.Seed = rand.Uint64()
	}
	// No reconnect buffer: a publish made while the connection is down
	// fails at once and is retried with its id, instead of waiting in
	// nats.go's buffer to be sent after the stream has forgotten the id.
	nc, err := connect(cfg, "hotcount-load", nats.ReconnectBufSize(-1))
	if err != nil {
		return err
	}
	defer nc.Close()
	lc.JetStream = *mode == "true"
	if *mode == "auto" {
		lc.JetStream = streamTakes(ctx, nc, lc.Prefix+loadgen.Topic(0))
	}
	fmt.Fprintf(stdout, "hotcount load: seed %d (--seed %d repeats the topic sequence)\n", lc.Seed, lc.Seed)
	rep, err := loadgen.Run(ctx, nc, lc)
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
	if rep.Unacknowledged > 0 {
		// Each of them may or may not be stored (an acknowledgement lost
		// with the connection): the report leaves them out, so the store
		// may hold up to that many more.
		fmt.Fprintf(stdout, "%d messages not acknowledged, each perhaps stored, perhaps not: left out of the report, so the store may hold up to %d more mentions than it says\n", rep.Unacknowledged, rep.Unacknowledged*lc.Count)
		if err == nil {
			err = fmt.Errorf("%d messages not acknowledged", rep.Unacknowledged)
		}
	}
	if !lc.JetStream {
		fmt.Fprintln(stderr, "hotcount load: warning: core NATS is at-most-once: a subscriber that is slow or not there drops what the server received, so the store may hold fewer (--jetstream true counts only what a stream stored)")
	}
	if *report != "" {
		b, jerr := json.MarshalIndent(rep, "", "  ")
		if jerr == nil {
			jerr = os.WriteFile(*report, b, 0o644)
		}
		if jerr != nil && err == nil {
			err = fmt.Errorf("write report: %w", jerr)
		}
	}
	return err
}
