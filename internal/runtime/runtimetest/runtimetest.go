// Package runtimetest is the conformance suite every runtime.Runtime must
// pass: lifecycle transitions observed through Recover, idempotency of every
// step, independence of sandboxes, and cleanup on delete.
package runtimetest

import (
	"context"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spacesandbox/space/internal/ids"
	"github.com/spacesandbox/space/internal/runtime"
	"github.com/spacesandbox/space/internal/sandbox"
	"github.com/spacesandbox/space/internal/templates"
)

// Harness gives the suite a runtime under test and what it needs to use it.
type Harness struct {
	// Runtime is the implementation under test.
	Runtime runtime.Runtime
	// Template is a template the runtime can create sandboxes from.
	Template sandbox.TemplateRef
	// Timeout bounds each lifecycle step (slow runtimes such as TCG need more).
	Timeout time.Duration
	// Reopen, when set, returns a new instance of the runtime over the same
	// host state, as after a server restart.
	Reopen func(t *testing.T) runtime.Runtime
	// AssertGone, when set, checks that nothing of a deleted sandbox remains
	// on the host (processes, mounts, cgroups, files).
	AssertGone func(t *testing.T, spec runtime.Spec)
	// HasAgent says the runtime runs a real agent: the suite then checks
	// that it answers after every step and that files survive suspend.
	HasAgent bool
}

// Run runs the suite. newHarness is called once per test.
func Run(t *testing.T, newHarness func(t *testing.T) Harness) {
	tests := []struct {
		name string
		fn   func(*testing.T, Harness)
	}{
		{"Lifecycle", testLifecycle},
		{"StepsAreIdempotent", testIdempotent},
		{"DeleteFromEveryStatus", testDeleteFromEveryStatus},
		{"IndependentSandboxes", testIndependent},
		{"RecoverAfterRestart", testRecover},
		{"Capabilities", testCapabilities},
		{"AgentAcrossLifecycle", testAgentAcrossLifecycle},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) { tc.fn(t, newHarness(t)) })
	}
}

func newSpec(t *testing.T, h Harness) runtime.Spec {
	id := ids.New(ids.Sandbox)
	return runtime.Spec{
		SandboxID:   id,
		Template:    h.Template,
		Resources:   sandbox.Resources{VCPUs: 1, MemoryMiB: 256, DiskMiB: 1024},
		SnapshotDir: filepath.Join(t.TempDir(), "snap-"+id),
	}
}

