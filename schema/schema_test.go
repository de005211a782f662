package schema_test

import (
	"testing"
	"time"
	"unicode/utf8"

	"github.com/hotcount/hotcount/schema"
)

// TestBucketKeys: bucket keys round-trip for topics with '#', digits and
// the other kinds' prefixes in them, and never meet a total's key.
func TestBucketKeys(t *testing.T) {
	at := time.Date(2026, 12, 3, 8, 59, 30, 0, time.UTC)
	m, h := schema.Minute.Index(at), schema.Hour.Index(at)
	if got := schema.Minute.Start(m); !got.Equal(at.Truncate(time.Minute)) {
		t.Errorf("minute %d starts %v, want %v", m, got, at.Truncate(time.Minute))
	}
	if got := schema.Hour.Start(h); !got.Equal(at.Truncate(time.Hour)) {
		t.Errorf("hour %d starts %v, want %v", h, got, at.Truncate(time.Hour))
	}
	for _, topic := range []string{"golang", "a#1", "x#m5#0", "MINUTE#y", "3", "TREND#z#meta"} {
		for _, g := range []schema.Granularity{schema.Minute, schema.Hour} {
			pk := schema.BucketKey(topic, g, 29_000_123, 7)
			gotTopic, gotG, i, shard, err := schema.ParseBucketKey(pk)
			if err != nil || gotTopic != topic || gotG != g || i != 29_000_123 || shard != 7 {
				t.Errorf("ParseBucketKey(%q) = %q %c %d %d %v", pk, gotTopic, gotG, i, shard, err)
			}
			if _, _, err := schema.ParseShardKey(pk); err == nil {
				t.Errorf("bucket key %q parses as a total's shard key", pk)
			}
			if got := schema.BucketOf(topic, g, 29_000_123).Key(7); got != pk {
				t.Errorf("BucketOf(%q, %v).Key = %q, want %q", topic, g, got, pk)
			}
		}
		if got := schema.TotalOf(topic).Key(3); got != schema.ShardKey(topic, 3) {
			t.Errorf("TotalOf(%q).Key = %q, want its shard key", topic, got)
		}
	}
	fresh := schema.Counter{Topic: "golang", Kind: schema.Fresh, Index: m}
	if got, want := fresh.Key(0), schema.BucketKey("golang", schema.Minute, m, 0); got != want {
		t.Errorf("a Fresh counter's key %q, want its minute's %q", got, want)
	}
}

// TestCounters: what a counter is, and how a Fresh one splits.
func TestCounters(t *testing.T) {
	at := time.Date(2026, 12, 3, 8, 59, 30, 0, time.UTC)
	m, h := schema.Minute.Index(at), schema.Hour.Index(at)
	total, minute, hour := schema.TotalOf("golang"), schema.BucketOf("golang", schema.Minute, m), schema.BucketOf("golang", schema.Hour, h)
	fresh := schema.Counter{Topic: "golang", Kind: schema.Fresh, Index: m}
	for _, c := range []struct {
		c                schema.Counter
		bucket, mentions bool
		g                schema.Granularity
		hasG             bool
	}{
		{total, false, true, 0, false},
		{fresh, true, true, 0, false},
		{minute, true, false, schema.Minute, true},
		{hour, true, false, schema.Hour, true},
	} {
		g, ok := c.c.Granularity()
		if c.c.IsBucket() != c.bucket || c.c.CountsMentions() != c.mentions || g != c.g || ok != c.hasG {
			t.Errorf("%+v: IsBucket %v, CountsMentions %v, Granularity %v %v", c.c, c.c.IsBucket(), c.c.CountsMentions(), g, ok)
		}
	}
	if gotT, gotM, gotH := fresh.Split(); gotT != total || gotM != minute || gotH != hour {
		t.Errorf("Split = %+v, %+v, %+v", gotT, gotM, gotH)
	}
	if gotT, gotM, gotH := minute.Split(); gotT != (schema.Counter{}) || gotM != (schema.Counter{}) || gotH != (schema.Counter{}) {
		t.Errorf("a minute counter splits again: %+v, %+v, %+v", gotT, gotM, gotH)
	}
	r := schema.Retention{Minute: time.Hour}
	if got, want := r.Expiry(minute), at.Truncate(time.Minute).Add(time.Minute+time.Hour).Unix(); got != want {
		t.Errorf("minute expires at %d, want %d", got, want)
	}
	if got, want := r.Expiry(fresh), r.Expiry(minute); got != want {
		t.Errorf("a Fresh counter expires at %d, want its minute's %d", got, want)
	}
	if got, want := r.Expiry(hour), at.Truncate(time.Hour).Add(time.Hour+schema.DefaultHourRetention).Unix(); got != want {
		t.Errorf("hour expires at %d, want %d", got, want)
	}
	if got := r.Expiry(total); got != 0 {
		t.Errorf("a total expires at %d, want never (0)", got)
	}
}

