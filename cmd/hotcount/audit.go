package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/hotcount/hotcount/config"
	"github.com/hotcount/hotcount/durability/durable"
	"github.com/hotcount/hotcount/mention"
	"github.com/hotcount/hotcount/pipeline/store"
	"github.com/hotcount/hotcount/schema"
	"github.com/hotcount/hotcount/sidecar"
	"github.com/hotcount/hotcount/tools/audit"
)

const auditHelp = `Usage: hotcount audit [flags]

Recounts the mention stream and compares it with the DynamoDB table: are
these numbers right? It reads the stream's retained history with ordered
consumers (no durable state; the sidecars' readers are not touched), judges
every message as the sidecars do in the durable modes (topic rules,
payload, "at" against the message's stream timestamp and --max-lateness),
counts each topic's total and, as --windows has them, its minute and hour
buckets, then reads those counters from the table (strongly consistent,
BatchGetItem, at most --rate items a second) and lists those that differ.
Give it the sidecars' settings (--nats-mode, --stream, --partitions,
--subject, --table, --windows, --max-lateness, ...): the same flags,
variables or --config file as run.

It compares only what it can prove: totals when it read every mention the
stream ever held (nothing aged out past --max-age, no --since or --until);
a bucket when no mention that could land in it was left unread (a mention's
"at" may be up to --max-lateness before its publication) and it is not
past its retention; and neither for a counter with mentions in flight
(past its stream's checkpoint, below which the sidecars have every mention
in the table, or published during the audit), nor for one the sidecars
hold out of the table (hotcount quarantine list). The
summary says what it skipped and why. Exit 1 when a counter differs.

Memory is bounded: it holds at most --max-counters counters at once. A
stream with more is read again for each share of the topics (by topic
hash), so the result is exact and the audit slower.

Flags:
`

// auditFlags are audit's own flags, besides the settings.
type auditFlags struct {
	since, until string
	maxCounters  int
	maxListed    int
	rate         float64
	json         bool
}

// auditSettings are the settings audit reads.
func auditSettings(s string) bool {
	switch s {
	case "stream", "nats-mode", "partitions", "table", "dynamodb-endpoint", "shards",
		"max-count", "max-topic-bytes", "max-lateness", "windows", "minute-retention", "hour-retention":
		return true
	}
	return natsSettings(s)
}

// cmdAudit recounts the stream and compares it with the table.
func cmdAudit(ctx context.Context, args, environ []string, stdout, stderr io.Writer) error {
	cfg := config.Default()
	fs := cfg.FlagSet("hotcount audit", auditSettings)
	var f auditFlags
	fs.StringVar(&f.since, "since", "", "audit the mentions stored since then: RFC 3339 (2026-03-01T12:00:00Z) or a duration back from now (6h); empty: the stream's start")
	fs.StringVar(&f.until, "until", "", "audit the mentions stored until then, as --since; empty: the stream's end. Buckets ending by then are compared; the stream is read --max-lateness past it for late mentions")
	fs.IntVar(&f.maxCounters, "max-counters", audit.DefaultMaxCounters, "the most counters (a topic's total, each of its buckets) held at once; past it the stream is read again per share of the topics")
	fs.Float64Var(&f.rate, "rate", audit.DefaultRate, "table items read per second, strongly consistent (0: no limit)")
	fs.IntVar(&f.maxListed, "max-listed", audit.DefaultMaxListed, "differences listed; the rest are counted")
	fs.BoolVar(&f.json, "json", false, "print the report as one JSON document")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), auditHelp)
		fs.PrintDefaults()
	}
	if err := parse(&cfg, fs, args, environ, stderr); err != nil {
		return err
	}
	acfg, err := auditConfig(cfg, f, time.Now())
	if err != nil {
		return usageError{err}
	}
	if terminal(stderr) {
		acfg.Progress = func(p audit.Progress) {
			fmt.Fprintf(stderr, "\rhotcount audit: pass %d: %d of %d messages read\x1b[K", p.Pass, p.Read, p.Total)
		}
		defer fmt.Fprint(stderr, "\r\x1b[K")
	}

	nc, err := connect(cfg, "hotcount-audit")
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	log, err := newLogger(cfg, stderr)
	if err != nil {
		return err
	}
	table, err := sidecar.OpenStore(ctx, cfg, store.NewMetrics(prometheus.NewRegistry()), log)
	if err != nil {
		return err
	}
	if d, ok := table.(*store.DynamoDB); ok {
		// This Region's stream holds this Region's mentions: the audit
		// compares them with this Region's shards (and the single-Region
		// ones of the table's past), not every Region's.
		d.Regions.All = nil
	}
	defer table.Close()
	acfg.Checkpoints = durable.NewCheckpoints(js, "")
	for i, s := range acfg.Streams {
		if !s.Durable {
			continue
		}
		if acfg.Streams[i].Rules, err = durable.ReadRules(ctx, js, "", s.Name); err != nil {
			return fmt.Errorf("the rules of stream %s: %w", s.Name, err)
		}
	}
	rep, err := audit.Run(ctx, js, table, acfg)
	if err != nil {
		return err
	}
	if f.json {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(jsonReport{Report: rep, Mode: cfg.NATSMode, Table: cfg.Table, Differ: rep.Differ(), OK: rep.Differ() == 0 && checked(rep)}); err != nil {
			return err
		}
	} else {
		printAudit(stdout, rep, cfg)
	}
	if n := rep.Differ(); n > 0 {
		return fmt.Errorf("%w: counters that differ: %d", audit.ErrDiffers, n)
	}
	if !checked(rep) {
		// An audit that proved nothing is no all-clear.
		return errors.New("audit: nothing was compared (see the notes): the numbers are not proved right")
	}
	return nil
}

