package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/hotcount/hotcount/config"
	"github.com/hotcount/hotcount/pipeline/store"
	"github.com/hotcount/hotcount/schema"
)

// cmdTableCreate creates the table (pk string HASH, on-demand) if absent,
// and enables its TTL on the time buckets' expiresAt.
func cmdTableCreate(ctx context.Context, args, environ []string, stdout, stderr io.Writer) error {
	cfg := config.Default()
	fs := cfg.FlagSet("hotcount table create", func(s string) bool {
		return s == "table" || s == "dynamodb-endpoint" || s == "config"
	})
	if err := parse(&cfg, fs, args, environ, stderr); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	client, err := store.NewDynamoDBClient(ctx, cfg.DynamoDBEndpoint)
	if err != nil {
		return err
	}
	created, err := store.CreateTable(ctx, client, cfg.Table)
	if err != nil {
		return err
	}
	if created {
		fmt.Fprintf(stdout, "table %s created (key %s, on-demand)\n", cfg.Table, schema.AttrPK)
	} else {
		fmt.Fprintf(stdout, "table %s exists; left as it is\n", cfg.Table)
	}
	// Without TTL, time buckets are never deleted (readers ignore the
	// expired ones all the same): worth saying, not worth failing for,
	// since local stand-ins such as dynalite lack the call.
	status, err := store.EnableTTL(ctx, client, cfg.Table)
	switch {
	case errors.Is(err, store.ErrNoTTL):
		fmt.Fprintf(stdout, "TTL on %s: not supported by this endpoint (%v); time buckets will not expire here, and reads ignore them once past their retention\n", schema.AttrExpiresAt, err)
	case err != nil:
		return err
	default:
		fmt.Fprintf(stdout, "TTL on %s: %s (time buckets expire after --minute-retention and --hour-retention)\n", schema.AttrExpiresAt, strings.ToLower(status))
	}
	return nil
}
