package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/hotcount/hotcount/config"
	"github.com/hotcount/hotcount/loadgen"
)

// cmdLoad publishes synthetic mentions and reports what it sent.
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
	report := fs.String("report", "", "write the per-topic counts sent to this JSON file")
	if err := parse(&cfg, fs, args, environ, stderr); err != nil {
		return err
	}
	lc.Prefix = cfg.Subject[:len(cfg.Subject)-1]
	if err := lc.Validate(); err != nil {
		return usageError{err}
	}
	nc, err := connect(cfg, "hotcount-load")
	if err != nil {
		return err
	}
	defer nc.Close()
	rep, err := loadgen.Run(ctx, nc, lc)
	fmt.Fprintf(stdout, "sent %d messages (%d mentions) over %d topics in %s: %.0f messages/s\n",
		rep.Messages, rep.Mentions, len(rep.PerTopic), rep.Elapsed.Round(time.Millisecond),
		float64(rep.Messages)/rep.Elapsed.Seconds())
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
