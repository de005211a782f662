package durable

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/hotcount/hotcount/durability/rules"
	"github.com/hotcount/hotcount/pipeline/ingest"
)

// errRefused is the error of a stream whose rules this sidecar cannot
// follow: it stops the engine (Run).
var errRefused = errors.New("durable: refused")

// agreeAll records or reads the rules of every stream of the mode that
// exists, and refuses (errRefused) when the rules in force now differ from
// this sidecar's settings in what it cannot follow: a sidecar started
// with another --table or --region does not start.
func (e *Engine) agreeAll(ctx context.Context) error {
	for p := range max(e.cfg.Partitions, 1) {
		name := e.streamName(p)
		if _, err := e.js.Stream(ctx, name); err != nil {
			continue // not there yet, or NATS away: its reader checks when it reads
		}
		h, err := e.book.Open(ctx, name, e.Own())
		if err != nil {
			if errors.Is(err, rules.ErrRolledBack) {
				e.metrics.backwards.Inc()
			}
			e.sampled.Warn("the stream's rules not read at the start; its reader reads them", zap.String("stream", name), zap.Error(err))
			continue
		}
		if c, ok := h.Latest(); ok {
			if err := e.agree(name, c.Rules); err != nil {
				return err
			}
		}
	}
	return nil
}

// judgement is how a reading judges a message: its stream's rules in
// force at the message's sequence, as take uses them.
type judgement struct {
	limits         ingest.Limits
	minutes, hours bool
}

func judgementOf(r rules.Rules) judgement {
	return judgement{limits: r.Limits(), minutes: r.Minutes, hours: r.Hours}
}

// agree compares the stream's rules r with this sidecar's settings. Where
// they judge a message differently (--max-count, --windows, ...), the
// sidecar follows the stream, and says so; where they would have it read
// other streams or write other items (--table, --region, ...), it does
// not read the stream, and the error names the settings and the command
// that changes the stream's rules.
func (e *Engine) agree(name string, r rules.Rules) error {
	ds := rules.Differences(r, e.Own())
	refused := rules.Structural(ds)
	e.metrics.ruleDiffs.WithLabelValues("followed").Set(float64(len(ds) - len(refused)))
	e.metrics.ruleDiffs.WithLabelValues("refused").Set(float64(len(refused)))
	if len(refused) > 0 {
		var why, set []string
		for _, d := range refused {
			why = append(why, d.String())
			v := d.Own
			if v == "" {
				v = `""`
			}
			set = append(set, "--"+d.Setting+" "+v)
		}
		return fmt.Errorf("%w: stream %s: this sidecar's settings differ from the stream's rules in what decides which streams and items its counts go to (%s); it does not read the stream. Run it with the stream's values, or change the stream's rules for the whole fleet first: hotcount stream rules set %s (docs/SEMANTICS.md, \"The stream carries its rules\")",
			errRefused, name, strings.Join(why, "; "), strings.Join(set, " "))
	}
	for _, d := range ds {
		e.log.Warn("following the stream's rules, not this sidecar's setting", zap.String("stream", name),
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
	if err := e.agree(r.s.name, e.tableNow(r.s.name, c.Rules)); err != nil {
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
