// Package natsauth is how hotcount authenticates to NATS (Auth) and keeps
// the secrets of NATS URLs out of what it prints (RedactURLs, RedactErr):
// config, the sidecar and the commands share it.
package natsauth

import (
	"fmt"
	"net/url"
	"strings"

	"github.com/nats-io/nats.go"
)

// Auth is how hotcount authenticates to NATS and checks its certificate.
// Every field is optional.
type Auth struct {
	Creds   string // credentials file (JWT + NKey seed)
	NKey    string // NKey seed file
	Token   string // token
	TLSCA   string // CA certificate file
	TLSCert string // client certificate file, with TLSKey
	TLSKey  string
}

// Options turns a into nats.go connection options.
func (a Auth) Options() ([]nats.Option, error) {
	var opts []nats.Option
	if a.Creds != "" {
		opts = append(opts, nats.UserCredentials(a.Creds))
	}
	if a.NKey != "" {
		o, err := nats.NkeyOptionFromSeed(a.NKey)
		if err != nil {
			return nil, fmt.Errorf("natsauth: nkey seed %s: %w", a.NKey, err)
		}
		opts = append(opts, o)
	}
	if a.Token != "" {
		opts = append(opts, nats.Token(a.Token))
	}
	if a.TLSCA != "" {
		opts = append(opts, nats.RootCAs(a.TLSCA))
	}
	if a.TLSCert != "" {
		opts = append(opts, nats.ClientCert(a.TLSCert, a.TLSKey))
	}
	return opts, nil
}

// Redacted stands in for a secret in a printed URL.
const Redacted = "REDACTED"

// RedactURLs replaces the passwords (and tokens given as the user) in a
// comma-separated list of NATS URLs. A part that does not parse but holds
// user information loses everything before its '@'.
func RedactURLs(list string) string {
	parts := strings.Split(list, ",")
	for i, p := range parts {
		u, err := url.Parse(strings.TrimSpace(p))
		switch {
		case err != nil || (u.User == nil && strings.Contains(p, "@")):
			// Did not parse, or parsed without user information though it
			// holds an '@' (a secret with '/', '?' or '#' in it): everything
			// between the scheme and the last '@' goes.
			if at := strings.LastIndexByte(p, '@'); at >= 0 {
				scheme, _, ok := strings.Cut(p, "://")
				if !ok {
					scheme = ""
				} else {
					scheme += "://"
				}
				parts[i] = scheme + Redacted + p[at:]
			}
		case u.User != nil:
			if _, has := u.User.Password(); has {
				u.User = url.UserPassword(u.User.Username(), Redacted)
			} else {
				u.User = url.User(Redacted) // a bare user part is a token
			}
			parts[i] = u.String()
		}
	}
	return strings.Join(parts, ",")
}

// RedactErr returns err with every URL of list in its message (nats.go's
// own messages quote the URL) in redacted form; it unwraps to err.
func RedactErr(err error, list string) error {
	if err == nil {
		return nil
	}
	for _, p := range strings.Split(list, ",") {
		if u, perr := url.Parse(strings.TrimSpace(p)); strings.Contains(p, "@") && (perr != nil || u.User == nil) {
			// A URL that does not parse as URL and user: a parser's message
			// would quote pieces of the secret. Say only that.
			return &redactedError{msg: fmt.Sprintf("NATS URL %s does not parse (its error is not shown: it would quote the secret)", RedactURLs(p)), err: err}
		}
	}
	return &redactedError{msg: redactIn(err.Error(), list), err: err}
}

// redactIn replaces, in text, every URL of list by its redacted form.
func redactIn(text, list string) string {
	for _, p := range strings.Split(list, ",") {
		if p = strings.TrimSpace(p); p != "" {
			text = strings.ReplaceAll(text, p, RedactURLs(p))
		}
	}
	return text
}

// redactedError is an error whose message had secrets taken out; it still
// unwraps to the original for errors.Is.
type redactedError struct {
	msg string
	err error
}

func (e *redactedError) Error() string { return e.msg }
func (e *redactedError) Unwrap() error { return e.err }
