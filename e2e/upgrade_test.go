package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spacesandbox/space/client"
	"github.com/spacesandbox/space/internal/runtime/runtimetest"
)

// previousRelease is the commit whose binary made the data directories
// this release must upgrade: the last one before projects (migration 6).
// Move it forward when a release changes the schema again.
const previousRelease = "cf061e5506d543a4250760a5671b257d1518cb49"

// upgradeStop is the release a data directory of previousRelease starts
// once before a release whose agent differs from previousRelease's: the
// first to keep agents by content (4373e5a) as users have it (landed as
// stop 31), so it keeps the agent previousRelease's sandboxes ran, which
// later releases take as theirs (README, "Upgrading").
const upgradeStop = "799cb764a6c025dcaa5879871af5c26b2cdfd5e1"

// buildRelease builds space (with build tags tags, if any) and space-agent
// of commit rev from this repository's history into a directory of the
// test's.
func buildRelease(t *testing.T, rev string, tags ...string) (bin, agent string) {
	t.Helper()
	src := t.TempDir()
	archive := exec.Command("git", "-C", "..", "archive", "--format=tar", rev)
	untar := exec.Command("tar", "-x", "-C", src)
	var aerr bytes.Buffer
	archive.Stderr = &aerr
	pipe, err := archive.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	untar.Stdin = pipe
	if err := untar.Start(); err != nil {
		t.Fatal(err)
	}
	if err := archive.Run(); err != nil {
		if os.Getenv("CI") == "" {
			t.Skipf("release %s is not in this checkout's history: %v %s", rev[:12], err, aerr.String())
		}
		t.Fatalf("git archive %s (CI needs the repository's history): %v %s", rev[:12], err, aerr.String())
	}
	if err := untar.Wait(); err != nil {
		t.Fatalf("untar %s: %v", rev[:12], err)
	}
	out := t.TempDir()
	bin, agent = filepath.Join(out, "space"), filepath.Join(out, "space-agent")
	for _, b := range []struct {
		out, pkg string
		env      []string
	}{{bin, "./cmd/space", nil}} {
		// Built as TestMain builds this release's (-trimpath, -race when
		// the tests are), so the build cache serves the unchanged packages.
		args := []string{"build", "-trimpath", "-o", b.out}
		if raceEnabled {
			args = append(args, "-race")
		}
		if len(tags) > 0 {
			args = append(args, "-tags", strings.Join(tags, ","))
		}
		cmd := exec.Command("go", append(args, b.pkg)...)
		cmd.Dir = src
		cmd.Env = append(os.Environ(), b.env...)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("build %s of %s: %v\n%s", b.pkg, rev[:12], err, out)
		}
	}
	buildAgent(t, src, agent)
	return bin, agent
}

// buildAgent builds the space-agent of the source tree src to out as
// `make build` does: reproducibly (-trimpath, no VCS stamp), so one agent
// source gives the same bytes wherever and whenever it is built.
func buildAgent(t *testing.T, src, out string, extra ...string) {
	t.Helper()
	cmd := exec.Command("go", append(append([]string{"build", "-trimpath", "-buildvcs=false"}, extra...), "-o", out, "./cmd/space-agent")...)
	cmd.Dir = src
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build space-agent in %s: %v\n%s", src, err, b)
	}
}

