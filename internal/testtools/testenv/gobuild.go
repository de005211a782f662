package testenv

import (
	"os"
	"runtime/debug"
)

// GoBuild returns the arguments and the environment with which a test's
// `go build` builds as this test binary was built: -race, -trimpath, -tags
// and CGO_ENABLED as it had them. Every package the test binary holds is
// then in the build cache already, and the build compiles only what is new
// (a main package) and links. With other flags it compiles the whole graph
// again: for hotcount's command, from an empty build cache (a newcomer's
// first make test, CI on a new machine), about 2 minutes of a 2-core
// machine. It links without a symbol table or DWARF (-s -w), which the
// cache's keys leave out and which shortens the link.
//
// Flags it does not copy (-cover, -gcflags, -asan, -msan) leave the build
// right, only slower: the packages they change compile again.
func GoBuild() (args, env []string) {
	env = os.Environ()
	args = []string{"-ldflags=-s -w"}
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return args, env
	}
	for _, s := range info.Settings {
		switch {
		case s.Key == "-race" && s.Value == "true":
			args = append(args, "-race")
		case s.Key == "-trimpath" && s.Value == "true":
			args = append(args, "-trimpath")
		case s.Key == "-tags" && s.Value != "":
			args = append(args, "-tags", s.Value)
		case s.Key == "CGO_ENABLED":
			env = append(env, "CGO_ENABLED="+s.Value)
		}
	}
	return args, env
}
