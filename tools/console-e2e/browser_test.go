package consolee2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"

	"github.com/go-outbox/outbox/internal/testsvc"
)

// ChromiumEnv names the variable holding the browser the tests drive (scripts/chromium.sh
// prints it, and .ci/run exports it). Unset, chromium or chromium-browser on PATH is used.
const ChromiumEnv = "OUTBOX_TEST_CHROMIUM"

// The browser's window: the size of every screenshot as well.
const (
	viewportWidth  = 1280
	viewportHeight = 800
)

// TestMain fails the run if a goroutine outlives the tests: chromedp's goroutines (the
// reader of the browser's pipe, the target's event loops) end with the allocator's cancel,
// which waits for the browser process to exit.
func TestMain(m *testing.M) { os.Exit(testsvc.RunWithLeakCheck(m)) }

// chromiumPath returns the browser to drive, skipping t when there is none, or failing it
// under OUTBOX_REQUIRE_SERVICES=1, as a missing database does.
func chromiumPath(t testing.TB) string {
	t.Helper()
	if p := os.Getenv(ChromiumEnv); p != "" {
		if _, err := exec.LookPath(p); err != nil {
			t.Fatalf("%s=%s is no browser to run: %v", ChromiumEnv, p, err)
		}
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	err := fmt.Errorf("no headless browser: set %s, or install Debian's chromium (bash scripts/chromium.sh install prints its path)", ChromiumEnv)
	if os.Getenv(testsvc.RequireEnv) == "1" {
		t.Fatalf("required test service missing (%s=1): %v", testsvc.RequireEnv, err)
	}
	t.Skipf("skipping: %v", err)
	return ""
}

// browserOptions are the flags the browser runs with: chromedp's defaults (headless, no
// first-run page, no background networking, and Puppeteer's quiet set), then what a
// container needs (no sandbox as root, no GPU) and no component updates, which would
// reach for the network.
func browserOptions(path string) []chromedp.ExecAllocatorOption {
	return append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(path),
		chromedp.Headless,
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.WindowSize(viewportWidth, viewportHeight),
	)
}

// tab is one browser tab a test drives, with what the page did that it must not do.
type tab struct {
	t   *testing.T
	ctx context.Context

	mu      sync.Mutex
	dialogs []string // messages of the JavaScript dialogs the page opened (alert, confirm)
}

// newBrowser starts a headless browser of t's own and returns its first tab. The browser
// is stopped when t ends (the allocator's cancel waits for its process to exit); every
// action of the tab ends within timeout. Each dialog the page opens is dismissed and
// recorded (see [tab.Dialogs]).
func newBrowser(t *testing.T, timeout time.Duration) *tab {
	t.Helper()
	path := chromiumPath(t)
	actx, acancel := chromedp.NewExecAllocator(context.Background(), browserOptions(path)...)
	bctx, bcancel := chromedp.NewContext(actx, chromedp.WithErrorf(func(format string, args ...any) {
		// The browser's protocol errors are worth a line of the test's log, not a failure:
		// a test checks what the page shows.
		t.Logf("chromedp: "+format, args...)
	}))
	t.Cleanup(func() {
		bcancel()
		acancel()
	})
	// The first Run starts the browser; it lives as long as bctx, so no timeout on that.
	if err := chromedp.Do(bctx, chromedp.EmulateViewport(viewportWidth, viewportHeight)); err != nil {
		t.Fatalf("start the headless browser %s: %v", path, err)
	}
	ctx, cancel := context.WithTimeout(bctx, timeout)
	t.Cleanup(cancel)
	tb := &tab{t: t, ctx: ctx}
	dialogs := chromedp.Events(ctx, page.JavascriptDialogOpening)
	go func() {
		for ev, err := range dialogs {
			if err != nil {
				return
			}
			tb.mu.Lock()
			tb.dialogs = append(tb.dialogs, ev.Message)
			tb.mu.Unlock()
			_, _ = chromedp.Call(ctx, page.HandleJavaScriptDialog, page.HandleJavaScriptDialogParams{Accept: false})
		}
	}()
	return tb
}

// Dialogs returns the messages of the dialogs the page has opened so far.
func (b *tab) Dialogs() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]string(nil), b.dialogs...)
}

// do runs steps in the tab, failing the test on an error.
func (b *tab) do(what string, steps ...chromedp.Action[chromedp.Void]) {
	b.t.Helper()
	if err := chromedp.Do(b.ctx, steps...); err != nil {
		b.t.Fatalf("%s: %v", what, err)
	}
}

// open navigates to url and waits for its load; the page must answer 200.
func (b *tab) open(url string) {
	b.t.Helper()
	resp, err := chromedp.RunResponse(b.ctx, chromedp.Navigate(url))
	if err != nil {
		b.t.Fatalf("open %s: %v", url, err)
	}
	if resp == nil || resp.Status != 200 {
		b.t.Fatalf("open %s: answered %s, want 200", url, status(resp))
	}
}

// click clicks the element with id and waits for the page it leads to; that page must
// answer 200 (after redirects: a POST's 303 leads to a GET page).
func (b *tab) click(id string) {
	b.t.Helper()
	resp, err := chromedp.RunResponse(b.ctx, chromedp.Click(chromedp.ID(id), chromedp.NodeVisible))
	if err != nil {
		b.t.Fatalf("click #%s on %s: %v", id, b.location(), err)
	}
	if resp == nil || resp.Status != 200 {
		b.t.Fatalf("click #%s: the page it led to (%s) answered %s, want 200", id, b.location(), status(resp))
	}
}

// status describes resp's status for a message.
func status(resp *network.Response) string {
	if resp == nil {
		return "no response"
	}
	return fmt.Sprintf("%d %s", resp.Status, resp.StatusText)
}

// text returns the text of the element with id, waiting for it to be there.
func (b *tab) text(id string) string {
	b.t.Helper()
	s, err := chromedp.Run(b.ctx, chromedp.Text(chromedp.ID(id), chromedp.NodeVisible))
	if err != nil {
		b.t.Fatalf("read #%s on %s: %v", id, b.location(), err)
	}
	return strings.TrimSpace(s)
}

// has reports whether the page shows an element matching the CSS selector sel, without
// waiting for one.
func (b *tab) has(sel string) bool {
	b.t.Helper()
	n, err := chromedp.Run(b.ctx, chromedp.Evaluate[bool](fmt.Sprintf("document.querySelector(%q) !== null", sel)))
	if err != nil {
		b.t.Fatalf("look for %s on %s: %v", sel, b.location(), err)
	}
	return n
}

// eval evaluates a JavaScript expression in the page (a promise is awaited) and returns its
// value.
func eval[T any](b *tab, expr string) T {
	b.t.Helper()
	v, err := chromedp.Run(b.ctx, chromedp.Evaluate[T](expr, chromedp.EvalAwaitPromise))
	if err != nil {
		b.t.Fatalf("evaluate %s on %s: %v", expr, b.location(), err)
	}
	return v
}

// location returns the tab's URL, for messages.
func (b *tab) location() string {
	u, err := chromedp.Run(b.ctx, chromedp.Location())
	if err != nil {
		return "(location unknown: " + err.Error() + ")"
	}
	return u
}

// screenshot returns a PNG of the viewport.
func (b *tab) screenshot() []byte {
	b.t.Helper()
	png, err := chromedp.Run(b.ctx, chromedp.CaptureScreenshot())
	if err != nil {
		b.t.Fatalf("screenshot of %s: %v", b.location(), err)
	}
	return png
}
