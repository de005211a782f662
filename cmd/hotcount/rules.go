package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/pflag"

	"github.com/hotcount/hotcount/config"
	"github.com/hotcount/hotcount/durability/durable"
	"github.com/hotcount/hotcount/durability/rules"
)

// settable are the settings `hotcount stream rules set` changes: the
// rules that judge a message and the items it counts in. The mode, the
// subject and the partitions name the streams themselves: another value
// is other streams (hotcount stream create).
var settable = []string{"max-count", "max-topic-bytes", "max-lateness", "windows", "minute-retention", "hour-retention", "table", "region"}

// cmdStreamRules shows or changes the streams' rules.
func cmdStreamRules(ctx context.Context, args, environ []string, stdout, stderr io.Writer) error {
	return group(ctx, "stream rules", args, environ, stdout, stderr,
		subcommand{"show", "each stream's rules in force and their history", cmdRulesShow},
		subcommand{"set", "change the rules of every stream from its next message on (the settings given on the command line only)", cmdRulesSet})
}

// rulesFlags are the settings that name the streams.
func rulesFlags(cfg *config.Config, name string, more func(string) bool) *pflag.FlagSet {
	return cfg.FlagSet(name, func(s string) bool {
		return natsSettings(s) || s == "stream" || s == "nats-mode" || s == "partitions" || more(s)
	})
}

// openRules connects to NATS and opens the rules' book.
func openRules(ctx context.Context, cfg config.Config, name string) (jetstream.JetStream, *rules.Book, func(), error) {
	if !cfg.Durable() {
		return nil, nil, nil, usageError{fmt.Errorf("--nats-mode %s reads no stream: jetstream or partitioned", cfg.NATSMode)}
	}
	nc, err := connect(cfg, name)
	if err != nil {
		return nil, nil, nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, nil, err
	}
	book, err := durable.OpenRules(ctx, js, "", streamNames(cfg)[0])
	if err != nil {
		nc.Close()
		return nil, nil, nil, err
	}
	return js, book, nc.Close, nil
}

// cmdRulesShow prints each stream's rules and their history.
func cmdRulesShow(ctx context.Context, args, environ []string, stdout, stderr io.Writer) error {
	cfg := config.Default()
	cfg.NATSMode = config.ModePartitioned
	fs := rulesFlags(&cfg, "hotcount stream rules show", func(string) bool { return false })
	asJSON := fs.Bool("json", false, "print the histories as JSON")
	if err := parse(&cfg, fs, args, environ, stderr); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	js, _, done, err := openRules(ctx, cfg, "hotcount-stream-rules")
	if err != nil {
		return err
	}
	defer done()
	all := make(map[string]rules.History)
	for _, name := range streamNames(cfg) {
		h, err := durable.ReadRules(ctx, js, "", name)
		if err != nil {
			return err
		}
		all[name] = h
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(all)
	}
	for _, name := range streamNames(cfg) {
		printHistory(stdout, name, all[name])
	}
	return nil
}

// printHistory prints one stream's history, the rules in force last.
func printHistory(w io.Writer, name string, h rules.History) {
	if len(h) == 0 {
		fmt.Fprintf(w, "%s: no rules recorded yet (the first sidecar to read it records its own settings)\n", name)
		return
	}
	fmt.Fprintf(w, "%s:\n", name)
	for i, c := range h {
		mark := "  "
		if i == len(h)-1 {
			mark = "* "
		}
		fmt.Fprintf(w, "  %sfrom sequence %d (creation %s), %s by %s: %s\n", mark, c.Seq+1, time.UnixMicro(c.Epoch).UTC().Format(time.RFC3339), c.At.Format(time.RFC3339), c.By, c.Why)
		fmt.Fprintf(w, "      %s\n", describe(c.Rules))
	}
}

// describe is r as settings.
func describe(r rules.Rules) string {
	windows := r.Windows()
	if windows == "" {
		windows = "none"
	}
	region := r.Region
	if region == "" {
		region = `"" (single-Region layout)`
	}
	parts := []string{
		"--nats-mode " + r.Mode, "--subject " + r.Subject,
	}
	if r.Partitions > 0 {
		parts = append(parts, fmt.Sprintf("--partitions %d", r.Partitions))
	}
	return strings.Join(append(parts, "--table "+r.Table, "--region "+region,
		fmt.Sprintf("--max-count %d", r.MaxCount), fmt.Sprintf("--max-topic-bytes %d", r.MaxTopicBytes),
		"--max-lateness "+r.MaxLateness.String(), "--windows "+windows,
		"--minute-retention "+r.MinuteRetention.String(), "--hour-retention "+r.HourRetention.String()), " ")
}

