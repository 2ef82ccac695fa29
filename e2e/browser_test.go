package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/browser"
	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"
)

// browserTab is a real headless Chromium (Debian's chromium) driven over
// the DevTools protocol, one tab, 1280×800. It records every console error,
// uncaught exception and browser-log error (a CSP refusal is one); the test
// fails on any at its end.
type browserTab struct {
	t         *testing.T
	ctx       context.Context
	shots     string // where screenshots go
	downloads string

	mu       sync.Mutex
	problems []string
	expected []string // refusals the test provokes (expectRefusal)
}

// expectRefusal says the test is about to provoke a 4xx answer from path
// (a wrong or revoked token, input the server refuses): the browser logs a
// failed request for it as an error, which is then not one of the page's.
func (b *browserTab) expectRefusal(path string) {
	b.mu.Lock()
	b.expected = append(b.expected, path)
	b.mu.Unlock()
}

// needChromium skips without Chromium, or fails when the run requires it
// (SPACE_REQUIRE_CHROMIUM=1, which CI sets).
func needChromium(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("SPACE_REQUIRE_CHROMIUM") == "1" {
		t.Fatal("SPACE_REQUIRE_CHROMIUM=1 but chromium is not installed (apt-get install chromium)")
	}
	t.Skip("chromium is not installed (apt-get install chromium)")
	return ""
}

// artifactDir is where a test keeps files for people to look at after the
// run (screenshots): $SPACE_ARTIFACTS/<name>, or a folder under the
// system's temporary directory. It is kept, and its path is logged.
func artifactDir(t *testing.T, name string) string {
	root := os.Getenv("SPACE_ARTIFACTS")
	if root == "" {
		root = filepath.Join(os.TempDir(), "space-artifacts")
	}
	dir := filepath.Join(root, name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Logf("artifacts (screenshots): %s", dir)
	fmt.Fprintf(os.Stderr, "e2e: %s screenshots in %s\n", name, dir)
	return dir
}

func newBrowserTab(t *testing.T, shots string) *browserTab {
	t.Helper()
	path := needChromium(t)
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(path),
		chromedp.NoSandbox, // tests run as root
		chromedp.WindowSize(1280, 800),
		chromedp.UserDataDir(t.TempDir()),
		// Nothing leaves loopback: no name resolves but local ones, and
		// none of the browser's own services run.
		chromedp.Flag("host-resolver-rules", "MAP * ~NOTFOUND, EXCLUDE localhost, EXCLUDE 127.0.0.1"),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-domain-reliability", true),
		chromedp.Flag("no-pings", true),
	)
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(actx)
	t.Cleanup(func() { cancel(); cancelAlloc() })
	b := &browserTab{t: t, ctx: ctx, shots: shots, downloads: t.TempDir()}
	messages := chromedp.Console(ctx)
	go func() {
		for m, err := range messages {
			if err != nil {
				return
			}
			if m.Type == chromedp.ConsoleError || m.Type == chromedp.ConsoleException {
				b.mu.Lock()
				b.problems = append(b.problems, fmt.Sprintf("%s: %s (%s:%d)", m.Type, m.Text, m.URL, m.Line))
				b.mu.Unlock()
			}
		}
	}()
	if _, err := chromedp.CallBrowser(ctx, browser.SetDownloadBehavior, browser.SetDownloadBehaviorParams{
		Behavior: browser.SetDownloadBehaviorBehaviorAllow, DownloadPath: b.downloads,
	}); err != nil {
		t.Fatalf("chromium: %v", err)
	}
	b.do("set the viewport", 30*time.Second, chromedp.EmulateViewport(1280, 800))
	return b
}

// do runs steps within timeout.
func (b *browserTab) do(what string, timeout time.Duration, steps ...chromedp.Action[chromedp.Void]) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, timeout)
	defer cancel()
	if err := chromedp.Do(ctx, steps...); err != nil {
		b.shot("failed-" + strings.ReplaceAll(what, " ", "-"))
		b.t.Fatalf("browser: %s: %v", what, err)
	}
}