// TestUpgradeFromPreviousRelease: a data directory the previous release's
// binary made — a running sandbox with a file, a suspended one, a
// snapshot, a warm pool, a second token, an idempotency key — is served by
// this release's binary with nothing lost: every sandbox and token works,
// all of it is the default project's, and projects work from then on.
func TestUpgradeFromPreviousRelease(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the previous release")
	}
	requireGVisor(t)
	oldBin, oldAgent := buildRelease(t, previousRelease)
	// The agent is installed at one path and replaced there by the
	// upgrade, as `make build` does. The previous release's sandboxes mount
	// that path itself and record no agent, and gVisor restores a save only
	// onto the bytes it was made with: when this release's agent differs,
	// the data directory goes through upgradeStop first, as README's
	// "Upgrading" tells users to (it keeps the old agent for them).
	agentPath := filepath.Join(t.TempDir(), "space-agent")
	newAgent := filepath.Join(t.TempDir(), "space-agent")
	buildAgent(t, "..", newAgent)
	agentChanged := !bytes.Equal(mustRead(t, oldAgent), mustRead(t, newAgent))
	install := func(from string) {
		t.Helper()
		b, err := os.ReadFile(from)
		if err == nil {
			err = os.WriteFile(agentPath+".new", b, 0o755)
		}
		if err == nil {
			err = os.Rename(agentPath+".new", agentPath)
		}
		if err != nil {
			t.Fatalf("install the agent: %v", err)
		}
	}
	install(oldAgent)
	dataDir := t.TempDir()
	if out, err := exec.Command(oldBin, "template", "build", "test", "--data-dir", dataDir).CombinedOutput(); err != nil {
		t.Fatalf("build the test template with the previous release: %v\n%s", err, out)
	}
	t.Cleanup(func() { killGVisorLeftovers(dataDir) })
	// SQLite, the single machine's default, also where CI puts gvisor
	// servers on PostgreSQL: the upgrade of the embedded database is the
	// one every single-machine user makes.
	s := startServer(t, serverOpts{bin: oldBin, dataDir: dataDir, template: "test:latest", env: []string{"SPACE_STORE="},
		args: []string{"--runtime", "gvisor", "--build-seed=false", "--agent-bin", agentPath}})
	t.Cleanup(func() { cleanupGVisor(s) })
	ctx := context.Background()
	c := s.client()

	// What the previous release leaves behind.
	second, errOut, code := s.runCLI("token", "create", "--name", "second")
	if code != 0 {
		t.Fatalf("token create (previous release) = %d %s", code, errOut)
	}
	second = strings.TrimSpace(second)
	running := s.createRunning()
	if r := s.do("PUT", "/v1/sandboxes/"+running+"/files?path=/tmp/kept.txt", s.token, []byte("kept across the upgrade"), "Content-Type: application/octet-stream"); r.status/100 != 2 {
		t.Fatalf("write = %d %s", r.status, r.body)
	}
	suspended := s.createRunning()
	if r := s.do("PUT", "/v1/sandboxes/"+suspended+"/files?path=/tmp/suspended.txt", s.token, []byte("asleep"), "Content-Type: application/octet-stream"); r.status/100 != 2 {
		t.Fatalf("write = %d %s", r.status, r.body)
	}
	// Two suspended: one woken by this release as it comes, one after the
	// agent is replaced too.
	later := s.createRunning()
	if r := s.do("PUT", "/v1/sandboxes/"+later+"/files?path=/tmp/suspended.txt", s.token, []byte("asleep longer"), "Content-Type: application/octet-stream"); r.status/100 != 2 {
		t.Fatalf("write = %d %s", r.status, r.body)
	}
	for _, id := range []string{suspended, later} {
		if op, _, err := c.Lifecycle(ctx, "suspend", id, ""); err != nil || s.waitOp(op.ID).State != "succeeded" {
			t.Fatalf("suspend: %v", err)
		}
	}
	snap, snapOp, err := c.CreateSnapshot(ctx, running, "before-upgrade", "")
	if err != nil || s.waitOp(snapOp.ID).State != "succeeded" {
		t.Fatalf("snapshot: %v", err)
	}
	if r := s.do("PUT", "/v1/warm-pools/test:latest", s.token, []byte(`{"min_ready":1}`)); r.status != 200 {
		t.Fatalf("warm pool = %d %s", r.status, r.body)
	}
	keyed := s.do("POST", "/v1/sandboxes", s.token, []byte(`{"template":"test:latest","metadata":{"k":"v"}}`), "Idempotency-Key: before-upgrade-1")
	var keyedResp client.CreateSandboxResponse
	keyed.json(t, &keyedResp)
	if keyed.status != 202 {
		t.Fatalf("keyed create = %d %s", keyed.status, keyed.body)
	}
	s.waitOp(keyedResp.Operation.ID)

	// This release, on the same data directory.
	s.stop()
	if agentChanged {
		t.Logf("this release changes the agent: upgrading through %s", upgradeStop[:12])
		stopBin, stopAgent := buildRelease(t, upgradeStop)
		if !bytes.Equal(mustRead(t, stopAgent), mustRead(t, oldAgent)) {
			t.Fatalf("the agent of %s is not %s's: it cannot be the upgrade stop", upgradeStop[:12], previousRelease[:12])
		}
		s.bin = stopBin
		s.start()
		if r := s.do("GET", "/v1/sandboxes/"+running, s.token, nil); r.status != 200 {
			t.Fatalf("the upgrade stop's view of a running sandbox = %d %s", r.status, r.body)
		}
		s.stop()
	}
	s.bin = spaceBin
	install(newAgent)
	s.start()

	for _, tok := range []string{s.token, second} {
		if r := s.do("GET", "/v1/sandboxes/"+running, tok, nil); r.status != 200 {
			t.Fatalf("a token of the previous release = %d %s", r.status, r.body)
		}
	}
	var sb client.Sandbox
	s.do("GET", "/v1/sandboxes/"+running, s.token, nil).json(t, &sb)
	if sb.State != "running" || sb.Project != "default" {
		t.Fatalf("the running sandbox after the upgrade: %+v", sb)
	}
	if out, code := s.sh(running, "cat /tmp/kept.txt"); code != 0 || out != "kept across the upgrade" {
		t.Fatalf("the running sandbox's file after the upgrade = %d %q", code, out)
	}
	if op, _, err := c.Lifecycle(ctx, "wake", suspended, ""); err != nil || s.waitOp(op.ID).State != "succeeded" {
		t.Fatalf("wake of a sandbox the previous release suspended: %v\n%s", err, s.log())
	}
	if out, code := s.sh(suspended, "cat /tmp/suspended.txt"); code != 0 || out != "asleep" {
		t.Fatalf("the woken sandbox's file = %d %q", code, out)
	}
	fromSnap, _, err := c.CreateSandbox(ctx, client.CreateSandboxRequest{Snapshot: snap.ID}, "")
	if err != nil || s.waitOp(fromSnap.Operation.ID).State != "succeeded" {
		t.Fatalf("create from the previous release's snapshot: %v", err)
	}
	if out, code := s.sh(fromSnap.Sandbox.ID, "cat /tmp/kept.txt"); code != 0 || out != "kept across the upgrade" {
		t.Fatalf("the snapshot's file = %d %q", code, out)
	}
	var wp struct {
		MinReady int `json:"min_ready"`
	}
	s.do("GET", "/v1/warm-pools/test:latest", s.token, nil).json(t, &wp)
	if wp.MinReady != 1 {
		t.Fatalf("warm pool after the upgrade: %+v", wp)
	}
	again := s.do("POST", "/v1/sandboxes", s.token, []byte(`{"template":"test:latest","metadata":{"k":"v"}}`), "Idempotency-Key: before-upgrade-1")
	var againResp client.CreateSandboxResponse
	again.json(t, &againResp)
	if again.header.Get("Idempotent-Replayed") != "true" || againResp.Sandbox.ID != keyedResp.Sandbox.ID {
		t.Fatalf("a retry of a key the previous release stored = %d %s", again.status, again.body)
	}
	// Every record is the default project's; the first token is its owner.
	var ops client.List[client.Operation]
	s.do("GET", "/v1/operations?limit=500", s.token, nil).json(t, &ops)
	for _, op := range ops.Items {
		if op.Project != "default" {
			t.Errorf("operation %s of the previous release is in project %q", op.ID, op.Project)
		}
	}
	var toks client.List[client.Token]
	s.do("GET", "/v1/tokens", s.token, nil).json(t, &toks)
	if len(toks.Items) != 2 || toks.Items[0].Role != "owner" || toks.Items[1].Role != "owner" {
		t.Fatalf("tokens after the upgrade: %+v", toks.Items)
	}
	// Projects work on the upgraded data directory.
	if r := s.do("POST", "/v1/projects", s.token, []byte(`{"name":"after"}`)); r.status != 201 {
		t.Fatalf("create a project after the upgrade = %d %s", r.status, r.body)
	}
	r := s.do("POST", "/v1/tokens", s.token, []byte(`{"name":"m","project":"after","role":"member"}`))
	var made struct{ Value string }
	json.Unmarshal(r.body, &made)
	if r := s.do("GET", "/v1/sandboxes/"+running, made.Value, nil); r.status != 404 {
		t.Fatalf("another project's token on the default project's sandbox = %d", r.status)
	}

	// The next upgrade changes the agent: what the previous release saved
	// (without a record of its agent) still wakes and starts, with the
	// agent this release took as theirs on its first start.
	s.stop()
	replaceAgent(t, agentPath)
	s.start()
	if op, _, err := c.Lifecycle(ctx, "wake", later, ""); err != nil || s.waitOp(op.ID).State != "succeeded" {
		t.Fatalf("wake of a sandbox the previous release suspended, after the agent changed: %v\n%s", err, s.log())
	}
	if out, code := s.sh(later, "cat /tmp/suspended.txt"); code != 0 || out != "asleep longer" {
		t.Fatalf("the sandbox woken after the agent changed = %d %q", code, out)
	}
	fromSnap, _, err = c.CreateSandbox(ctx, client.CreateSandboxRequest{Snapshot: snap.ID}, "")
	if err != nil || s.waitOp(fromSnap.Operation.ID).State != "succeeded" {
		t.Fatalf("create from the previous release's snapshot after the agent changed: %v\n%s", err, s.log())
	}
	if out, code := s.sh(fromSnap.Sandbox.ID, "cat /tmp/kept.txt"); code != 0 || out != "kept across the upgrade" {
		t.Fatalf("the snapshot's file after the agent changed = %d %q", code, out)
	}
	if out, code := s.sh(running, "cat /tmp/kept.txt"); code != 0 || out != "kept across the upgrade" {
		t.Fatalf("the running sandbox after the agent changed = %d %q", code, out)
	}
	time.Sleep(100 * time.Millisecond)
}

