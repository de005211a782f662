// Package mention is a mention as producers publish it and hotcount takes
// it: the subject (`<prefix>.<topic>`), the payload (`{"count": n, "at":
// ..., "by": ...}`) and the rules that judge both. Producers (package
// client) and the sidecar's readers share it, so it needs nothing but the
// standard library.
package mention

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"
)

// Rejection reasons: the fixed label set of hotcount_ingest_invalid_total and
// the value of the Hotcount-Error header on dead-lettered messages.
const (
	ReasonTopic   = "topic"   // empty, too long, not UTF-8, control characters
	ReasonPayload = "payload" // too large, not JSON, no count field
	ReasonCount   = "count"   // not a whole number in 1..max-count
	ReasonAt      = "at"      // not a time, or outside max-lateness before now .. MaxAhead after
	// ReasonBy is a "by" that is not a string of 1..MaxByBytes bytes of
	// UTF-8 without control characters: not a rejection, the mention
	// counts without its contributor (Payload.ByErr).
	ReasonBy = "by"
)

// MaxByBytes bounds a mention's "by", its contributor's id: room for a
// hash of a user id or a UUID, far less than a topic may take.
const MaxByBytes = 128

// MaxPayloadBytes bounds a mention's payload. `{"count": n}` needs a few
// dozen bytes; anything near this is not a mention.
const MaxPayloadBytes = 4096

// Limits bound what a message may carry.
type Limits struct {
	// MaxCount is the largest count one message may add.
	MaxCount int64
	// MaxTopicBytes is the longest topic accepted, in bytes.
	MaxTopicBytes int
	// MaxLateness is how long before its reference time (its arrival in
	// core mode, its publication in the durable modes) a message's "at"
	// may be; 0 is DefaultMaxLateness.
	MaxLateness time.Duration
}

// Defaults for Limits.
const (
	// DefaultMaxCount is the default largest count of one message.
	DefaultMaxCount = 1_000_000
	// DefaultMaxTopicBytes is the default longest topic. DynamoDB allows
	// 2048-byte partition keys; this leaves room for the prefix and shard.
	DefaultMaxTopicBytes = 256
	// DefaultMaxLateness is the default bound of a mention's "at" in the
	// past: a day, for a backfill after an outage of hours, well inside
	// the minute buckets' default retention (two days by
	// default) and the stream's default max age.
	DefaultMaxLateness = 24 * time.Hour
	// MaxAhead is how far after its reference time a message's "at" may
	// be: clocks that disagree by this much are still taken.
	MaxAhead = time.Minute
)

// InvalidError is a message rejected by the parser; Reason is one of the
// Reason constants.
type InvalidError struct {
	Reason string
	Msg    string
}

func (e *InvalidError) Error() string { return "mention: invalid " + e.Reason + ": " + e.Msg }

func invalid(reason, format string, args ...any) *InvalidError {
	return &InvalidError{Reason: reason, Msg: fmt.Sprintf(format, args...)}
}

// Topic returns the topic of a subject under prefix (which ends with a dot):
// everything after the prefix, dots included, so `mentions.eu.west.k8s`
// under `mentions.` is `eu.west.k8s`.
func Topic(prefix, subject string, l Limits) (string, error) {
	topic, ok := strings.CutPrefix(subject, prefix)
	if !ok {
		return "", invalid(ReasonTopic, "subject %q is not under %q", subject, prefix)
	}
	if err := ValidateTopic(topic, l.MaxTopicBytes); err != nil {
		return "", err
	}
	return topic, nil
}

// ValidateTopic applies CheckTopic and marks a violation as a topic
// rejection.
func ValidateTopic(topic string, maxBytes int) error {
	if err := CheckTopic(topic, maxBytes); err != nil {
		return invalid(ReasonTopic, "%v", err)
	}
	return nil
}