// TestCounterNames: names round-trip for every kind, for topics with '#',
// '.', unicode and the other kinds' prefixes in them, and are laid out
// byte for byte as the journal entries and spill files of earlier
// versions hold them: a change of the encoding fails here.
func TestCounterNames(t *testing.T) {
	for _, c := range []struct {
		c    schema.Counter
		name string
	}{
		{schema.TotalOf("golang"), "golang"},
		{schema.Counter{Topic: "golang", Kind: schema.Fresh, Index: 29_000_123}, "\x01M1ke6xgolang"},
		{schema.BucketOf("golang", schema.Minute, 4097), "\x01m00101golang"},
		{schema.BucketOf("a.b#c", schema.Hour, 63), "\x01h0000_a.b#c"},
		{schema.BucketOf("t", schema.Minute, 1<<30-1), "\x01m_____t"},
	} {
		if got := c.c.Name(); got != c.name {
			t.Errorf("%+v named %q, want %q", c.c, got, c.name)
		}
		if got := string(c.c.AppendName([]byte("x"))); got != "x"+c.name {
			t.Errorf("%+v appended as %q, want %q", c.c, got, "x"+c.name)
		}
		if got, ok := schema.ParseName(c.name); !ok || got != c.c {
			t.Errorf("ParseName(%q) = %+v, %v; want %+v", c.name, got, ok, c.c)
		}
	}
	kinds := []schema.Kind{schema.Total, schema.Fresh, schema.MinuteBucket, schema.HourBucket}
	for _, topic := range []string{"golang", "a#1", "x#m5#0", "a.b.c", "MINUTE#y", "TREND#z#meta", "3", "héllo wörld", "日本語", "🔥#1.2"} {
		for _, k := range kinds {
			for _, i := range []int64{0, 1, 63, 64, 29_000_123, 1<<30 - 1} {
				c := schema.Counter{Topic: topic, Kind: k, Index: i}
				if k == schema.Total {
					c.Index = 0
				}
				name := c.Name()
				if got, ok := schema.ParseName(name); !ok || got != c {
					t.Errorf("ParseName(%q) = %+v, %v; want %+v", name, got, ok, c)
				}
				if !utf8.ValidString(name) {
					t.Errorf("%+v: name %q is not valid UTF-8 (journal entries are JSON)", c, name)
				}
				if err := schema.ValidateTopic(name, 1024); k != schema.Total && err == nil {
					t.Errorf("a bucket's name %q passes as a topic: it could meet one", name)
				}
			}
		}
	}
	// An index out of range is kept within it.
	if got, _ := schema.ParseName(schema.BucketOf("t", schema.Minute, -5).Name()); got.Index != 0 {
		t.Errorf("index -5 reads back as %d, want 0", got.Index)
	}
	if got, _ := schema.ParseName(schema.BucketOf("t", schema.Minute, 1<<40).Name()); got.Index != 1<<30-1 {
		t.Errorf("index 2^40 reads back as %d, want 2^30-1", got.Index)
	}
	// Named is the counter its name reads back as, in range or not.
	for _, i := range []int64{-5, 0, 4097, 1<<30 - 1, 1 << 40} {
		c := schema.Counter{Topic: "t", Kind: schema.Fresh, Index: i}
		if got, _ := schema.ParseName(c.Name()); got != c.Named() {
			t.Errorf("index %d: name reads back as %+v, Named is %+v", i, got, c.Named())
		}
	}
	// A damaged name is a total spelt like it, as it was read before.
	for _, name := range []string{"\x01", "\x01M0000", "\x01x00000t", "\x01m00!00t"} {
		if got, ok := schema.ParseName(name); ok || got != schema.TotalOf(name) {
			t.Errorf("ParseName(%q) = %+v, %v; want not ok, the total of %q", name, got, ok, name)
		}
	}
}

