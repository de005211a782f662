package sidecar

import (
	"context"
	"errors"
	"testing"
	"time"

	natsserver "github.com/nats-io/nats-server/v2/server"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/hotcount/hotcount/config"
	"github.com/hotcount/hotcount/internal/testenv"
)

// TestSIGTERMDuringStartReturns starts a JetStream-mode sidecar against a
// NATS server without JetStream, so that opening the journal retries, and
// ends its context meanwhile, as SIGTERM would: Run must return the
// context's error at once, having closed what it had opened, rather than
// sleep through its back-off or fail on what it had not built.
func TestSIGTERMDuringStartReturns(t *testing.T) {
	ns, err := natsserver.NewServer(&natsserver.Options{Host: "127.0.0.1", Port: -1, NoLog: true, NoSigs: true})
	if err != nil {
		t.Fatal(err)
	}
	go ns.Start()
	t.Cleanup(ns.Shutdown)
	if !ns.ReadyForConnections(10 * time.Second) {
		t.Fatal("NATS not ready")
	}
	cfg := config.Default()
	cfg.NATSURL = ns.ClientURL()
	cfg.NATSMode = config.ModeJetStream
	cfg.Store = config.StoreBolt
	cfg.DataDir = t.TempDir()
	cfg.HTTPAddr, cfg.AdminAddr = "127.0.0.1:0", "127.0.0.1:0"
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	core, logs := observer.New(zap.WarnLevel)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- New(cfg, zap.New(core)).Run(ctx) }()

	testenv.Eventually(t, 30*time.Second, func() error {
		if logs.FilterMessage("cannot open the journal; retrying").Len() == 0 {
			return errors.New("the journal has not been retried yet")
		}
		return nil
	})
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("Run returned %v, want the context's end", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run still starting 10 s after its context ended")
	}
}
