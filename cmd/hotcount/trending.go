package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/hotcount/hotcount/config"
	"github.com/hotcount/hotcount/pipeline/moderation"
	"github.com/hotcount/hotcount/schema"
	"github.com/hotcount/hotcount/sidecar"
)

const trendingUsage = `Usage:
  hotcount trending hide TOPIC [flags]    take TOPIC off the trending list, fleet-wide (still counted)
  hotcount trending unhide TOPIC [flags]  let a hidden TOPIC trend again
  hotcount trending allow TOPIC [flags]   with --trending-review: let TOPIC trend (also unhides it)
  hotcount trending list [flags]          the hidden and allowed topics, and those waiting for review

The decisions are kept in the JetStream key-value bucket --trending-bucket
on --nats-url; every sidecar applies each at its next answer and logs it.
hide, unhide and allow take --by (default $USER) and --reason, for the
audit; list takes --json. A TOPIC that starts with - follows --:
hotcount trending hide -- -topic. hotcount trending hide --help lists the
flags.
`

// trendingSettings are what `hotcount trending` reads: NATS, the bucket,
// what decides its replicas when it creates it, and the longest topic.
func trendingSettings(s string) bool {
	switch s {
	case "trending-bucket", "nats-mode", "stream", "partitions", "max-topic-bytes":
		return true
	}
	return natsSettings(s)
}

// cmdTrending moderates the fleet's trending list:
//
//	hotcount trending hide TOPIC [--reason R] [--by NAME]
//	hotcount trending unhide TOPIC
//	hotcount trending allow TOPIC
//	hotcount trending list [--json]
func cmdTrending(ctx context.Context, args, environ []string, stdout, stderr io.Writer) error {
	if help(args) {
		fmt.Fprint(stdout, trendingUsage)
		return nil
	}
	cfg, call, err := parseTrending(args, environ, stderr)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	nc, err := connect(cfg, "hotcount-trending")
	if err != nil {
		return err
	}
	defer nc.Close()
	b, err := sidecar.OpenModeration(ctx, cfg, nc)
	if errors.Is(err, moderation.ErrUnavailable) {
		return fmt.Errorf("%w; the sidecars on this server list every topic", err)
	}
	if err != nil {
		return err
	}
	return call.run(ctx, b, stdout)
}

// trendingCall is one `hotcount trending` command as its line says it.
type trendingCall struct {
	verb, topic, by, reason string
	asJSON                  bool
}

// parseTrending reads a `hotcount trending` command line: its settings
// and the call, or a usage error before any connection.
func parseTrending(args, environ []string, stderr io.Writer) (config.Config, trendingCall, error) {
	verbs := []string{"hide", "unhide", "allow", "list"}
	if len(args) == 0 || !slices.Contains(verbs, args[0]) {
		return config.Config{}, trendingCall{}, usageError{fmt.Errorf(`"trending" takes a subcommand: %s (hotcount trending --help)`, strings.Join(verbs, ", "))}
	}
	c := trendingCall{verb: args[0]}
	cfg := config.Default()
	fs := cfg.FlagSet("hotcount trending "+c.verb, trendingSettings)
	if c.verb == "list" {
		fs.BoolVar(&c.asJSON, "json", false, "print the decisions and the waiting topics as JSON")
	} else {
		fs.StringVar(&c.by, "by", "", "who decides, for the audit (default $USER)")
		fs.StringVar(&c.reason, "reason", "", "why, for the audit")
	}
	if err := parse(&cfg, fs, args[1:], environ, stderr); err != nil {
		return cfg, c, err
	}
	switch rest := fs.Args(); {
	case c.verb == "list" && len(rest) > 0:
		return cfg, c, usageError{fmt.Errorf("trending list takes no topic (got %q)", rest)}
	case c.verb == "list":
	case len(rest) != 1:
		return cfg, c, usageError{fmt.Errorf("trending %s takes one TOPIC (got %d arguments; quote a topic with spaces)", c.verb, len(rest))}
	default:
		c.topic = rest[0]
		if err := schema.ValidateTopic(c.topic, cfg.MaxTopicBytes); err != nil {
			return cfg, c, usageError{fmt.Errorf("trending %s %q: %w", c.verb, c.topic, err)}
		}
		if c.by == "" {
			c.by = envValue(environ, "USER")
		}
		if c.by == "" {
			return cfg, c, usageError{errors.New("--by: say who decides, for the audit ($USER is not set)")}
		}
	}
	return cfg, c, nil
}

