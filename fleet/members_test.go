package fleet_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/hotcount/hotcount/fleet"
	"github.com/hotcount/hotcount/internal/testtools/testenv"
)

// TestOwnerSpreadsAndMovesLittle: every partition has one owner among the
// members, the owners share the partitions about evenly, and a member's
// arrival moves only partitions to it.
func TestOwnerSpreadsAndMovesLittle(t *testing.T) {
	const parts = 256
	members := []string{"a1", "b2", "c3", "d4"}
	count := map[string]int{}
	before := make([]string, parts)
	for p := range parts {
		before[p] = fleet.Owner(p, members)
		count[before[p]]++
	}
	for _, m := range members {
		if n := count[m]; n < parts/4/2 || n > parts/4*2 {
			t.Errorf("%s owns %d of %d partitions, want about %d", m, n, parts, parts/4)
		}
	}
	moved := 0
	for p := range parts {
		after := fleet.Owner(p, append(slices.Clone(members), "e5"))
		if after != before[p] {
			moved++
			if after != "e5" {
				t.Errorf("partition %d moved from %s to %s, not to the newcomer", p, before[p], after)
			}
		}
	}
	if moved == 0 || moved > parts/5*2 {
		t.Errorf("%d of %d partitions moved to a fifth member, want about %d", moved, parts, parts/5)
	}
}

// start runs run until the test ends, or until the stop it returns is
// called (once or more), and fails the test if run returns an error.
func start(t testing.TB, run func(context.Context) error) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := run(ctx); err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	stop = sync.OnceFunc(func() { cancel(); <-done })
	t.Cleanup(stop)
	return stop
}

// TestFleetFollowsMembers: sidecars see each other join, one that leaves
// is gone at once, one that goes silent is gone after Expiry intervals,
// and the partitions are always divided among the live ones.
func TestFleetFollowsMembers(t *testing.T) {
	ns := testenv.NATS(t)
	const every = 50 * time.Millisecond
	leave := map[*fleet.Members]func(){}
	join := func(id, scope string) *fleet.Members {
		m := fleet.NewMembers(testenv.Connect(t, ns.ClientURL()), fleet.DefaultMembersSubject, id, scope, every, zaptest.NewLogger(t))
		if m.Settled() {
			t.Error("settled before listening")
		}
		leave[m] = start(t, m.Run)
		return m
	}
	a, b, c := join("a", "T/S"), join("b", "T/S"), join("c", "T/S")
	other := join("x", "other-table/S") // another deployment on the same server
	sees := func(m *fleet.Members, want ...string) {
		t.Helper()
		testenv.Eventually(t, 5*time.Second, func() error {
			if got := m.Live(); !slices.Equal(got, want) {
				return fmt.Errorf("members %v, want %v", got, want)
			}
			return nil
		})
	}
	for _, f := range []*fleet.Members{a, b, c} {
		sees(f, "a", "b", "c")
	}
	sees(other, "x")
	owned := 0
	for _, f := range []*fleet.Members{a, b, c} {
		owned += len(f.Owned(64))
	}
	if owned != 64 {
		t.Errorf("the three own %d of 64 partitions", owned)
	}

	leave[c]()
	left := time.Now()
	sees(a, "a", "b")
	if d := time.Since(left); d > fleet.Expiry*every {
		t.Errorf("a leaving sidecar was seen gone after %s, want at once", d)
	}

	// Silence: d's connection closes without a word (a crash).
	dConn := testenv.Connect(t, ns.ClientURL())
	d := fleet.NewMembers(dConn, fleet.DefaultMembersSubject, "d", "T/S", every, zaptest.NewLogger(t))
	start(t, d.Run)
	sees(a, "a", "b", "d")
	sees(b, "a", "b", "d")
	sees(d, "a", "b", "d")
	dConn.Close()
	sees(a, "a", "b")
	sees(b, "a", "b")
	// d, cut off, hears nobody, itself included: it must not conclude that
	// the others died and claim every partition.
	if got := d.Live(); !slices.Equal(got, []string{"a", "b", "d"}) {
		t.Errorf("the cut-off sidecar sees %v, want the fleet it last heard", got)
	}
	if got := len(a.Owned(64)) + len(b.Owned(64)); got != 64 {
		t.Errorf("a and b own %d of 64 partitions", got)
	}
}
