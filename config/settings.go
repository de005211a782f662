package config

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/hotcount/hotcount/internal/natsauth"
)

// setting describes one setting. Its flag name is also its YAML key.
type setting struct {
	name   string
	was    string // the variable's former name, still read with a warning
	usage  string
	bind   func(fs *pflag.FlagSet, c *Config, name, usage string)
	secret bool // never printed
}

func str(field func(*Config) *string) func(*pflag.FlagSet, *Config, string, string) {
	return func(fs *pflag.FlagSet, c *Config, name, usage string) {
		p := field(c)
		fs.StringVar(p, name, *p, usage)
	}
}

func integer(field func(*Config) *int) func(*pflag.FlagSet, *Config, string, string) {
	return func(fs *pflag.FlagSet, c *Config, name, usage string) {
		p := field(c)
		fs.IntVar(p, name, *p, usage)
	}
}

func dur(field func(*Config) *time.Duration) func(*pflag.FlagSet, *Config, string, string) {
	return func(fs *pflag.FlagSet, c *Config, name, usage string) {
		p := field(c)
		fs.DurationVar(p, name, *p, usage)
	}
}

func integer64(field func(*Config) *int64) func(*pflag.FlagSet, *Config, string, string) {
	return func(fs *pflag.FlagSet, c *Config, name, usage string) {
		p := field(c)
		fs.Int64Var(p, name, *p, usage)
	}
}

func boolean(field func(*Config) *bool) func(*pflag.FlagSet, *Config, string, string) {
	return func(fs *pflag.FlagSet, c *Config, name, usage string) {
		p := field(c)
		fs.BoolVar(p, name, *p, usage)
	}
}

// settings lists every setting, in the order --help shows them: each
// area's, in the file that checks them.
var settings = slices.Concat(natsFlags, durableFlags, ingestFlags, storeFlags, flushFlags, lookupFlags, trendFlags, processFlags)

func (s setting) envName() string {
	return EnvPrefix + strings.ToUpper(strings.ReplaceAll(s.name, "-", "_"))
}

// FlagSet returns a flag set for command name bound to c's fields, whose
// current values are the defaults. With take set, only the settings it
// accepts are in it. Each flag's help names its environment variable.
func (c *Config) FlagSet(name string, take func(setting string) bool) *pflag.FlagSet {
	fs := pflag.NewFlagSet(name, pflag.ContinueOnError)
	fs.SortFlags = false
	for _, s := range settings {
		if take != nil && !take(s.name) {
			continue
		}
		s.bind(fs, c, s.name, s.usage+" ($"+s.envName()+")")
	}
	return fs
}

// lookupSetting returns the setting of a flag's name, if it is one.
func lookupSetting(name string) (setting, bool) {
	for _, s := range settings {
		if s.name == name {
			return s, true
		}
	}
	return setting{}, false
}

// Print writes the effective settings of fs as YAML, the form --config
// reads, with secrets (the token, a password in a URL) redacted.
func Print(w io.Writer, fs *pflag.FlagSet) error {
	secret := make(map[string]bool)
	for _, s := range settings {
		secret[s.name] = s.secret
	}
	var err error
	fs.VisitAll(func(f *pflag.Flag) {
		if err != nil || f.Name == "config" {
			return
		}
		v := f.Value.String()
		switch {
		case secret[f.Name] && v != "":
			v = natsauth.Redacted
		case f.Name == "nats-url":
			v = natsauth.RedactURLs(v)
		}
		_, err = fmt.Fprintf(w, "%s: %q\n", f.Name, v)
	})
	return err
}
