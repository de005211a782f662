package ingest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/hotcount/hotcount/store"
)

// Rejection reasons: the fixed label set of hotcount_ingest_invalid_total and
// the value of the Hotcount-Error header on dead-lettered messages.
const (
	ReasonTopic   = "topic"   // empty, too long, not UTF-8, control characters
	ReasonPayload = "payload" // too large, not JSON, no count field
	ReasonCount   = "count"   // not a whole number in 1..max-count
)

// MaxPayloadBytes bounds a mention's payload. `{"count": n}` needs a few
// dozen bytes; anything near this is not a mention.
const MaxPayloadBytes = 4096

// Limits bound what a message may carry.
type Limits struct {
	// MaxCount is the largest count one message may add.
	MaxCount int64
	// MaxTopicBytes is the longest topic accepted, in bytes.
	MaxTopicBytes int
}

// Defaults for Limits.
const (
	// DefaultMaxCount is the default largest count of one message.
	DefaultMaxCount = 1_000_000
	// DefaultMaxTopicBytes is the default longest topic. DynamoDB allows
	// 2048-byte partition keys; this leaves room for the prefix and shard.
	DefaultMaxTopicBytes = 256
)

// InvalidError is a message rejected by the parser; Reason is one of the
// Reason constants.
type InvalidError struct {
	Reason string
	Msg    string
}

func (e *InvalidError) Error() string { return "ingest: invalid " + e.Reason + ": " + e.Msg }

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

// ValidateTopic applies the store's topic rules (store.ValidateTopic) and
// marks a violation as a topic rejection.
func ValidateTopic(topic string, maxBytes int) error {
	if err := store.ValidateTopic(topic, maxBytes); err != nil {
		return invalid(ReasonTopic, "%v", err)
	}
	return nil
}

// Count returns the count a payload adds: 1 for an empty payload, n for
// `{"count": n}` with n a whole number in 1..max. Other fields are ignored.
// The common shape, `{"count": n}` alone with any whitespace, is read
// without encoding/json and without allocating; anything else goes to the
// strict parser, and both give the same answer for every payload (FuzzCount
// holds them to it).
func Count(payload []byte, max int64) (int64, error) {
	if len(payload) == 0 {
		return 1, nil
	}
	if n, ok := fastCount(payload); ok && n >= 1 && n <= max && len(payload) <= MaxPayloadBytes {
		return n, nil
	}
	return strictCount(payload, max)
}

// fastCount reads a payload that is exactly `{"count":<int>}` with JSON
// whitespace anywhere between tokens, the integer in JSON's own grammar
// (no leading zeros, no fraction or exponent) and within int64. ok is false
// for anything else, which the strict parser then judges.
func fastCount(p []byte) (n int64, ok bool) {
	i := skipSpace(p, 0)
	if i == len(p) || p[i] != '{' {
		return 0, false
	}
	i = skipSpace(p, i+1)
	const key = `"count"`
	if len(p)-i < len(key) || string(p[i:i+len(key)]) != key {
		return 0, false
	}
	i = skipSpace(p, i+len(key))
	if i == len(p) || p[i] != ':' {
		return 0, false
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
			return 0, false // past int64: the strict parser says so
		}
		n = n*10 + d
		i++
	}
	if i == start || (p[start] == '0' && i-start > 1) {
		return 0, false // no digits, or a leading zero (not JSON)
	}
	i = skipSpace(p, i)
	if i == len(p) || p[i] != '}' || skipSpace(p, i+1) != len(p) {
		return 0, false
	}
	if neg {
		n = -n
	}
	return n, true
}

// skipSpace returns the index of the first byte at or after i that is not
// JSON whitespace.
func skipSpace(p []byte, i int) int {
	for i < len(p) && (p[i] == ' ' || p[i] == '\t' || p[i] == '\n' || p[i] == '\r') {
		i++
	}
	return i
}

// strictCount is Count by encoding/json, for every payload shape.
func strictCount(payload []byte, max int64) (int64, error) {
	if len(payload) > MaxPayloadBytes {
		return 0, invalid(ReasonPayload, "payload is %d bytes, more than %d", len(payload), MaxPayloadBytes)
	}
	var p struct {
		Count json.RawMessage `json:"count"`
	}
	if err := json.Unmarshal(payload, &p); err != nil {
		return 0, invalid(ReasonPayload, "payload is not a JSON object: %v", err)
	}
	raw := bytes.TrimSpace(p.Count)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return 0, invalid(ReasonPayload, `payload has no "count"`)
	}
	// ParseInt refuses strings, fractions, exponents and out-of-range values:
	// a count is a plain JSON integer or nothing.
	n, err := strconv.ParseInt(string(raw), 10, 64)
	if err != nil {
		return 0, invalid(ReasonCount, "count %.32s is not a whole number", raw)
	}
	if n < 1 || n > max {
		return 0, invalid(ReasonCount, "count %d is outside 1..%d", n, max)
	}
	return n, nil
}