// checked says whether the audit compared any counter.
func checked(r audit.Report) bool { return r.Totals.Compared+r.Buckets.Compared > 0 }

// jsonReport is --json's document: the report, and its verdict.
type jsonReport struct {
	audit.Report
	Mode   string `json:"mode"`
	Table  string `json:"table"`
	Differ int64  `json:"differ"`
	OK     bool   `json:"ok"`
}

// auditConfig turns the settings and audit's flags into the audit's
// configuration; now is the time --since and --until count back from.
func auditConfig(cfg config.Config, f auditFlags, now time.Time) (audit.Config, error) {
	prefix, err := mention.Prefix(cfg.Subject)
	if err != nil {
		return audit.Config{}, err
	}
	minutes, hours := cfg.Buckets()
	acfg := audit.Config{
		Prefix:      prefix,
		Limits:      mention.Limits{MaxCount: cfg.MaxCount, MaxTopicBytes: cfg.MaxTopicBytes, MaxLateness: cfg.Lateness()},
		Minutes:     minutes,
		Hours:       hours,
		Retention:   schema.Retention{Minute: cfg.MinuteRetention, Hour: cfg.HourRetention},
		Shards:      cfg.ReadGuess(),
		MaxCounters: f.maxCounters,
		MaxListed:   f.maxListed,
		Rate:        f.rate,
	}
	if f.rate == 0 {
		acfg.Rate = -1 // no limit
	}
	switch {
	case f.maxCounters < 1:
		return audit.Config{}, fmt.Errorf("--max-counters %d must be at least 1", f.maxCounters)
	case f.rate < 0:
		return audit.Config{}, fmt.Errorf("--rate %g must not be negative", f.rate)
	case f.maxListed < 1:
		return audit.Config{}, fmt.Errorf("--max-listed %d must be at least 1", f.maxListed)
	}
	if acfg.Since, err = when("--since", f.since, now); err != nil {
		return audit.Config{}, err
	}
	if acfg.Until, err = when("--until", f.until, now); err != nil {
		return audit.Config{}, err
	}
	if !acfg.Since.IsZero() && !acfg.Until.IsZero() && !acfg.Until.After(acfg.Since) {
		return audit.Config{}, fmt.Errorf("--until %s is not after --since %s", f.until, f.since)
	}
	if !acfg.Until.IsZero() && acfg.Until.Before(now) && !minutes && !hours {
		return audit.Config{}, errors.New("nothing to compare: --until leaves the totals out, and --windows is none (no buckets)")
	}
	switch cfg.NATSMode {
	case config.ModePartitioned:
		l := layoutOf(cfg)
		for p := range l.Partitions {
			acfg.Streams = append(acfg.Streams, audit.Stream{Name: l.Name(p), Partitioned: true, Durable: true})
		}
	case config.ModeJetStream:
		acfg.Streams = []audit.Stream{{Name: cfg.Stream, Durable: true}}
	default: // core: the sidecars do not consume the stream
		acfg.Streams = []audit.Stream{{Name: cfg.Stream}}
	}
	return acfg, nil
}

