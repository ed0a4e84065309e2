package console

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"log/slog"
	"net/http"
	"strings"
)

// The cookies the console sets, scoped to its prefix.
const (
	// csrfCookie holds a random nonce; a form's token is the nonce signed with the key, so
	// that a token is good only with the cookie of the browser it was given to.
	csrfCookie = "outbox_console_csrf"
	// flashCookie carries the message of an action to the page it redirects to, signed.
	flashCookie = "outbox_console_flash"
	// csrfField is the form field of the token.
	csrfField = "csrf"
	// maxFormBytes bounds a POST's body: the forms are a handful of short fields.
	maxFormBytes = 64 << 10
)

// sign is the HMAC of purpose and value under the console's key, base64url.
func (c *console) sign(purpose, value string) string {
	m := hmac.New(sha256.New, c.key)
	m.Write([]byte(purpose))
	m.Write([]byte{0})
	m.Write([]byte(value))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// csrfToken returns the token of r's browser for the forms of a page, setting the nonce
// cookie first if r has none.
func (c *console) csrfToken(w http.ResponseWriter, r *http.Request) string {
	nonce := ""
	if ck, err := r.Cookie(csrfCookie); err == nil && validNonce(ck.Value) {
		nonce = ck.Value
	} else {
		var b [32]byte
		_, _ = rand.Read(b[:])
		nonce = base64.RawURLEncoding.EncodeToString(b[:])
		http.SetCookie(w, &http.Cookie{
			Name: csrfCookie, Value: nonce, Path: c.prefix, HttpOnly: true, Secure: r.TLS != nil,
			SameSite: http.SameSiteStrictMode,
		})
	}
	return c.sign("csrf", nonce)
}

func validNonce(s string) bool {
	b, err := base64.RawURLEncoding.DecodeString(s)
	return err == nil && len(b) == 32
}

// csrfOK reports whether r's form carries the token of r's cookie, compared in constant
// time.
func (c *console) csrfOK(r *http.Request) bool {
	ck, err := r.Cookie(csrfCookie)
	if err != nil || !validNonce(ck.Value) {
		return false
	}
	got := r.PostFormValue(csrfField)
	want := c.sign("csrf", ck.Value)
	return hmac.Equal([]byte(got), []byte(want))
}

// setFlash has the next page show msg.
func (c *console) setFlash(w http.ResponseWriter, r *http.Request, msg string) {
	v := base64.RawURLEncoding.EncodeToString([]byte(msg))
	http.SetCookie(w, &http.Cookie{
		Name: flashCookie, Value: v + "." + c.sign("flash", v), Path: c.prefix, HttpOnly: true,
		Secure: r.TLS != nil, SameSite: http.SameSiteStrictMode,
	})
}

// takeFlash returns the message an action left for this page, and clears it.
func (c *console) takeFlash(w http.ResponseWriter, r *http.Request) string {
	ck, err := r.Cookie(flashCookie)
	if err != nil {
		return ""
	}
	http.SetCookie(w, &http.Cookie{Name: flashCookie, Value: "", Path: c.prefix, MaxAge: -1, HttpOnly: true,
		Secure: r.TLS != nil, SameSite: http.SameSiteStrictMode})
	v, sig, ok := strings.Cut(ck.Value, ".")
	if !ok || !hmac.Equal([]byte(sig), []byte(c.sign("flash", v))) {
		return ""
	}
	b, err := base64.RawURLEncoding.DecodeString(v)
	if err != nil {
		return ""
	}
	return string(b)
}

// user names who made r, for the audit.
func (c *console) user(r *http.Request) string {
	if c.cfg.User != nil {
		if u := c.cfg.User(r); u != "" {
			return u
		}
		return "anonymous"
	}
	if u, _, ok := r.BasicAuth(); ok && u != "" {
		return u
	}
	return "anonymous"
}

func (c *console) logger() *slog.Logger {
	if c.cfg.Logger != nil {
		return c.cfg.Logger
	}
	return slog.Default()
}

// audit is the record of one POST, filled in as it is handled and logged once.
type audit struct {
	action  string
	store   string // the store's name, or ""
	group   string // the inbox's group, or ""
	attrs   []slog.Attr
	rows    int64
	outcome string
	err     error
}

// with adds attributes to the record (the ids, the filter, the count matched).
func (a *audit) with(attrs ...slog.Attr) { a.attrs = append(a.attrs, attrs...) }

func (c *console) writeAudit(r *http.Request, a *audit) {
	attrs := []slog.Attr{
		slog.String("user", c.user(r)),
		slog.String("remote", r.RemoteAddr),
		slog.String("action", a.action),
	}
	if a.store != "" {
		attrs = append(attrs, slog.String("store", a.store))
	}
	if a.group != "" {
		attrs = append(attrs, slog.String("group", a.group))
	}
	attrs = append(attrs, a.attrs...)
	attrs = append(attrs, slog.Int64("rows", a.rows), slog.String("outcome", a.outcome))
	if a.err != nil {
		attrs = append(attrs, slog.Any("error", a.err))
	}
	c.logger().LogAttrs(r.Context(), slog.LevelInfo, "outbox console: "+a.action, attrs...)
}

// action wraps a POST handler: it refuses the request in read-only mode, across origins or
// without the CSRF token (403, nothing done), and writes the one audit record of the
// request whatever happens.
func (c *console) action(name string, fn func(http.ResponseWriter, *http.Request, *audit)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		a := &audit{action: name, store: r.PathValue("store"), group: r.PathValue("group")}
		defer c.writeAudit(r, a)
		if !c.cfg.AllowWrites {
			a.outcome = "refused: read-only"
			c.refuse(w, r, http.StatusForbidden, "The console is read-only: writes are not allowed.")
			return
		}
		if err := c.csrf.Check(r); err != nil {
			a.outcome, a.err = "refused: cross-origin", err
			c.refuse(w, r, http.StatusForbidden, "Cross-origin request refused.")
			return
		}
		r.Body = http.MaxBytesReader(w, r.Body, maxFormBytes)
		if err := r.ParseForm(); err != nil {
			a.outcome, a.err = "refused: bad form", err
			c.refuse(w, r, http.StatusBadRequest, "The form could not be read.")
			return
		}
		if !c.csrfOK(r) {
			a.outcome = "refused: bad CSRF token"
			c.refuse(w, r, http.StatusForbidden, "The form's CSRF token is missing or wrong: reload the page and try again.")
			return
		}
		fn(w, r, a)
	}
}
