package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/hotcount/hotcount/client"
	"github.com/hotcount/hotcount/config"
	"github.com/hotcount/hotcount/pipeline/trend"
)

// cmdTop prints the fleet's trending topics as a sidecar's lookup API
// (--http) ranks them, once or, with --watch, refreshed in place.
func cmdTop(ctx context.Context, args, environ []string, stdout, stderr io.Writer) error {
	cfg := config.Default()
	// top is a client of --http, not its listener: the rule against serving
	// beyond loopback without a token is not for it.
	cfg.HTTPPublic = true
	fs := cfg.FlagSet("hotcount top", func(s string) bool {
		return s == "http" || s == "http-token-file" || s == "config"
	})
	if f := fs.Lookup("http"); f != nil {
		f.Usage = "the sidecar's lookup API to ask (its --http)" + f.Usage[strings.LastIndex(f.Usage, " ($"):]
	}
	window := fs.String("window", "15m", "the recent window: whole minutes, up to 1h (1m, 5m, 15m, 1h)")
	limit := fs.Int("limit", 20, "topics to show, 1..100")
	watch := fs.Bool("watch", false, "refresh the list every --every until interrupted")
	every := fs.Duration("every", 2*time.Second, "with --watch, how often to refresh")
	if err := parse(&cfg, fs, args, environ, stderr); err != nil {
		return err
	}
	if *every < 100*time.Millisecond {
		return usageError{fmt.Errorf("--every %s is under 100ms", *every)}
	}
	opts := []client.ReaderOption{}
	if cfg.HTTPTokenFile != "" {
		token, err := config.ReadToken(cfg.HTTPTokenFile)
		if err != nil {
			return fmt.Errorf("--http-token-file: %w", err)
		}
		opts = append(opts, client.WithToken(token))
	}
	r, err := client.NewReader("http://"+cfg.HTTPAddr, opts...)
	if err != nil {
		return err
	}
	for {
		qctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		t, err := r.Trending(qctx, *window, *limit)
		cancel()
		if err != nil && !*watch {
			return err
		}
		if *watch {
			fmt.Fprint(stdout, "\x1b[H\x1b[2J") // home, clear: refreshed in place
		}
		if err != nil {
			fmt.Fprintf(stdout, "hotcount top: %v (retrying every %s)\n", err, *every)
		} else {
			printTrending(stdout, t, cfg.HTTPAddr)
		}
		if !*watch {
			return nil
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(*every):
		}
	}
}

// printTrending writes the list as a table.
func printTrending(w io.Writer, t trend.Trending, from string) {
	fmt.Fprintf(w, "trending over the last %s (%s to %s UTC), from %s\n\n", t.Window, t.From.UTC().Format("15:04:05"), t.To.UTC().Format("15:04:05"), from)
	if len(t.Topics) == 0 {
		if t.Note != "" {
			fmt.Fprintln(w, "nothing to rank:", t.Note)
		} else {
			fmt.Fprintln(w, "nothing is trending: no topic stands above its baseline")
		}
		return
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "#\tTOPIC\tCOUNT\tCONTRIBUTORS\tBASELINE\tSCORE\t")
	for i, e := range t.Topics {
		fmt.Fprintf(tw, "%d\t%s\t%d\t%d\t%.1f\t%.1f\t\n", i+1, e.Topic, e.Count, e.Contributors, e.Baseline, e.Score)
	}
	tw.Flush() //nolint:errcheck // w's errors are the caller's to see
	fmt.Fprintln(w, "\nscore: (recent - baseline) / sqrt(baseline + 1), recent the count, or with --trending-by contributors the contributors per minute;")
	fmt.Fprintln(w, "baseline: what the windows before expect at the topic's rate; contributors: distinct, estimated, of the mentions that name one")
}
