package main

import (
	"bufio"
	"bytes"
	"context"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"unicode"
)

// readmeCommands returns the command lines of the README's shell blocks
// that start with prefix, comments cut, split into words as a shell would
// (single and double quotes; nothing fancier is used there).
func readmeCommands(t testing.TB, prefix string) [][]string {
	t.Helper()
	raw, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	var out [][]string
	inShell := false
	sc := bufio.NewScanner(bytes.NewReader(raw))
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "```"):
			inShell = !inShell && strings.TrimPrefix(line, "```") == "sh"
			continue
		case !inShell || !strings.HasPrefix(line, prefix):
			continue
		}
		words := shellWords(t, line)
		out = append(out, words)
	}
	if len(out) == 0 {
		t.Fatalf("the README has no %q command", prefix)
	}
	return out
}

// shellWords splits line as sh would, up to an unquoted #.
func shellWords(t testing.TB, line string) []string {
	var words []string
	var cur strings.Builder
	inWord, quote := false, rune(0)
	for _, r := range line {
		switch {
		case quote != 0 && r == quote:
			quote = 0
		case quote != 0:
			cur.WriteRune(r)
		case r == '\'' || r == '"':
			quote, inWord = r, true
		case r == '#' && !inWord:
			return append(words, finish(&cur, &inWord)...)
		case r == ' ' || r == '\t':
			words = append(words, finish(&cur, &inWord)...)
		default:
			cur.WriteRune(r)
			inWord = true
		}
	}
	if quote != 0 {
		t.Fatalf("unclosed quote in README command %q", line)
	}
	return append(words, finish(&cur, &inWord)...)
}

func finish(cur *strings.Builder, inWord *bool) []string {
	if !*inWord {
		return nil
	}
	w := cur.String()
	cur.Reset()
	*inWord = false
	return []string{w}
}

// hotcountArgs returns the arguments of a README command line that runs
// hotcount (`hotcount ...` or `go run ./cmd/hotcount ...`), or nil.
func hotcountArgs(words []string) []string {
	switch {
	case len(words) > 0 && words[0] == "hotcount":
		return words[1:]
	case len(words) > 2 && words[0] == "go" && words[1] == "run" && words[2] == "./cmd/hotcount":
		return words[3:]
	}
	return nil
}

// TestReadmeCommands: every hotcount command in the README's shell blocks
// names a real command, and every flag it gives is one that command takes
// (its --help lists it); every make target it names is in the Makefile.
func TestReadmeCommands(t *testing.T) {
	n := 0
	for _, prefix := range []string{"hotcount ", "go run ./cmd/hotcount "} {
		for _, words := range readmeCommands(t, prefix) {
			args := hotcountArgs(words)
			var cmd []string // the command path: run, table create, ...
			for _, a := range args {
				if strings.HasPrefix(a, "-") || (len(cmd) > 0 && !isSubcommand(cmd[0], a)) {
					break
				}
				cmd = append(cmd, a)
			}
			var stdout, stderr bytes.Buffer
			err := dispatch(context.Background(), append(append([]string{}, cmd...), "--help"), nil, &stdout, &stderr)
			if code := exitCode(err, &stderr); code != exitOK {
				t.Errorf("README: %s: `hotcount %s --help` exits %d: %s", strings.Join(words, " "), strings.Join(cmd, " "), code, stderr.String())
				continue
			}
			help := stdout.String() + stderr.String()
			for _, a := range args {
				if !strings.HasPrefix(a, "--") {
					continue
				}
				flag, _, _ := strings.Cut(a, "=")
				if !regexp.MustCompile(`(?m)^\s+(-\w, )?` + regexp.QuoteMeta(flag) + `\b`).MatchString(help) {
					t.Errorf("README: %s: `hotcount %s` has no flag %s", strings.Join(words, " "), strings.Join(cmd, " "), flag)
				}
			}
			n++
		}
	}
	makefile, err := os.ReadFile("../../Makefile")
	if err != nil {
		t.Fatal(err)
	}
	for _, words := range readmeCommands(t, "make ") {
		for _, target := range words[1:] {
			if !regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(target) + `:`).Match(makefile) {
				t.Errorf("README: make %s: no such target in the Makefile", target)
			}
		}
		n++
	}
	t.Logf("%d README commands checked", n)
}

// isSubcommand says whether word is a subcommand of command.
func isSubcommand(command, word string) bool {
	switch command {
	case "table", "stream":
		return word == "create"
	case "shards":
		return word == "show" || word == "set"
	}
	return false
}

// TestDocLinks: every relative link in the README and the docs names a file
// that exists, and an anchor names a heading of that file (GitHub's slugs).
func TestDocLinks(t *testing.T) {
	pages, err := filepath.Glob("../../docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	pages = append(pages, "../../README.md", "../../deploy/README.md")
	link := regexp.MustCompile(`\]\(([^)\s]+)\)`)
	for _, page := range pages {
		raw, err := os.ReadFile(page)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range link.FindAllStringSubmatch(string(raw), -1) {
			target := m[1]
			if strings.Contains(target, "://") {
				continue
			}
			file, anchor, _ := strings.Cut(target, "#")
			path := page
			if file != "" {
				path = filepath.Join(filepath.Dir(page), file)
			}
			body, err := os.ReadFile(path)
			if err != nil {
				if info, serr := os.Stat(path); serr == nil && info.IsDir() {
					continue
				}
				t.Errorf("%s: link %s: %v", page, target, err)
				continue
			}
			if anchor != "" && !slices.Contains(slugs(string(body)), anchor) {
				t.Errorf("%s: link %s: no such heading in %s", page, target, path)
			}
		}
	}
}

// slugs returns the anchors GitHub gives a Markdown file's headings.
func slugs(md string) []string {
	var out []string
	inCode := false
	for line := range strings.Lines(md) {
		if strings.HasPrefix(line, "```") {
			inCode = !inCode
		}
		if inCode || !strings.HasPrefix(line, "#") {
			continue
		}
		h := strings.ToLower(strings.TrimSpace(strings.TrimLeft(line, "#")))
		var b strings.Builder
		for _, r := range h {
			switch {
			case r == ' ':
				b.WriteRune('-')
			case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
				b.WriteRune(r)
			}
		}
		out = append(out, b.String())
	}
	return out
}
