package main

import (
	"context"
	"io"
	"runtime/debug"

	"github.com/KimMachineGun/automemlimit/memlimit"
	"go.uber.org/zap"

	"github.com/hotcount/hotcount/config"
	"github.com/hotcount/hotcount/sidecar"
)

// memoryShare is the part of the memory budget GOMEMLIMIT gets: the rest
// is headroom for what the Go runtime does not count (stacks in flight,
// the kernel's buffers).
const memoryShare = 0.9

// runSidecar builds the logger, sets the memory limit and runs the sidecar
// until ctx ends. started, if set, runs once the sidecar's listeners are
// bound and its pipeline runs: what it prints is then true.
func runSidecar(ctx context.Context, cfg config.Config, stderr io.Writer, started func(*sidecar.Sidecar)) error {
	log, err := newLogger(cfg, stderr)
	if err != nil {
		return err
	}
	defer log.Sync() //nolint:errcheck // stderr may not support sync
	setMemoryLimit(cfg, log)
	sc := sidecar.New(cfg, log)
	if started == nil {
		return sc.Run(ctx)
	}
	done := make(chan error, 1)
	go func() { done <- sc.Run(ctx) }()
	select {
	case <-sc.Started():
		started(sc)
		return <-done
	case err := <-done:
		return err
	}
}

// setMemoryLimit sets GOMEMLIMIT to memoryShare of the budget: the
// --memory-limit setting, else the container's cgroup limit, so that the
// garbage collector works harder before the kernel's OOM killer would. A
// GOMEMLIMIT in the environment wins over both.
func setMemoryLimit(cfg config.Config, log *zap.Logger) {
	if cfg.MemoryLimit == "none" {
		return
	}
	budget, source := int64(0), "--memory-limit"
	if n, err := config.ParseBytes(cfg.MemoryLimit); err == nil && n > 0 {
		budget = n
	} else if n, err := memlimit.FromCgroup(); err == nil && n > 0 && n < 1<<62 {
		budget, source = int64(n), "cgroup"
	}
	if budget == 0 {
		return
	}
	if env := debug.SetMemoryLimit(-1); env != 1<<63-1 {
		log.Info("memory limit from GOMEMLIMIT", zap.Int64("bytes", env))
		return
	}
	limit := int64(float64(budget) * memoryShare)
	debug.SetMemoryLimit(limit)
	log.Info("memory limit", zap.String("from", source), zap.Int64("budget", budget), zap.Int64("gomemlimit", limit))
}