func ctxFor(t *testing.T, h Harness) context.Context {
	d := h.Timeout
	if d == 0 {
		d = time.Minute
	}
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func must(t *testing.T, what string, err error) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

func expect(t *testing.T, h Harness, spec runtime.Spec, want runtime.Status) {
	t.Helper()
	got, err := h.Runtime.Recover(ctxFor(t, h), spec)
	if err != nil {
		t.Fatalf("Recover: %v", err)
	}
	if got != want {
		t.Fatalf("status = %s, want %s", got, want)
	}
}

func cleanup(t *testing.T, h Harness, spec runtime.Spec) {
	t.Cleanup(func() { h.Runtime.Delete(context.Background(), spec) })
}

func testLifecycle(t *testing.T, h Harness) {
	spec := newSpec(t, h)
	cleanup(t, h, spec)
	expect(t, h, spec, runtime.StatusAbsent)
	must(t, "create", h.Runtime.Create(ctxFor(t, h), spec))
	expect(t, h, spec, runtime.StatusRunning)
	must(t, "pause", h.Runtime.Pause(ctxFor(t, h), spec))
	expect(t, h, spec, runtime.StatusPaused)
	must(t, "resume", h.Runtime.Resume(ctxFor(t, h), spec))
	expect(t, h, spec, runtime.StatusRunning)
	for i := 0; i < 3; i++ {
		must(t, "suspend", h.Runtime.Suspend(ctxFor(t, h), spec))
		expect(t, h, spec, runtime.StatusSuspended)
		must(t, "restore", h.Runtime.Restore(ctxFor(t, h), spec))
		expect(t, h, spec, runtime.StatusRunning)
	}
	// Suspend from paused.
	must(t, "pause", h.Runtime.Pause(ctxFor(t, h), spec))
	must(t, "suspend paused", h.Runtime.Suspend(ctxFor(t, h), spec))
	expect(t, h, spec, runtime.StatusSuspended)
	must(t, "restore", h.Runtime.Restore(ctxFor(t, h), spec))
	expect(t, h, spec, runtime.StatusRunning)
	must(t, "delete", h.Runtime.Delete(ctxFor(t, h), spec))
	expect(t, h, spec, runtime.StatusAbsent)
	if h.AssertGone != nil {
		h.AssertGone(t, spec)
	}
}

func testIdempotent(t *testing.T, h Harness) {
	spec := newSpec(t, h)
	cleanup(t, h, spec)
	for i := 0; i < 2; i++ {
		must(t, "create", h.Runtime.Create(ctxFor(t, h), spec))
	}
	expect(t, h, spec, runtime.StatusRunning)
	must(t, "resume running", h.Runtime.Resume(ctxFor(t, h), spec))
	must(t, "restore running", h.Runtime.Restore(ctxFor(t, h), spec))
	expect(t, h, spec, runtime.StatusRunning)
	for i := 0; i < 2; i++ {
		must(t, "pause", h.Runtime.Pause(ctxFor(t, h), spec))
	}
	expect(t, h, spec, runtime.StatusPaused)
	for i := 0; i < 2; i++ {
		must(t, "suspend", h.Runtime.Suspend(ctxFor(t, h), spec))
	}
	expect(t, h, spec, runtime.StatusSuspended)
	for i := 0; i < 2; i++ {
		must(t, "restore", h.Runtime.Restore(ctxFor(t, h), spec))
	}
	expect(t, h, spec, runtime.StatusRunning)
	for i := 0; i < 2; i++ {
		must(t, "delete", h.Runtime.Delete(ctxFor(t, h), spec))
	}
	expect(t, h, spec, runtime.StatusAbsent)
}

func testDeleteFromEveryStatus(t *testing.T, h Harness) {
	for _, to := range []runtime.Status{runtime.StatusRunning, runtime.StatusPaused, runtime.StatusSuspended} {
		t.Run(string(to), func(t *testing.T) {
			spec := newSpec(t, h)
			cleanup(t, h, spec)
			must(t, "create", h.Runtime.Create(ctxFor(t, h), spec))
			switch to {
			case runtime.StatusPaused:
				must(t, "pause", h.Runtime.Pause(ctxFor(t, h), spec))
			case runtime.StatusSuspended:
				must(t, "suspend", h.Runtime.Suspend(ctxFor(t, h), spec))
			}
			expect(t, h, spec, to)
			must(t, "delete", h.Runtime.Delete(ctxFor(t, h), spec))
			expect(t, h, spec, runtime.StatusAbsent)
			if h.AssertGone != nil {
				h.AssertGone(t, spec)
			}
		})
	}
}

func testIndependent(t *testing.T, h Harness) {
	a, b := newSpec(t, h), newSpec(t, h)
	cleanup(t, h, a)
	cleanup(t, h, b)
	must(t, "create a", h.Runtime.Create(ctxFor(t, h), a))
	must(t, "create b", h.Runtime.Create(ctxFor(t, h), b))
	must(t, "pause a", h.Runtime.Pause(ctxFor(t, h), a))
	expect(t, h, a, runtime.StatusPaused)
	expect(t, h, b, runtime.StatusRunning)
	must(t, "delete a", h.Runtime.Delete(ctxFor(t, h), a))
	expect(t, h, a, runtime.StatusAbsent)
	expect(t, h, b, runtime.StatusRunning)
}

func testRecover(t *testing.T, h Harness) {
	if h.Reopen == nil {
		t.Skip("runtime harness offers no restart")
	}
	run, paused, susp := newSpec(t, h), newSpec(t, h), newSpec(t, h)
	for _, s := range []runtime.Spec{run, paused, susp} {
		cleanup(t, h, s)
		must(t, "create", h.Runtime.Create(ctxFor(t, h), s))
	}
	must(t, "pause", h.Runtime.Pause(ctxFor(t, h), paused))
	must(t, "suspend", h.Runtime.Suspend(ctxFor(t, h), susp))
	h.Runtime = h.Reopen(t)
	expect(t, h, run, runtime.StatusRunning)
	expect(t, h, paused, runtime.StatusPaused)
	expect(t, h, susp, runtime.StatusSuspended)
	must(t, "resume after restart", h.Runtime.Resume(ctxFor(t, h), paused))
	must(t, "restore after restart", h.Runtime.Restore(ctxFor(t, h), susp))
	expect(t, h, paused, runtime.StatusRunning)
	expect(t, h, susp, runtime.StatusRunning)
}

func testCapabilities(t *testing.T, h Harness) {
	if h.Runtime.Name() == "" {
		t.Fatal("runtime has no name")
	}
	c := h.Runtime.Capabilities()
	if c.Detail == "" {
		t.Fatal("capabilities say nothing about how the runtime runs here")
	}
}

// agentAnswers checks the agent replies to Info.
func agentAnswers(t *testing.T, h Harness, spec runtime.Spec) {
	t.Helper()
	c, err := h.Runtime.Agent(ctxFor(t, h), spec)
	if err != nil {
		t.Fatalf("agent: %v", err)
	}
	if _, err := c.Info(ctxFor(t, h)); err != nil {
		t.Fatalf("agent info: %v", err)
	}
}

func testAgentAcrossLifecycle(t *testing.T, h Harness) {
	if !h.HasAgent {
		t.Skip("runtime harness runs no agent")
	}
	spec := newSpec(t, h)
	cleanup(t, h, spec)
	must(t, "create", h.Runtime.Create(ctxFor(t, h), spec))
	agentAnswers(t, h, spec)
	c, _ := h.Runtime.Agent(ctxFor(t, h), spec)
	if _, err := c.WriteFile(ctxFor(t, h), "/root/kept.txt", 0o600, strings.NewReader("kept across suspend"), 0); err != nil {
		t.Fatalf("write: %v", err)
	}
	must(t, "pause", h.Runtime.Pause(ctxFor(t, h), spec))
	must(t, "resume", h.Runtime.Resume(ctxFor(t, h), spec))
	agentAnswers(t, h, spec)
	for i := 0; i < 2; i++ {
		must(t, "suspend", h.Runtime.Suspend(ctxFor(t, h), spec))
		must(t, "restore", h.Runtime.Restore(ctxFor(t, h), spec))
		agentAnswers(t, h, spec)
		c, _ := h.Runtime.Agent(ctxFor(t, h), spec)
		_, b, err := c.ReadFile(ctxFor(t, h), "/root/kept.txt", 0, 100)
		if err != nil || string(b) != "kept across suspend" {
			t.Fatalf("file after restore %d: %q %v", i, b, err)
		}
	}
	other := newSpec(t, h)
	cleanup(t, h, other)
	must(t, "create other", h.Runtime.Create(ctxFor(t, h), other))
	oc, _ := h.Runtime.Agent(ctxFor(t, h), other)
	if _, _, err := oc.ReadFile(ctxFor(t, h), "/root/kept.txt", 0, 100); err == nil {
		t.Fatal("a file written in one sandbox is visible in another")
	}
}

// TestTemplate builds the builtin `test` template into a new template
// store in a temporary directory.
func TestTemplate(t *testing.T) (*templates.Store, templates.Template) {
	t.Helper()
	store, err := templates.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	tpl, err := store.Build(context.Background(), "test", io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	return store, tpl
}

// BuildAgent builds the static space-agent for a runtime under test.
func BuildAgent(t *testing.T) string {
	t.Helper()
	out := filepath.Join(t.TempDir(), "space-agent")
	cmd := exec.Command("go", "build", "-o", out, "github.com/spacesandbox/space/cmd/space-agent")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build agent: %v\n%s", err, b)
	}
	return out
}
