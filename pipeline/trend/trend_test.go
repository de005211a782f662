package trend

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/hotcount/hotcount/internal/testtools/testenv"
	"github.com/hotcount/hotcount/schema"
)

func TestParseWindow(t *testing.T) {
	for in, want := range map[string]time.Duration{
		"1m": time.Minute, "15m": 15 * time.Minute, "90m": 90 * time.Minute,
		"1h": time.Hour, "24h": 24 * time.Hour, "7d": 7 * 24 * time.Hour,
	} {
		got, err := ParseWindow(in)
		if err != nil || got != want {
			t.Errorf("ParseWindow(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, in := range []string{"", "m", "0m", "-5m", "+5m", "1.5h", "5s", "5", "1w", "99999999m", "1h30m"} {
		if _, err := ParseWindow(in); !errors.Is(err, ErrBadRequest) {
			t.Errorf("ParseWindow(%q) = %v, want a bad request", in, err)
		}
	}
	for d, want := range map[time.Duration]string{time.Minute: "1m", 90 * time.Minute: "90m", 2 * time.Hour: "2h", 48 * time.Hour: "2d"} {
		if got := FormatWindow(d); got != want {
			t.Errorf("FormatWindow(%v) = %q, want %q", d, got, want)
		}
	}
}

// TestPlan: a window is read as the buckets that cover [now − window,
// now], the first the one now − window falls in, the last the one now
// falls in; minutes up to the minute span, hours beyond; never past a
// granularity's retention.
func TestPlan(t *testing.T) {
	now := time.Date(2026, 12, 3, 10, 7, 30, 0, time.UTC)
	cfg := Config{Minutes: true, Hours: true}
	sp, err := cfg.plan(15*time.Minute, now)
	if err != nil || sp.G != schema.Minute || sp.Buckets() != 16 || !sp.From.Equal(time.Date(2026, 12, 3, 9, 52, 0, 0, time.UTC)) || !sp.To.Equal(now) {
		t.Errorf("15m: %+v, %v", sp, err)
	}
	sp, err = cfg.plan(24*time.Hour, now)
	if err != nil || sp.G != schema.Hour || sp.Buckets() != 25 || !sp.From.Equal(time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)) {
		t.Errorf("24h: %+v, %v", sp, err)
	}
	if _, err := cfg.plan(40*24*time.Hour, now); !errors.Is(err, ErrBadRequest) {
		t.Errorf("40d, past the hours' 35 days: %v, want a bad request", err)
	}
	hoursOnly := Config{Hours: true}
	if sp, err := hoursOnly.plan(15*time.Minute, now); err != nil || sp.G != schema.Hour || sp.Buckets() != 2 {
		t.Errorf("15m with hours only: %+v, %v; want the hour before and the current one", sp, err)
	}
	// Whatever the second: from at or before now − window, at most one
	// bucket earlier.
	for sec := range 60 {
		at := now.Truncate(time.Minute).Add(time.Duration(sec) * time.Second)
		sp, err := cfg.plan(time.Minute, at)
		if from := at.Add(-time.Minute); err != nil || sp.From.After(from) || from.Sub(sp.From) >= time.Minute || !sp.To.Equal(at) {
			t.Errorf("1m at second %d: %+v, %v; want from in (%s − 1m, %s]", sec, sp, err, from, from)
		}
	}
	minutesOnly := Config{Minutes: true, Retention: schema.Retention{Minute: 2 * time.Hour}}
	if _, err := minutesOnly.plan(3*time.Hour, now); !errors.Is(err, ErrBadRequest) {
		t.Errorf("3h with minutes kept 2h: %v, want a bad request", err)
	}
	if _, err := (Config{}).plan(time.Hour, now); !errors.Is(err, ErrBadRequest) {
		t.Errorf("windows off: %v, want a bad request", err)
	}
}

// TestScore: a steady topic scores about 0 however large; a spike scores
// by its size against its noise, so a tiny topic's spike does not beat a
// real surge.
func TestScore(t *testing.T) {
	if s := Score(10_000, 10_000); s != 0 {
		t.Errorf("steady 10k: %v", s)
	}
	tiny, surge := Score(20, 1), Score(2000, 100)
	if tiny >= surge {
		t.Errorf("a spike from 1 to 20 (%v) beats a surge from 100 to 2,000 (%v)", tiny, surge)
	}
	if Score(5, 10) >= 0 {
		t.Errorf("a falling topic scores %v", Score(5, 10))
	}
}

// TestBaseline: a short window is scored against the four windows before
// it in minutes, a long one against the whole hours before it; expect
// scales the baseline's rate to the time the window covers so far.
func TestBaseline(t *testing.T) {
	now := time.Date(2026, 12, 3, 10, 7, 30, 0, time.UTC)
	cfg := Config{Minutes: true, Hours: true}
	w, _ := cfg.plan(5*time.Minute, now)
	if b := cfg.baseline(w); b.G != schema.Minute || b.Buckets() != 20 || b.Last != w.First-1 {
		t.Errorf("5m: baseline %+v", b)
	}
	w, _ = cfg.plan(time.Hour, now)
	if b := cfg.baseline(w); b.G != schema.Hour || b.Buckets() != 4 || !b.To.Equal(time.Date(2026, 12, 3, 9, 0, 0, 0, time.UTC)) {
		t.Errorf("1h: baseline %+v", b)
	}
	at := func(m int64) time.Time { return schema.Minute.Start(m) }
	base := Span{G: schema.Minute, First: 80, Last: 99, From: at(80), To: at(100)}
	if e := expect(40, base, Span{G: schema.Minute, First: 100, Last: 104, From: at(100), To: at(105)}); e != 10 {
		t.Errorf("40 over 20 minutes expects %v in 5, want 10", e)
	}
	// The window's last minute half gone: 4.5 minutes expect 9.
	if e := expect(40, base, Span{G: schema.Minute, First: 100, Last: 104, From: at(100), To: at(104).Add(30 * time.Second)}); e != 9 {
		t.Errorf("40 over 20 minutes expects %v in 4.5, want 9", e)
	}
	if e := expect(40, Span{First: 100, Last: 99}, base); e != 0 {
		t.Errorf("an empty baseline expects %v", e)
	}
}

// TestSketch: merged summaries rank a surging topic's candidates first,
// older minutes fold into blocks that still count for the baseline, and
// the sketch stays bounded however many topics come.
func TestSketch(t *testing.T) {
	now := time.Date(2026, 12, 3, 12, 0, 30, 0, time.UTC)
	s := newSketch(func() time.Time { return now })
	last := schema.Minute.Index(now)
	for i := last - 120; i <= last; i++ {
		m := map[string]int64{"steady": 1000, "surge": 5}
		if i > last-5 {
			m["surge"] = 500
		}
		for k := range 3000 { // a long tail, more than the sketch keeps
			m["tail-"+strconv.Itoa(int(i)*3000+k)] = 1
		}
		s.Merge(Summary{Writer: "w", Minutes: map[int64]map[string]int64{i: m}})
	}
	if int64(len(s.mentions.minutes)) > recentMinutes || len(s.mentions.blocks) > int(sketchMinutes/blockMinutes)+1 {
		t.Errorf("%d minute maps and %d blocks kept", len(s.mentions.minutes), len(s.mentions.blocks))
	}
	for _, m := range s.mentions.minutes {
		if len(m) > 2*sketchTopics {
			t.Errorf("a minute keeps %d topics", len(m))
		}
	}
	cfg := Config{Minutes: true, Hours: true}
	window, _ := cfg.plan(5*time.Minute, now)
	got := s.candidates(window, cfg.baseline(window), 2, ByMentions, 0, 0, nil)
	if len(got) != 2 || got[0] != "surge" {
		t.Errorf("candidates %v, want surge first", got)
	}
	// An hour window is scored against hours, which reach into the blocks:
	// steady stays steady.
	window, _ = cfg.plan(time.Hour, now)
	if got := s.candidates(window, cfg.baseline(window), 1, ByMentions, 0, 0, nil); len(got) != 1 || got[0] != "surge" {
		t.Errorf("hour candidates %v, want surge", got)
	}
}

// TestBadWindows: windows and steps out of range are the caller's error,
// never a panic or a read past the bounds.
func TestBadWindows(t *testing.T) {
	st := openBolt(t)
	s := New(Config{Minutes: true, Hours: true, CacheTTL: time.Second, CacheSize: 10}, st, prometheus.NewRegistry(), time.Now)
	ctx := context.Background()
	for _, q := range [][2]string{{"11574d", "100000d"}, {"100000d", "100000d"}, {"1h", "1d"}, {"30d", "1m"}, {"0m", "1m"}} {
		if _, err := s.SeriesOf(ctx, "golang", q[0], q[1]); !errors.Is(err, ErrBadRequest) {
			t.Errorf("series window %s step %s: %v, want a bad request", q[0], q[1], err)
		}
	}
	for _, w := range []string{"36d", "401d", "", "1y"} {
		if _, err := s.Window(ctx, "golang", w); !errors.Is(err, ErrBadRequest) {
			t.Errorf("window %q: %v, want a bad request", w, err)
		}
	}
	for _, w := range []string{"61m", "2h", "35d"} {
		if _, err := s.Window(ctx, "golang", w); err != nil {
			t.Errorf("window %q: %v", w, err)
		}
	}
	// A day of minutes is 1,441 points with the minute now − 1d falls in;
	// a series up to the retention reads from that bucket, not from its
	// step's start, whatever the time of day.
	for _, q := range [][2]string{{"1d", "1m"}, {"1440m", "1m"}, {"35d", "1d"}, {"35d", "12h"}} {
		if sr, err := s.SeriesOf(ctx, "golang", q[0], q[1]); err != nil || len(sr.Points) == 0 || sr.Points[0].From.Before(sr.From) {
			t.Errorf("series window %s step %s: %d points from %v, %v", q[0], q[1], len(sr.Points), sr.From, err)
		}
	}
	if _, err := s.Trending(ctx, "2h", 10); !errors.Is(err, ErrBadRequest) {
		t.Errorf("trending over 2h: %v, want a bad request", err)
	}
}

// TestWindowAnsweredAsAsked: a window asked as 24h is answered as 24h,
// and as 1d as 1d, from one cache entry; a series' step likewise.
func TestWindowAnsweredAsAsked(t *testing.T) {
	st := openBolt(t)
	reg := prometheus.NewRegistry()
	s := New(Config{Minutes: true, Hours: true, CacheTTL: time.Minute, CacheSize: 10}, st, reg, time.Now)
	ctx := context.Background()
	for _, w := range []string{"24h", "1d", "24h", "1440m"} {
		c, err := s.Window(ctx, "golang", w)
		if err != nil || c.Window != w {
			t.Errorf("window %s answered %q (%v)", w, c.Window, err)
		}
	}
	if n := testenv.MetricWith(t, reg, "hotcount_trend_reads_total", "source", "store"); n != 1 {
		t.Errorf("%v store reads for one window asked four ways, want 1", n)
	}
	sr, err := s.SeriesOf(ctx, "golang", "60m", "60m")
	if err != nil || sr.Window != "60m" || sr.Step != "60m" {
		t.Errorf("series 60m by 60m answered window %q step %q (%v)", sr.Window, sr.Step, err)
	}
}

// TestNewTopicsInAnOldFleet: three hours of steady topics, then 40 topics
// never seen before with 50 mentions each in the last five minutes. The
// fleet's history is old, so the new topics have a baseline of 0 and are
// the list, even though every candidate is new.
func TestNewTopicsInAnOldFleet(t *testing.T) {
	ctx := context.Background()
	st := openBolt(t)
	now := time.Date(2026, 12, 3, 12, 0, 30, 0, time.UTC)
	clock := func() time.Time { return now }
	s := New(Config{Minutes: true, Hours: true, CacheTTL: time.Second, CacheSize: 10}, st, prometheus.NewRegistry(), clock)
	sk := newSketch(clock)
	s.UseSketch(sk)
	last := schema.Minute.Index(now)
	add := func(topic string, minute, n int64) {
		for _, g := range []schema.Granularity{schema.Minute, schema.Hour} {
			i := minute
			if g == schema.Hour {
				i = schema.Hour.Index(schema.Minute.Start(minute))
			}
			if err := st.Add(ctx, testenv.Inc(schema.BucketOf(topic, g, i), 0, n), now); err != nil {
				t.Fatal(err)
			}
		}
	}
	for m := last - 180; m <= last; m++ {
		sum := Summary{Minutes: map[int64]map[string]int64{m: {"steady": 100}}}
		add("steady", m, 100)
		if m > last-5 {
			for k := range 40 {
				topic := "new-" + strconv.Itoa(k)
				sum.Minutes[m][topic] = 10
				add(topic, m, 10)
			}
		}
		sk.Merge(sum)
	}
	if err := st.MarkHistory(ctx, schema.Minute.Start(last-180)); err != nil {
		t.Fatal(err)
	}
	for _, w := range []string{"5m", "15m", "1h"} {
		tr, err := s.Trending(ctx, w, 10)
		if err != nil {
			t.Fatal(err)
		}
		if len(tr.Topics) != 10 || tr.Note != "" || tr.Topics[0].Baseline != 0 || !strings.HasPrefix(tr.Topics[0].Topic, "new-") {
			t.Errorf("%s: %+v (note %q), want ten new topics with baseline 0", w, tr.Topics, tr.Note)
		}
	}
}

// TestHistoryFollowsABackfill: the fleet's history starts at the earliest
// minute written, also when a later flush writes earlier minutes than the
// first one did (mentions stamped with an old "at").
func TestHistoryFollowsABackfill(t *testing.T) {
	ctx := context.Background()
	st := openBolt(t)
	now := time.Date(2026, 12, 3, 12, 0, 30, 0, time.UTC)
	s := New(Config{Minutes: true, Hours: true, CacheTTL: time.Second, CacheSize: 10}, st, prometheus.NewRegistry(), func() time.Time { return now })
	last := schema.Minute.Index(now)
	for _, step := range []struct {
		minute int64
		want   int64
	}{{last, last}, {last - 1, last - 1}, {last - 90, last - 90}, {last - 5, last - 90}} {
		s.Observe(map[schema.Counter]int64{schema.BucketOf("a", schema.Minute, step.minute): 1, schema.TotalOf("a"): 1})
		got, err := st.HistoryStart(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if want := schema.Minute.Start(step.want); !got.Equal(want) {
			t.Errorf("after a flush of minute %d: history starts %v, want %v", step.minute-last, got, want)
		}
		if h, err := s.historyStart(ctx); err != nil || !h.Equal(got) {
			t.Errorf("the service's history start %v, %v; the store's %v", h, err, got)
		}
	}
}

// TestLateWritesAreReadAgain: a settled bucket's count is cached, but a
// write to it heard of afterwards (a backfill's flush, in the fleet's
// summaries or this sidecar's own) has it read again, its minute's hour
// too; then it is cached again.
func TestLateWritesAreReadAgain(t *testing.T) {
	ctx := context.Background()
	st := openBolt(t)
	clk := testenv.NewClock(time.Date(2026, 12, 3, 12, 0, 30, 0, time.UTC))
	s := New(Config{Minutes: true, Hours: true, CacheTTL: time.Second, CacheSize: 10}, st, prometheus.NewRegistry(), clk.Now)
	sk := newSketch(clk.Now)
	s.UseSketch(sk)
	m := schema.Minute.Index(clk.Now()) - 70 // settled, and its hour too
	h := schema.Hour.Index(schema.Minute.Start(m))
	minute, hour := Span{G: schema.Minute, First: m, Last: m}, Span{G: schema.Hour, First: h, Last: h}
	write := func(n int64) {
		for _, c := range []schema.Counter{schema.BucketOf("a", schema.Minute, m), schema.BucketOf("a", schema.Hour, h)} {
			if err := st.Add(ctx, testenv.Inc(c, 0, n), clk.Now()); err != nil {
				t.Fatal(err)
			}
		}
	}
	read := func(sp Span) int64 {
		t.Helper()
		sums, _, err := s.read(ctx, "a", []Span{sp})
		if err != nil {
			t.Fatal(err)
		}
		return sums[0][0]
	}
	check := func(when string, wantMinute, wantHour int64) {
		t.Helper()
		if got := read(minute); got != wantMinute {
			t.Errorf("%s: minute %d, want %d", when, got, wantMinute)
		}
		if got := read(hour); got != wantHour {
			t.Errorf("%s: hour %d, want %d", when, got, wantHour)
		}
	}
	write(5)
	check("first read", 5, 5)
	write(7) // unannounced: the cached counts stand
	check("cached", 5, 5)

	clk.Add(time.Second)
	sk.Merge(Summary{Writer: "other", Minutes: map[int64]map[string]int64{m: {"a": 7}}})
	clk.Add(time.Second)
	check("after the fleet's summary", 12, 12)
	write(1)
	check("cached again", 12, 12)

	clk.Add(time.Second)
	s.Observe(map[schema.Counter]int64{schema.BucketOf("a", schema.Minute, m): 1, schema.BucketOf("a", schema.Hour, h): 1})
	clk.Add(time.Second)
	check("after this sidecar's flush", 13, 13)
}
