package config

import (
	"fmt"
	"slices"
	"strings"
)

// current returns environ with each deprecated variable renamed to its
// setting's current one, unless that is set too (it wins).
func current(environ []string) []string {
	set := make(map[string]bool, len(environ))
	for _, kv := range environ {
		name, _, _ := strings.Cut(kv, "=")
		set[name] = true
	}
	out := make([]string, 0, len(environ))
	for _, kv := range environ {
		name, v, _ := strings.Cut(kv, "=")
		for _, s := range settings {
			if s.was != "" && name == s.was {
				if set[s.envName()] {
					name = "" // dropped: the current name is set
				} else {
					name = s.envName()
				}
			}
		}
		if name != "" {
			out = append(out, name+"="+v)
		}
	}
	return out
}

// Deprecated returns a warning for each variable in environ under a name
// that still works for now but will not in the next release.
func Deprecated(environ []string) []string {
	var out []string
	for _, kv := range environ {
		name, _, _ := strings.Cut(kv, "=")
		for _, s := range settings {
			if s.was != "" && name == s.was {
				out = append(out, fmt.Sprintf("%s is deprecated and will be refused in the next release: rename it %s", s.was, s.envName()))
			}
		}
	}
	return out
}

// unknownVars is the error for HOTCOUNT_* variables that are no setting,
// each with the known variable it is likely a typo of, if any.
func unknownVars(unknown []string, byEnv map[string]string) error {
	slices.Sort(unknown)
	for i, key := range unknown {
		if near := nearest(key, byEnv); near != "" {
			unknown[i] += " (did you mean " + near + "?)"
		}
	}
	return fmt.Errorf("config: unknown environment variable(s) %s: each is %s and a flag's name in capitals with - as _, as --help shows", strings.Join(unknown, ", "), EnvPrefix)
}

// nearest returns the known variable closest to an unknown one, if one is
// a likely typo or a former name (at most 3 edits apart).
func nearest(key string, known map[string]string) string {
	best, bestD := "", 4
	for k := range known {
		if d := edits(key, k); d < bestD || (d == bestD && k < best) {
			best, bestD = k, d
		}
	}
	return best
}

// edits is the Levenshtein distance between a and b.
func edits(a, b string) int {
	prev := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur := make([]int, len(b)+1)
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev = cur
	}
	return prev[len(b)]
}