// run makes the call's change in b, or lists b, and says what it did.
func (c trendingCall) run(ctx context.Context, b *moderation.Bucket, stdout io.Writer) error {
	now := time.Now()
	switch c.verb {
	case "hide":
		d, err := b.Hide(ctx, c.topic, c.by, c.reason, now)
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "hidden %q from the trending list, fleet-wide (%s): every sidecar leaves it out of its next answer; its mentions are still counted\n", c.topic, decided(d))
	case "allow":
		d, err := b.Allow(ctx, c.topic, c.by, c.reason, now)
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "allowed %q onto the trending list, fleet-wide (%s): sidecars with --trending-review list it from their next answer while it trends; it is no longer hidden or waiting\n", c.topic, decided(d))
	case "unhide":
		was, changed, err := b.Unhide(ctx, c.topic, c.by, c.reason, now)
		if err != nil {
			return err
		}
		if !changed {
			state := "not moderated"
			if was.State != "" {
				state = string(was.State)
			}
			fmt.Fprintf(stdout, "%q is not hidden (%s): nothing to do\n", c.topic, state)
			return nil
		}
		fmt.Fprintf(stdout, "unhidden %q, fleet-wide (by %s; hidden by %s at %s): it may trend again from every sidecar's next answer (with --trending-review, once allowed)\n", c.topic, c.by, was.By, was.At.Format(time.RFC3339))
	case "list":
		l, err := b.List(ctx)
		if err != nil {
			return err
		}
		if c.asJSON {
			return json.NewEncoder(stdout).Encode(l)
		}
		return printModeration(stdout, l)
	}
	return nil
}

// decided is a decision's who, when and why, for people.
func decided(d moderation.Decision) string {
	s := fmt.Sprintf("by %s at %s", d.By, d.At.Format(time.RFC3339))
	if d.Reason != "" {
		s += fmt.Sprintf(", reason %q", d.Reason)
	}
	return s
}

// printModeration writes the moderation as two tables: the decisions, and
// the topics waiting for review.
func printModeration(w io.Writer, l moderation.List) error {
	if len(l.Decisions) == 0 {
		fmt.Fprintln(w, "no topic is hidden or allowed")
	} else {
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "TOPIC\tSTATE\tBY\tAT\tREASON")
		for _, d := range l.Decisions {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", d.Topic, d.State, d.By, d.At.UTC().Format(time.RFC3339), d.Reason)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	fmt.Fprintln(w)
	if len(l.Waiting) == 0 {
		fmt.Fprintln(w, "no topic is waiting for review (sidecars with --trending-review record those they would have listed)")
		return nil
	}
	fmt.Fprintln(w, "waiting for review (hotcount trending allow TOPIC lists one, hide keeps it off):")
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TOPIC\tFIRST SEEN\tCOUNT\tSCORE")
	for _, wt := range l.Waiting {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%.1f\n", wt.Topic, wt.FirstSeen.UTC().Format(time.RFC3339), wt.Count, wt.Score)
	}
	return tw.Flush()
}

// envValue is name's value in environ (os.Environ's form; the last one
// wins, as in a shell), or "".
func envValue(environ []string, name string) string {
	v := ""
	for _, kv := range environ {
		if val, ok := strings.CutPrefix(kv, name+"="); ok {
			v = val
		}
	}
	return v
}
