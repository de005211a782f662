package durable

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/hotcount/hotcount/durability/rules"
	"github.com/hotcount/hotcount/mention"
)

// errRefused is the error of a stream whose rules this sidecar cannot
// follow: it stops the engine (Run).
var errRefused = errors.New("durable: refused")

// agreeAll records or reads the rules of every stream of the mode that
// exists, and refuses (errRefused) a sidecar that has nothing to read
// (useful): started with another --table or --region than the fleet's.
func (e *Engine) agreeAll(ctx context.Context) error {
	ok, why, err := e.useful(ctx)
	if err != nil || ok {
		return nil // NATS away, or work to do: each reader checks its own
	}
	return why
}

// useful says whether this sidecar's settings can write some stream of
// the mode: those of the rules in force now, or of the rules of the first
// message a reader would judge from its checkpoint (a stream not read up
// to a change of the Region layout or a retention is a sidecar's of the
// earlier settings to read up to it). why is the refusal when not.
func (e *Engine) useful(ctx context.Context) (ok bool, why, err error) {
	own := e.Own()
	seen := false
	for p := range max(e.cfg.Partitions, 1) {
		name := e.streamName(p)
		st, err := e.js.Stream(ctx, name)
		if err != nil {
			continue // not there yet: its reader checks when it reads
		}
		h, err := e.book.Open(ctx, name, own)
		if err != nil {
			if errors.Is(err, rules.ErrRolledBack) {
				e.metrics.backwards.Inc()
			}
			return false, nil, err
		}
		cp, _, err := e.ckpt.load(ctx, name)
		if err != nil {
			return false, nil, err
		}
		epoch := epochOf(st.CachedInfo())
		next := uint64(1)
		if cp.Epoch == epoch {
			next = cp.Seq + 1
		}
		now, _ := h.In(epoch, math.MaxUint64)
		first, _ := h.In(epoch, next+1)
		e.histMu.Lock()
		e.hist[name] = h
		e.histMu.Unlock()
		if !seen {
			all := rules.Differences(now, own)
			e.metrics.ruleDiffs.WithLabelValues("followed").Set(float64(len(all) - len(rules.Structural(all))))
		}
		seen = true
		nowDs := rules.Structural(rules.Differences(now, own))
		if len(nowDs) == 0 || len(rules.Structural(rules.Differences(e.tableNow(name, first), own))) == 0 {
			return true, nil, nil
		}
		if why == nil {
			why = refusal(name, nowDs)
		}
	}
	return !seen, why, nil
}

// refusal is the error of a sidecar whose settings ds differ from the
// rules of stream name in what decides which items its counts go to.
func refusal(name string, ds []rules.Difference) error {
	var why, set []string
	for _, d := range ds {
		why = append(why, d.String())
		v := d.Own
		if v == "" {
			v = `""`
		}
		set = append(set, "--"+d.Setting+" "+v)
	}
	return fmt.Errorf("%w: stream %s: this sidecar's settings differ from the stream's rules in what decides which streams and items its counts go to (%s), and no stream has messages left under rules it can write. Run it with the stream's values, or change the stream's rules for the whole fleet first: hotcount stream rules set %s (docs/SEMANTICS.md, \"The stream carries its rules\")",
		errRefused, name, strings.Join(why, "; "), strings.Join(set, " "))
}

// judgement is how a reading judges a message: its stream's rules in
// force at the message's sequence, as take uses them.
type judgement struct {
	limits         mention.Limits
	minutes, hours bool
}

func judgementOf(r rules.Rules) judgement {
	return judgement{limits: r.Limits(), minutes: r.Minutes, hours: r.Hours}
}

// agree compares the rules r of the next message a reader of stream name
// judges with this sidecar's settings. Where they judge a message
// differently (--max-count, --windows, ...), the sidecar follows the
// stream, and says so. Where they would have it write other items
// (--region, a retention; --table against the rules in force now), it
// does not read the stream (a non-fatal error, tried again): either the
// messages are a sidecar's of the earlier settings, which stops there, or
// this one waits for them. When it has nothing left to read anywhere
// (useful), the error is errRefused and the engine stops.
func (e *Engine) agree(ctx context.Context, name string, r rules.Rules) error {
	ds := rules.Differences(e.tableNow(name, r), e.Own())
	refused := rules.Structural(ds)
	e.metrics.ruleDiffs.WithLabelValues("followed").Set(float64(len(ds) - len(refused)))
	e.refusing.Store(name, len(refused) > 0)
	n := 0
	e.refusing.Range(func(_, v any) bool {
		if v.(bool) {
			n++
		}
		return true
	})
	e.metrics.ruleDiffs.WithLabelValues("refused").Set(float64(n))
	if len(refused) > 0 {
		if ok, why, err := e.useful(ctx); err == nil && !ok {
			return why
		}
		return fmt.Errorf("stream %s: from here its rules differ from this sidecar's settings in what decides which items its counts go to (%s): not reading it. A sidecar of the settings in force reads on from where those of the earlier ones stopped (docs/SEMANTICS.md, \"The stream carries its rules\")",
			name, refused[0])
	}
	for _, d := range ds {
		e.sampled.Warn("following the stream's rules, not this sidecar's setting", zap.String("stream", name),
			zap.String("setting", d.Setting), zap.String("stream_value", d.Stream), zap.String("own", d.Own))
	}
	return nil
}

// changed takes a rules message met in r's reading: from the next
// sequence on, the reading judges by the new rules. A change this
// sidecar cannot follow ends the reading (the next start refuses the
// stream, naming the settings); a malformed one too: no mention after it
// can be judged.
func (e *Engine) changed(r *reading, msg jetstream.Msg) error {
	c, err := rules.Parse(msg.Data(), r.s.epoch, r.last)
	if err != nil {
		return fmt.Errorf("stream %s: a rules message that is not one (published by hand to %s?): %w", r.s.name, msg.Subject(), err)
	}
	e.histMu.Lock()
	e.hist[r.s.name] = e.hist[r.s.name].With(c)
	e.histMu.Unlock()
	if err := e.agree(r.ctx, r.s.name, c.Rules); err != nil {
		return err
	}
	r.j = judgementOf(c.Rules)
	e.win.skip(r.s, r.last)
	e.metrics.ruleChanges.Inc()
	e.log.Info("the stream's rules changed", zap.String("stream", r.s.name), zap.Uint64("seq", c.Seq),
		zap.String("by", c.By), zap.String("why", c.Why))
	return nil
}

// tableNow is r with the table of the stream's last change: the table is
// where the whole fleet's counts live, not a judgement of one message, so
// a sidecar of the table in force reads again (a rewind) the messages of
// an earlier table too; the items it writes then are its table's.
func (e *Engine) tableNow(name string, r rules.Rules) rules.Rules {
	e.histMu.Lock()
	defer e.histMu.Unlock()
	if c, ok := e.hist[name].Latest(); ok {
		r.Table = c.Rules.Table
	}
	return r
}

// judgementAt is how the message at seq of s is judged: for a recount,
// which reads one topic's subject and so meets no rules message.
func (e *Engine) judgementAt(s stream, seq uint64) judgement {
	e.histMu.Lock()
	defer e.histMu.Unlock()
	r, ok := e.hist[s.name].In(s.epoch, seq)
	if !ok {
		r = e.Own() // no reading started here: nothing recorded to follow
	}
	return judgementOf(r)
}
