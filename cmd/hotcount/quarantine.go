package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/pflag"

	"github.com/hotcount/hotcount/config"
	"github.com/hotcount/hotcount/durability/durable"
	"github.com/hotcount/hotcount/durability/quarantine"
	"github.com/hotcount/hotcount/pipeline/store"
	"github.com/hotcount/hotcount/sidecar"
)

// quarantineSettings are what `hotcount quarantine` reads: where the
// quarantine is (the mode and engine, NATS or --data-dir), and for replay
// the store.
func quarantineSettings(s string) bool {
	switch s {
	case "nats-mode", "durable-engine", "stream", "partitions", "data-dir", "store", "table", "dynamodb-endpoint":
		return true
	}
	return natsSettings(s)
}

// openQuarantine parses the settings and opens the quarantine they name,
// and the journal a replay consults, on NATS connection nc (all nil in
// core mode); close ends the connection, if any.
func openQuarantine(ctx context.Context, name string, args, environ []string, stderr io.Writer, more func(*pflag.FlagSet)) (cfg config.Config, q quarantine.Store, j quarantine.Journal, nc *nats.Conn, close func(), err error) {
	cfg = config.Default()
	fs := cfg.FlagSet(name, quarantineSettings)
	more(fs)
	if err := parse(&cfg, fs, args, environ, stderr); err != nil {
		return cfg, nil, nil, nil, nil, err
	}
	close = func() {}
	if cfg.Durable() {
		if nc, err = connect(cfg, "hotcount-quarantine"); err != nil {
			return cfg, nil, nil, nil, nil, err
		}
		close = nc.Close
	}
	q, err = sidecar.OpenQuarantine(ctx, cfg, nc)
	if err == nil {
		j, err = sidecar.QuarantineJournal(ctx, cfg, nc)
	}
	if err != nil {
		close()
		return cfg, nil, nil, nil, nil, err
	}
	return cfg, q, j, nc, close, nil
}

// cmdQuarantineList prints the writes held in the quarantine, and why.
// In the durable modes it lists the counters held in the streams'
// checkpoint records first (which the sidecars replay themselves), then
// what the previous release's journal engine left in its quarantine.
func cmdQuarantineList(ctx context.Context, args, environ []string, stdout, stderr io.Writer) error {
	var asJSON bool
	cfg, q, _, nc, done, err := openQuarantine(ctx, "hotcount quarantine list", args, environ, stderr, func(fs *pflag.FlagSet) {
		fs.BoolVar(&asJSON, "json", false, "print the entries as JSON")
	})
	if err != nil {
		return err
	}
	defer done()
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	held, err := heldCounters(ctx, cfg, nc)
	if err != nil {
		return err
	}
	es, err := q.List(ctx)
	if err != nil {
		return err
	}
	if asJSON {
		if es == nil {
			es = []quarantine.Entry{}
		}
		if cfg.Durable() {
			return json.NewEncoder(stdout).Encode(struct {
				Held    []durable.Held     `json:"held"`
				Entries []quarantine.Entry `json:"entries"`
			}{append([]durable.Held{}, held...), es})
		}
		return json.NewEncoder(stdout).Encode(es)
	}
	if len(held) > 0 {
		tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "STREAM\tTOPIC\tCOUNTER\tDELTA\tSEQUENCES\tREFUSED SINCE\tREASON")
		for _, h := range held {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d..%d\t%s\t%s\n", h.Stream, h.Topic, counterKind(h.Counter), h.Delta, h.First, h.Last,
				h.Since.UTC().Format(time.RFC3339), h.Reason)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "%d counters held in the streams' checkpoints; the sidecars write them by position every 10 s once the store takes them\n", len(held))
	}
	if len(es) == 0 {
		if len(held) == 0 {
			fmt.Fprintln(stdout, "the quarantine is empty")
		}
		return nil
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TOPIC\tCOUNTER\tSHARD\tDELTA\tREFUSED SINCE\tQUARANTINED\tREASON")
	var mentions int64
	for _, e := range es {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%s\t%s\t%s\n", e.Topic, counterKind(e.Counter), e.Shard, e.Delta,
			e.Since.UTC().Format(time.RFC3339), e.At.UTC().Format(time.RFC3339), e.Reason)
		if c, ok := store.ParseName(e.Counter); ok && c.CountsMentions() {
			mentions += e.Delta
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "%d writes held, %d mentions in topic totals; `hotcount quarantine replay` writes them once the store takes them\n", len(es), mentions)
	return nil
}

// heldCounters lists the counters the durable engine holds in the
// checkpoints of the settings' streams, through nc (none in core mode).
func heldCounters(ctx context.Context, cfg config.Config, nc *nats.Conn) ([]durable.Held, error) {
	if !cfg.Durable() {
		return nil, nil
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	return durable.HeldIn(ctx, js, "", streamNames(cfg))
}

// counterKind names a counter for people: total, or the bucket and its
// start.
func counterKind(name string) string {
	c, ok := store.ParseName(name)
	if !ok {
		return name
	}
	g, ok := c.Granularity()
	if !ok {
		return "total"
	}
	return g.String() + " from " + g.Start(c.Index).UTC().Format(time.RFC3339)
}

// cmdQuarantineReplay writes the quarantined writes to the store, each
// exactly once, and removes those written.
func cmdQuarantineReplay(ctx context.Context, args, environ []string, stdout, stderr io.Writer) error {
	var asJSON bool
	cfg, q, j, _, done, err := openQuarantine(ctx, "hotcount quarantine replay", args, environ, stderr, func(fs *pflag.FlagSet) {
		fs.BoolVar(&asJSON, "json", false, "print what was written and what is left as JSON")
	})
	if err != nil {
		return err
	}
	defer done()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	st, err := openShardsStore(ctx, cfg, stderr)
	if err != nil {
		return err
	}
	defer st.Close()
	r, err := quarantine.Replay(ctx, q, st, j, store.NewSequencer(time.Now), store.NewWriterID, time.Now)
	if asJSON {
		if jerr := json.NewEncoder(stdout).Encode(r); jerr != nil {
			return jerr
		}
	} else {
		fmt.Fprintf(stdout, "written: %d writes, %d mentions in topic totals\n", len(r.Written), r.Mentions())
		for _, e := range r.Journaled {
			fmt.Fprintf(stdout, "removed: %s %s shard %d delta %d: its journal entry wrote it (its sidecar stopped while handing it over)\n", e.Topic, counterKind(e.Counter), e.Shard, e.Delta)
		}
		for _, f := range r.Left {
			fmt.Fprintf(stdout, "left: %s %s shard %d delta %d: %s\n", f.Topic, counterKind(f.Counter), f.Shard, f.Delta, f.Error)
		}
	}
	if err != nil {
		return err
	}
	if len(r.Left) > 0 {
		return fmt.Errorf("%d writes left in the quarantine: run replay again once the store takes them (a write in doubt is never applied twice)", len(r.Left))
	}
	return nil
}
