package console

import (
	"bytes"
	"embed"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"html/template"
	"net/http"
	"net/url"
	"strings"
	"time"
	"unicode/utf8"
)

//go:embed templates/*.html
var templateFS embed.FS

//go:embed static/console.css
var stylesheet []byte

// The pages, each a template file of templates/ rendered in the layout.
var pageNames = []string{"overview", "store", "deadletters", "event", "confirm", "blocked", "rejected", "rejectedmsg", "error"}

// templates holds every page, parsed with the layout.
type templates struct{ byName map[string]*template.Template }

var funcs = template.FuncMap{
	"utc":  formatTime,
	"age":  formatAge,
	"clip": clip,
}

func parseTemplates() (*templates, error) {
	base, err := template.New("layout").Funcs(funcs).ParseFS(templateFS, "templates/layout.html")
	if err != nil {
		return nil, fmt.Errorf("console: parse the layout: %w", err)
	}
	t := &templates{byName: map[string]*template.Template{}}
	for _, name := range pageNames {
		b, err := base.Clone()
		if err != nil {
			return nil, err
		}
		if _, err := b.ParseFS(templateFS, "templates/"+name+".html"); err != nil {
			return nil, fmt.Errorf("console: parse page %s: %w", name, err)
		}
		t.byName[name] = b
	}
	return t, nil
}

// navLink is a link of the page's navigation bar.
type navLink struct {
	ID, Href, Label string
	Current         bool
}

// page is what the layout renders: its title and navigation around one page's Data.
type page struct {
	Title    string
	Prefix   string
	ReadOnly bool
	Flash    string
	Nav      []navLink
	Data     any
}

// render writes the page name with status.
func (c *console) render(w http.ResponseWriter, r *http.Request, status int, name string, p page) {
	p.Prefix, p.ReadOnly = c.prefix, !c.cfg.AllowWrites
	if p.Flash == "" {
		p.Flash = c.takeFlash(w, r)
	}
	var buf bytes.Buffer
	if err := c.pages.byName[name].ExecuteTemplate(&buf, "layout", p); err != nil {
		c.logger().ErrorContext(r.Context(), "outbox console: render page", "page", name, "err", err)
		http.Error(w, "outbox console: the page could not be rendered", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	_, _ = w.Write(buf.Bytes())
}

// errorData is the error page's.
type errorData struct{ Message, Back string }

// refuse answers an error page with status and message; nothing was done.
func (c *console) refuse(w http.ResponseWriter, r *http.Request, status int, msg string) {
	c.render(w, r, status, "error", page{Title: http.StatusText(status), Data: errorData{Message: msg}})
}

func (c *console) stylesheet(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/css; charset=utf-8")
	_, _ = w.Write(stylesheet)
}

// href is the console's path of the segments (each escaped) with query q, if any.
func (c *console) href(q url.Values, segments ...string) string {
	var b strings.Builder
	b.WriteString(c.prefix)
	for i, s := range segments {
		if i > 0 {
			b.WriteByte('/')
		}
		b.WriteString(url.PathEscape(s))
	}
	if enc := q.Encode(); enc != "" {
		b.WriteByte('?')
		b.WriteString(enc)
	}
	return b.String()
}

// formatTime writes t in UTC to the millisecond; the zero time as a dash.
func formatTime(t time.Time) string {
	if t.IsZero() {
		return "—"
	}
	return t.UTC().Format("2006-01-02 15:04:05.000")
}

// formatAge writes a duration rounded for a person: 850ms, 12.3s, 4m05s, 3h12m, 2d4h.
func formatAge(d time.Duration) string {
	switch {
	case d <= 0:
		return "—"
	case d < time.Second:
		return d.Round(time.Millisecond).String()
	case d < time.Minute:
		return d.Round(100 * time.Millisecond).String()
	case d < time.Hour:
		return fmt.Sprintf("%dm%02ds", int(d/time.Minute), int(d%time.Minute/time.Second))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh%02dm", int(d/time.Hour), int(d%time.Hour/time.Minute))
	}
	return fmt.Sprintf("%dd%dh", int(d/(24*time.Hour)), int(d%(24*time.Hour)/time.Hour))
}

// clip cuts s to n characters, marking the cut.
func clip(s string, n int) string {
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	r := []rune(s)
	return string(r[:n]) + "…"
}

// maxShownBody bounds the payload or body a page shows.
const maxShownBody = 1 << 20

// body is a payload as a page shows it.
type body struct {
	Kind string // "JSON", "text", "binary, in hex" or "empty"
	Size int
	Text string
}

// showBody writes b pretty-printed when it is JSON, as text when it is UTF-8, else as a hex
// dump; a body over 1 MiB is cut.
func showBody(b []byte) body {
	out := body{Size: len(b)}
	cut := ""
	if len(b) > maxShownBody {
		b, cut = b[:maxShownBody], fmt.Sprintf("\n… (%d more bytes not shown)", out.Size-maxShownBody)
	}
	var buf bytes.Buffer
	switch {
	case len(b) == 0:
		out.Kind = "empty"
	case cut == "" && json.Valid(b) && json.Indent(&buf, b, "", "  ") == nil:
		out.Kind, out.Text = "JSON", buf.String()
	case utf8.Valid(b):
		out.Kind, out.Text = "text", string(b)+cut
	default:
		out.Kind, out.Text = "binary, in hex", hex.Dump(b)+cut
	}
	return out
}

// kv is a row of a two-column table.
type kv struct{ K, V string }
