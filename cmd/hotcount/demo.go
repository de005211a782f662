package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/hotcount/hotcount/config"
	"github.com/hotcount/hotcount/tools/demo"
)

// cmdDemo races writers against the emulated per-key ceiling, in front of
// a local DynamoDB API: the dynalite it starts (--dynalite, as make demo
// does) or one already running (--dynamodb-endpoint).
func cmdDemo(ctx context.Context, args, environ []string, stdout, stderr io.Writer) error {
	cfg := config.Default()
	fs := cfg.FlagSet("hotcount demo", func(s string) bool { return s == "dynamodb-endpoint" || s == "config" })
	dc := demo.Config{Table: "hotcount-demo", Shards: []int{1, 2, 4, 8}}
	dynalite := fs.String("dynalite", "", "start this dynalite (test/dynalite/serve.js, which make deps readies) on a free port and race against it, instead of --dynamodb-endpoint")
	fs.Float64Var(&dc.Ceiling, "ceiling", 100, "emulated write units per second per key (DynamoDB's is 1000; scaled down so the local API is not the limit)")
	fs.IntVar(&dc.Writers, "writers", 16, "concurrent writers")
	fs.DurationVar(&dc.Duration, "duration", 3*time.Second, "length of each race")
	fs.DurationVar(&dc.FlushInterval, "flush-interval", 100*time.Millisecond, "the coalescing flusher's interval")
	svg := fs.String("svg", "", "also write the chart to this SVG file (its folder is created if need be)")
	if err := parse(&cfg, fs, args, environ, stderr); err != nil {
		return err
	}
	switch {
	case *dynalite != "" && cfg.DynamoDBEndpoint != "":
		return usageError{errors.New("demo takes --dynalite or --dynamodb-endpoint, not both")}
	case *dynalite != "":
		endpoint, stop, err := demo.StartDynalite(ctx, *dynalite, stderr)
		if err != nil {
			return err
		}
		defer stop()
		dc.Endpoint = endpoint
	case cfg.DynamoDBEndpoint != "":
		dc.Endpoint = cfg.DynamoDBEndpoint
	default:
		return usageError{errors.New("demo needs --dynalite (make demo passes test/dynalite's) or --dynamodb-endpoint")}
	}
	fmt.Fprintf(stdout, "one hot topic, %d writers, ceiling %.0f writes/s per key, %s per race\n", dc.Writers, dc.Ceiling, dc.Duration)
	results, err := demo.Run(ctx, dc, stdout)
	if err != nil {
		return err
	}
	if *svg != "" {
		if err := writeChart(*svg, dc, results); err != nil {
			return err
		}
		fmt.Fprintln(stdout, "chart:", *svg)
	}
	return nil
}

// writeChart writes the demo's chart to path, creating its folder.
func writeChart(path string, dc demo.Config, results []demo.Result) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := demo.WriteSVG(f, dc, results); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