// cmdRulesSet changes the rules of every stream of the mode: the settings
// given on the command line take the values given, the others keep the
// stream's. The change is a message in each stream, and every reader
// judges the messages after it by the new rules.
func cmdRulesSet(ctx context.Context, args, environ []string, stdout, stderr io.Writer) error {
	cfg := config.Default()
	cfg.NATSMode = config.ModePartitioned
	fs := rulesFlags(&cfg, "hotcount stream rules set", func(s string) bool {
		for _, t := range settable {
			if s == t {
				return true
			}
		}
		return false
	})
	why := fs.String("why", "", "why the rules change: kept in their history (required)")
	dryRun := fs.Bool("dry-run", false, "print the change and record nothing")
	if err := parse(&cfg, fs, args, environ, stderr); err != nil {
		return err
	}
	var changed []string
	typedNow := typedFlags(args, settable)
	for _, t := range settable {
		if typedNow[t] {
			changed = append(changed, t)
		}
	}
	if len(changed) == 0 {
		return usageError{fmt.Errorf("nothing to change: give one or more of --%s", strings.Join(settable, ", --"))}
	}
	if *why == "" && !*dryRun {
		return usageError{fmt.Errorf("--why is required: it is kept in the rules' history")}
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	_, book, done, err := openRules(ctx, cfg, "hotcount-stream-rules")
	if err != nil {
		return err
	}
	defer done()
	for _, name := range streamNames(cfg) {
		cur, ok, err := book.Latest(ctx, name)
		if err != nil {
			return err
		}
		if !ok {
			return fmt.Errorf("stream %s has no rules yet for its creation: a sidecar records its settings (or the rules of the stream's earlier creation) as the first when it first reads it; start one", name)
		}
		next := apply(cur.Rules, cfg, changed)
		ds := rules.Differences(cur.Rules, next)
		if len(ds) == 0 {
			fmt.Fprintf(stdout, "%s: unchanged\n", name)
			continue
		}
		for _, d := range ds {
			fmt.Fprintf(stdout, "%s: --%s %s -> %s\n", name, d.Setting, d.Stream, d.Own)
		}
		if *dryRun {
			continue
		}
		c, err := book.Set(ctx, name, next, *why, cur)
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "%s: in force from sequence %d\n", name, c.Seq+1)
		if slices.ContainsFunc(rules.Structural(ds), func(d rules.Difference) bool { return d.Setting != "table" }) {
			fmt.Fprintf(stdout, "%s: the sidecars of the earlier settings read up to it and stop reading there; roll the fleet once hotcount stream status shows the checkpoint at %d or past\n", name, c.Seq)
		}
	}
	return nil
}

// typedFlags are those of names that the command line itself gives: not
// the environment or a --config file, which are a pod's settings, not a
// change an operator typed.
func typedFlags(args, names []string) map[string]bool {
	fs := pflag.NewFlagSet("", pflag.ContinueOnError)
	fs.ParseErrorsAllowlist.UnknownFlags = true
	fs.SetOutput(io.Discard)
	for _, n := range names {
		fs.String(n, "", "")
	}
	_ = fs.Parse(args) // the real parse has reported any error
	out := make(map[string]bool)
	fs.Visit(func(f *pflag.Flag) { out[f.Name] = true })
	return out
}

// apply is r with the settings named in changed taken from cfg.
func apply(r rules.Rules, cfg config.Config, changed []string) rules.Rules {
	for _, s := range changed {
		switch s {
		case "max-count":
			r.MaxCount = cfg.MaxCount
		case "max-topic-bytes":
			r.MaxTopicBytes = cfg.MaxTopicBytes
		case "max-lateness":
			r.MaxLateness = rules.Duration(cfg.Lateness())
		case "windows":
			r.Minutes, r.Hours = cfg.Buckets()
		case "minute-retention":
			r.MinuteRetention = rules.Duration(cfg.MinuteRetention)
		case "hour-retention":
			r.HourRetention = rules.Duration(cfg.HourRetention)
		case "table":
			r.Table = cfg.Table
		case "region":
			r.Region = cfg.Region
		}
	}
	return r
}
