package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/hotcount/hotcount/config"
	"github.com/hotcount/hotcount/shards"
	"github.com/hotcount/hotcount/sidecar"
	"github.com/hotcount/hotcount/store"
)

// cmdShards shows a topic's shards, or sets its shard count:
//
//	hotcount shards show TOPIC...
//	hotcount shards set TOPIC N
func cmdShards(ctx context.Context, args, environ []string, stdout, stderr io.Writer) error {
	if len(args) == 0 || (args[0] != "show" && args[0] != "set") {
		return usageError{errors.New(`"shards" takes show TOPIC... or set TOPIC N`)}
	}
	verb := args[0]
	cfg := config.Default()
	fs := cfg.FlagSet("hotcount shards "+verb, func(s string) bool {
		return s == "table" || s == "dynamodb-endpoint" || s == "store" || s == "data-dir" || s == "config"
	})
	if err := parse(&cfg, fs, args[1:], environ, stderr); err != nil {
		return err
	}
	rest := fs.Args()
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	st, err := sidecar.OpenStore(ctx, cfg, store.NewMetrics(prometheus.NewRegistry()))
	if err != nil {
		return err
	}
	defer st.Close()

	if verb == "set" {
		if len(rest) != 2 {
			return usageError{errors.New("shards set takes TOPIC N")}
		}
		n, err := strconv.Atoi(rest[1])
		if err != nil {
			return usageError{fmt.Errorf("shard count %q is not a number", rest[1])}
		}
		before, after, err := shards.Set(ctx, st, rest[0], n)
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "%s: writes on %d shards (was %d), reads %d\n", rest[0], after.Write(), before.Write(), after.Read())
		return nil
	}
	if len(rest) == 0 {
		return usageError{errors.New("shards show takes one or more topics")}
	}
	metas, err := st.Metas(ctx, rest)
	if err != nil {
		return err
	}
	for _, topic := range rest {
		m := metas[topic]
		got, err := st.Gather(ctx, topic, m.Read(), true)
		if err != nil {
			return err
		}
		sum, _ := store.Sum(got)
		recorded := "recorded"
		if !m.Exists() {
			recorded = "no metadata: one shard"
		}
		fmt.Fprintf(stdout, "%s: total %d; writes on %d shards, reads %d (%s)\n", topic, sum, m.Write(), len(got), recorded)
		for _, s := range got {
			fmt.Fprintf(stdout, "  shard %d: %d (updated %d)\n", s.Shard, s.Count, s.UpdatedAt)
		}
	}
	return nil
}