// CheckTopic checks a topic before it becomes part of a key: not empty, at
// most maxBytes long, valid UTF-8, no control characters. DynamoDB allows
// partition keys up to 2048 bytes; maxBytes keeps well inside that. The
// ingest, the lookup API and the store apply it.
func CheckTopic(topic string, maxBytes int) error {
	switch {
	case topic == "":
		return errors.New("topic is empty")
	case len(topic) > maxBytes:
		return fmt.Errorf("topic is %d bytes, longer than %d", len(topic), maxBytes)
	case !utf8.ValidString(topic):
		return errors.New("topic is not valid UTF-8")
	}
	for _, r := range topic {
		if unicode.IsControl(r) {
			return fmt.Errorf("topic contains control character %U", r)
		}
	}
	return nil
}

// Prefix returns the topic prefix of a subscription subject, which must be
// `<prefix>.>`: `mentions.>` gives `mentions.`.
func Prefix(subject string) (string, error) {
	p, ok := strings.CutSuffix(subject, ">")
	if !ok || !strings.HasSuffix(p, ".") || len(p) < 2 || strings.ContainsAny(p, "* \t\r\n") {
		return "", fmt.Errorf("mention: subject %q must be a literal prefix followed by .> (like mentions.>)", subject)
	}
	return p, nil
}

// ProbeHeader marks a message that is no mention: `hotcount stream
// create` publishes such probes to check the server's routing, and every
// reader passes over them without counting them.
const ProbeHeader = "Hotcount-Probe"

// DefaultDuplicateWindow is the window in which a stream drops a second
// message with the same Nats-Msg-Id (`hotcount stream create` sets it): a
// producer may retry a publish for about half of it.
const DefaultDuplicateWindow = 2 * time.Minute

// Payload is what a mention message's payload says.
type Payload struct {
	// Count is the mentions the message adds.
	Count int64
	// At, when HasAt, is when they happened, in Unix milliseconds: the
	// payload's "at".
	At    int64
	HasAt bool
	// By is who mentioned it (the payload's "by", nil without one): an
	// opaque id of 1..MaxByBytes bytes that only trending's count of
	// distinct contributors reads. It may share the payload's memory.
	By []byte
	// ByErr says why a "by" was ignored (an *InvalidError of ReasonBy):
	// the mention counts all the same, without its contributor, so that
	// a contributor id never decides a count.
	ByErr error
}

// ParsePayload reads a mention's payload: empty is one mention; else a JSON
// object with "count", a whole number in 1..max, and optionally "at", when
// the mentions happened: an RFC 3339 string ("2026-03-01T12:00:00Z", any
// fraction of a second, a zone required) or a whole number of Unix
// milliseconds (1772366400000). An "at" of null is no "at". And optionally
// "by", who mentioned it: a string of 1..MaxByBytes bytes of UTF-8 without
// control characters (null is none; any other value is ignored, ByErr
// says why). Other fields are ignored.
//
// The common shapes, `{"count": n}`, `{"count": n, "at": ms}`, each with
// `"by": "id"` last, in that order with any whitespace and a "by" of plain
// ASCII without escapes, are read without encoding/json and without
// allocating; anything else goes to the strict parser, and both give the
// same answer for every payload (FuzzCount holds them to it).
func ParsePayload(payload []byte, max int64) (Payload, error) {
	if len(payload) == 0 {
		return Payload{Count: 1}, nil
	}
	if p, ok := fastPayload(payload); ok && p.Count >= 1 && p.Count <= max && len(payload) <= MaxPayloadBytes {
		return p, nil
	}
	return strictPayload(payload, max)
}

// Count returns the count a payload adds (ParsePayload's): 1 for an empty
// payload, n for `{"count": n}` with n a whole number in 1..max.
func Count(payload []byte, max int64) (int64, error) {
	p, err := ParsePayload(payload, max)
	return p.Count, err
}