// replaceAgent puts another agent at path: other bytes (without -trimpath
// the build directory is in the binary), as an upgrade that changes the
// agent brings.
func replaceAgent(t *testing.T, path string) {
	t.Helper()
	other := runtimetest.BuildAgent(t)
	if bytes.Equal(mustRead(t, path), mustRead(t, other)) {
		t.Fatal("the replacement agent has the same bytes: the test would prove nothing")
	}
	if err := os.Rename(other, path); err != nil {
		t.Fatal(err)
	}
}

// TestAgentReplacedUnderSavedSandboxes: replacing the agent binary at
// --agent-bin (an upgrade that changes the agent) leaves every saved
// sandbox restorable: a suspended sandbox wakes and a snapshot starts new
// sandboxes with the agent they were saved with, which the runtime kept by
// content; new sandboxes run the new agent.
func TestAgentReplacedUnderSavedSandboxes(t *testing.T) {
	requireGVisor(t)
	agentPath := filepath.Join(t.TempDir(), "space-agent")
	buildAgent(t, "..", agentPath)
	dataDir := t.TempDir()
	if out, err := exec.Command(spaceBin, "template", "build", "test", "--data-dir", dataDir).CombinedOutput(); err != nil {
		t.Fatalf("build test template: %v\n%s", err, out)
	}
	t.Cleanup(func() { killGVisorLeftovers(dataDir) })
	s := startServer(t, serverOpts{bin: spaceBin, dataDir: dataDir, template: "test:latest",
		args: []string{"--runtime", "gvisor", "--build-seed=false", "--agent-bin", agentPath}})
	t.Cleanup(func() { cleanupGVisor(s) })
	ctx := context.Background()
	c := s.client()
	suspended := s.createRunning()
	if out, code := s.sh(suspended, "echo saved > /tmp/f"); code != 0 {
		t.Fatalf("write: %d %s", code, out)
	}
	if op, _, err := c.Lifecycle(ctx, "suspend", suspended, ""); err != nil || s.waitOp(op.ID).State != "succeeded" {
		t.Fatalf("suspend: %v", err)
	}
	src := s.createRunning()
	s.sh(src, "echo snap > /tmp/f")
	snap, sop, err := c.CreateSnapshot(ctx, src, "", "")
	if err != nil || s.waitOp(sop.ID).State != "succeeded" {
		t.Fatalf("snapshot: %v", err)
	}
	s.stop()
	replaceAgent(t, agentPath)
	s.start()
	if op, _, err := c.Lifecycle(ctx, "wake", suspended, ""); err != nil || s.waitOp(op.ID).State != "succeeded" {
		t.Fatalf("wake after the agent was replaced: %v\n%s", err, s.log())
	}
	if out, code := s.sh(suspended, "cat /tmp/f"); code != 0 || out != "saved\n" {
		t.Fatalf("the woken sandbox = %d %q", code, out)
	}
	from, _, err := c.CreateSandbox(ctx, client.CreateSandboxRequest{Snapshot: snap.ID}, "")
	if err != nil || s.waitOp(from.Operation.ID).State != "succeeded" {
		t.Fatalf("create from a snapshot after the agent was replaced: %v\n%s", err, s.log())
	}
	if out, code := s.sh(from.Sandbox.ID, "cat /tmp/f"); code != 0 || out != "snap\n" {
		t.Fatalf("the snapshot's sandbox = %d %q", code, out)
	}
	fresh := s.createRunning()
	if out, code := s.sh(fresh, "true"); code != 0 {
		t.Fatalf("a new sandbox on the new agent: %d %s", code, out)
	}
	kept, _ := filepath.Glob(filepath.Join(dataDir, "runtime", "gvisor", "agents", strings.Repeat("[0-9a-f]", 64)))
	if len(kept) != 2 {
		t.Errorf("agents kept: %v, want the old and the new", kept)
	}
}
