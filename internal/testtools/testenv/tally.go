package testenv

import (
	"fmt"
	"maps"
	"strings"
	"sync"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/hotcount/hotcount/mention"
)

// Tally counts the mentions a core NATS subscriber receives, by topic: what
// a reader that keeps up gets of what producers published.
type Tally struct {
	mu  sync.Mutex
	got map[string]int64
}

// NewTally subscribes to subject on the server at url and counts each
// message's mentions (mention.Count) under its subject past prefix. A
// message that carries no valid count fails the test. It is subscribed
// (the server has the interest) when NewTally returns.
func NewTally(t testing.TB, url, subject, prefix string) *Tally {
	t.Helper()
	nc := Connect(t, url)
	tl := &Tally{got: make(map[string]int64)}
	if _, err := nc.Subscribe(subject, func(m *nats.Msg) {
		n, err := mention.Count(m.Data, mention.DefaultMaxCount)
		if err != nil {
			t.Errorf("%s %q: %v", m.Subject, m.Data, err)
		}
		tl.mu.Lock()
		tl.got[strings.TrimPrefix(m.Subject, prefix)] += n
		tl.mu.Unlock()
	}); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return tl
}

// Is says (nil) whether the tally is exactly want, topic by topic.
func (tl *Tally) Is(want map[string]int64) error {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	if !maps.Equal(tl.got, want) {
		return fmt.Errorf("received %d topics %v, want %d topics %v", len(tl.got), tl.got, len(want), want)
	}
	return nil
}
