package e2e

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/input"
	"github.com/chromedp/chromedp"

	"github.com/spacesandbox/space/client"
)

// consoleLogin opens the console and logs in with token.
func consoleLogin(b *browserTab, base, token string) {
	b.t.Helper()
	b.open("open the console", base+"/console/", 30*time.Second)
	b.do("log in", 30*time.Second,
		chromedp.WaitVisible(chromedp.CSS("#token")),
		chromedp.SendKeys(chromedp.CSS("#token"), token),
		chromedp.Click(chromedp.CSS("#login")))
	b.waitFor("logged in", `!document.getElementById('nav').hidden`, 15*time.Second)
}

// waitPage waits until the console has shown page (its main element says
// so once the page has read what it shows).
func (b *browserTab) waitPage(page string, timeout time.Duration) {
	b.t.Helper()
	b.waitFor("the "+page+" page", `document.getElementById('main').dataset.ready === '`+page+`'`, timeout)
}

// jsonText is v as JSON text (a quoted string is also a JavaScript
// string literal).
func jsonText(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// TestConsole drives the web console in real headless Chromium against a
// real server on gVisor: log in (a wrong token refused), create a sandbox
// and watch it turn running without reloading, run python in the
// terminal, upload a file and download it back byte-identical, suspend
// and wake from the buttons while the terminal reconnects and keeps its
// output, see a revoked token's session refused, delete. Screenshots of
// every page (1280×800) go to the folder it logs.
func TestConsole(t *testing.T) {
	needChromium(t)
	requireGVisor(t)
	s := startSeedServer(t, "gvisor")
	base := "http://" + s.apiAddr
	shots := artifactDir(t, "console")
	b := newBrowserTab(t, shots)

	// A wrong token is refused, and says so.
	b.expectRefusal("/v1/token")
	b.open("open the console", base+"/console/", 30*time.Second)
	b.do("wrong token", 30*time.Second,
		chromedp.WaitVisible(chromedp.CSS("#token")),
		chromedp.SendKeys(chromedp.CSS("#token"), "space_wrong"),
		chromedp.Click(chromedp.CSS("#login")))
	b.waitFor("the refusal", `document.getElementById('login-error').textContent.includes('refused')`, 10*time.Second)
	b.shot("login")
	b.labelled("login")
	b.eval(`document.getElementById('token').value = ''`)
	b.do("log in", 10*time.Second, chromedp.SendKeys(chromedp.CSS("#token"), s.token), chromedp.Click(chromedp.CSS("#login")))
	b.waitPage("overview", 15*time.Second)
	if got := b.eval(`sessionStorage.getItem('space.token') === ` + jsonText(s.token) + ` && !location.href.includes('space_') ? 'ok' : location.href`); got != "ok" {
		t.Fatalf("token storage: %s", got)
	}

	// Create from the sandboxes page; it turns running with no reload.
	b.do("sandboxes page", 10*time.Second, chromedp.Navigate(base+"/console/#/sandboxes"))
	b.waitPage("sandboxes", 15*time.Second)
	b.eval(`window.__marker = 'same page'; ''`)
	b.do("create", 10*time.Second, chromedp.Click(chromedp.CSS("#create")))
	b.waitFor("a new row", `document.querySelector('#sandboxes-table tr[data-id]') !== null`, 20*time.Second)
	sbx := b.eval(`document.querySelector('#sandboxes-table tr[data-id]').dataset.id`)
	b.waitFor("running", `document.querySelector('#sandboxes-table tr[data-id="`+sbx+`"]')?.dataset.state === 'running'`, 90*time.Second)
	if b.eval(`window.__marker || 'reloaded'`) != "same page" {
		t.Fatal("the page reloaded")
	}
	b.shot("sandboxes")
	b.labelled("sandboxes")

	// The sandbox page: a terminal runs python.
	b.do("sandbox page", 10*time.Second, chromedp.Click(chromedp.CSS(`a[href="#/sandboxes/`+sbx+`"]`)))
	b.waitPage("sandbox", 15*time.Second)
	b.do("open the terminal", 10*time.Second, chromedp.Click(chromedp.CSS("#terminal-open")))
	b.waitFor("the terminal connected", `document.getElementById('terminal').dataset.status === 'connected'`, 30*time.Second)
	b.waitFor("the prompt", `/# $/.test(document.getElementById('terminal').dataset.text || '')`, 30*time.Second)
	typeLine := func(line string) {
		t.Helper()
		b.do("type "+line, 20*time.Second, chromedp.Focus(chromedp.CSS("#terminal .xterm-helper-textarea")), typeInto(line))
	}
	typeLine(`python3 -c 'print(6*7)'`)
	b.waitFor("42 in the terminal", `/[\r\n]42\r?\n/.test(document.getElementById('terminal').dataset.text || '')`, 30*time.Second)
	b.shot("sandbox-terminal")
	b.labelled("sandbox")

	// Resizing the window resizes the terminal's PTY.
	wide := b.eval(`document.getElementById('terminal').dataset.size`)
	b.do("a narrower window", 10*time.Second, chromedp.EmulateViewport(1000, 800))
	b.waitFor("the terminal resized", `(() => { const z = document.getElementById('terminal').dataset.size; return z && z !== '`+wide+`'; })()`, 10*time.Second)
	size := strings.Split(b.eval(`document.getElementById('terminal').dataset.size`), "x")
	typeLine(`stty size`)
	b.waitFor("stty's answer", `(document.getElementById('terminal').dataset.text || '').includes('`+size[1]+` `+size[0]+`\r\n')`, 20*time.Second)
	b.do("the window back", 10*time.Second, chromedp.EmulateViewport(1280, 800))

	// Upload a file into /root, then download it back.
	payload := make([]byte, 300<<10)
	rand.Read(payload)
	src := filepath.Join(t.TempDir(), "console-upload.bin")
	if err := os.WriteFile(src, payload, 0o644); err != nil {
		t.Fatal(err)
	}
	b.do("upload", 30*time.Second, chromedp.SetUploadFiles(chromedp.CSS("#files-upload"), []string{src}))
	b.waitFor("the uploaded file listed", `document.querySelector('#files-list tr[data-name="console-upload.bin"]') !== null`, 30*time.Second)
	b.do("download", 10*time.Second, chromedp.Click(chromedp.CSS(`#files-list button[data-download="console-upload.bin"]`)))
	var got []byte
	waitFor(t, "the download", func() bool {
		var err error
		got, err = os.ReadFile(filepath.Join(b.downloads, "console-upload.bin"))
		return err == nil && len(got) == len(payload)
	})
	if !bytes.Equal(got, payload) {
		t.Fatalf("downloaded %d bytes, not the %d uploaded", len(got), len(payload))
	}

	// The network policy, edited on the page: egress none with one address
	// allowed, then a rule the server refuses. The sandbox follows at once.
	pub := s.up.Public[0].String()
	reach := func() bool {
		out, _ := s.sh(sbx, "curl -sS -m 3 http://"+pub+"/ 2>&1")
		return reachedUpstream(out)
	}
	if !reach() {
		t.Fatalf("with the default egress (public) the sandbox does not reach %s", pub)
	}
	setPolicy := func(egress, allow string) {
		t.Helper()
		b.eval(`(() => { document.getElementById('net-egress').value = ` + jsonText(egress) + `; document.getElementById('net-allow').value = ` + jsonText(allow) +
			`; document.getElementById('net-form').dispatchEvent(new Event('input')); return ''; })()`)
		b.do("save the policy", 10*time.Second, chromedp.Click(chromedp.CSS("#net-save")))
	}
	setPolicy("none", "")
	b.waitFor("the policy saved", `document.getElementById('net-status').dataset.state === 'succeeded'`, 10*time.Second)
	b.waitFor("the details showing it", `document.getElementById('details').textContent.includes('egress none')`, 10*time.Second)
	if reach() {
		t.Fatal("egress none set in the console, and the sandbox still reaches the upstream")
	}
	b.expectRefusal("/v1/sandboxes/" + sbx + "/network")
	setPolicy("none", "198.51.100.0/33\n"+pub)
	b.waitFor("the refusal", `document.getElementById('net-status').dataset.state === 'failed'`, 10*time.Second)
	if msg := b.eval(`document.getElementById('net-status').textContent`); !strings.Contains(msg, "198.51.100.0/33") {
		t.Fatalf("the refused rule is not named: %q", msg)
	}
	setPolicy("none", pub)
	b.waitFor("the policy saved", `document.getElementById('net-status').dataset.state === 'succeeded'`, 10*time.Second)
	if sb, err := s.client().GetSandbox(context.Background(), sbx); err != nil || sb.Network == nil || sb.Network.Egress != "none" || !slices.Equal(sb.Network.Allow, []string{pub}) {
		t.Fatalf("the policy saved in the console: %+v %v", sb, err)
	}
	if !reach() {
		t.Fatalf("%s allowed in the console, and the sandbox does not reach it", pub)
	}
	if got := b.eval(`document.getElementById('net-ingress').textContent`); got == "" || got == "—" {
		t.Fatal("the ingress token is not shown")
	}
	b.shot("sandbox-network")

	// A counter prints in the terminal across a suspend and a wake: the
	// terminal reconnects (Last-Event-ID) and keeps what it showed.
	typeLine(`for i in $(seq 1 400); do echo tick-$i; sleep 0.25; done`)
	b.waitFor("ticks", `(document.getElementById('terminal').dataset.text || '').includes('tick-3')`, 20*time.Second)
	b.do("suspend", 10*time.Second, chromedp.Click(chromedp.CSS("#do-suspend")))
	b.waitFor("suspended", `document.getElementById('sandbox-state')?.dataset.state === 'suspended'`, 90*time.Second)
	b.waitFor("the terminal waiting", `document.getElementById('terminal').dataset.status === 'reconnecting'`, 30*time.Second)
	b.waitFor("the suspend's progress", `document.getElementById('op-progress').dataset.state === 'succeeded'`, 30*time.Second)
	b.shot("sandbox-suspended")
	before := b.eval(`document.getElementById('terminal').dataset.text`)
	b.do("wake", 10*time.Second, chromedp.Click(chromedp.CSS("#do-wake")))
	b.waitFor("running again", `document.getElementById('sandbox-state')?.dataset.state === 'running'`, 90*time.Second)
	b.waitFor("the terminal reconnected", `document.getElementById('terminal').dataset.status === 'connected'`, 30*time.Second)
	last := lastTick(before)
	b.waitFor("ticks after the wake", `(document.getElementById('terminal').dataset.text || '').includes('tick-`+strconv.Itoa(last+8)+`')`, 30*time.Second)
	after := b.eval(`document.getElementById('terminal').dataset.text`)
	// Every tick from before the suspend to after the wake, once each.
	for i := max(1, last-20); i <= last+8; i++ {
		if n := strings.Count(after, "tick-"+strconv.Itoa(i)+"\r\n"); n != 1 && strings.Contains(after, "tick-"+strconv.Itoa(max(1, last-20))+"\r\n") {
			t.Fatalf("tick-%d shown %d times after the wake:\n%s", i, n, after)
		}
	}
	if !strings.Contains(b.eval(`document.querySelector('#terminal .xterm-rows').textContent`), "tick-") {
		t.Fatal("the terminal shows no output after the wake")
	}
	b.shot("sandbox-woken")

	// A process started through the API, seen and killed on the page.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	sess, err := s.client().CreateCommand(ctx, sbx, client.CommandRequest{Command: []string{"sleep", "600"}}, "")
	if err != nil {
		t.Fatal(err)
	}
	ended := make(chan *client.Event, 1)
	go func() {
		last, _ := s.client().Attach(ctx, sess, "", 3, func(client.Event) error { return nil })
		ended <- last
	}()
	proc := `document.querySelector('#processes tr[data-process="` + sess.ProcessID + `"]')`
	waitFor(t, "the process on the page", func() bool {
		b.do("refresh the processes", 10*time.Second, chromedp.Click(chromedp.CSS("#procs-refresh")))
		time.Sleep(300 * time.Millisecond)
		return b.eval(proc+`?.dataset.state || ''`) == "running"
	})
	b.do("kill it", 10*time.Second, chromedp.Click(chromedp.CSS(`#processes tr[data-process="`+sess.ProcessID+`"] button[data-signal="SIGKILL"]`)))
	select {
	case last := <-ended:
		if last == nil || last.Name != "process_exited" || last.Signal != "SIGKILL" {
			t.Fatalf("the process killed from the console ended with %+v", last)
		}
	case <-ctx.Done():
		t.Fatal("the process killed from the console runs on")
	}
	waitFor(t, "the process gone from the running ones", func() bool {
		b.do("refresh the processes", 10*time.Second, chromedp.Click(chromedp.CSS("#procs-refresh")))
		time.Sleep(300 * time.Millisecond)
		return b.eval(proc+`?.dataset.state || 'gone'`) == "gone"
	})

	// Fork ×2 and a snapshot from the sandbox's page; a sandbox started
	// from the snapshot on the snapshots page; the snapshot deleted there.
	b.eval(`(() => { document.getElementById('fork-count').value = '2'; return ''; })()`)
	b.do("fork", 10*time.Second, chromedp.Click(chromedp.CSS("#do-fork")))
	b.waitFor("the fork's progress", `document.getElementById('op-progress').dataset.state === 'succeeded' && document.querySelectorAll('#op-progress a[data-fork]').length === 2`, 90*time.Second)
	var copies []string
	if err := json.Unmarshal([]byte(b.eval(`JSON.stringify([...document.querySelectorAll('#op-progress a[data-fork]')].map((a) => a.dataset.fork))`)), &copies); err != nil {
		t.Fatal(err)
	}
	for _, c := range copies {
		if sb, err := s.client().GetSandbox(context.Background(), c); err != nil || sb.State != "running" || sb.ForkOf != sbx {
			t.Fatalf("fork %s from the console: %+v %v", c, sb, err)
		}
	}
	b.shot("sandbox-forked")
	b.eval(`(() => { document.getElementById('snapshot-name').value = 'console-snap'; return ''; })()`)
	b.do("snapshot", 10*time.Second, chromedp.Click(chromedp.CSS("#do-snapshot")))
	b.waitFor("the snapshot's progress", `document.getElementById('op-progress').dataset.state === 'succeeded' && document.querySelector('#op-progress a[data-snapshot]') !== null`, 90*time.Second)
	snapID := b.eval(`document.querySelector('#op-progress a[data-snapshot]').dataset.snapshot`)
	b.do("snapshots page", 10*time.Second, chromedp.Click(chromedp.CSS(`#op-progress a[data-snapshot]`)))
	b.waitPage("snapshots", 15*time.Second)
	row := `document.querySelector('#snapshots-table tr[data-snapshot="` + snapID + `"]')`
	b.waitFor("the snapshot listed, ready", row+`?.dataset.state === 'ready' && `+row+`.dataset.name === 'console-snap'`, 20*time.Second)
	b.shot("snapshots")
	b.labelled("snapshots")
	b.do("new sandbox from the snapshot", 10*time.Second, chromedp.Click(chromedp.CSS(`button[data-start="`+snapID+`"]`)))
	b.waitPage("sandbox", 20*time.Second)
	fromSnap := b.eval(`document.getElementById('sandbox-state').closest('.page-head').querySelector('h1').textContent`)
	b.waitFor("the sandbox from the snapshot running", `document.getElementById('sandbox-state')?.dataset.state === 'running'`, 90*time.Second)
	if out, _ := s.sh(fromSnap, "cat /root/console-upload.bin | wc -c"); strings.TrimSpace(out) != strconv.Itoa(len(payload)) {
		t.Fatalf("the sandbox started from the console's snapshot lacks the uploaded file: %q", out)
	}
	b.do("snapshots page again", 10*time.Second, chromedp.Navigate(base+"/console/#/snapshots"))
	b.waitPage("snapshots", 15*time.Second)
	// Tagged as a template, it is what a create of that name starts from,
	// and it cannot be deleted until untagged.
	b.eval(`(() => { document.getElementById('tag-snapshot').value = ` + jsonText(snapID) + `; document.getElementById('tag-ref').value = 'console-warm:v1'; return ''; })()`)
	b.do("tag it", 10*time.Second, chromedp.Click(chromedp.CSS("#tag-do")))
	b.waitFor("the tag shown", `document.querySelector('button[data-untag="`+snapID+`"]') !== null`, 20*time.Second)
	fromTag, _, err := s.client().CreateSandbox(context.Background(), client.CreateSandboxRequest{Template: "console-warm:v1"}, "")
	if err != nil || fromTag.Sandbox.Snapshot != snapID {
		t.Fatalf("create of the tag set in the console: %+v %v", fromTag, err)
	}
	// (A snapshot a sandbox is still starting from cannot be deleted.)
	if op := s.waitOp(fromTag.Operation.ID); op.State != "succeeded" {
		t.Fatalf("create of the tag set in the console: %+v", op.Error)
	}
	b.expectRefusal("/v1/snapshots/" + snapID)
	b.do("delete the tagged snapshot", 10*time.Second, chromedp.Click(chromedp.CSS(`button[data-delete="`+snapID+`"]`)))
	b.waitFor("the confirmation", `document.getElementById('confirm').open`, 5*time.Second)
	b.do("confirm", 10*time.Second, chromedp.Click(chromedp.CSS("#confirm-ok")))
	b.waitFor("the refusal shown", `[...document.querySelectorAll('#toasts .error')].some((x) => x.textContent.includes('`+snapID+`'))`, 10*time.Second)
	b.shot("snapshots-tagged")
	b.do("untag it", 10*time.Second, chromedp.Click(chromedp.CSS(`button[data-untag="`+snapID+`"]`)))
	b.waitFor("the tag gone", `document.querySelector('button[data-untag="`+snapID+`"]') === null && `+row+` !== null`, 20*time.Second)
	b.do("delete the snapshot", 10*time.Second, chromedp.Click(chromedp.CSS(`button[data-delete="`+snapID+`"]`)))
	b.waitFor("the confirmation", `document.getElementById('confirm').open`, 5*time.Second)
	b.do("confirm", 10*time.Second, chromedp.Click(chromedp.CSS("#confirm-ok")))
	b.waitFor("the snapshot gone from the list", row+` === null`, 20*time.Second)
	if _, err := s.client().GetSnapshot(context.Background(), snapID); !client.IsCode(err, "not_found") {
		t.Fatalf("the snapshot deleted in the console: %v", err)
	}
	b.do("back to the sandbox", 10*time.Second, chromedp.Navigate(base+"/console/#/sandboxes/"+sbx))
	b.waitPage("sandbox", 15*time.Second)

	// The other pages.
	for _, p := range []struct{ hash, ready string }{{"#/operations", "operations"}, {"#/", "overview"}, {"#/templates", "templates"}} {
		b.do("page "+p.ready, 10*time.Second, chromedp.Navigate(base+"/console/"+p.hash))
		b.waitPage(p.ready, 20*time.Second)
		b.shot(p.ready)
		b.labelled(p.ready)
	}
	// A warm pool set from the templates page fills, and the page shows it.
	pool := `document.querySelector('tr[data-template="seed:latest"]')`
	setPool := func(n string) {
		t.Helper()
		b.eval(`(() => { const i = ` + pool + `.querySelector('input'); i.value = '` + n + `'; return ''; })()`)
		b.do("set the warm pool to "+n, 10*time.Second, chromedp.Click(chromedp.CSS(`tr[data-template="seed:latest"] button`)))
		b.waitFor("the pool at "+n, pool+`.querySelector('.pool-ready').dataset.ready === '`+n+`'`, 90*time.Second)
	}
	setPool("1")
	b.shot("templates-pool")
	setPool("0")

	// The audit log shows this session's changes, allowed and refused,
	// newest first, and filters them on the server.
	b.do("audit page", 10*time.Second, chromedp.Navigate(base+"/console/#/audit"))
	b.waitPage("audit", 20*time.Second)
	b.shot("audit")
	b.labelled("audit")
	auditRows := func(filter string) string {
		return b.eval(`JSON.stringify([...document.querySelectorAll('#audit tr[data-action]')].filter((r) => ` + filter + `).map((r) => r.dataset.action + ' ' + r.dataset.outcome))`)
	}
	if got := auditRows(`r.dataset.action.endsWith(':fork') && r.dataset.outcome === 'ok'`); got == "[]" {
		t.Fatalf("the audit page shows no fork: %s", auditRows("true"))
	}
	if got := auditRows(`r.dataset.action.endsWith('/network') && r.dataset.outcome === 'invalid_argument'`); got == "[]" {
		t.Fatalf("the audit page shows no refused network policy: %s", auditRows("true"))
	}
	b.eval(`(() => { document.getElementById('audit-action').value = ':fork'; return ''; })()`)
	b.do("filter the audit log", 10*time.Second, chromedp.Click(chromedp.CSS("#audit-apply")))
	b.waitFor("only forks", `document.getElementById('audit-status').dataset.count !== undefined && [...document.querySelectorAll('#audit tr[data-action]')].every((r) => r.dataset.action.endsWith(':fork'))`, 20*time.Second)
	if got := auditRows("true"); got == "[]" {
		t.Fatal("the audit log filtered by :fork is empty")
	}
	b.eval(`(() => { const o = document.getElementById('audit-outcome'); o.value = 'refused'; o.dispatchEvent(new Event('change')); return ''; })()`)
	if got := auditRows(`r.dataset.outcome === 'ok'`); got != "[]" {
		t.Fatalf("refused only, yet allowed rows show: %s", got)
	}
	b.do("overview", 10*time.Second, chromedp.Navigate(base+"/console/#/"))
	b.waitPage("overview", 20*time.Second)
	if !strings.Contains(b.eval(`document.getElementById('latency').textContent`), "suspend") {
		t.Fatal("the overview shows no suspend latency")
	}

	// A session whose token is revoked can no longer act.
	r := s.do("POST", "/v1/tokens", s.token, []byte(`{"name":"console-member","role":"member"}`))
	var made struct {
		Token struct {
			ID string `json:"id"`
		} `json:"token"`
		Value string `json:"value"`
	}
	r.json(t, &made)
	if made.Value == "" {
		t.Fatalf("create token: %d %s", r.status, r.body)
	}
	b.do("log out", 10*time.Second, chromedp.Click(chromedp.CSS("#logout")))
	consoleLogin(b, base, made.Value)
	// A member may snapshot but not tag: the page says so.
	b.do("snapshots page as member", 10*time.Second, chromedp.Navigate(base+"/console/#/snapshots"))
	b.waitPage("snapshots", 15*time.Second)
	if got := b.eval(`document.getElementById('tag-do').disabled && document.getElementById('tag-help') !== null ? 'ok' : 'enabled'`); got != "ok" {
		t.Fatal("a member's snapshots page offers tagging, which needs an admin")
	}
	b.do("audit page as member", 10*time.Second, chromedp.Navigate(base+"/console/#/audit"))
	b.waitPage("audit", 15*time.Second)
	if got := b.eval(`document.getElementById('audit-denied') !== null && document.getElementById('audit') === null ? 'ok' : 'shown'`); got != "ok" {
		t.Fatal("a member's audit page does not say the log needs an admin")
	}
	b.do("sandbox page as member", 10*time.Second, chromedp.Navigate(base+"/console/#/sandboxes/"+sbx))
	b.waitPage("sandbox", 15*time.Second)
	if r := s.do("DELETE", "/v1/tokens/"+made.Token.ID, s.token, nil); r.status != 200 && r.status != 204 {
		t.Fatalf("revoke: %d %s", r.status, r.body)
	}
	b.expectRefusal("/v1/sandboxes/" + sbx + ":pause")
	// The page's event stream re-checks the token at its next change or
	// keepalive and may log the session out before the click: either way
	// the session must end on the login page, having changed nothing.
	how := b.eval(`(() => { const p = document.getElementById('do-pause'); if (!p) return 'logged out by the event stream'; p.click(); return 'clicked pause'; })()`)
	t.Logf("revoked session: %s", how)
	b.waitFor("the login page", `(document.getElementById('login-error')?.textContent || '').includes('Logged out')`, 20*time.Second)
	b.shot("revoked")
	if nav := b.eval(`getComputedStyle(document.getElementById('nav')).display + ' ' + getComputedStyle(document.getElementById('who')).display`); nav != "none none" {
		t.Fatalf("the logged-out page still shows the navigation and the user: %s", nav)
	}
	if sb, err := s.client().GetSandbox(context.Background(), sbx); err != nil || sb.State != "running" {
		t.Fatalf("after a revoked token's pause: %+v %v", sb, err)
	}
	if b.eval(`sessionStorage.getItem('space.token') || 'gone'`) != "gone" {
		t.Fatal("the revoked token is still kept")
	}

	// Delete, confirmed in the dialog.
	consoleLogin(b, base, s.token)
	b.do("sandbox page", 10*time.Second, chromedp.Navigate(base+"/console/#/sandboxes/"+sbx))
	b.waitPage("sandbox", 15*time.Second)
	b.do("delete", 10*time.Second, chromedp.Click(chromedp.CSS("#do-delete")))
	b.waitFor("the confirmation", `document.getElementById('confirm').open`, 5*time.Second)
	b.shot("confirm-delete")
	b.do("confirm", 10*time.Second, chromedp.Click(chromedp.CSS("#confirm-ok")))
	b.waitFor("deleted", `document.getElementById('sandbox-state')?.dataset.state === 'deleted'`, 60*time.Second)
	if sb, err := s.client().GetSandbox(context.Background(), sbx); err != nil || sb.State != "deleted" {
		t.Fatalf("after delete: %+v %v", sb, err)
	}
	b.noConsoleErrors()
}

// typeInto types line and Enter into the focused element as a person
// would: the text as input (what a keyboard's characters become), Enter as
// a key press. (chromedp's SendKeys sends a key event and a character event
// for each printable key, and xterm.js takes both.)
func typeInto(line string) chromedp.Action[chromedp.Void] {
	return chromedp.Func(func(ctx context.Context, t *chromedp.Target) error {
		if _, err := cdp.Call(ctx, t, input.InsertText, input.InsertTextParams{Text: line}); err != nil {
			return err
		}
		enter := input.DispatchKeyEventParams{Key: "Enter", Code: "Enter", WindowsVirtualKeyCode: 13, NativeVirtualKeyCode: 13}
		for _, typ := range []input.DispatchKeyEventType{input.DispatchKeyEventTypeRawKeyDown, input.DispatchKeyEventTypeChar, input.DispatchKeyEventTypeKeyUp} {
			ev := enter
			ev.Type = typ
			if typ == input.DispatchKeyEventTypeChar {
				ev.Text = "\r"
			}
			if _, err := cdp.Call(ctx, t, input.DispatchKeyEvent, ev); err != nil {
				return err
			}
		}
		return nil
	})
}

// lastTick is the highest tick-N in text.
func lastTick(text string) int {
	last := 0
	for _, f := range strings.Split(text, "tick-")[1:] {
		end := strings.IndexFunc(f, func(r rune) bool { return r < '0' || r > '9' })
		if end < 0 {
			end = len(f)
		}
		if n, err := strconv.Atoi(f[:end]); err == nil && n > last {
			last = n
		}
	}
	return last
}

// TestConsoleThousandSandboxesFakeRuntime loads the sandboxes page over a
// fleet of 1,000 and reports how long the page took (navigation to the
// first rows shown, in the browser); the table keeps only the rows in view
// in the DOM and reads the next page as it scrolls. The FAKE runtime runs
// the fleet as records without agents: the page's cost is the API's and
// the browser's, not the sandboxes'.
func TestConsoleThousandSandboxesFakeRuntime(t *testing.T) {
	needChromium(t)
	s := startServer(t, serverOpts{args: []string{"--runtime", "fake", "--max-sandboxes", "0"}, env: []string{"SPACE_AGENT_BIN=off"}})
	const n = 1000
	var wg sync.WaitGroup
	ids := make(chan struct{}, n)
	for range n {
		ids <- struct{}{}
	}
	close(ids)
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range ids {
				r := s.do("POST", "/v1/sandboxes", s.token, []byte(`{"metadata":{"fleet":"console"}}`))
				if r.status != 202 {
					t.Errorf("create: %d %s", r.status, r.body)
					return
				}
			}
		}()
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	b := newBrowserTab(t, artifactDir(t, "console-fleet"))
	consoleLogin(b, "http://"+s.apiAddr, s.token)
	var loads []int
	for range 3 {
		b.do("reload the sandboxes page", 30*time.Second, chromedp.Navigate("about:blank"), chromedp.Navigate("http://"+s.apiAddr+"/console/#/sandboxes"))
		b.waitFor("the first rows", `document.getElementById('main').dataset.ready === 'sandboxes' && document.querySelectorAll('#sandboxes-table tr[data-id]').length > 10`, 30*time.Second)
		ms, _ := strconv.Atoi(b.eval(`String(Math.round(Number(document.getElementById('main').dataset.readyAt)))`))
		loads = append(loads, ms)
	}
	t.Logf("sandboxes page with %d sandboxes: ready in %v ms (navigation start to rows shown; 3 loads)", n, loads)
	os.WriteFile(filepath.Join(b.shots, "load.json"), []byte(`{"sandboxes":1000,"ready_ms":`+jsonText(loads)+"}\n"), 0o644)
	b.shot("sandboxes-1000")
	if rows, _ := strconv.Atoi(b.eval(`String(document.querySelectorAll('#sandboxes-table tr[data-id]').length)`)); rows > 120 {
		t.Fatalf("%d rows in the DOM: the table is not virtualised", rows)
	}
	// Scrolling to the end reads the second page: all 1,000 are listed.
	b.eval(`(() => { const s = document.querySelector('.scroller'); s.scrollTop = s.scrollHeight; return ''; })()`)
	b.waitFor("all 1000 listed", `document.getElementById('sandbox-count').textContent.startsWith('1000 sandboxes')`, 20*time.Second)
	b.eval(`(() => { const s = document.querySelector('.scroller'); s.scrollTop = s.scrollHeight; return ''; })()`)
	b.waitFor("the last rows shown", `document.querySelector('#sandboxes-table tr[aria-rowindex="1001"]') !== null`, 10*time.Second)
	b.labelled("sandboxes (fleet)")

	// Three selected, suspended in bulk after a confirmation; the rows
	// follow live, and the state filter finds them.
	b.eval(`(() => { document.querySelector('.scroller').scrollTop = 0; return ''; })()`)
	b.waitFor("the first rows again", `document.querySelector('#sandboxes-table tr[aria-rowindex="2"]') !== null`, 10*time.Second)
	for i := 1; i <= 3; i++ {
		b.do("select a row", 10*time.Second, chromedp.Click(chromedp.CSS(`#sandboxes-table tr[aria-rowindex="`+strconv.Itoa(i+1)+`"] input[type=checkbox]`)))
	}
	picked := b.eval(`JSON.stringify([2, 3, 4].map((i) => document.querySelector('#sandboxes-table tr[aria-rowindex="' + i + '"]').dataset.id))`)
	b.do("bulk suspend", 10*time.Second, chromedp.Click(chromedp.CSS(`button[data-bulk="suspend"]`)))
	b.waitFor("the confirmation", `document.getElementById('confirm').open && document.getElementById('confirm-title').textContent === 'Suspend 3 sandboxes?'`, 5*time.Second)
	b.do("confirm", 10*time.Second, chromedp.Click(chromedp.CSS("#confirm-ok")))
	b.waitFor("three suspended", picked+`.every((id) => document.querySelector('#sandboxes-table tr[data-id="' + id + '"]')?.dataset.state === 'suspended')`, 30*time.Second)
	b.shot("sandboxes-bulk-suspended")
	b.do("filter suspended", 10*time.Second, chromedp.SetValue(chromedp.CSS("#filter-state"), "suspended"), chromedp.Evaluate[chromedp.Void](`document.getElementById('filter-state').dispatchEvent(new Event('change'))`))
	b.waitFor("the filtered list", `document.getElementById('sandbox-count').textContent.startsWith('3 sandboxes')`, 10*time.Second)
	b.noConsoleErrors()
}