// fastPayload reads a payload that is exactly `{"count":<int>}` or
// `{"count":<int>,"at":<int>}` with JSON whitespace anywhere between
// tokens, the integers in JSON's own grammar (no leading zeros, no fraction
// or exponent) and within int64. ok is false for anything else, which the
// strict parser then judges.
func fastPayload(p []byte) (out Payload, ok bool) {
	i := skipSpace(p, 0)
	if i == len(p) || p[i] != '{' {
		return Payload{}, false
	}
	if out.Count, i, ok = fastField(p, skipSpace(p, i+1), `"count"`); !ok {
		return Payload{}, false
	}
	if i < len(p) && p[i] == ',' && isKey(p, skipSpace(p, i+1), `"at"`) {
		if out.At, i, ok = fastField(p, skipSpace(p, i+1), `"at"`); !ok {
			return Payload{}, false
		}
		out.HasAt = true
	}
	if i < len(p) && p[i] == ',' {
		if out.By, i, ok = fastString(p, skipSpace(p, i+1), `"by"`); !ok || ValidateBy(out.By) != nil {
			return Payload{}, false
		}
	}
	if i == len(p) || p[i] != '}' || skipSpace(p, i+1) != len(p) {
		return Payload{}, false
	}
	return out, true
}

// isKey says whether p[i:] starts with key.
func isKey(p []byte, i int, key string) bool {
	return len(p)-i >= len(key) && string(p[i:i+len(key)]) == key
}

// fastField reads `key : <int>` from p[i:] and returns the integer and the
// index of the first byte after it that is not JSON whitespace.
func fastField(p []byte, i int, key string) (n int64, next int, ok bool) {
	if !isKey(p, i, key) {
		return 0, 0, false
	}
	i = skipSpace(p, i+len(key))
	if i == len(p) || p[i] != ':' {
		return 0, 0, false
	}
	i = skipSpace(p, i+1)
	neg := i < len(p) && p[i] == '-'
	if neg {
		i++
	}
	start := i
	for i < len(p) && p[i] >= '0' && p[i] <= '9' {
		d := int64(p[i] - '0')
		if n > (math.MaxInt64-d)/10 {
			return 0, 0, false // past int64: the strict parser says so
		}
		n = n*10 + d
		i++
	}
	if i == start || (p[start] == '0' && i-start > 1) {
		return 0, 0, false // no digits, or a leading zero (not JSON)
	}
	if neg {
		n = -n
	}
	return n, skipSpace(p, i), true
}

// fastString reads `key : "<printable ASCII but \" and \\>"` from p[i:]
// and returns the string's bytes (p's own) and the index of the first
// byte after it that is not JSON whitespace. Anything else (escapes,
// non-ASCII) is the strict parser's.
func fastString(p []byte, i int, key string) (s []byte, next int, ok bool) {
	if !isKey(p, i, key) {
		return nil, 0, false
	}
	i = skipSpace(p, i+len(key))
	if i == len(p) || p[i] != ':' {
		return nil, 0, false
	}
	i = skipSpace(p, i+1)
	if i == len(p) || p[i] != '"' {
		return nil, 0, false
	}
	start := i + 1
	for i = start; i < len(p) && p[i] != '"'; i++ {
		if p[i] < 0x20 || p[i] >= 0x7f || p[i] == '\\' {
			return nil, 0, false
		}
	}
	if i == len(p) {
		return nil, 0, false
	}
	return p[start:i:i], skipSpace(p, i+1), true
}

// ValidateBy checks a mention's "by": 1..MaxByBytes bytes of UTF-8
// without control characters, the rules of a topic (CheckTopic)
// with a shorter bound.
func ValidateBy(by []byte) error {
	switch {
	case len(by) == 0:
		return invalid(ReasonBy, "by is empty: leave it out for a mention of no one in particular")
	case len(by) > MaxByBytes:
		return invalid(ReasonBy, "by is %d bytes, longer than %d", len(by), MaxByBytes)
	case !utf8.Valid(by):
		return invalid(ReasonBy, "by is not valid UTF-8")
	}
	for _, r := range string(by) {
		if unicode.IsControl(r) {
			return invalid(ReasonBy, "by contains control character %U", r)
		}
	}
	return nil
}

// skipSpace returns the index of the first byte at or after i that is not
// JSON whitespace.
func skipSpace(p []byte, i int) int {
	for i < len(p) && (p[i] == ' ' || p[i] == '\t' || p[i] == '\n' || p[i] == '\r') {
		i++
	}
	return i
}

