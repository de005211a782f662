package client_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	dto "github.com/prometheus/client_model/go"
	"go.uber.org/zap"

	"github.com/hotcount/hotcount/config"
	"github.com/hotcount/hotcount/ingest"
	"github.com/hotcount/hotcount/internal/embeddednats"
	"github.com/hotcount/hotcount/internal/testenv"
	"github.com/hotcount/hotcount/sidecar"
)

// hotcount is a sidecar on the embedded store against a real NATS server,
// as the examples and the tests run it: lookup API and admin listener on
// free ports, flushes every 50 ms.
type hotcount struct {
	natsURL string // the NATS server
	httpURL string // the lookup API
	sc      *sidecar.Sidecar
	cfg     config.Config
	stop    func() error // shuts the sidecar down; again, returns the same
}

// startHotcount starts a sidecar in mode (config.ModeCore or ModeJetStream,
// creating the stream) against the NATS server at natsURL, storing in dir,
// and waits until it takes mentions. tune changes its settings first.
func startHotcount(natsURL, mode, dir string, tune func(*config.Config)) (*hotcount, error) {
	cfg := config.Default()
	cfg.NATSURL, cfg.NATSMode = natsURL, mode
	cfg.Store, cfg.DataDir = config.StoreBolt, dir
	cfg.HTTPAddr, cfg.AdminAddr = "127.0.0.1:0", "127.0.0.1:0"
	cfg.FlushInterval = 50 * time.Millisecond
	if tune != nil {
		tune(&cfg)
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if mode == config.ModeJetStream {
		nc, err := nats.Connect(natsURL)
		if err != nil {
			return nil, err
		}
		_, err = ingest.EnsureStream(context.Background(), nc, cfg.Stream, cfg.Subject, ingest.DefaultDuplicateWindow)
		nc.Close()
		if err != nil {
			return nil, err
		}
	}
	sc := sidecar.New(cfg, zap.NewNop())
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- sc.Run(ctx) }()
	select {
	case <-sc.Started():
	case err := <-done:
		cancel()
		return nil, err
	}
	h := &hotcount{natsURL: natsURL, httpURL: "http://" + sc.HTTPAddr(), sc: sc, cfg: cfg,
		stop: sync.OnceValue(func() error { cancel(); return <-done })}
	// Started means listening; taking mentions means subscribed (or the
	// consumer bound), which the NATS dependency gauge says.
	if err := poll(10*time.Second, func() error {
		if up, err := gauge(sc, "hotcount_dependency_up", "nats"); err != nil || up != 1 {
			return fmt.Errorf("sidecar not subscribed (%v)", err)
		}
		return nil
	}); err != nil {
		h.stop() //nolint:errcheck // the first error says it
		return nil, err
	}
	return h, nil
}

// waitWritten waits until the sidecar has written n mentions to its store.
func (h *hotcount) waitWritten(n int64) error {
	return poll(30*time.Second, func() error {
		got, err := gauge(h.sc, "hotcount_flusher_flushed_mentions_total", "")
		if err != nil || got < float64(n) {
			return fmt.Errorf("%v of %d mentions written (%v)", got, n, err)
		}
		return nil
	})
}

// written is waitWritten for an example.
func (h *hotcount) written(n int64) {
	if err := h.waitWritten(n); err != nil {
		panic(err)
	}
}

// gauge reads a metric of the sidecar's: the series whose dependency
// label is dep, or the first series when dep is empty.
func gauge(sc *sidecar.Sidecar, name, dep string) (float64, error) {
	mfs, err := sc.Registry().Gather()
	if err != nil {
		return 0, err
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if dep == "" || slices.ContainsFunc(m.GetLabel(), func(l *dto.LabelPair) bool {
				return l.GetName() == "dependency" && l.GetValue() == dep
			}) {
				return m.GetGauge().GetValue() + m.GetCounter().GetValue(), nil
			}
		}
	}
	return 0, fmt.Errorf("no metric %s", name)
}

// poll calls cond every 10 ms until it returns nil or timeout passes.
func poll(timeout time.Duration, cond func() error) error {
	deadline := time.Now().Add(timeout)
	for {
		err := cond()
		if err == nil || time.Now().After(deadline) {
			return err
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// example starts what an example needs, a NATS server with JetStream and
// a sidecar in mode tuned by tune, and returns it with the function that
// stops both. Examples have no *testing.T: a failure is a panic.
func example(mode string, tune ...func(*config.Config)) (*hotcount, func()) {
	dir, err := os.MkdirTemp("", "hotcount-example-")
	if err != nil {
		panic(err)
	}
	ns, err := embeddednats.Start(-1, filepath.Join(dir, "jetstream"))
	if err != nil {
		panic(err)
	}
	h, err := startHotcount(ns.ClientURL(), mode, dir, func(c *config.Config) {
		for _, f := range tune {
			f(c)
		}
	})
	if err != nil {
		panic(err)
	}
	return h, func() {
		if err := h.stop(); err != nil {
			panic(err)
		}
		ns.Shutdown()
		ns.WaitForShutdown()
		os.RemoveAll(dir)
	}
}

// withTokenFile runs the sidecar with --http-token-file holding token.
func withTokenFile(token string) func(*config.Config) {
	return func(c *config.Config) {
		c.HTTPTokenFile = filepath.Join(c.DataDir, "token")
		if err := os.WriteFile(c.HTTPTokenFile, []byte(token+"\n"), 0o600); err != nil {
			panic(err)
		}
	}
}

// startT is startHotcount for a test, on its own NATS server, stopped when
// the test ends.
func startT(t *testing.T, mode string, tune func(*config.Config)) (*hotcount, *server.Server) {
	t.Helper()
	ns := testenv.NATS(t)
	h, err := startHotcount(ns.ClientURL(), mode, t.TempDir(), tune)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := h.stop(); err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("sidecar: %v", err)
		}
	})
	return h, ns
}
