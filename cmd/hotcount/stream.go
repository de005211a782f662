package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/pflag"

	"github.com/hotcount/hotcount/config"
	"github.com/hotcount/hotcount/durability/durable"
	"github.com/hotcount/hotcount/durability/rules"
	"github.com/hotcount/hotcount/durability/streams"
	"github.com/hotcount/hotcount/internal/natsauth"
	"github.com/hotcount/hotcount/mention"
	"github.com/hotcount/hotcount/pipeline/ingest"
)

// natsSettings are the settings a command needs to reach NATS.
func natsSettings(s string) bool {
	switch s {
	case "nats-url", "nats-creds", "nats-nkey", "nats-token", "nats-tls-ca", "nats-tls-cert", "nats-tls-key", "subject", "config":
		return true
	}
	return false
}

// connect opens a plain NATS connection with cfg's authentication and the
// extra options.
func connect(cfg config.Config, name string, extra ...nats.Option) (*nats.Conn, error) {
	opts, err := cfg.NATSAuth().Options()
	if err != nil {
		return nil, err
	}
	nc, err := nats.Connect(cfg.NATSURL, append(append(opts, nats.Name(name)), extra...)...)
	if err != nil {
		return nil, natsauth.RedactErr(fmt.Errorf("connect %s: %w", cfg.NATSURL, err), cfg.NATSURL)
	}
	return nc, nil
}

// streamFlags are the stream limits `stream create` takes besides the
// settings.
type streamFlags struct {
	replicas int
	dup      time.Duration
	maxAge   time.Duration
	maxBytes int64
}

// cmdStreamCreate creates the stream of mentions if absent, laid out for
// the mode the settings give (the same settings as run's): one stream for
// core and jetstream modes, the partition streams for partitioned mode,
// whose routing it then probes and whose leaders it spreads.
func cmdStreamCreate(ctx context.Context, args, environ []string, stdout, stderr io.Writer) error {
	cfg := config.Default()
	fs := cfg.FlagSet("hotcount stream create", func(s string) bool {
		return natsSettings(s) || s == "stream" || s == "nats-mode" || s == "partitions"
	})
	var f streamFlags
	fs.IntVar(&f.replicas, "replicas", 1, "each stream's replicas in a NATS cluster: 3 keeps every stored mention through the loss of a node")
	fs.DurationVar(&f.dup, "duplicate-window", mention.DefaultDuplicateWindow, "window in which a repeated Nats-Msg-Id is dropped by the stream")
	fs.DurationVar(&f.maxAge, "max-age", ingest.DefaultStreamMaxAge, "how long the stream keeps a mention (counted or not)")
	fs.Int64Var(&f.maxBytes, "max-bytes", ingest.DefaultStreamMaxBytes, "the storage bound in bytes (partitioned mode: of all the partition streams, each an equal share); full, a stream refuses new publishes rather than drop stored mentions")
	if err := parse(&cfg, fs, args, environ, stderr); err != nil {
		return err
	}
	// --partitions N on the command line means partitioned mode, as it
	// did before the mode was a setting here (--partitions 0: not
	// partitioned, as then); the mode the settings give otherwise rules,
	// as it does for run.
	if n, mode := typed(args); n > 0 && cfg.NATSMode != config.ModePartitioned {
		if mode != "" {
			return usageError{fmt.Errorf("--partitions %d is for --nats-mode partitioned, not %s", n, mode)}
		}
		cfg.NATSMode, cfg.Partitions = config.ModePartitioned, n
	}
	if cfg.NATSMode == config.ModePartitioned && (cfg.Partitions < 1 || cfg.Partitions > 1024) {
		return usageError{fmt.Errorf("--partitions is 1..1024 (got %d)", cfg.Partitions)}
	}
	if f.maxAge <= 0 || f.maxBytes <= 0 {
		return usageError{fmt.Errorf("--max-age and --max-bytes must be positive (got %s, %d)", f.maxAge, f.maxBytes)}
	}
	if f.replicas < 1 || f.replicas > 5 {
		return usageError{fmt.Errorf("--replicas is 1..5 (got %d)", f.replicas)}
	}
	nc, err := connect(cfg, "hotcount-stream-create")
	if err != nil {
		return err
	}
	defer nc.Close()
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if cfg.NATSMode == config.ModePartitioned {
		return createPartitioned(ctx, nc, cfg, f, stdout)
	}
	created, err := ingest.EnsureStream(ctx, nc, cfg.Stream, cfg.Subject, f.dup, ingest.StreamOptions{MaxAge: f.maxAge, MaxBytes: f.maxBytes, Replicas: f.replicas})
	if err != nil {
		return err
	}
	if created {
		fmt.Fprintf(stdout, "stream %s created (subjects %s, file storage, %d replica(s), duplicate window %s, max age %s, max bytes %d, new publishes refused when full)\n", cfg.Stream, cfg.Subject, f.replicas, f.dup, f.maxAge, f.maxBytes)
	} else {
		fmt.Fprintf(stdout, "stream %s exists; left as it is\n", cfg.Stream)
	}
	return nil
}

