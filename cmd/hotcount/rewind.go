package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/hotcount/hotcount/config"
	"github.com/hotcount/hotcount/durability/durable"
)

// cmdStreamRewind moves the durable readers back: every stream of the mode
// (or --stream-name), to the first message at or after --to, or to the
// first it holds (--to-start), for the table the streams' rules name (or
// --table). It says first what the streams no longer hold and what
// becomes of held counters; --dry-run stops there.
func cmdStreamRewind(ctx context.Context, args, environ []string, stdout, stderr io.Writer) error {
	cfg := config.Default()
	cfg.NATSMode = config.ModePartitioned
	fs := rulesFlags(&cfg, "hotcount stream rewind", func(string) bool { return false })
	to := fs.String("to", "", "read again from the first message at or after this time: RFC 3339, or a duration back from now (2h)")
	toStart := fs.Bool("to-start", false, "read again from the first message each stream holds")
	only := fs.String("stream-name", "", "rewind this stream only (default: every stream of the mode)")
	table := fs.String("table", "", "the table the readers fill (default: the table the streams' rules name)")
	dryRun := fs.Bool("dry-run", false, "say what would be read again and lost, and change nothing")
	if err := parse(&cfg, fs, args, environ, stderr); err != nil {
		return err
	}
	if (*to == "") == !*toStart {
		return usageError{errors.New("give one of --to TIME and --to-start")}
	}
	var since time.Time
	if *to != "" {
		var err error
		if since, err = when("--to", *to, time.Now()); err != nil {
			return usageError{err}
		}
	}
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	js, _, done, err := openRules(ctx, cfg, "hotcount-stream-rewind")
	if err != nil {
		return err
	}
	defer done()
	names := streamNames(cfg)
	if *only != "" {
		names = []string{*only}
	}
	for _, name := range names {
		st, err := js.Stream(ctx, name)
		if err != nil {
			return fmt.Errorf("stream %s: %w", name, err)
		}
		state := st.CachedInfo().State
		seq := state.FirstSeq
		if !*toStart {
			if seq, err = firstAt(ctx, st, since, state); err != nil {
				return err
			}
		}
		target := *table
		if !typedFlags(args, []string{"table"})["table"] {
			h, err := durable.ReadRules(ctx, js, "", name)
			if err != nil {
				return err
			}
			target = cfg.Table
			if c, ok := h.Latest(); ok {
				target = c.Rules.Table
			}
		}
		if state.FirstSeq > 1 && (*toStart || since.Before(state.FirstTime)) {
			fmt.Fprintf(stdout, "%s: no longer holds sequences 1..%d (its limits dropped them): what they held is not read again; the first it holds is from %s\n",
				name, state.FirstSeq-1, state.FirstTime.UTC().Format(time.RFC3339))
		}
		r, err := durable.Rewind(ctx, js, "", name, seq, target, *dryRun)
		if err != nil {
			return err
		}
		verb := "rewound"
		if *dryRun {
			verb = "would rewind"
		}
		fmt.Fprintf(stdout, "%s: %s from checkpoint %d to read again from sequence %d (%d messages), into table %s, generation %d",
			name, verb, r.From, r.To, state.LastSeq+1-min(r.To, state.LastSeq+1), r.Table, r.Gen)
		if r.Kept+r.Dropped > 0 {
			fmt.Fprintf(stdout, "; held counters: %d kept (all before it), %d read again (and held again if the store still refuses them)", r.Kept, r.Dropped)
		}
		fmt.Fprintln(stdout)
	}
	return nil
}

// firstAt is the sequence of st's first message at or after t: one past
// the last when none is.
func firstAt(ctx context.Context, st jetstream.Stream, t time.Time, state jetstream.StreamState) (uint64, error) {
	if !t.After(state.FirstTime) {
		return state.FirstSeq, nil
	}
	if t.After(state.LastTime) {
		return state.LastSeq + 1, nil
	}
	cons, err := st.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{DeliverPolicy: jetstream.DeliverByStartTimePolicy, OptStartTime: &t})
	if err != nil {
		return 0, err
	}
	msg, err := cons.Next(jetstream.FetchMaxWait(5 * time.Second))
	if err != nil {
		return 0, fmt.Errorf("stream %s: the first message at %s: %w", st.CachedInfo().Config.Name, t.Format(time.RFC3339), err)
	}
	md, err := msg.Metadata()
	if err != nil {
		return 0, err
	}
	return md.Sequence.Stream, nil
}
