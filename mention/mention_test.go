package mention_test

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/hotcount/hotcount/mention"
)

var limits = mention.Limits{MaxCount: 1000, MaxTopicBytes: 16}

func TestTopic(t *testing.T) {
	tests := []struct {
		name    string
		subject string
		want    string
		reason  string
	}{
		{"simple", "mentions.golang", "golang", ""},
		{"dots kept", "mentions.eu.west.k8s", "eu.west.k8s", ""},
		{"unicode", "mentions.café", "café", ""},
		{"at length limit", "mentions." + strings.Repeat("a", 16), strings.Repeat("a", 16), ""},
		{"too long", "mentions." + strings.Repeat("a", 17), "", mention.ReasonTopic},
		{"empty topic", "mentions.", "", mention.ReasonTopic},
		{"other prefix", "other.golang", "", mention.ReasonTopic},
		{"invalid utf8", "mentions.a\xffb", "", mention.ReasonTopic},
		{"control character", "mentions.a\x01b", "", mention.ReasonTopic},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := mention.Topic("mentions.", tt.subject, limits)
			checkReason(t, err, tt.reason)
			if got != tt.want {
				t.Errorf("Topic(%q) = %q, want %q", tt.subject, got, tt.want)
			}
		})
	}
}

func TestCount(t *testing.T) {
	tests := []struct {
		name    string
		payload string
		want    int64
		reason  string
	}{
		{"empty is one", "", 1, ""},
		{"count", `{"count": 5}`, 5, ""},
		{"count with spaces", ` { "count" : 7 } `, 7, ""},
		{"other fields ignored", `{"count": 2, "source": "web"}`, 2, ""},
		{"max", `{"count": 1000}`, 1000, ""},
		{"over max", `{"count": 1001}`, 0, mention.ReasonCount},
		{"zero", `{"count": 0}`, 0, mention.ReasonCount},
		{"negative", `{"count": -3}`, 0, mention.ReasonCount},
		{"fraction", `{"count": 1.5}`, 0, mention.ReasonCount},
		{"exponent", `{"count": 1e3}`, 0, mention.ReasonCount},
		{"string", `{"count": "5"}`, 0, mention.ReasonCount},
		{"bool", `{"count": true}`, 0, mention.ReasonCount},
		{"beyond int64", `{"count": 99999999999999999999}`, 0, mention.ReasonCount},
		{"null", `{"count": null}`, 0, mention.ReasonPayload},
		{"missing", `{"n": 5}`, 0, mention.ReasonPayload},
		{"not json", `five`, 0, mention.ReasonPayload},
		{"array", `[5]`, 0, mention.ReasonPayload},
		{"truncated", `{"count": 5`, 0, mention.ReasonPayload},
		{"too large", `{"count": 1, "pad": "` + strings.Repeat("x", mention.MaxPayloadBytes) + `"}`, 0, mention.ReasonPayload},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := mention.Count([]byte(tt.payload), limits.MaxCount)
			checkReason(t, err, tt.reason)
			if got != tt.want {
				t.Errorf("Count(%q) = %d, want %d", tt.payload, got, tt.want)
			}
		})
	}
}

func TestPrefix(t *testing.T) {
	tests := []struct {
		subject, want string
		ok            bool
	}{
		{"mentions.>", "mentions.", true},
		{"app.mentions.>", "app.mentions.", true},
		{">", "", false},
		{"mentions", "", false},
		{"mentions.*", "", false},
		{"mentions.*.>", "", false},
	}
	for _, tt := range tests {
		got, err := mention.Prefix(tt.subject)
		if (err == nil) != tt.ok || got != tt.want {
			t.Errorf("Prefix(%q) = %q, %v; want %q, ok=%v", tt.subject, got, err, tt.want, tt.ok)
		}
	}
}

func checkReason(t *testing.T, err error, reason string) {
	t.Helper()
	if reason == "" {
		if err != nil {
			t.Fatalf("unexpected error: %v", err)
		}
		return
	}
	var inv *mention.InvalidError
	if !errors.As(err, &inv) {
		t.Fatalf("error = %v, want an InvalidError with reason %q", err, reason)
	}
	if inv.Reason != reason {
		t.Errorf("reason = %q (%v), want %q", inv.Reason, err, reason)
	}
}

