package client_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/hotcount/hotcount/config"
	"github.com/hotcount/hotcount/internal/embeddednats"
	"github.com/hotcount/hotcount/internal/testtools/testenv"
	"github.com/hotcount/hotcount/internal/testtools/testenv/sidecartest"
	"github.com/hotcount/hotcount/mention"
	"github.com/hotcount/hotcount/pipeline/ingest"
)

// hotcount is a sidecar on the embedded store against a real NATS server,
// as the examples and the tests run it: lookup API and admin listener on
// free ports, flushes every 50 ms.
type hotcount struct {
	natsURL string // the NATS server
	httpURL string // the lookup API
	sc      *sidecartest.Sidecar
	cfg     config.Config
}

// stop shuts the sidecar down; again, it returns the same.
func (h *hotcount) stop() error { return h.sc.Stop() }

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
		_, err = ingest.EnsureStream(context.Background(), nc, cfg.Stream, cfg.Subject, mention.DefaultDuplicateWindow)
		nc.Close()
		if err != nil {
			return nil, err
		}
	}
	sc, err := sidecartest.Start(cfg, nil)
	if err != nil {
		return nil, err
	}
	return &hotcount{natsURL: natsURL, httpURL: sc.URL(), sc: sc, cfg: cfg}, nil
}

// waitWritten waits until the sidecar has written n mentions to its store.
func (h *hotcount) waitWritten(n int64) error {
	return testenv.Poll(30*time.Second, func() error {
		got, err := gauge(h.sc, "hotcount_flusher_flushed_mentions_total")
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

// gauge reads an unlabelled metric of the sidecar's.
func gauge(sc *sidecartest.Sidecar, name string) (float64, error) {
	return testenv.MetricValue(sc.Registry(), name, "", "")
}

// example starts what an example needs, a NATS server with JetStream and
// a sidecar in mode tuned by tune, and returns it with the function that
// stops both. Examples have no *testing.T: a failure is a panic.
func example(mode string, tune ...func(*config.Config)) (*hotcount, func()) {
	dir, err := os.MkdirTemp("", "hotcount-example-")
	if err != nil {
		panic(err)
	}
	ns, err := embeddednats.Start(-1, filepath.Join(dir, "jetstream"), nil)
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
