// Command hotcount is a write-buffering sidecar that keeps hot counters in
// DynamoDB without melting a partition. See README.md.
//
//	hotcount run            the sidecar
//	hotcount dev            everything embedded: NATS, the store, the APIs
//	hotcount table create   create the DynamoDB table (idempotent)
//	hotcount stream create  create the JetStream stream(s) (idempotent)
//	hotcount stream status  where the partition streams are, and their backlog
//	hotcount load           publish synthetic mentions
//	hotcount shards         show or set a topic's shard count
//	hotcount trending       hide, unhide or allow topics on the trending list
//	hotcount audit          recount the stream and compare it with the table
//	hotcount demo           the hot-partition problem and its fix, live
//	hotcount check-config   validate settings and print them
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/spf13/pflag"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/hotcount/hotcount/config"
	"github.com/hotcount/hotcount/internal/datadir"
)

// version is stamped at build time: -ldflags "-X main.version=v1.2.3".
var version = "dev"

// Exit codes.
const (
	exitOK    = 0
	exitError = 1 // the command ran and failed
	exitUsage = 2 // bad command line or configuration
)

const usage = `hotcount: hot counters in DynamoDB without a hot partition.

Usage:
  hotcount run [flags]            run the sidecar
  hotcount dev [flags]            run with everything embedded (no outside service)
  hotcount table create [flags]   create the DynamoDB table if absent
  hotcount stream create [flags]  create the JetStream stream(s) of mentions if absent
  hotcount stream status [flags]  partitioned mode: each partition stream's leader and backlog
  hotcount quarantine list        the writes the store refused for good, held aside
  hotcount quarantine replay      write them, each exactly once, once the store takes them
  hotcount load [flags]           publish synthetic mentions
  hotcount top [flags]            the fleet's trending topics, live with --watch
  hotcount trending hide TOPIC    take a topic off the trending list, fleet-wide (still counted)
  hotcount trending unhide TOPIC  let a hidden topic trend again
  hotcount trending allow TOPIC   with --trending-review: let a topic trend
  hotcount trending list          the hidden and allowed topics, and those waiting for review
  hotcount shards show TOPIC...   a topic's shard counts and shards
  hotcount shards set TOPIC N     set a topic's shard count (reads never shrink)
  hotcount audit [flags]          recount the stream and compare it with the table
  hotcount demo [flags]           race writers against an emulated partition ceiling
  hotcount check-config [flags]   validate the settings and print them
  hotcount version                print the version

Every command takes --help. Settings are flags, HOTCOUNT_* variables or
keys of a YAML file given by --config.
`

// usageError marks errors that exit with exitUsage.
type usageError struct{ error }

func (e usageError) Unwrap() error { return e.error }

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	err := dispatch(ctx, os.Args[1:], os.Environ(), os.Stdout, os.Stderr)
	stop()
	os.Exit(exitCode(err, os.Stderr))
}

func exitCode(err error, stderr io.Writer) int {
	var ue usageError
	switch {
	case err == nil, errors.Is(err, pflag.ErrHelp):
		return exitOK
	case errors.As(err, &ue):
		fmt.Fprintln(stderr, "hotcount:", err)
		return exitUsage
	default:
		fmt.Fprintln(stderr, "hotcount:", err)
		return exitError
	}
}

// dispatch runs the command args name.
func dispatch(ctx context.Context, args, environ []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return usageError{errors.New("no command")}
	}
	cmd, rest := args[0], args[1:]
	switch cmd {
	case "run":
		return cmdRun(ctx, rest, environ, stderr)
	case "dev":
		return cmdDev(ctx, rest, environ, stdout, stderr)
	case "table":
		return group(ctx, "table", rest, environ, stdout, stderr, subcommand{"create", "create the DynamoDB table if absent", cmdTableCreate})
	case "stream":
		return group(ctx, "stream", rest, environ, stdout, stderr, subcommand{"create", "create the JetStream stream(s) of mentions if absent", cmdStreamCreate},
			subcommand{"status", "partitioned mode: each partition stream's leader and backlog", cmdStreamStatus},
			subcommand{"rules", "the rules that decide a count, recorded in each stream: show, set", cmdStreamRules},
			subcommand{"rewind", "move the durable readers back (--to TIME or --to-start), with the fleet running: fills a restored or new table exactly", cmdStreamRewind})
	case "quarantine":
		return group(ctx, "quarantine", rest, environ, stdout, stderr, subcommand{"list", "the writes the store refused for good, held aside, and why", cmdQuarantineList},
			subcommand{"replay", "write the quarantined writes, each exactly once, once the store takes them", cmdQuarantineReplay})
	case "load":
		return cmdLoad(ctx, rest, environ, stdout, stderr)
	case "top":
		return cmdTop(ctx, rest, environ, stdout, stderr)
	case "shards":
		return cmdShards(ctx, rest, environ, stdout, stderr)
	case "trending":
		return cmdTrending(ctx, rest, environ, stdout, stderr)
	case "audit":
		return cmdAudit(ctx, rest, environ, stdout, stderr)
	case "demo":
		return cmdDemo(ctx, rest, environ, stdout, stderr)
	case "check-config":
		return cmdCheckConfig(rest, environ, stdout, stderr)
	case "version", "--version":
		fmt.Fprintln(stdout, "hotcount", version)
		return nil
	case "help", "--help", "-h":
		fmt.Fprint(stdout, usage)
		return nil
	default:
		fmt.Fprint(stderr, usage)
		return usageError{fmt.Errorf("unknown command %q", cmd)}
	}
}