// typed is what the command line itself says (not the environment or the
// --config file) of --partitions (0: not typed) and --nats-mode ("").
func typed(args []string) (partitions int, mode string) {
	fs := pflag.NewFlagSet("", pflag.ContinueOnError)
	fs.ParseErrorsAllowlist.UnknownFlags = true
	fs.SetOutput(io.Discard)
	p := fs.Int("partitions", 0, "")
	m := fs.String("nats-mode", "", "")
	if fs.Parse(args) != nil {
		return 0, ""
	}
	return *p, *m
}

// createPartitioned creates the partition streams, checks that the server
// routes producers' subjects into them, and spreads their leaders.
func createPartitioned(ctx context.Context, nc *nats.Conn, cfg config.Config, f streamFlags, stdout io.Writer) error {
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	l := layoutOf(cfg)
	created, err := streams.Ensure(ctx, js, l, streams.Options{MaxAge: f.maxAge, MaxBytes: f.maxBytes, Duplicates: f.dup, Replicas: f.replicas})
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "partition streams %s..%s: %d created (subjects <partition>.%s, file storage, %d replica(s), duplicate window %s, max age %s, max bytes %d each), %d there already and left as they are\n",
		l.Name(0), l.Name(l.Partitions-1), created, cfg.Subject, f.replicas, f.dup, f.maxAge, (f.maxBytes+int64(l.Partitions)-1)/int64(l.Partitions), l.Partitions-created)
	if legacy, err := streams.Legacy(ctx, js, l); err == nil && legacy != "" {
		fmt.Fprintf(stdout, "note: stream %s is the previous release's partitioned layout (%s); see deploy/README.md, \"Moving to partition streams\"\n", l.Stream, legacy)
	}
	probed, err := streams.Probe(ctx, js, l)
	if err != nil {
		return err
	}
	if err := checkpointProbes(ctx, js, l, probed); err != nil {
		return err
	}
	from, to := l.Mapping()
	fmt.Fprintf(stdout, "routing checked: the server maps %s to %s, and each probe landed in its partition's stream\n", from, to)
	// The streams are there and routed: a spread that fails (a stream
	// between leaders) is a warning, and running stream create again
	// spreads them again.
	leaders, err := streams.Spread(ctx, nc, js, l, 10*time.Second)
	if err != nil {
		fmt.Fprintf(stdout, "warning: leaders not spread (%v); run stream create again to spread them\n", err)
	}
	fmt.Fprintf(stdout, "leaders: %s\nrun the sidecars with --nats-mode partitioned --partitions %d\n", formatLeaders(leaders), l.Partitions)
	return nil
}