// when reads --since or --until: RFC 3339, or a duration back from now;
// empty is the zero time.
func when(flag, v string, now time.Time) (time.Time, error) {
	if v == "" {
		return time.Time{}, nil
	}
	if t, err := time.Parse(time.RFC3339, v); err == nil {
		return t, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < 0 {
		return time.Time{}, fmt.Errorf("%s %q is neither an RFC 3339 time (2026-03-01T12:00:00Z) nor a duration back from now (6h)", flag, v)
	}
	return now.Add(-d), nil
}

// printAudit writes the report for people: the summary, what was and was
// not checked, then the counters that differ.
func printAudit(w io.Writer, r audit.Report, cfg config.Config) {
	printScope(w, r, cfg)
	printChecks(w, r, cfg)
	printDifferences(w, r)
}

// printScope says what the audit read: the streams and table, the range,
// the messages and what of them was rejected or skipped, the passes.
func printScope(w io.Writer, r audit.Report, cfg config.Config) {
	names := make([]string, len(r.Streams))
	for i, s := range r.Streams {
		names[i] = s.Name
	}
	what := names[0]
	if len(names) > 1 {
		what = fmt.Sprintf("%s..%s (%d partition streams)", names[0], names[len(names)-1], len(names))
	}
	fmt.Fprintf(w, "hotcount audit: stream %s (%s mode) against table %s\n", what, cfg.NATSMode, cfg.Table)
	if r.Since != nil || r.Until != nil {
		from, to := "the start", "the end"
		if r.Since != nil {
			from = r.Since.UTC().Format(time.RFC3339)
		}
		if r.Until != nil {
			to = r.Until.UTC().Format(time.RFC3339)
		}
		fmt.Fprintf(w, "range: %s to %s\n", from, to)
	}
	rejected := int64(0)
	var reasons []string
	for _, k := range slices.Sorted(maps.Keys(r.Rejected)) {
		rejected += r.Rejected[k]
		reasons = append(reasons, fmt.Sprintf("%s %d", k, r.Rejected[k]))
	}
	fmt.Fprintf(w, "read: %d messages, %d mentions of %d topics; %d rejected", r.Messages, r.Mentions, r.Topics, rejected)
	if len(reasons) > 0 {
		fmt.Fprintf(w, " (%s)", strings.Join(reasons, ", "))
	}
	fmt.Fprintf(w, "; %d probes and %d messages outside %s skipped\n", r.Probes, r.Outside, cfg.Subject)
	if r.Shares > 1 {
		fmt.Fprintf(w, "passes: %d reads of the stream, the topics in %d shares to hold at most --max-counters counters at once\n", r.Passes, r.Shares)
	}
}

// printChecks says what was compared and what was not, and the notes.
func printChecks(w io.Writer, r audit.Report, cfg config.Config) {
	if r.Totals.Checked {
		fmt.Fprintf(w, "totals: %d compared, %d differ (the stream holds every mention it took)\n", r.Totals.Compared, r.Totals.Differ)
	} else {
		fmt.Fprintln(w, "totals: not checked (see the notes)")
	}
	if r.Buckets.Checked {
		fmt.Fprintf(w, "buckets (%s): %d compared, %d differ; not checked: %d partly outside what was read, %d past their retention\n",
			cfg.Windows, r.Buckets.Compared, r.Buckets.Differ, r.Buckets.Partial, r.Buckets.Expired)
	} else {
		fmt.Fprintln(w, "buckets: not checked (--windows none)")
	}
	if r.InFlight > 0 {
		fmt.Fprintf(w, "in flight: %d counters not checked\n", r.InFlight)
	}
	if r.Held > 0 {
		fmt.Fprintf(w, "held: %d counters not checked, their writes refused (hotcount quarantine list)\n", r.Held)
	}
	if r.Foreign > 0 {
		fmt.Fprintf(w, "foreign: %d counters not checked, their items hold mentions of a stream not read (see the notes)\n", r.Foreign)
	}
	if r.Totals.Compared+r.Buckets.Compared == 0 {
		fmt.Fprintln(w, "nothing was checked")
	}
	fmt.Fprintln(w, "notes:")
	for _, n := range r.Notes {
		fmt.Fprintf(w, "  - %s\n", n)
	}
}

// printDifferences lists the counters that differ, or says none does.
func printDifferences(w io.Writer, r audit.Report) {
	if len(r.Differences) == 0 {
		if r.Totals.Compared+r.Buckets.Compared > 0 {
			fmt.Fprintln(w, "no difference: every counter checked matches the stream")
		}
		return
	}
	fmt.Fprintf(w, "counters that differ: %d (difference: table − stream)\n", r.Differ())
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "TOPIC\tCOUNTER\tBUCKET\tSTREAM\tTABLE\tDIFFERENCE\t")
	for _, d := range r.Differences {
		bucket := "-"
		if d.Bucket != nil {
			bucket = d.Bucket.UTC().Format(time.RFC3339)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%+d\t\n", d.Topic, d.Counter, bucket, d.Stream, d.Table, d.Difference)
	}
	tw.Flush() //nolint:errcheck // w's errors are the caller's to see
	if r.Unlisted > 0 {
		fmt.Fprintf(w, "and %d more (--max-listed)\n", r.Unlisted)
	}
}
