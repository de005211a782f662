package httpapi_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/hotcount/hotcount/pipeline/httpapi"
)

func TestRequireToken(t *testing.T) {
	const token = "0123456789abcdef0123456789abcdef"
	h := httpapi.RequireToken(token, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, `{"count":1}`) }))
	for _, tc := range []struct {
		name, auth string
		status     int
		body       string
	}{
		{"none", "", 401, "missing Authorization"},
		{"basic", "Basic dXNlcjpwYXNz", 401, "not a bearer token"},
		{"wrong", "Bearer nope", 401, "wrong token"},
		{"prefix", "Bearer " + token[:10], 401, "wrong token"},
		{"right", "Bearer " + token, 200, `{"count":1}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := httptest.NewRequest("GET", "/v1/topics/golang", nil)
			if tc.auth != "" {
				r.Header.Set("Authorization", tc.auth)
			}
			w := httptest.NewRecorder()
			h.ServeHTTP(w, r)
			if w.Code != tc.status || !strings.Contains(w.Body.String(), tc.body) {
				t.Errorf("%d %s, want %d with %q", w.Code, w.Body, tc.status, tc.body)
			}
			if tc.status == 401 && w.Header().Get("WWW-Authenticate") == "" {
				t.Error("401 without WWW-Authenticate")
			}
		})
	}
}