// checkpointProbes checkpoints each partition stream whose front is only
// the probes just deleted at the last of them: the position engine, which
// counts a stream's front that is gone before it was read as mentions
// lost to retention, then knows that nothing was lost there.
func checkpointProbes(ctx context.Context, js jetstream.JetStream, l streams.Layout, probed streams.Probed) error {
	for p := range l.Partitions {
		name := l.Name(p)
		front := probed.Front(name)
		if front == 0 {
			continue
		}
		st, err := js.Stream(ctx, name)
		if err != nil {
			return err
		}
		if st.CachedInfo().State.FirstSeq != front+1 {
			continue // a mention came first, or a probe is still there: nothing to say
		}
		if err := durable.Advance(ctx, js, name, "", front); err != nil {
			return err
		}
	}
	return nil
}

// streamNames are the durable streams the settings name: the partition
// streams in partitioned mode, else the one stream.
func streamNames(cfg config.Config) []string {
	if cfg.NATSMode != config.ModePartitioned {
		return []string{cfg.Stream}
	}
	return layoutOf(cfg).Names()
}

// layoutOf is the partition streams' layout the settings give.
func layoutOf(cfg config.Config) streams.Layout {
	return streams.Layout{Stream: cfg.Stream, Subject: cfg.Subject, Partitions: cfg.Partitions}
}

// formatLeaders prints leaders per server, sorted by server: "n0 3, n1 3".
func formatLeaders(leaders map[string]int) string {
	if len(leaders) == 0 {
		return "none"
	}
	var parts []string
	for _, s := range slices.Sorted(maps.Keys(leaders)) {
		parts = append(parts, fmt.Sprintf("%s %d", s, leaders[s]))
	}
	return strings.Join(parts, ", ")
}

// cmdStreamStatus shows where the streams live (the partition streams,
// or jetstream mode's one stream) and how far the sidecars have written
// each: one line per stream, then the leaders per server.
func cmdStreamStatus(ctx context.Context, args, environ []string, stdout, stderr io.Writer) error {
	cfg := config.Default()
	cfg.NATSMode = config.ModePartitioned
	fs := cfg.FlagSet("hotcount stream status", func(s string) bool {
		return natsSettings(s) || s == "stream" || s == "nats-mode" || s == "partitions"
	})
	asJSON := fs.Bool("json", false, "print the partitions as JSON")
	if err := parse(&cfg, fs, args, environ, stderr); err != nil {
		return err
	}
	nc, err := connect(cfg, "hotcount-stream-status")
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if !cfg.Durable() {
		return usageError{fmt.Errorf("--nats-mode %s reads no stream: jetstream or partitioned", cfg.NATSMode)}
	}
	ps, err := streams.Status(ctx, js, streamNames(cfg))
	if err != nil {
		return err
	}
	parts, err := withCheckpoints(ctx, js, ps)
	if err != nil {
		return err
	}
	for i := range parts {
		if parts[i].Missing {
			continue
		}
		h, err := durable.ReadRules(ctx, js, "", parts[i].Stream)
		if err != nil {
			return err
		}
		if c, ok := h.Latest(); ok {
			parts[i].Rules, parts[i].RuleChanges = &c, len(h)
		}
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(parts)
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "PARTITION\tSTREAM\tLEADER\tREPLICAS\tMESSAGES\tBYTES\tCHECKPOINT\tUNWRITTEN\tOLDEST UNWRITTEN\tHELD")
	missing := 0
	for _, p := range parts {
		if p.Missing {
			missing++
			fmt.Fprintf(tw, "%d\t%s\t(missing)\t\t\t\t\t\t\t\n", p.P, p.Stream)
			continue
		}
		replicas := strings.Join(p.Replicas, ",")
		if len(p.Behind) > 0 {
			replicas += " (behind: " + strings.Join(p.Behind, ",") + ")"
		}
		checkpoint, oldest := "none", "-"
		if p.Checkpoint != nil {
			checkpoint = strconv.FormatUint(p.Checkpoint.Seq, 10)
		}
		if p.OldestUnwritten > 0 {
			oldest = p.OldestUnwritten.Round(time.Second).String()
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%d\t%d\t%s\t%d\t%s\t%d\n", p.P, p.Stream, p.Leader, replicas, p.Msgs, p.Bytes,
			checkpoint, p.Unwritten, oldest, p.Held())
	}
	tw.Flush()
	fmt.Fprintf(stdout, "leaders: %s\n", formatLeaders(streams.Leaders(ps)))
	printRules(stdout, parts)
	if missing > 0 {
		if cfg.NATSMode == config.ModeJetStream {
			return fmt.Errorf("stream %s missing: run `hotcount stream create --nats-mode jetstream`", cfg.Stream)
		}
		return fmt.Errorf("%d of %d partition streams missing: run `hotcount stream create --nats-mode partitioned --partitions %d`", missing, len(ps), cfg.Partitions)
	}
	return nil
}