// strictPayload is ParsePayload by encoding/json, for every payload shape.
func strictPayload(payload []byte, max int64) (Payload, error) {
	if len(payload) > MaxPayloadBytes {
		return Payload{}, invalid(ReasonPayload, "payload is %d bytes, more than %d", len(payload), MaxPayloadBytes)
	}
	var p struct {
		Count json.RawMessage `json:"count"`
		At    json.RawMessage `json:"at"`
		By    json.RawMessage `json:"by"`
	}
	if err := json.Unmarshal(payload, &p); err != nil {
		return Payload{}, invalid(ReasonPayload, "payload is not a JSON object: %v", err)
	}
	raw := bytes.TrimSpace(p.Count)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return Payload{}, invalid(ReasonPayload, `payload has no "count"`)
	}
	// ParseInt refuses strings, fractions, exponents and out-of-range values:
	// a count is a plain JSON integer or nothing.
	n, err := strconv.ParseInt(string(raw), 10, 64)
	if err != nil {
		return Payload{}, invalid(ReasonCount, "count %.32s is not a whole number", raw)
	}
	if n < 1 || n > max {
		return Payload{}, invalid(ReasonCount, "count %d is outside 1..%d", n, max)
	}
	out := Payload{Count: n}
	if raw = bytes.TrimSpace(p.At); len(raw) > 0 && !bytes.Equal(raw, []byte("null")) {
		if out.At, err = parseAt(raw); err != nil {
			return Payload{}, err
		}
		out.HasAt = true
	}
	if raw = bytes.TrimSpace(p.By); len(raw) > 0 && !bytes.Equal(raw, []byte("null")) {
		var by string
		switch {
		case raw[0] != '"' || json.Unmarshal(raw, &by) != nil:
			out.ByErr = invalid(ReasonBy, "by %.40s is not a string", raw)
		default:
			if out.ByErr = ValidateBy([]byte(by)); out.ByErr == nil {
				out.By = []byte(by)
			}
		}
	}
	return out, nil
}

// parseAt reads an "at" (valid JSON): an RFC 3339 string or a whole number
// of Unix milliseconds.
func parseAt(raw []byte) (int64, error) {
	if raw[0] == '"' {
		var s string
		if err := json.Unmarshal(raw, &s); err == nil {
			if t, err := time.Parse(time.RFC3339, s); err == nil {
				return t.UnixMilli(), nil
			}
		}
	} else if ms, err := strconv.ParseInt(string(raw), 10, 64); err == nil {
		return ms, nil
	}
	return 0, invalid(ReasonAt, `at %.40s is not a time: an RFC 3339 string ("2026-03-01T12:00:00Z") or whole Unix milliseconds (1772366400000)`, raw)
}

// CheckAt returns the time of an "at" (Unix milliseconds), or refuses it
// when it is more than maxLateness (0: DefaultMaxLateness) before ref or
// more than MaxAhead after it. ref is the message's reference time: its
// arrival in core mode, its publication in the durable modes, so that a
// message redelivered later is judged as it was the first time.
func CheckAt(at int64, ref time.Time, maxLateness time.Duration) (time.Time, error) {
	if maxLateness <= 0 {
		maxLateness = DefaultMaxLateness
	}
	t := time.UnixMilli(at)
	switch {
	case t.Before(ref.Add(-maxLateness)):
		return time.Time{}, invalid(ReasonAt, "at %s is %s before the message's arrival or publication (%s): later than --max-lateness %s allows",
			t.UTC().Format(time.RFC3339Nano), ref.Sub(t).Round(time.Millisecond), ref.UTC().Format(time.RFC3339Nano), maxLateness)
	case t.After(ref.Add(MaxAhead)):
		return time.Time{}, invalid(ReasonAt, "at %s is %s after the message's arrival or publication (%s): more than %s ahead",
			t.UTC().Format(time.RFC3339Nano), t.Sub(ref).Round(time.Millisecond), ref.UTC().Format(time.RFC3339Nano), MaxAhead)
	}
	return t, nil
}