// subcommand is one of the commands a group (table, stream) takes.
type subcommand struct {
	name, summary string
	run           func(ctx context.Context, args, environ []string, stdout, stderr io.Writer) error
}

// group runs the subcommand args name of the group name (hotcount table
// create), or prints the group's usage (--help).
func group(ctx context.Context, name string, args, environ []string, stdout, stderr io.Writer, subs ...subcommand) error {
	if help(args) {
		fmt.Fprint(stdout, "Usage:\n")
		for _, s := range subs {
			fmt.Fprintf(stdout, "  %-32s%s (hotcount %s %s --help: its flags)\n", "hotcount "+name+" "+s.name+" [flags]", s.summary, name, s.name)
		}
		return nil
	}
	names := make([]string, len(subs))
	for i, s := range subs {
		if len(args) > 0 && args[0] == s.name {
			return s.run(ctx, args[1:], environ, stdout, stderr)
		}
		names[i] = s.name
	}
	what := "one subcommand"
	if len(subs) > 1 {
		what = "a subcommand"
	}
	return usageError{fmt.Errorf("%q takes %s: %s (hotcount %s --help)", name, what, strings.Join(names, ", "), name)}
}

// parse parses and validates the settings of a command.
func parse(cfg *config.Config, fs *pflag.FlagSet, args, environ []string, stderr io.Writer) error {
	fs.SetOutput(stderr)
	if err := config.Parse(fs, args, environ); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return err
		}
		return usageError{err}
	}
	for _, w := range config.Deprecated(environ) {
		fmt.Fprintln(stderr, "hotcount: warning:", w)
	}
	if err := cfg.Validate(); err != nil {
		return usageError{config.Explain(err, fs)}
	}
	return nil
}

// newLogger builds the logger the settings ask for: JSON (for production) or
// console (for people), coloured only on a terminal: a log file or a pipe
// gets no escape codes.
func newLogger(cfg config.Config, stderr io.Writer) (*zap.Logger, error) {
	level, err := zapcore.ParseLevel(cfg.LogLevel)
	if err != nil {
		return nil, err
	}
	var enc zapcore.Encoder
	if cfg.LogFormat == "console" {
		ec := zap.NewDevelopmentEncoderConfig()
		ec.EncodeLevel = zapcore.CapitalLevelEncoder
		if terminal(stderr) {
			ec.EncodeLevel = zapcore.CapitalColorLevelEncoder
		}
		enc = zapcore.NewConsoleEncoder(ec)
	} else {
		enc = zapcore.NewJSONEncoder(zap.NewProductionEncoderConfig())
	}
	core := zapcore.NewCore(enc, zapcore.Lock(zapcore.AddSync(stderr)), level)
	return zap.New(core, zap.AddCaller()).With(zap.String("version", version)), nil
}

func cmdRun(ctx context.Context, args, environ []string, stderr io.Writer) error {
	cfg := config.Default()
	fs := cfg.FlagSet("hotcount run", nil)
	if err := parse(&cfg, fs, args, environ, stderr); err != nil {
		return err
	}
	if cfg.UsesDataDir() {
		// Before anything opens a file in it: see package datadir.
		unlock, err := datadir.Lock(cfg.DataDir)
		if err != nil {
			return err
		}
		defer unlock()
	}
	return runSidecar(ctx, cfg, stderr, nil)
}

func cmdCheckConfig(args, environ []string, stdout, stderr io.Writer) error {
	cfg := config.Default()
	fs := cfg.FlagSet("hotcount check-config", nil)
	if err := parse(&cfg, fs, args, environ, stderr); err != nil {
		return err
	}
	fmt.Fprintln(stdout, "# configuration is valid; effective settings:")
	return config.Print(stdout, fs)
}

// help says whether a command's arguments ask for its help rather than name
// a subcommand.
func help(args []string) bool {
	return len(args) > 0 && (args[0] == "--help" || args[0] == "-h" || args[0] == "help")
}

// terminal says whether w is a terminal (a character device), where
// colour codes show as colours rather than as escape sequences.
func terminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}
