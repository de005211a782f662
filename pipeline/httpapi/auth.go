package httpapi

import (
	"crypto/sha256"
	"crypto/subtle"
	"net"
	"net/http"
	"strings"
)

// RequireToken serves h only to requests that carry token as a bearer
// token (Authorization: Bearer <token>); others get 401 with the reason,
// as JSON like every error of the API. The comparison takes the same time
// whatever the token sent: both sides are hashed first, so neither its
// bytes nor its length leak through timing.
func RequireToken(token string, h http.Handler) http.Handler {
	want := sha256.Sum256([]byte(token))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		auth := r.Header.Get("Authorization")
		got, ok := strings.CutPrefix(auth, "Bearer ")
		switch {
		case auth == "":
			unauthorized(w, "missing Authorization: Bearer <token>")
		case !ok:
			unauthorized(w, "Authorization is not a bearer token")
		default:
			sum := sha256.Sum256([]byte(strings.TrimSpace(got)))
			if subtle.ConstantTimeCompare(sum[:], want[:]) != 1 {
				unauthorized(w, "wrong token")
				return
			}
			h.ServeHTTP(w, r)
		}
	})
}

func unauthorized(w http.ResponseWriter, reason string) {
	w.Header().Set("WWW-Authenticate", `Bearer realm="hotcount"`)
	writeError(w, http.StatusUnauthorized, reason)
}

// LocalOnly serves h to this machine only: a loopback client that asked
// for a loopback host; others get 403 with refusal. The host matters as
// much as the address: a service mesh's proxy forwards everyone's requests
// from a loopback address (with the pod's name as the host), and a web
// page that rebinds its own name to 127.0.0.1 reaches a loopback listener
// from the visitor's browser (with its own name as the host), and a
// request that names a client behind a proxy (Forwarded, X-Forwarded-For)
// is not this machine's either. The Host is the client's to say, so
// behind a mesh that forwards from loopback without those headers, this
// stops browsers and honest clients, not a hostile one: there, keep it off
// or rely on the token. With a token, a request from elsewhere that
// carries it (RequireToken) is served too.
func LocalOnly(h http.Handler, token, refusal string) http.Handler {
	var withToken http.Handler
	if token != "" {
		withToken = RequireToken(token, h)
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case loopback(r.RemoteAddr) && loopbackHost(r.Host) && !proxied(r.Header):
			h.ServeHTTP(w, r)
		case withToken != nil:
			withToken.ServeHTTP(w, r)
		default:
			writeError(w, http.StatusForbidden, refusal)
		}
	})
}

// proxied says whether a request names a client behind a proxy: a mesh's
// sidecar proxy that forwards from loopback may add these, and a request
// that carries them is not this machine's whatever its Host says.
func proxied(h http.Header) bool {
	for _, k := range []string{"Forwarded", "X-Forwarded-For", "X-Real-Ip", "X-Envoy-External-Address"} {
		if h.Get(k) != "" {
			return true
		}
	}
	return false
}

// loopbackHost says whether a request's Host names this machine's loopback.
func loopbackHost(hostport string) bool {
	host, _, err := net.SplitHostPort(hostport)
	if err != nil {
		host = hostport // no port
	}
	host = strings.Trim(host, "[]")
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// loopback says whether a request's client address is this machine's.
func loopback(remoteAddr string) bool {
	host, _, err := net.SplitHostPort(remoteAddr)
	if err != nil {
		return false
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
