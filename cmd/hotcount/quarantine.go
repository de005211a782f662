package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/pflag"

	"github.com/hotcount/hotcount/config"
	"github.com/hotcount/hotcount/durability/durable"
	"github.com/hotcount/hotcount/pipeline/quarantine"
	"github.com/hotcount/hotcount/pipeline/store"
	"github.com/hotcount/hotcount/schema"
	"github.com/hotcount/hotcount/sidecar"
)

// quarantineSettings are what `hotcount quarantine` reads: where the
// quarantine is (the mode, NATS or --data-dir), and for replay the store.
func quarantineSettings(s string) bool {
	switch s {
	case "nats-mode", "stream", "partitions", "data-dir", "store", "table", "dynamodb-endpoint":
		return true
	}
	return natsSettings(s)
}

// openQuarantine parses the settings and opens what holds the refused
// writes they name: in core mode the folder quarantine (q), in the
// durable modes the NATS connection whose streams' checkpoints hold them
// (nc), once durable has said the command applies there; close ends the
// connection, if any.
func openQuarantine(name string, args, environ []string, stderr io.Writer, more func(*pflag.FlagSet), durable func(config.Config) error) (cfg config.Config, q quarantine.Store, nc *nats.Conn, close func(), err error) {
	cfg = config.Default()
	fs := cfg.FlagSet(name, quarantineSettings)
	more(fs)
	if err := parse(&cfg, fs, args, environ, stderr); err != nil {
		return cfg, nil, nil, nil, err
	}
	if cfg.Durable() {
		if err := durable(cfg); err != nil {
			return cfg, nil, nil, nil, err
		}
		if nc, err = connect(cfg, "hotcount-quarantine"); err != nil {
			return cfg, nil, nil, nil, err
		}
		return cfg, nil, nc, nc.Close, nil
	}
	d, err := sidecar.OpenQuarantine(cfg)
	if err != nil {
		return cfg, nil, nil, nil, err
	}
	return cfg, d, nil, func() {}, nil
}

// cmdQuarantineList prints the writes held in the quarantine, and why.
// In the durable modes it lists the counters held in the streams'
// checkpoint records, which the sidecars write themselves.
func cmdQuarantineList(ctx context.Context, args, environ []string, stdout, stderr io.Writer) error {
	var asJSON bool
	cfg, q, nc, done, err := openQuarantine("hotcount quarantine list", args, environ, stderr, func(fs *pflag.FlagSet) {
		fs.BoolVar(&asJSON, "json", false, "print the entries as JSON")
	}, func(config.Config) error { return nil })
	if err != nil {
		return err
	}
	defer done()
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if cfg.Durable() {
		held, err := heldCounters(ctx, cfg, nc)
		if err != nil {
			return err
		}
		return printHeld(stdout, held, asJSON)
	}
	es, err := q.List(ctx)
	if err != nil {
		return err
	}
	if asJSON {
		return json.NewEncoder(stdout).Encode(append([]quarantine.Entry{}, es...))
	}
	if len(es) == 0 {
		fmt.Fprintln(stdout, "the quarantine is empty")
		return nil
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TOPIC\tCOUNTER\tSHARD\tDELTA\tREFUSED SINCE\tQUARANTINED\tREASON")
	var mentions int64
	for _, e := range es {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%s\t%s\t%s\n", e.Topic, counterKind(e.Counter), e.Shard, e.Delta,
			e.Since.UTC().Format(time.RFC3339), e.At.UTC().Format(time.RFC3339), e.Reason)
		if c, ok := schema.ParseName(e.Counter); ok && c.CountsMentions() {
			mentions += e.Delta
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "%d writes held, %d mentions in topic totals; `hotcount quarantine replay` writes them once the store takes them\n", len(es), mentions)
	return nil
}

// printHeld prints the counters the durable engine holds in the streams'
// checkpoints.
func printHeld(stdout io.Writer, held []durable.Held, asJSON bool) error {
	if asJSON {
		return json.NewEncoder(stdout).Encode(struct {
			Held []durable.Held `json:"held"`
		}{append([]durable.Held{}, held...)})
	}
	if len(held) == 0 {
		fmt.Fprintln(stdout, "the quarantine is empty")
		return nil
	}
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
	return nil
}

// heldCounters lists the counters the durable engine holds in the
// checkpoints of the settings' streams, through nc.
func heldCounters(ctx context.Context, cfg config.Config, nc *nats.Conn) ([]durable.Held, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	return durable.HeldIn(ctx, js, "", streamNames(cfg))
}

// counterKind names a counter for people: total, or the bucket and its
// start.
func counterKind(name string) string {
	c, ok := schema.ParseName(name)
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
	cfg, q, _, done, err := openQuarantine("hotcount quarantine replay", args, environ, stderr, func(fs *pflag.FlagSet) {
		fs.BoolVar(&asJSON, "json", false, "print what was written and what is left as JSON")
	}, func(config.Config) error {
		// A replay from here would race the readers that own the
		// streams' positions; they write what they hold themselves.
		return usageError{errors.New("the durable modes hold refused counters in the streams' checkpoints, and the sidecars write them by position once the store takes them: `hotcount quarantine list` shows them; there is nothing to replay by hand")}
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
	r, err := quarantine.Replay(ctx, q, st, store.NewSequencer(time.Now), store.NewWriterID, time.Now)
	if asJSON {
		if jerr := json.NewEncoder(stdout).Encode(r); jerr != nil {
			return jerr
		}
	} else {
		fmt.Fprintf(stdout, "written: %d writes, %d mentions in topic totals\n", len(r.Written), r.Mentions())
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
