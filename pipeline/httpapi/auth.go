package httpapi

import (
	"crypto/sha256"
	"crypto/subtle"
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
