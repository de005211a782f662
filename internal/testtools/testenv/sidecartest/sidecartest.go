// Package sidecartest starts a sidecar in the test's process: sidecar.New
// and Run on a goroutine, waiting until it is started (listeners bound),
// ready (/readyz answers) and subscribed (the NATS subscription taken, or
// the consumer bound). It is the one place a test starts a sidecar that
// way.
//
// It is a package of its own, not part of testenv, because testenv is
// imported by the internal tests of packages that sidecar imports
// (flusher, trend, console): testenv importing sidecar would be a cycle.
package sidecartest

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/hotcount/hotcount/config"
	"github.com/hotcount/hotcount/internal/testtools/testenv"
	"github.com/hotcount/hotcount/sidecar"
)

// StartTimeout bounds each wait of Start: for the sidecar to start, to be
// ready, and then to subscribe.
const StartTimeout = 20 * time.Second

// StopGrace is how long past its --shutdown-timeout Stop waits for Run to
// return before it gives up with an error.
const StopGrace = 10 * time.Second

// Sidecar is a running sidecar.
type Sidecar struct {
	*sidecar.Sidecar // HTTPAddr, AdminAddr, Registry
	// Config is the configuration it runs with.
	Config config.Config
	stop   func() error
	// stopped is set once Stop was called: the caller has Run's error.
	stopped atomic.Bool
}

// URL is the lookup API's base URL, http://host:port.
func (s *Sidecar) URL() string { return "http://" + s.HTTPAddr() }

// AdminURL is the admin listener's base URL.
func (s *Sidecar) AdminURL() string { return "http://" + s.AdminAddr() }

// Stop ends Run's context (SIGTERM), waits for Run to return and returns
// its error, or an error if Run has not returned within the sidecar's
// --shutdown-timeout and StopGrace; called again, it returns the same.
func (s *Sidecar) Stop() error {
	s.stopped.Store(true)
	return s.stop()
}

// Start runs a sidecar for cfg, which must have passed Validate, and
// waits until it is started, ready and subscribed; log nil is zap.NewNop.
// The caller stops it (Stop). For code without a testing.TB (examples); a
// test calls Run.
func Start(cfg config.Config, log *zap.Logger, opts ...sidecar.Option) (*Sidecar, error) {
	if log == nil {
		log = zap.NewNop()
	}
	sc := sidecar.New(cfg, log, opts...)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- sc.Run(ctx) }()
	s := &Sidecar{Sidecar: sc, Config: cfg, stop: sync.OnceValue(func() error {
		cancel()
		budget := cfg.ShutdownTimeout + StopGrace
		select {
		case err := <-done:
			return err
		case <-time.After(budget):
			return fmt.Errorf("sidecar did not stop within %s (its --shutdown-timeout %s and %s)", budget, cfg.ShutdownTimeout, StopGrace)
		}
	})}
	select {
	case <-sc.Started():
	case err := <-done:
		cancel()
		return nil, fmt.Errorf("sidecar did not start: %w", err)
	case <-time.After(StartTimeout):
		return nil, errors.Join(fmt.Errorf("sidecar did not start within %s", StartTimeout), s.Stop())
	}
	// Started means listening; ready is /readyz's 200 on the admin
	// listener, and subscribed is what /healthz calls nats ok, and
	// hotcount_dependency_up{dependency="nats"} 1.
	if err := testenv.Poll(StartTimeout, func() error { return s.Probe("/readyz") }); err != nil {
		return nil, errors.Join(err, s.Stop())
	}
	if err := testenv.Poll(StartTimeout, func() error {
		up, err := testenv.MetricValue(sc.Registry(), "hotcount_dependency_up", "dependency", "nats")
		if err != nil || up != 1 {
			return fmt.Errorf("sidecar not subscribed to NATS (up %v, %v)", up, err)
		}
		return nil
	}); err != nil {
		return nil, errors.Join(err, s.Stop())
	}
	return s, nil
}

// Probe is nil when the admin listener answers GET path (/readyz,
// /healthz) with 200, and otherwise says what it answered.
func (s *Sidecar) Probe(path string) error {
	resp, err := http.Get(s.AdminURL() + path)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s", path, resp.Status)
	}
	return nil
}

// Run is Start for a test: a sidecar that cannot start fails it, and the
// sidecar stops when the test ends, failing the test if that stop's Run
// returned an error. A test that stopped it itself (Stop) has checked
// Run's error already: the end of the test does not report it again.
func Run(t testing.TB, cfg config.Config, log *zap.Logger, opts ...sidecar.Option) *Sidecar {
	t.Helper()
	s, err := Start(cfg, log, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if s.stopped.Load() {
			return
		}
		if err := s.stop(); err != nil {
			t.Errorf("sidecar: %v", err)
		}
	})
	return s
}
