package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/hotcount/hotcount/config"
	"github.com/hotcount/hotcount/internal/demo"
)

// cmdDemo races writers against the emulated per-key ceiling (make demo
// starts dynalite for it).
func cmdDemo(ctx context.Context, args, environ []string, stdout, stderr io.Writer) error {
	cfg := config.Default()
	fs := cfg.FlagSet("hotcount demo", func(s string) bool { return s == "dynamodb-endpoint" || s == "config" })
	dc := demo.Config{Table: "hotcount-demo", Shards: []int{1, 2, 4, 8}}
	fs.Float64Var(&dc.Ceiling, "ceiling", 100, "emulated write units per second per key (DynamoDB's is 1000; scaled down so the local API is not the limit)")
	fs.IntVar(&dc.Writers, "writers", 16, "concurrent writers")
	fs.DurationVar(&dc.Duration, "duration", 3*time.Second, "length of each race")
	fs.DurationVar(&dc.FlushInterval, "flush-interval", 100*time.Millisecond, "the coalescing flusher's interval")
	svg := fs.String("svg", "", "also write the chart to this SVG file")
	if err := parse(&cfg, fs, args, environ, stderr); err != nil {
		return err
	}
	if cfg.DynamoDBEndpoint == "" {
		return usageError{fmt.Errorf("demo needs --dynamodb-endpoint (make demo starts dynalite and passes it)")}
	}
	dc.Endpoint = cfg.DynamoDBEndpoint
	fmt.Fprintf(stdout, "one hot topic, %d writers, ceiling %.0f writes/s per key, %s per race\n", dc.Writers, dc.Ceiling, dc.Duration)
	results, err := demo.Run(ctx, dc, stdout)
	if err != nil {
		return err
	}
	if *svg != "" {
		f, err := os.Create(*svg)
		if err != nil {
			return err
		}
		if err := demo.WriteSVG(f, dc, results); err != nil {
			f.Close()
			return err
		}
		if err := f.Close(); err != nil {
			return err
		}
		fmt.Fprintln(stdout, "chart:", *svg)
	}
	return nil
}