// open loads url in the tab and waits until its document has loaded,
// watching the document itself rather than the load event chromedp's
// Navigate waits for: on a fresh CI machine that wait once never ended
// (30 s) on a fresh tab's first navigation to a page that serves in
// milliseconds. The old document is marked first, so a page that looks
// the same (the login form again) is not taken for the new one.
func (b *browserTab) open(what, url string, timeout time.Duration) {
	b.t.Helper()
	b.eval(`document.documentElement.dataset.spaceOld = '1'; ''`)
	ctx, cancel := context.WithTimeout(b.ctx, timeout)
	defer cancel()
	res, err := chromedp.Call(ctx, page.Navigate, page.NavigateParams{URL: url})
	if err == nil && res.ErrorText != "" {
		err = fmt.Errorf("%s", res.ErrorText)
	}
	if err != nil {
		b.shot("failed-" + strings.ReplaceAll(what, " ", "-"))
		b.t.Fatalf("browser: %s: navigate to %s: %v", what, url, err)
	}
	// Evaluating while the old document goes away fails ("cannot find
	// context"): that is a not-yet, as is the old document still there.
	var last error
	for ctx.Err() == nil {
		loaded, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`document.documentElement.dataset.spaceOld === undefined && document.readyState === 'complete'`))
		if err == nil && loaded {
			return
		}
		last = err
		time.Sleep(50 * time.Millisecond)
	}
	b.shot("failed-" + strings.ReplaceAll(what, " ", "-"))
	b.t.Fatalf("browser: %s: %s did not load within %v (last error: %v)", what, url, timeout, last)
}

// waitFor waits until the JavaScript expression is truthy.
func (b *browserTab) waitFor(what, expr string, timeout time.Duration) {
	b.t.Helper()
	b.do("wait for "+what, timeout+5*time.Second, chromedp.Poll[chromedp.Void](expr, chromedp.WithPollingTimeout(timeout), chromedp.WithPollingInterval(50*time.Millisecond)))
}

// eval returns the value of a JavaScript expression as a string.
func (b *browserTab) eval(expr string) string {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer cancel()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[string](expr))
	if err != nil {
		b.t.Fatalf("browser: eval %s: %v", expr, err)
	}
	return v
}

// shot saves a screenshot of the viewport (1280×800) as name.png.
func (b *browserTab) shot(name string) {
	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer cancel()
	png, err := chromedp.Run(ctx, chromedp.CaptureScreenshot())
	if err != nil {
		b.t.Logf("screenshot %s: %v", name, err)
		return
	}
	if err := os.WriteFile(filepath.Join(b.shots, name+".png"), png, 0o644); err != nil {
		b.t.Logf("screenshot %s: %v", name, err)
	}
}

// labelled fails the test if a control on the page has no accessible
// name (a label, aria-label, aria-labelledby or text): what a screen
// reader would announce as just "button" or "edit text".
func (b *browserTab) labelled(page string) {
	b.t.Helper()
	bad := b.eval(`JSON.stringify([...document.querySelectorAll('input, select, textarea, button, a[href]')]
		.filter((el) => el.type !== 'hidden' && !el.closest('[hidden]'))
		.filter((el) => !((el.labels && el.labels.length) || el.getAttribute('aria-label') || el.getAttribute('aria-labelledby') || el.textContent.trim()))
		.map((el) => el.outerHTML.slice(0, 120)))`)
	if bad != "[]" {
		b.t.Errorf("%s: controls without an accessible name: %s", page, bad)
	}
}

// noConsoleErrors fails the test if the page logged an error.
func (b *browserTab) noConsoleErrors() {
	b.t.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
next:
	for _, p := range b.problems {
		for _, path := range b.expected {
			if strings.Contains(p, "status of 4") && strings.Contains(p, path+":") {
				continue next
			}
		}
		b.t.Errorf("browser console: %s", p)
	}
}
