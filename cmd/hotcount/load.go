package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/hotcount/hotcount/config"
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

// cmdLoad publishes synthetic mentions and reports what it sent: what the
// stream acknowledged, when a stream takes the subject.
func cmdLoad(ctx context.Context, args, environ []string, stdout, stderr io.Writer) error {
	cfg := config.Default()
	fs := cfg.FlagSet("hotcount load", natsSettings)
	var lc loadgen.Config
	fs.IntVar(&lc.Topics, "topics", 1000, "distinct topics (topic-0, topic-1, ...)")
	fs.Float64Var(&lc.Zipf, "zipf", 1.1, "Zipf skew s of the topic distribution, > 1; 0 is uniform")
	fs.IntVar(&lc.Rate, "rate", 0, "messages per second; 0 is as fast as NATS takes them")
	fs.DurationVar(&lc.Duration, "duration", 10*time.Second, "how long to publish; 0 is until --messages")
	fs.Int64Var(&lc.Messages, "messages", 0, "stop after this many messages; 0 is no bound")
	fs.Int64Var(&lc.Count, "count", 1, `count per message: 1 sends empty payloads, more sends {"count": n}`)
	fs.Uint64Var(&lc.Seed, "seed", uint64(time.Now().UnixNano()), "seed of the topic sequence")
	report := fs.String("report", "", "write the per-topic counts published (acknowledged, with JetStream) to this JSON file")
	mode := fs.String("jetstream", "auto", "publish with JetStream acknowledgements and count only what the stream stored: auto (when a stream takes the subject, as with hotcount dev), true or false (core publishes, fire and forget)")
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
	nc, err := connect(cfg, "hotcount-load")
	if err != nil {
		return err
	}
	defer nc.Close()
	lc.JetStream = *mode == "true"
	if *mode == "auto" {
		lc.JetStream = streamTakes(ctx, nc, lc.Prefix+loadgen.Topic(0))
	}
	if !lc.JetStream {
		fmt.Fprintln(stderr, "hotcount load: core NATS publishes, fire and forget: what a slow subscriber or a full stream drops is still counted as sent (--jetstream true counts only what a stream stored)")
	}
	rep, err := loadgen.Run(ctx, nc, lc)
	verb := "sent"
	if lc.JetStream {
		verb = "stored (acknowledged by the stream)"
	}
	fmt.Fprintf(stdout, "%s %d messages (%d mentions) over %d topics in %s: %.0f messages/s\n",
		verb, rep.Messages, rep.Mentions, len(rep.PerTopic), rep.Elapsed.Round(time.Millisecond),
		float64(rep.Messages)/rep.Elapsed.Seconds())
	if rep.Unacknowledged > 0 {
		fmt.Fprintf(stdout, "%d messages not acknowledged by the stream (left out of the counts)\n", rep.Unacknowledged)
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
