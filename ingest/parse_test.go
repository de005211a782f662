package ingest_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/hotcount/hotcount/ingest"
)

var limits = ingest.Limits{MaxCount: 1000, MaxTopicBytes: 16}

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
		{"too long", "mentions." + strings.Repeat("a", 17), "", ingest.ReasonTopic},
		{"empty topic", "mentions.", "", ingest.ReasonTopic},
		{"other prefix", "other.golang", "", ingest.ReasonTopic},
		{"invalid utf8", "mentions.a\xffb", "", ingest.ReasonTopic},
		{"control character", "mentions.a\x01b", "", ingest.ReasonTopic},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ingest.Topic("mentions.", tt.subject, limits)
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
		{"over max", `{"count": 1001}`, 0, ingest.ReasonCount},
		{"zero", `{"count": 0}`, 0, ingest.ReasonCount},
		{"negative", `{"count": -3}`, 0, ingest.ReasonCount},
		{"fraction", `{"count": 1.5}`, 0, ingest.ReasonCount},
		{"exponent", `{"count": 1e3}`, 0, ingest.ReasonCount},
		{"string", `{"count": "5"}`, 0, ingest.ReasonCount},
		{"bool", `{"count": true}`, 0, ingest.ReasonCount},
		{"beyond int64", `{"count": 99999999999999999999}`, 0, ingest.ReasonCount},
		{"null", `{"count": null}`, 0, ingest.ReasonPayload},
		{"missing", `{"n": 5}`, 0, ingest.ReasonPayload},
		{"not json", `five`, 0, ingest.ReasonPayload},
		{"array", `[5]`, 0, ingest.ReasonPayload},
		{"truncated", `{"count": 5`, 0, ingest.ReasonPayload},
		{"too large", `{"count": 1, "pad": "` + strings.Repeat("x", ingest.MaxPayloadBytes) + `"}`, 0, ingest.ReasonPayload},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ingest.Count([]byte(tt.payload), limits.MaxCount)
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
		got, err := ingest.Prefix(tt.subject)
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
	var inv *ingest.InvalidError
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
	f.Fuzz(func(t *testing.T, payload []byte) {
		n, err := ingest.Count(payload, limits.MaxCount)
		if err == nil && (n < 1 || n > limits.MaxCount) {
			t.Fatalf("Count(%q) = %d accepted outside 1..%d", payload, n, limits.MaxCount)
		}
		// The fast path changes nothing: the same count, or the same
		// rejection, as the strict parser.
		if len(payload) > 0 {
			sn, serr := ingest.StrictCount(payload, limits.MaxCount)
			if n != sn || (err == nil) != (serr == nil) || (err != nil && err.Error() != serr.Error()) {
				t.Fatalf("Count(%q) = %d, %v; strict parser: %d, %v", payload, n, err, sn, serr)
			}
		}
	})
}

// TestCountFastPathDoesNotAllocate pins the common payload's cost.
func TestCountFastPathDoesNotAllocate(t *testing.T) {
	payload := []byte(`{"count":1}`)
	if a := testing.AllocsPerRun(1000, func() { ingest.Count(payload, limits.MaxCount) }); a != 0 { //nolint:errcheck // measured
		t.Errorf("Count(%s) allocates %v times", payload, a)
	}
}
