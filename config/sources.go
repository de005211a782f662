package config

import (
	"errors"
	"fmt"
	"strings"

	"github.com/knadh/koanf/parsers/yaml"
	"github.com/knadh/koanf/providers/env/v2"
	"github.com/knadh/koanf/providers/file"
	"github.com/knadh/koanf/providers/posflag"
	"github.com/knadh/koanf/v2"
	"github.com/spf13/pflag"
)

// origin is where a setting's value came from, when not from the command
// line.
type origin struct {
	at   string // for a value that does not parse: "$HOTCOUNT_SHARDS", "hotcount.yaml: shards"
	name string // for Validate's complaints: "$HOTCOUNT_SHARDS", "the --config file"
}

// fromAnnotation is the flag annotation Parse records a setting's origin
// under, for Explain.
const fromAnnotation = "hotcount-config-from"

// Parse fills fs's settings from args, environ (os.Environ's form) and the
// YAML file named by --config or HOTCOUNT_CONFIG. Flags of fs that are not
// settings (a command's own) are parsed from args only. An error names
// where the bad value came from: the variable or the file (pflag names the
// flag).
func Parse(fs *pflag.FlagSet, args, environ []string) error {
	if err := fs.Parse(args); err != nil {
		return err
	}
	// Each source is loaded over the ones it wins against: the file, the
	// environment, then the flags set on the command line. The defaults
	// are not loaded: they are the flags' values already, and setting a
	// flag to its default would mark it set (a command asks fs.Changed
	// whether a setting was chosen).
	k := koanf.New(".") // no setting's name has a dot: a nested key is unknown
	from := make(map[string]origin)
	if err := loadFile(k, fs, configPath(fs, environ), from); err != nil {
		return err
	}
	if err := loadEnv(k, fs, environ, from); err != nil {
		return err
	}
	// Without a koanf instance, posflag leaves out every flag the command
	// line did not set.
	if err := k.Load(posflag.ProviderWithValue(fs, ".", nil, settingFlag), nil); err != nil {
		return fmt.Errorf("config: command line: %w", err)
	}
	return apply(fs, k, from)
}

// configPath is the YAML file to read: --config, else HOTCOUNT_CONFIG (the
// last one in environ), else none ("").
func configPath(fs *pflag.FlagSet, environ []string) string {
	f := fs.Lookup("config")
	if f == nil {
		return ""
	}
	path := f.Value.String()
	if !f.Changed {
		for _, kv := range environ {
			if v, ok := strings.CutPrefix(kv, EnvPrefix+"CONFIG="); ok {
				path = v
			}
		}
	}
	return path
}

// loadFile loads the YAML file at path (none when path is empty) into k,
// which is still empty, keeping only the settings fs takes. A key that is
// no setting is an error.
func loadFile(k *koanf.Koanf, fs *pflag.FlagSet, path string, from map[string]origin) error {
	if path == "" {
		return nil
	}
	if err := k.Load(file.Provider(path), yaml.Parser()); err != nil {
		return fmt.Errorf("config: read %s: %w", path, err)
	}
	for _, key := range k.Keys() {
		_, known := lookupSetting(key)
		switch {
		case !known || key == "config":
			return fmt.Errorf("config: %s: unknown setting %q", path, key)
		case fs.Lookup(key) == nil:
			// A setting of another command: one file serves them all,
			// as the environment does.
			k.Delete(key)
		default:
			from[key] = origin{at: path + ": " + key, name: "the --config file"}
		}
	}
	return nil
}

// loadEnv loads the HOTCOUNT_* variables of environ into k, deprecated
// names renamed, keeping only the settings fs takes. A HOTCOUNT_* variable
// that is no setting is an error.
func loadEnv(k *koanf.Koanf, fs *pflag.FlagSet, environ []string, from map[string]origin) error {
	byEnv := make(map[string]string, len(settings))
	for _, s := range settings {
		byEnv[s.envName()] = s.name
	}
	var unknown []string
	if err := k.Load(env.Provider(".", env.Opt{
		Prefix:      EnvPrefix,
		EnvironFunc: func() []string { return current(environ) },
		TransformFunc: func(key, v string) (string, any) {
			name, ok := byEnv[key]
			if !ok {
				unknown = append(unknown, key)
				return "", nil
			}
			if fs.Lookup(name) == nil || name == "config" {
				return "", nil // a setting this command does not take
			}
			from[name] = origin{at: "$" + key, name: "$" + key}
			return name, v
		},
	}), nil); err != nil {
		return fmt.Errorf("config: environment: %w", err)
	}
	if len(unknown) > 0 {
		return unknownVars(unknown, byEnv)
	}
	return nil
}

// settingFlag is posflag's callback: it keeps the settings, as their
// flags' text, and leaves out a command's own flags, which pflag alone
// parses.
func settingFlag(name, v string) (string, any) {
	if _, ok := lookupSetting(name); !ok {
		return "", nil
	}
	return name, v
}

// apply sets each flag to the value that won in k, in key order so that of
// two bad values the same one is reported every time. A flag the command
// line set is set again to its own value; the others record their origin
// for Explain.
func apply(fs *pflag.FlagSet, k *koanf.Koanf, from map[string]origin) error {
	for _, key := range k.Keys() {
		onCommandLine := fs.Changed(key) // pflag's mark, before fs.Set adds its own
		v := fmt.Sprint(k.Get(key))
		if err := fs.Set(key, v); err != nil {
			return fmt.Errorf("config: %s: %q is not %s (--%s)", from[key].at, v, kind(fs.Lookup(key)), key)
		}
		if !onCommandLine {
			_ = fs.SetAnnotation(key, fromAnnotation, []string{from[key].name}) // fails only for a flag fs.Set did not find
		}
	}
	return nil
}

// kind says in words what a flag's value must be.
func kind(f *pflag.Flag) string {
	switch f.Value.Type() {
	case "int", "int64":
		return "a whole number"
	case "duration":
		return "a duration such as 500ms, 2s or 1m"
	case "bool":
		return "true or false"
	default:
		return "a valid " + f.Value.Type()
	}
}

// Explain adds to each of Validate's complaints where its value came from,
// when that was not the command line: "(from $HOTCOUNT_SHARDS)" or "(from
// the --config file)". fs is the flag set Parse filled.
func Explain(err error, fs *pflag.FlagSet) error {
	var joined interface{ Unwrap() []error }
	if !errors.As(err, &joined) {
		return err
	}
	var out []error
	for _, e := range joined.Unwrap() {
		name, _, _ := strings.Cut(e.Error(), ":")
		if f := fs.Lookup(name); f != nil && len(f.Annotations[fromAnnotation]) > 0 {
			e = fmt.Errorf("%w (from %s)", e, f.Annotations[fromAnnotation][0])
		}
		out = append(out, e)
	}
	return fmt.Errorf("config: %w", errors.Join(out...))
}