func TestInRegionRoundTrips(t *testing.T) {
	for _, key := range []string{
		schema.ShardKey("a#b.c", 3),
		schema.BucketKey("x.y", schema.Minute, 29000000, 0),
		schema.MetaKey("t"),
		schema.HistoryKey,
	} {
		in := schema.InRegion(key, "eu-west-1")
		base, region := schema.SplitRegion(in)
		if base != key || region != "eu-west-1" {
			t.Errorf("SplitRegion(InRegion(%q)) = %q, %q", key, base, region)
		}
		if base, region := schema.SplitRegion(key); base != key || region != "" {
			t.Errorf("SplitRegion(%q) = %q, %q: a single-Region key has no Region", key, base, region)
		}
	}
	if got := schema.InRegion(schema.ShardKey("golang", 2), "us-east-1"); got != "TREND#golang#us-east-1.2" {
		t.Errorf("a Region's shard key is %q", got)
	}
	topic, shard, err := schema.ParseShardKey("TREND#a.b#us-east-1.7")
	if err != nil || topic != "a.b" || shard != 7 {
		t.Errorf("ParseShardKey of a Region's key: %q %d %v", topic, shard, err)
	}
	for _, bad := range []string{"", "US-EAST-1", "us.east", "us#east", "a b"} {
		if schema.ValidateRegion(bad) == nil {
			t.Errorf("ValidateRegion(%q) accepted it", bad)
		}
	}
}

func TestShardKey(t *testing.T) {
	tests := []struct {
		topic string
		shard int
		want  string
	}{
		{"golang", 0, "TREND#golang#0"},
		{"eu.west.k8s", 3, "TREND#eu.west.k8s#3"},
		{"a#1", 2, "TREND#a#1#2"},
	}
	for _, tt := range tests {
		if got := schema.ShardKey(tt.topic, tt.shard); got != tt.want {
			t.Errorf("ShardKey(%q, %d) = %q, want %q", tt.topic, tt.shard, got, tt.want)
		}
		topic, shard, err := schema.ParseShardKey(tt.want)
		if err != nil || topic != tt.topic || shard != tt.shard {
			t.Errorf("ParseShardKey(%q) = %q, %d, %v; want %q, %d", tt.want, topic, shard, err, tt.topic, tt.shard)
		}
	}
	for _, bad := range []string{"golang#1", "TREND#golang", "TREND#golang#x", "TREND#golang#-1"} {
		if _, _, err := schema.ParseShardKey(bad); err == nil {
			t.Errorf("ParseShardKey(%q) accepted", bad)
		}
	}
}

func TestValidateTopic(t *testing.T) {
	tests := []struct {
		name  string
		topic string
		ok    bool
	}{
		{"plain", "golang", true},
		{"dots", "eu.west.k8s", true},
		{"unicode", "café-☕", true},
		{"at limit", "abcdefghijkl", true},
		{"empty", "", false},
		{"too long", "abcdefghijklm", false},
		{"invalid utf8", "a\xffb", false},
		{"newline", "a\nb", false},
		{"nul", "a\x00b", false},
		{"del", "a\x7fb", false},
		{"c1 control", "a\u0085b", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := schema.ValidateTopic(tt.topic, 12)
			if (err == nil) != tt.ok {
				t.Errorf("ValidateTopic(%q) = %v, want ok=%v", tt.topic, err, tt.ok)
			}
		})
	}
}

func TestNamedIsShort(t *testing.T) {
	for _, tt := range []struct {
		topics []string
		want   string
	}{
		{nil, ""},
		{[]string{"a"}, `"a"`},
		{[]string{"a", "b", "c"}, `"a", "b", "c"`},
		{[]string{"a", "b", "c", "d", "e"}, `"a", "b", "c" and 2 more`},
	} {
		if got := schema.Named(tt.topics); got != tt.want {
			t.Errorf("Named(%v) = %s, want %s", tt.topics, got, tt.want)
		}
	}
}
