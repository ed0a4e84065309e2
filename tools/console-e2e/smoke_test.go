package consolee2e

import (
	"bytes"
	"image/png"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// TestBrowserDrivesAPage proves the browser setup on a page of the test's own: the browser
// starts headless with the tests' flags, loads a page from a loopback server, runs its
// script on a click, reads the text the script wrote, follows a form's POST through its 303
// and takes a screenshot of the window's size.
func TestBrowserDrivesAPage(t *testing.T) {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		_, _ = w.Write([]byte(`<!doctype html><title>smoke</title>
<p id="out">before</p>
<button id="js" onclick="document.getElementById('out').textContent='clicked'">js</button>
<form method="post" action="/act"><button id="post">post</button></form>`))
	})
	mux.HandleFunc("POST /act", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "/done", http.StatusSeeOther)
	})
	mux.HandleFunc("GET /done", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		_, _ = w.Write([]byte(`<!doctype html><p id="flash">posted</p>`))
	})
	srv := httptest.NewServer(mux)
	defer srv.Close()

	b := newBrowser(t, time.Minute)
	b.open(srv.URL + "/")
	if got := eval[string](b, "document.title"); got != "smoke" {
		t.Fatalf("the title reads %q, want %q", got, "smoke")
	}
	if got := b.text("out"); got != "before" {
		t.Fatalf("#out reads %q before the click, want %q", got, "before")
	}
	b.do("click #js", chromedp.Click(chromedp.ID("js")))
	if got := b.text("out"); got != "clicked" {
		t.Fatalf("#out reads %q after the click, want %q", got, "clicked")
	}
	b.click("post")
	if got := b.text("flash"); got != "posted" {
		t.Fatalf("after the POST the page shows %q, want %q", got, "posted")
	}
	if b.has("#js") {
		t.Fatal("the page the POST led to still shows the first page's button")
	}
	img, err := png.Decode(bytes.NewReader(b.screenshot()))
	if err != nil {
		t.Fatalf("the screenshot is no PNG: %v", err)
	}
	if got := img.Bounds().Size(); got.X != viewportWidth || got.Y != viewportHeight {
		t.Fatalf("the screenshot is %dx%d, want %dx%d", got.X, got.Y, viewportWidth, viewportHeight)
	}
	if d := b.Dialogs(); len(d) != 0 {
		t.Fatalf("the page opened dialogs: %q", d)
	}
}
