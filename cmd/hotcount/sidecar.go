package main

import (
	"context"
	"io"

	"github.com/hotcount/hotcount/config"
	"github.com/hotcount/hotcount/sidecar"
)

// runSidecar builds the logger and runs the sidecar until ctx ends.
func runSidecar(ctx context.Context, cfg config.Config, stderr io.Writer) error {
	log, err := newLogger(cfg, stderr)
	if err != nil {
		return err
	}
	defer log.Sync() //nolint:errcheck // stderr may not support sync
	return sidecar.New(cfg, log).Run(ctx)
}
