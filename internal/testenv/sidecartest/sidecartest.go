// Package sidecartest starts a sidecar in the test's process: sidecar.New
// and Run on a goroutine, waiting until it is started (listeners bound)
// and subscribed (the NATS subscription taken, or the consumer bound).
//
// It is a package of its own, not part of testenv, because testenv is
// imported by the internal tests of packages that sidecar imports
// (flusher, trend, console): testenv importing sidecar would be a cycle.
package sidecartest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"go.uber.org/zap"

	"github.com/hotcount/hotcount/config"
	"github.com/hotcount/hotcount/internal/testenv"
	"github.com/hotcount/hotcount/sidecar"
)

// StartTimeout bounds each wait of Start: for the sidecar to start, and
// then for it to subscribe.
const StartTimeout = 20 * time.Second

// Sidecar is a running sidecar.
type Sidecar struct {
	*sidecar.Sidecar // HTTPAddr, AdminAddr, Registry
	// Config is the configuration it runs with.
	Config config.Config
	stop   func() error
}

// URL is the lookup API's base URL, http://host:port.
func (s *Sidecar) URL() string { return "http://" + s.HTTPAddr() }

// AdminURL is the admin listener's base URL.
func (s *Sidecar) AdminURL() string { return "http://" + s.AdminAddr() }

// Stop ends Run's context (SIGTERM), waits for Run to return and returns
// its error; called again, it returns the same.
func (s *Sidecar) Stop() error { return s.stop() }

// Start runs a sidecar for cfg, which must have passed Validate, and
// waits until it is started and subscribed; log nil is zap.NewNop. The
// caller stops it (Stop). For code without a testing.TB (examples); a
// test calls Run.
func Start(cfg config.Config, log *zap.Logger, opts ...sidecar.Option) (*Sidecar, error) {
	if log == nil {
		log = zap.NewNop()
	}
	sc := sidecar.New(cfg, log, opts...)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- sc.Run(ctx) }()
	s := &Sidecar{Sidecar: sc, Config: cfg, stop: sync.OnceValue(func() error { cancel(); return <-done })}
	select {
	case <-sc.Started():
	case err := <-done:
		cancel()
		return nil, fmt.Errorf("sidecar did not start: %w", err)
	case <-time.After(StartTimeout):
		return nil, errors.Join(fmt.Errorf("sidecar did not start within %s", StartTimeout), s.Stop())
	}
	// Started means listening; subscribed is what /healthz calls nats ok,
	// and hotcount_dependency_up{dependency="nats"} 1.
	if err := testenv.Poll(StartTimeout, func() error {
		up, err := Gauge(sc.Registry(), "hotcount_dependency_up", "dependency", "nats")
		if err != nil || up != 1 {
			return fmt.Errorf("sidecar not subscribed to NATS (up %v, %v)", up, err)
		}
		return nil
	}); err != nil {
		return nil, errors.Join(err, s.Stop())
	}
	return s, nil
}

// Run is Start for a test: a sidecar that cannot start fails it, and the
// sidecar stops when the test ends, failing the test if Run returned an
// error (a test that stopped it itself checked that error already).
func Run(t testing.TB, cfg config.Config, log *zap.Logger, opts ...sidecar.Option) *Sidecar {
	t.Helper()
	s, err := Start(cfg, log, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Stop(); err != nil {
			t.Errorf("sidecar: %v", err)
		}
	})
	return s
}

// Gauge is the value of the named counter or gauge in g: of its series
// whose label is value, or of its first series when label is empty.
func Gauge(g prometheus.Gatherer, name, label, value string) (float64, error) {
	mfs, err := g.Gather()
	if err != nil {
		return 0, err
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if label == "" || slices.ContainsFunc(m.GetLabel(), func(l *dto.LabelPair) bool {
				return l.GetName() == label && l.GetValue() == value
			}) {
				return m.GetGauge().GetValue() + m.GetCounter().GetValue(), nil
			}
		}
	}
	return 0, fmt.Errorf("no metric %s", name)
}
