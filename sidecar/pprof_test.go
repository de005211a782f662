package sidecar_test

import (
	"bytes"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hotcount/hotcount/config"
)

// TestPprofIsOptInAndLocal: /debug/pprof is absent by default; with
// --pprof it serves profiles to this machine, refuses a request that names
// another host (a mesh's proxy, a rebinding page: 403 without a token file,
// 401 with one), and serves that one once it carries --http-token-file's
// token.
func TestPprofIsOptInAndLocal(t *testing.T) {
	get := func(t *testing.T, url, host, token string) (int, []byte) {
		t.Helper()
		req, err := http.NewRequest(http.MethodGet, url, nil)
		if err != nil {
			t.Fatal(err)
		}
		if host != "" {
			req.Host = host
		}
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return resp.StatusCode, body
	}

	off := newEnv(t, nil)
	if code, _ := get(t, off.sc.AdminURL()+"/debug/pprof/heap", "", ""); code != http.StatusNotFound {
		t.Errorf("/debug/pprof/heap without --pprof: %d, want 404", code)
	}
	local := newEnvOn(t, off, func(c *config.Config) { c.Pprof, c.DataDir = true, t.TempDir() })
	if code, body := get(t, local.sc.AdminURL()+"/debug/pprof/goroutine?debug=1", "", ""); code != http.StatusOK || !strings.Contains(string(body), "goroutine") {
		t.Errorf("goroutines from this machine, no token file: %d %.200s", code, body)
	}
	if code, body := get(t, local.sc.AdminURL()+"/debug/pprof/goroutine?debug=1", "hotcount-7f9c:9091", ""); code != http.StatusForbidden || !strings.Contains(string(body), "this machine only") {
		t.Errorf("a request for another host, no token file: %d %s, want 403 naming why", code, body)
	}
	// A mesh's proxy forwarding from loopback, the Host set to look local.
	req, err := http.NewRequest(http.MethodGet, local.sc.AdminURL()+"/debug/pprof/goroutine?debug=1", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Host = "localhost:9091"
	req.Header.Set("X-Forwarded-For", "10.1.2.3")
	if resp, err := http.DefaultClient.Do(req); err != nil {
		t.Fatal(err)
	} else if resp.Body.Close(); resp.StatusCode != http.StatusForbidden {
		t.Errorf("a proxied request naming localhost: %d, want 403", resp.StatusCode)
	}
	// The command line may carry --nats-token: not served.
	if code, body := get(t, local.sc.AdminURL()+"/debug/pprof/cmdline", "", ""); code != http.StatusNotFound {
		t.Errorf("/debug/pprof/cmdline: %d %.100s, want 404", code, body)
	}

	const token = "s3cret-pprof-token-0123456789"
	file := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(file, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	on := newEnv(t, func(c *config.Config) { c.Pprof, c.HTTPTokenFile = true, file })
	base := on.sc.AdminURL() + "/debug/pprof/"
	if code, body := get(t, base+"heap?debug=1", "", ""); code != http.StatusOK || !strings.Contains(string(body), "heap profile") {
		t.Errorf("heap from this machine: %d %.200s", code, body)
	}
	if code, body := get(t, base+"profile?seconds=1", "", ""); code != http.StatusOK || !bytes.HasPrefix(body, []byte{0x1f, 0x8b}) {
		t.Errorf("CPU profile from this machine: %d, %d bytes (want a gzipped profile)", code, len(body))
	}
	if code, body := get(t, base+"goroutine?debug=1", "hotcount-7f9c:9091", ""); code != http.StatusUnauthorized {
		t.Errorf("a request for another host without the token: %d %s, want 401", code, body)
	}
	if code, body := get(t, base+"goroutine?debug=1", "hotcount-7f9c:9091", token); code != http.StatusOK || !strings.Contains(string(body), "goroutine") {
		t.Errorf("a request for another host with the token: %d %.200s", code, body)
	}
	if code, _ := get(t, base+"goroutine?debug=1", "hotcount-7f9c:9091", "wrong"); code != http.StatusUnauthorized {
		t.Errorf("a request for another host with a wrong token: %d, want 401", code)
	}
}
