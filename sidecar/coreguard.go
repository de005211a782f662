package sidecar

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/hotcount/hotcount/durability/durable"
	"github.com/hotcount/hotcount/durability/rules"
)

// coreGuardEvery is how often a running core-mode sidecar looks again
// for a durable fleet on its subject.
const coreGuardEvery = 10 * time.Second

// coreGuard keeps a core-mode sidecar off subjects a durable fleet
// counts: a stream that takes the subject and has rules recorded is read
// by jetstream-mode sidecars, and a core-mode sidecar beside them (a
// switch of mode half done, one pod left on the old settings) would
// count every mention a second time. It refuses to start, and a running
// sidecar stops when such a stream appears.
type coreGuard struct {
	js      jetstream.JetStream
	subject string
	log     *zap.Logger
}

func newCoreGuard(ctx context.Context, nc *nats.Conn, subject string, log *zap.Logger) (*coreGuard, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	g := &coreGuard{js: js, subject: subject, log: log}
	return g, g.check(ctx)
}

// check fails when a durable fleet's stream takes the subject. A NATS
// that does not answer is no finding: the check is made again.
func (g *coreGuard) check(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	name, err := rules.Claimed(ctx, g.js, durable.DefaultCheckpointBucket, g.subject)
	if err != nil {
		g.log.Warn("could not look for a durable fleet's stream on the subject; looking again in 10 s", zap.Error(err))
		return nil
	}
	if name != "" {
		return fmt.Errorf("sidecar: stream %s takes %s, and sidecars in a durable mode read it (its rules are recorded): in --nats-mode core this sidecar would count every mention a second time. Run it with --nats-mode jetstream (or partitioned), or, to move the fleet to core mode, stop the durable sidecars and delete the stream (docs/SEMANTICS.md, \"The stream carries its rules\")",
			name, g.subject)
	}
	return nil
}

// run checks again every coreGuardEvery until ctx ends, and returns the
// check's error, which stops the sidecar.
func (g *coreGuard) run(ctx context.Context) error {
	t := time.NewTicker(coreGuardEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		if err := g.check(ctx); err != nil {
			g.log.Error("a durable fleet counts this subject; stopping", zap.Error(err))
			return err
		}
	}
}
