package streams

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Partition is where one partition stream lives and what it holds, as
// `hotcount stream status` shows it.
type Partition struct {
	P        int      `json:"partition"`
	Stream   string   `json:"stream"`
	Leader   string   `json:"leader"`             // "" while it has none
	Replicas []string `json:"replicas,omitempty"` // the other servers holding it, current
	Behind   []string `json:"behind,omitempty"`   // replicas offline or catching up: no leader for now
	Msgs     uint64   `json:"messages"`
	Bytes    uint64   `json:"bytes"`
	// Epoch is the stream's creation time (Unix µs), its identity beside
	// its name; FirstSeq and LastSeq its sequences now.
	Epoch    int64  `json:"epoch"`
	FirstSeq uint64 `json:"first_sequence"`
	LastSeq  uint64 `json:"last_sequence"`
	Missing  bool   `json:"missing,omitempty"`
}

// Status reads the placement and state of the streams named, partition
// p's at names[p] (jetstream mode's one stream is partition 0).
func Status(ctx context.Context, js jetstream.JetStream, names []string) ([]Partition, error) {
	out := make([]Partition, len(names))
	for p, name := range names {
		out[p] = Partition{P: p, Stream: name}
		if err := status(ctx, js, &out[p]); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// requestTimeout bounds one JetStream API request: a stream between
// leaders may not answer at all, and a caller's longer deadline would
// otherwise be spent waiting for it.
const requestTimeout = 5 * time.Second

// status fills one partition's Partition.
func status(ctx context.Context, js jetstream.JetStream, out *Partition) error {
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	s, err := js.Stream(ctx, out.Stream)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		out.Missing = true
		return nil
	}
	if err != nil {
		return fmt.Errorf("streams: %s: %w", out.Stream, err)
	}
	info := s.CachedInfo()
	out.Msgs, out.Bytes = info.State.Msgs, info.State.Bytes
	out.Epoch, out.FirstSeq, out.LastSeq = info.Created.UnixMicro(), info.State.FirstSeq, info.State.LastSeq
	if ci := info.Cluster; ci != nil {
		out.Leader = ci.Leader
		for _, r := range ci.Replicas {
			if r.Offline || !r.Current {
				out.Behind = append(out.Behind, r.Name)
				continue
			}
			out.Replicas = append(out.Replicas, r.Name)
		}
	}
	return nil
}

// Leaders counts the partition streams each server leads.
func Leaders(ps []Partition) map[string]int {
	n := make(map[string]int)
	for _, p := range ps {
		if p.Leader != "" {
			n[p.Leader]++
		}
	}
	return n
}

// Spread moves partition streams' leaders until the servers lead about as
// many each (at most one apart), each move a leader step-down naming the
// least loaded of the stream's replicas as the preferred new leader. A stream held by one server (R1)
// cannot move and is left. An election can go another way than preferred,
// so Spread looks again after each round, up to spreadRounds rounds. It
// returns the leaders per server as it leaves them, and waits up to
// timeout for each new leader.
func Spread(ctx context.Context, nc *nats.Conn, js jetstream.JetStream, l Layout, timeout time.Duration) (map[string]int, error) {
	for round := 0; ; round++ {
		ps, err := Status(ctx, js, l.Names())
		if err != nil {
			return nil, err
		}
		load := Leaders(ps)
		moves := spreadMoves(ps, load)
		if len(moves) == 0 || round == spreadRounds {
			return load, nil
		}
		for stream, to := range moves {
			if err := StepDown(ctx, nc, stream, to); err != nil {
				return load, err
			}
			waitLeader(ctx, js, stream, to, timeout) //nolint:errcheck // elected elsewhere: the next round sees it
		}
	}
}

// spreadRounds bounds Spread's rounds of moves.
const spreadRounds = 4

// spreadMoves plans one round: stream -> the server to lead it. A stream
// moves when one of its replicas leads at least two fewer streams than its
// leader, to the least loaded of them; rounds of such moves end with the
// servers' loads at most one apart (as far as the replicas allow).
func spreadMoves(ps []Partition, load map[string]int) map[string]string {
	servers := 0
	seen := map[string]bool{}
	for _, p := range ps {
		for _, r := range append([]string{p.Leader}, p.Replicas...) {
			if r != "" && !seen[r] {
				seen[r] = true
				servers++
			}
		}
	}
	if servers < 2 {
		return nil
	}
	moves := map[string]string{}
	for _, p := range ps {
		if p.Leader == "" || len(p.Replicas) == 0 {
			continue
		}
		to := slices.MinFunc(p.Replicas, func(a, b string) int { return cmp.Compare(load[a], load[b]) })
		if load[to]+2 > load[p.Leader] {
			continue
		}
		moves[p.Stream] = to
		load[p.Leader]--
		load[to]++
	}
	return moves
}

// StepDown asks stream's leader to step down in favour of server (a
// server holding a replica of it).
func StepDown(ctx context.Context, nc *nats.Conn, stream, server string) error {
	req, _ := json.Marshal(map[string]any{"placement": map[string]string{"preferred": server}})
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	resp, err := nc.RequestWithContext(ctx, "$JS.API.STREAM.LEADER.STEPDOWN."+stream, req)
	if err != nil {
		return fmt.Errorf("streams: step down %s's leader: %w", stream, err)
	}
	var r struct {
		Error *struct {
			Description string `json:"description"`
		} `json:"error"`
	}
	if err := json.Unmarshal(resp.Data, &r); err != nil {
		return fmt.Errorf("streams: step down %s's leader: %w", stream, err)
	}
	if r.Error != nil {
		return fmt.Errorf("streams: step down %s's leader for %s: %s", stream, server, r.Error.Description)
	}
	return nil
}

// waitLeader polls stream's info until server leads it.
// Not a retry loop: a wait for an election (its LEADER_ELECTED advisory is at-most-once, and may be denied).
func waitLeader(ctx context.Context, js jetstream.JetStream, stream, server string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for {
		rctx, rcancel := context.WithTimeout(ctx, requestTimeout)
		s, err := js.Stream(rctx, stream)
		rcancel()
		if err == nil && s.CachedInfo().Cluster != nil && s.CachedInfo().Cluster.Leader == server {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}
