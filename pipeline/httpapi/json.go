package httpapi

import (
	"encoding/json"
	"net/http"
	"strconv"
	"sync"
	"unicode/utf8"

	"github.com/hotcount/hotcount/pipeline/lookup"
)

// appendTotal writes t as a JSON object (the single lookup adds a
// newline). It is written by hand because it is the hot path:
// encoding/json's reflection cost more than the rest of a cached lookup (BenchmarkHandler).
func appendTotal(b []byte, t lookup.Total) []byte {
	b = append(b, `{"topic":`...)
	b = appendString(b, t.Topic)
	b = append(b, `,"count":`...)
	b = strconv.AppendInt(b, t.Count, 10)
	b = append(b, `,"source":"`...)
	b = append(b, t.Source...)
	b = append(b, `","stale":`...)
	b = strconv.AppendBool(b, t.Stale)
	b = append(b, `,"ageMs":`...)
	b = strconv.AppendInt(b, t.AgeMs, 10)
	b = append(b, `,"shards":`...)
	b = strconv.AppendInt(b, int64(t.Shards), 10)
	if t.Saturated {
		b = append(b, `,"saturated":true`...)
	}
	if t.PendingIncluded {
		b = append(b, `,"pending":`...)
		b = strconv.AppendInt(b, t.Pending, 10)
		b = append(b, `,"includesPending":true`...)
	}
	return append(b, '}')
}

// appendString writes s as a JSON string. Topics are valid UTF-8 without
// control characters (ValidateTopic), but this escapes whatever it gets.
func appendString(b []byte, s string) []byte {
	b = append(b, '"')
	for i := 0; i < len(s); {
		c := s[i]
		if c >= 0x20 && c != '"' && c != '\\' && c < utf8.RuneSelf {
			b = append(b, c)
			i++
			continue
		}
		if c < utf8.RuneSelf {
			switch c {
			case '"', '\\':
				b = append(b, '\\', c)
			default:
				b = append(b, `\u00`...)
				b = append(b, "0123456789abcdef"[c>>4], "0123456789abcdef"[c&0xf])
			}
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b = append(b, `\ufffd`...)
		} else {
			b = append(b, s[i:i+size]...)
		}
		i += size
	}
	return append(b, '"')
}

var bufs = sync.Pool{New: func() any { b := make([]byte, 0, 512); return &b }}

func getBuf() *[]byte { b := bufs.Get().(*[]byte); *b = (*b)[:0]; return b }

func putBuf(b *[]byte) {
	if cap(*b) <= 64<<10 { // a huge batch answer is not worth keeping
		bufs.Put(b)
	}
}

func writeBody(w http.ResponseWriter, status int, body []byte) {
	h := w.Header()
	h["Content-Type"] = jsonType
	w.WriteHeader(status)
	w.Write(body) //nolint:errcheck // nothing to do about a client that left
}

var jsonType = []string{"application/json"}

func writeError(w http.ResponseWriter, status int, msg string) {
	body, _ := json.Marshal(struct {
		Error string `json:"error"`
	}{msg}) // a struct of one string always encodes
	writeBody(w, status, append(body, '\n'))
}
