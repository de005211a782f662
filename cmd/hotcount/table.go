package main

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/hotcount/hotcount/config"
	"github.com/hotcount/hotcount/store"
)

// cmdTableCreate creates the table (pk string HASH, on-demand) if absent.
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
		fmt.Fprintf(stdout, "table %s created (key %s, on-demand)\n", cfg.Table, store.AttrPK)
	} else {
		fmt.Fprintf(stdout, "table %s exists; left as it is\n", cfg.Table)
	}
	return nil
}
