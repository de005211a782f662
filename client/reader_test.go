package client_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"

	"github.com/hotcount/hotcount/api"
	"github.com/hotcount/hotcount/client"
	"github.com/hotcount/hotcount/config"
	"github.com/hotcount/hotcount/internal/testtools/testenv"
	"github.com/hotcount/hotcount/mention"
)

// TestReaderTotals: topics published with a Publisher read back exactly,
// one by one and in batches larger than one request takes, in the order
// asked, whatever characters they hold.
func TestReaderTotals(t *testing.T) {
	hc, _ := startT(t, config.ModeCore, nil)
	ctx := context.Background()
	pub, err := client.NewPublisher(testenv.Connect(t, hc.natsURL), client.WithCoreNATS())
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]int64{"a/b": 1, "a//b": 2, "a/./b": 3, "/lead": 4, "trail/": 5, "eu.west.k8s": 6,
		"é-ü": 7, "100%": 8, "q?x=1&y": 9, "hash#tag": 10, "plus+sign": 11}
	var names []string
	for i := range api.MaxBatch + 50 {
		want[fmt.Sprint("t-", i)] = int64(i + 1)
	}
	var total int64
	for topic, n := range want {
		if err := pub.Mention(ctx, topic, n); err != nil {
			t.Fatal(err)
		}
		names = append(names, topic)
		total += n
	}
	if err := pub.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if err := hc.waitWritten(total); err != nil {
		t.Fatal(err)
	}

	rd, err := client.NewReader(hc.httpURL + "/") // a trailing slash is fine
	if err != nil {
		t.Fatal(err)
	}
	for _, topic := range names[:20] {
		got, err := rd.Total(ctx, topic, client.WithConsistency(client.Strong))
		if err != nil || got.Topic != topic || got.Count != want[topic] || got.Source != "store" {
			t.Errorf("Total(%q) = %+v, %v; want count %d from the store", topic, got, err, want[topic])
		}
	}
	asked := append([]string{"never-mentioned"}, names...)
	asked = append(asked, names[0]) // a repeat is answered twice
	totals, err := rd.Totals(ctx, asked)
	if err != nil {
		t.Fatal(err)
	}
	if len(totals) != len(asked) {
		t.Fatalf("%d totals for %d topics", len(totals), len(asked))
	}
	for i, got := range totals {
		if got.Topic != asked[i] || got.Count != want[asked[i]] {
			t.Errorf("total %d: %s %d, want %s %d", i, got.Topic, got.Count, asked[i], want[asked[i]])
		}
	}
	if got, err := rd.Total(ctx, "golang", client.WithPending()); err != nil || !got.IncludesPending || got.Count != 0 {
		t.Errorf("Total with pending: %+v, %v", got, err)
	}
	for _, topic := range []string{".", ".."} { // a path would clean them away
		if got, err := rd.Total(ctx, topic); err != nil || got.Topic != topic || got.Count != 0 {
			t.Errorf("Total(%q) = %+v, %v", topic, got, err)
		}
	}
	if got, err := rd.Totals(ctx, nil); err != nil || len(got) != 0 {
		t.Errorf("Totals of none: %v, %v", got, err)
	}
}

// TestReaderErrors: what the API refuses comes back as an *Error with
// the status and the sidecar's reason, matching its sentinel; what the
// sidecar would refuse is refused before a request.
func TestReaderErrors(t *testing.T) {
	const token = "a-token-of-at-least-16-bytes"
	hc, _ := startT(t, config.ModeCore, withTokenFile(token))
	ctx := context.Background()
	reader := func(url string, opts ...client.ReaderOption) *client.Reader {
		t.Helper()
		r, err := client.NewReader(url, opts...)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	long := strings.Repeat("x", mention.DefaultMaxTopicBytes+1)
	tests := []struct {
		name   string
		r      *client.Reader
		topic  string
		is     error
		status int    // of the *Error; 0: none
		reason string // in the *Error
	}{
		{"no token", reader(hc.httpURL), "golang", client.ErrUnauthorized, 401, "missing Authorization: Bearer <token>"},
		{"wrong token", reader(hc.httpURL, client.WithToken("not-the-token-at-all")), "golang", client.ErrUnauthorized, 401, "wrong token"},
		{"token with a newline, as in the file", reader(hc.httpURL, client.WithToken(token+"\n")), "golang", nil, 0, ""},
		{"empty topic", reader(hc.httpURL, client.WithToken(token)), "", client.ErrInvalidTopic, 0, ""},
		{"control character", reader(hc.httpURL, client.WithToken(token)), "a\nb", client.ErrInvalidTopic, 0, ""},
		{"too long", reader(hc.httpURL, client.WithToken(token)), long, client.ErrInvalidTopic, 0, ""},
		{"longer than the sidecar takes", reader(hc.httpURL, client.WithToken(token), client.WithMaxTopicBytes(1024)), long, client.ErrBadRequest, 400, "longer than 256"},
		{"not the lookup API", reader("http://"+hc.sc.AdminAddr(), client.WithToken(token)), "golang", client.ErrNotFound, 404, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, call := range []func() error{
				func() error { _, err := tt.r.Total(ctx, tt.topic); return err },
				func() error { _, err := tt.r.Totals(ctx, []string{"golang", tt.topic}); return err },
			} {
				err := call()
				if !errors.Is(err, tt.is) || (tt.is == nil) != (err == nil) {
					t.Fatalf("error %v, want %v", err, tt.is)
				}
				var apiErr *client.Error
				if errors.As(err, &apiErr) != (tt.status != 0) {
					t.Fatalf("error %v: an *Error is expected: %v", err, tt.status != 0)
				}
				if apiErr != nil && (apiErr.StatusCode != tt.status || !strings.Contains(apiErr.Reason, tt.reason)) {
					t.Errorf("*Error %d %q, want %d with %q", apiErr.StatusCode, apiErr.Reason, tt.status, tt.reason)
				}
			}
		})
	}

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gone := "http://" + ln.Addr().String()
	ln.Close()
	var apiErr *client.Error
	if _, err := reader(gone).Total(ctx, "golang"); err == nil || errors.As(err, &apiErr) {
		t.Errorf("no sidecar: %v, want a connection error", err)
	}
	for _, url := range []string{"", "127.0.0.1:8080", "ftp://127.0.0.1", "http://", "http://127.0.0.1:8080/?x=1"} {
		if _, err := client.NewReader(url); err == nil {
			t.Errorf("NewReader(%q) took it", url)
		}
	}
}
