package main

import (
	"runtime/debug"
	"testing"

	"go.uber.org/zap"

	"github.com/hotcount/hotcount/config"
)

// TestMemoryLimit: --memory-limit sets GOMEMLIMIT to 90% of the budget;
// "none" leaves it alone.
func TestMemoryLimit(t *testing.T) {
	// As if no GOMEMLIMIT were in the environment (one there would win).
	before := debug.SetMemoryLimit(1<<63 - 1)
	defer debug.SetMemoryLimit(before)
	cfg := config.Default()
	cfg.MemoryLimit = "none"
	setMemoryLimit(cfg, zap.NewNop())
	if got := debug.SetMemoryLimit(-1); got != 1<<63-1 {
		t.Errorf("none: GOMEMLIMIT %d, want unchanged", got)
	}
	cfg.MemoryLimit = "100Mi"
	setMemoryLimit(cfg, zap.NewNop())
	if got, want := debug.SetMemoryLimit(-1), int64(0.9*100*(1<<20)); got != want {
		t.Errorf("100Mi: GOMEMLIMIT %d, want %d", got, want)
	}
}