// FuzzCount: no payload panics, and an accepted one is always in 1..max.
func FuzzCount(f *testing.F) {
	for _, s := range []string{"", `{"count": 5}`, `{"count": -1}`, `{"count": 1e9}`, `{"count":"7"}`, `[`, `{"count": 18446744073709551616}`} {
		f.Add([]byte(s))
	}
	for _, s := range []string{` { "count" : 12 } `, "{\"count\":\t1\n}", `{"count":0}`, `{"count":01}`, `{"count":-0}`, `{"count":1.0}`,
		`{"count":9223372036854775807}`, `{"count":9223372036854775808}`, `{"count":1,"x":2}`, `{"COUNT":3}`, `{"count":2}}`, `{"count":3`, `{"count":1}` + strings.Repeat(" ", 5000)} {
		f.Add([]byte(s))
	}
	for _, s := range []string{`{"count":1,"at":1772366400000}`, ` { "count" : 2 , "at" : -5 } `, `{"count":1,"at":01}`, `{"count":1,"at":1.5}`,
		`{"count":1,"at":9223372036854775808}`, `{"count":1,"at":"2026-03-01T12:00:00Z"}`, `{"count":1,"at":"2026-03-01T12:00:00.123+01:00"}`,
		`{"count":1,"at":"2026-03-01"}`, `{"count":1,"at":null}`, `{"count":1,"at":true}`, `{"at":5,"count":1}`, `{"count":1,"at":5,"at":6}`,
		`{"count":0,"at":"x"}`, `{"count":1,"at":}`, `{"count":1,"AT":7}`, `{"count":1,}`} {
		f.Add([]byte(s))
	}
	for _, s := range []string{`{"count":1,"by":"u1"}`, `{"count":1,"at":1772366400000,"by":"u1"}`, ` { "count" : 2 , "by" : "a b" } `, `{"count":1,"by":""}`,
		`{"count":1,"by":"\u0041"}`, `{"count":1,"by":"é"}`, `{"count":1,"by":"\n"}`, `{"count":1,"by":7}`, `{"count":1,"by":null}`, `{"by":"x","count":1}`,
		`{"count":1,"by":"` + strings.Repeat("x", 129) + `"}`, `{"count":1,"by":"x","at":5}`, `{"count":1,"by":"x"`, `{"count":1,"by":"x}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, payload []byte) {
		p, err := mention.ParsePayload(payload, limits.MaxCount)
		if err == nil && (p.Count < 1 || p.Count > limits.MaxCount) {
			t.Fatalf("ParsePayload(%q) = %+v accepted outside 1..%d", payload, p, limits.MaxCount)
		}
		if err != nil && !same(p, mention.Payload{}) {
			t.Fatalf("ParsePayload(%q) = %+v with error %v", payload, p, err)
		}
		// The fast path changes nothing: the same count and time, or the
		// same rejection, as the strict parser.
		if len(payload) > 0 {
			sp, serr := mention.StrictPayload(payload, limits.MaxCount)
			if !same(p, sp) || (err == nil) != (serr == nil) || (err != nil && err.Error() != serr.Error()) {
				t.Fatalf("ParsePayload(%q) = %+v, %v; strict parser: %+v, %v", payload, p, err, sp, serr)
			}
		}
	})
}

// byErr is the error of a "by" ignored for msg.
func byErr(msg string) error { return &mention.InvalidError{Reason: mention.ReasonBy, Msg: msg} }

// same says whether two payloads say the same.
func same(a, b mention.Payload) bool {
	return a.Count == b.Count && a.At == b.At && a.HasAt == b.HasAt && bytes.Equal(a.By, b.By) && (a.By == nil) == (b.By == nil) &&
		(a.ByErr == nil) == (b.ByErr == nil) && (a.ByErr == nil || a.ByErr.Error() == b.ByErr.Error())
}

// TestCountFastPathDoesNotAllocate pins the common payloads' cost.
func TestCountFastPathDoesNotAllocate(t *testing.T) {
	for _, payload := range [][]byte{nil, []byte(`{"count":1}`), []byte(`{"count":1,"at":1772366400000}`), []byte(`{"count":1,"by":"8f14e45f"}`)} {
		if a := testing.AllocsPerRun(1000, func() { mention.ParsePayload(payload, limits.MaxCount) }); a != 0 { //nolint:errcheck // measured
			t.Errorf("ParsePayload(%s) allocates %v times", payload, a)
		}
	}
}

func TestPayloadAt(t *testing.T) {
	const ms = 1772366400000 // 2026-03-01T12:00:00Z
	tests := []struct {
		name    string
		payload string
		want    mention.Payload
		reason  string
	}{
		{"no at", `{"count": 3}`, mention.Payload{Count: 3}, ""},
		{"empty", ``, mention.Payload{Count: 1}, ""},
		{"milliseconds", `{"count": 3, "at": 1772366400000}`, mention.Payload{Count: 3, At: ms, HasAt: true}, ""},
		{"milliseconds first", `{"at": 1772366400001, "count": 1}`, mention.Payload{Count: 1, At: ms + 1, HasAt: true}, ""},
		{"rfc3339", `{"count": 1, "at": "2026-03-01T12:00:00Z"}`, mention.Payload{Count: 1, At: ms, HasAt: true}, ""},
		{"rfc3339 fraction and zone", `{"count": 1, "at": "2026-03-01T13:00:00.250+01:00"}`, mention.Payload{Count: 1, At: ms + 250, HasAt: true}, ""},
		{"null is none", `{"count": 2, "at": null}`, mention.Payload{Count: 2}, ""},
		{"no zone", `{"count": 1, "at": "2026-03-01T12:00:00"}`, mention.Payload{}, mention.ReasonAt},
		{"a date", `{"count": 1, "at": "2026-03-01"}`, mention.Payload{}, mention.ReasonAt},
		{"seconds as a fraction", `{"count": 1, "at": 1772366400.5}`, mention.Payload{}, mention.ReasonAt},
		{"exponent", `{"count": 1, "at": 1.7e12}`, mention.Payload{}, mention.ReasonAt},
		{"bool", `{"count": 1, "at": true}`, mention.Payload{}, mention.ReasonAt},
		{"beyond int64", `{"count": 1, "at": 99999999999999999999}`, mention.Payload{}, mention.ReasonAt},
		{"bad count first", `{"count": 0, "at": "never"}`, mention.Payload{}, mention.ReasonCount},
		{"by", `{"count": 1, "by": "u-42"}`, mention.Payload{Count: 1, By: []byte("u-42")}, ""},
		{"by after at", `{"count": 1, "at": 1772366400000, "by": "u-42"}`, mention.Payload{Count: 1, At: ms, HasAt: true, By: []byte("u-42")}, ""},
		{"by first", `{"by": "u-42", "count": 2}`, mention.Payload{Count: 2, By: []byte("u-42")}, ""},
		{"by escaped", `{"count": 1, "by": "caf\u00e9"}`, mention.Payload{Count: 1, By: []byte("café")}, ""},
		{"by at its bound", `{"count": 1, "by": "` + strings.Repeat("x", mention.MaxByBytes) + `"}`, mention.Payload{Count: 1, By: []byte(strings.Repeat("x", mention.MaxByBytes))}, ""},
		{"by null is none", `{"count": 1, "by": null}`, mention.Payload{Count: 1}, ""},
		// A "by" that is not an id is ignored: the mention counts.
		{"by too long", `{"count": 5, "by": "` + strings.Repeat("x", mention.MaxByBytes+1) + `"}`, mention.Payload{Count: 5, ByErr: byErr("by is 129 bytes, longer than 128")}, ""},
		{"by empty", `{"count": 5, "by": ""}`, mention.Payload{Count: 5, ByErr: byErr("by is empty: leave it out for a mention of no one in particular")}, ""},
		{"by a number", `{"count": 5, "by": 42}`, mention.Payload{Count: 5, ByErr: byErr("by 42 is not a string")}, ""},
		{"by an object", `{"count": 5, "By": {"id": 7}}`, mention.Payload{Count: 5, ByErr: byErr(`by {"id": 7} is not a string`)}, ""},
		{"by a control character", `{"count": 5, "by": "a\tb"}`, mention.Payload{Count: 5, ByErr: byErr("by contains control character U+0009")}, ""},
		{"by not UTF-8 is JSON's U+FFFD", "{\"count\": 1, \"by\": \"\xff\"}", mention.Payload{Count: 1, By: []byte("\uFFFD")}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := mention.ParsePayload([]byte(tt.payload), limits.MaxCount)
			checkReason(t, err, tt.reason)
			if !same(got, tt.want) {
				t.Errorf("ParsePayload(%q) = %+v, want %+v", tt.payload, got, tt.want)
			}
		})
	}
}

func TestCheckAt(t *testing.T) {
	ref := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	ms := func(t time.Time) int64 { return t.UnixMilli() }
	tests := []struct {
		name   string
		at     int64
		late   time.Duration
		reason string
	}{
		{"now", ms(ref), 0, ""},
		{"a day late, the default bound", ms(ref.Add(-mention.DefaultMaxLateness)), 0, ""},
		{"past the default bound", ms(ref.Add(-mention.DefaultMaxLateness)) - 1, 0, mention.ReasonAt},
		{"at a set bound", ms(ref.Add(-time.Hour)), time.Hour, ""},
		{"past a set bound", ms(ref.Add(-time.Hour)) - 1, time.Hour, mention.ReasonAt},
		{"ahead within the skew", ms(ref.Add(mention.MaxAhead)), 0, ""},
		{"too far ahead", ms(ref.Add(mention.MaxAhead)) + 1, 0, mention.ReasonAt},
		{"the epoch", 0, 0, mention.ReasonAt},
		{"the least int64", math.MinInt64, 0, mention.ReasonAt},
		{"the most int64", math.MaxInt64, 0, mention.ReasonAt},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := mention.CheckAt(tt.at, ref, tt.late)
			checkReason(t, err, tt.reason)
			if err == nil && got.UnixMilli() != tt.at {
				t.Errorf("CheckAt(%d) = %v", tt.at, got)
			}
		})
	}
}

// BenchmarkCount is the parse of each payload shape: the empty payload and
// `{"count":1}` (no allocation), and those with an "at".
func BenchmarkCount(b *testing.B) {
	for _, payload := range []string{``, `{"count":1}`, `{"count":1,"at":1772366400000}`, `{"count":1,"at":"2026-03-01T12:00:00Z"}`, `{"count":1,"by":"8f14e45fceea167a"}`} {
		b.Run(fmt.Sprintf("%q", payload), func(b *testing.B) {
			p := []byte(payload)
			b.ReportAllocs()
			for b.Loop() {
				if _, err := mention.Count(p, mention.DefaultMaxCount); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