// partitionStatus is a partition stream's status with its position
// engine checkpoint: the messages past it (not yet in the store, or
// written and not yet checkpointed), and how old the first of them is,
// which the stream's max age must stay well above.
type partitionStatus struct {
	streams.Partition
	Checkpoint      *durable.Checkpoint `json:"checkpoint,omitempty"` // nil: none in the stream's epoch
	Unwritten       uint64              `json:"unwritten"`
	OldestUnwritten time.Duration       `json:"oldest_unwritten_ns"`
	// Rules is the last change of the stream's rules (nil: none
	// recorded yet), one of RuleChanges.
	Rules       *rules.Change `json:"rules,omitempty"`
	RuleChanges int           `json:"rule_changes"`
}

// printRules prints the rules in force: once when every stream has the
// same, else per stream.
func printRules(w io.Writer, parts []partitionStatus) {
	seen := make(map[string][]string)
	var order []string
	for _, p := range parts {
		d := "none recorded yet (the first sidecar to read the stream records its settings)"
		if p.Rules != nil {
			d = describe(p.Rules.Rules) + fmt.Sprintf(" (set %s by %s: %s; %d changes)", p.Rules.At.Format(time.RFC3339), p.Rules.By, p.Rules.Why, p.RuleChanges)
		}
		if seen[d] == nil {
			order = append(order, d)
		}
		seen[d] = append(seen[d], p.Stream)
	}
	for _, d := range order {
		if len(order) == 1 {
			fmt.Fprintf(w, "rules: %s\n", d)
		} else {
			fmt.Fprintf(w, "rules of %s: %s\n", strings.Join(seen[d], ","), d)
		}
	}
	fmt.Fprintln(w, "history: hotcount stream rules show")
}

// Held is the counters held in the checkpoint record.
func (p partitionStatus) Held() int {
	if p.Checkpoint == nil {
		return 0
	}
	return p.Checkpoint.Held
}

// withCheckpoints adds each partition's checkpoint record to ps.
func withCheckpoints(ctx context.Context, js jetstream.JetStream, ps []streams.Partition) ([]partitionStatus, error) {
	names := make([]string, len(ps))
	for i, p := range ps {
		names[i] = p.Stream
	}
	cps, err := durable.CheckpointsOf(ctx, js, "", names)
	if err != nil {
		return nil, err
	}
	out := make([]partitionStatus, len(ps))
	for i, p := range ps {
		out[i].Partition = p
		if p.Missing {
			continue
		}
		from := p.FirstSeq
		if cp, ok := cps[p.Stream]; ok && cp.Epoch == p.Epoch {
			out[i].Checkpoint = &cp
			from = max(from, cp.Seq+1)
		}
		if p.LastSeq < from || p.Msgs == 0 {
			continue
		}
		out[i].Unwritten = p.LastSeq - from + 1
		st, err := js.Stream(ctx, p.Stream)
		if err != nil {
			return nil, err
		}
		if m, err := st.GetMsg(ctx, from); err == nil {
			out[i].OldestUnwritten = time.Since(m.Time)
		}
	}
	return out, nil
}
