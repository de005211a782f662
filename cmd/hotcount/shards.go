package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/hotcount/hotcount/config"
	"github.com/hotcount/hotcount/pipeline/shardcount"
	"github.com/hotcount/hotcount/pipeline/store"
	"github.com/hotcount/hotcount/schema"
	"github.com/hotcount/hotcount/sidecar"
)

// cmdShards shows a topic's shards, or sets its shard count:
//
//	hotcount shards show TOPIC...
//	hotcount shards set TOPIC N
func cmdShards(ctx context.Context, args, environ []string, stdout, stderr io.Writer) error {
	if help(args) {
		fmt.Fprint(stdout, shardsUsage)
		return nil
	}
	if len(args) == 0 || (args[0] != "show" && args[0] != "set") {
		return usageError{errors.New(`"shards" takes show TOPIC... or set TOPIC N (hotcount shards --help)`)}
	}
	verb := args[0]
	cfg := config.Default()
	fs := cfg.FlagSet("hotcount shards "+verb, func(s string) bool {
		return s == "table" || s == "dynamodb-endpoint" || s == "store" || s == "data-dir" || s == "config"
	})
	if err := parse(&cfg, fs, args[1:], environ, stderr); err != nil {
		return err
	}
	if !fs.Changed("store") && cfg.Store != config.StoreBolt && devStore(cfg.DataDir) {
		// `hotcount dev` left its store here: a newcomer means that one,
		// not a DynamoDB table they have no credentials for.
		cfg.Store = config.StoreBolt
		fmt.Fprintf(stderr, "hotcount shards: reading the embedded store in %s (hotcount dev's); --store dynamodb reads the table\n", cfg.DataDir)
	}
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	st, err := openShardsStore(ctx, cfg, stderr)
	if err != nil {
		return err
	}
	defer st.Close()
	if verb == "set" {
		return shardsSet(ctx, st, fs.Args(), stdout)
	}
	return shardsShow(ctx, st, fs.Args(), stdout)
}

// openShardsStore opens the store cfg names, with a way out when another
// hotcount holds the embedded one.
func openShardsStore(ctx context.Context, cfg config.Config, stderr io.Writer) (sidecar.Store, error) {
	log, err := newLogger(cfg, stderr)
	if err != nil {
		return nil, err
	}
	st, err := sidecar.OpenStore(ctx, cfg, store.NewMetrics(prometheus.NewRegistry()), log)
	if errors.Is(err, store.ErrLocked) {
		// The usual case: hotcount dev is running on this folder and holds
		// its store. Its API serves the same view.
		return nil, fmt.Errorf("the embedded store in %s is in use by a running hotcount (hotcount dev?): read the shards through its API, curl http://127.0.0.1:8080/v1/topics/TOPIC/shards, or stop it first", cfg.DataDir)
	}
	return st, err
}

// shardsSet sets a topic's shard count: args are TOPIC N.
func shardsSet(ctx context.Context, st sidecar.Store, args []string, stdout io.Writer) error {
	if len(args) != 2 {
		return usageError{errors.New("shards set takes TOPIC N")}
	}
	n, err := strconv.Atoi(args[1])
	if err != nil {
		return usageError{fmt.Errorf("shard count %q is not a number", args[1])}
	}
	before, after, err := shardcount.Set(ctx, st, args[0], n)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "%s: writes on %d shards (was %d), reads %d\n", args[0], after.Write(), before.Write(), after.Read())
	return nil
}

// shardsShow prints each topic's total, shard counts and shards.
func shardsShow(ctx context.Context, st sidecar.Store, topics []string, stdout io.Writer) error {
	if len(topics) == 0 {
		return usageError{errors.New("shards show takes one or more topics")}
	}
	metas, err := st.Metas(ctx, topics)
	if err != nil {
		return err
	}
	for _, topic := range topics {
		m := metas[topic]
		got, err := st.Gather(ctx, topic, m.Read(), true)
		if err != nil {
			return err
		}
		sum, _ := schema.Sum(got)
		recorded := "recorded"
		if !m.Exists() {
			recorded = "no metadata: one shard"
		}
		fmt.Fprintf(stdout, "%s: total %d; writes on %d shards, reads %d (%s)\n", topic, sum, m.Write(), len(got), recorded)
		for _, s := range got {
			id := strconv.Itoa(s.Shard)
			if s.Region != "" {
				id = s.Region + "." + id // a Region's shard (--region)
			}
			fmt.Fprintf(stdout, "  shard %s: %d (updated %s)\n", id, s.Count, updated(s.UpdatedAt))
		}
	}
	return nil
}

const shardsUsage = `Usage:
  hotcount shards show TOPIC... [flags]  a topic's total, shard counts and shards
  hotcount shards set TOPIC N [flags]    set a topic's shard count (reads never shrink)

Without --store, a --data-dir holding hotcount dev's store is read;
otherwise the DynamoDB table. hotcount shards show --help lists the flags.
`

// devStore says whether dir holds an embedded store (hotcount.db).
func devStore(dir string) bool {
	_, err := os.Stat(filepath.Join(dir, store.BoltFile))
	return err == nil
}

// updated prints a shard's updatedAt (Unix milliseconds) as RFC 3339 in UTC,
// or "never" for a shard not yet written.
func updated(ms int64) string {
	if ms == 0 {
		return "never"
	}
	return time.UnixMilli(ms).UTC().Format("2006-01-02T15:04:05.000Z07:00")
}
