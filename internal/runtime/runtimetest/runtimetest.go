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

	"github.com/spacesandbox/space/internal/bench"
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
		{"SnapshotAndCreateFrom", testSnapshot},
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

// testSnapshot: a Snapshotter saves a running and a paused sandbox and
// leaves each as it was; copies made from a save hold its files, and what
// a copy writes no other sandbox sees.
func testSnapshot(t *testing.T, h Harness) {
	snap, ok := h.Runtime.(runtime.Snapshotter)
	if !ok {
		t.Skip("the runtime cannot copy live sandboxes")
	}
	ctx := ctxFor(t, h)
	src := newSpec(t, h)
	cleanup(t, h, src)
	must(t, "create", h.Runtime.Create(ctx, src))
	write := func(spec runtime.Spec, text string) {
		t.Helper()
		if h.HasAgent {
			c, err := h.Runtime.Agent(ctx, spec)
			must(t, "agent", err)
			_, err = c.WriteFile(ctx, "/root/state.txt", 0o600, strings.NewReader(text), 0)
			must(t, "write", err)
		}
	}
	read := func(spec runtime.Spec, want string) {
		t.Helper()
		if h.HasAgent {
			c, err := h.Runtime.Agent(ctx, spec)
			must(t, "agent", err)
			if _, b, err := c.ReadFile(ctx, "/root/state.txt", 0, 100); err != nil || string(b) != want {
				t.Fatalf("%s reads %q (%v), want %q", spec.SandboxID, b, err, want)
			}
		}
	}
	write(src, "saved")
	running := filepath.Join(t.TempDir(), "running")
	must(t, "snapshot running", snap.Snapshot(ctx, src, running))
	expect(t, h, src, runtime.StatusRunning)
	must(t, "snapshot again (done already)", snap.Snapshot(ctx, src, running))
	read(src, "saved")
	write(src, "after the save")

	must(t, "pause", h.Runtime.Pause(ctx, src))
	paused := filepath.Join(t.TempDir(), "paused")
	// Asked with Saved, the save is complete in dir when Saved is called,
	// and a copy may start from it while the source is brought back (as a
	// fork does).
	var early runtime.Spec
	started := make(chan error, 1)
	told := src
	told.Saved = func() {
		if _, err := os.Stat(paused); err != nil {
			t.Errorf("Saved was called before the save was in its directory: %v", err)
		}
		if early.SandboxID != "" {
			t.Error("Saved was called twice")
			return
		}
		early = newSpec(t, h)
		early.Resources = src.Resources
		cleanup(t, h, early)
		go func() { started <- snap.CreateFrom(ctx, early, paused) }()
	}
	must(t, "snapshot paused", snap.Snapshot(ctx, told, paused))
	if early.SandboxID == "" {
		t.Fatal("Snapshot did not call Saved")
	}
	must(t, "create from the save while the source came back", <-started)
	expect(t, h, src, runtime.StatusPaused)
	must(t, "resume", h.Runtime.Resume(ctx, src))

	copies := []runtime.Spec{early}
	for _, dir := range []string{running, running, paused} {
		c := newSpec(t, h)
		c.Resources = src.Resources
		cleanup(t, h, c)
		must(t, "create from "+filepath.Base(dir), snap.CreateFrom(ctx, c, dir))
		must(t, "create from again (done already)", snap.CreateFrom(ctx, c, dir))
		expect(t, h, c, runtime.StatusRunning)
		copies = append(copies, c)
	}
	os.RemoveAll(running) // the copies no longer need it
	read(copies[0], "after the save")
	read(copies[1], "saved")
	read(copies[2], "saved")
	read(copies[3], "after the save")
	write(copies[1], "copy 1")
	read(copies[2], "saved")
	read(src, "after the save")
	// A copy lives its own life: suspend, restore, delete.
	must(t, "suspend a copy", h.Runtime.Suspend(ctx, copies[1]))
	must(t, "restore a copy", h.Runtime.Restore(ctx, copies[1]))
	read(copies[1], "copy 1")
	for _, c := range copies {
		must(t, "delete a copy", h.Runtime.Delete(ctx, c))
		expect(t, h, c, runtime.StatusAbsent)
		if h.AssertGone != nil {
			h.AssertGone(t, c)
		}
	}
	expect(t, h, src, runtime.StatusRunning)
	read(src, "after the save")
	if err := snap.Snapshot(ctx, newSpec(t, h), filepath.Join(t.TempDir(), "absent")); err == nil {
		t.Fatal("snapshot of an absent sandbox succeeded")
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

// RunBare drives a bare sandbox through every row's work: create, a
// command (stdout only: stderr is not its output), pause, resume, suspend,
// a start from the save (which leaves the save as it was), wake and fork
// keep its files, a failing command is an error, and Close removes dir.
func RunBare(t *testing.T, ctx context.Context, b bench.Bare, dir string) {
	t.Helper()
	run := func(argv ...string) string {
		t.Helper()
		var out strings.Builder
		if err := b.Exec(ctx, &out, argv...); err != nil {
			t.Fatal(err)
		}
		return out.String()
	}
	must(t, "create", b.Create(ctx))
	if got := run("sh", "-c", "echo hi > /tmp/f; cat /tmp/f; echo to-stderr >&2"); got != "hi\n" {
		t.Fatalf("exec = %q", got)
	}
	for _, step := range []struct {
		name string
		do   func(context.Context) error
	}{{"pause", b.Pause}, {"resume", b.Resume}, {"suspend", b.Suspend}, {"from save", b.FromSave}, {"from save again", b.FromSave}, {"wake", b.Wake}, {"fork", b.Fork}} {
		must(t, step.name, step.do(ctx))
	}
	if got := run("cat", "/tmp/f"); got != "hi\n" {
		t.Fatalf("after suspend, starts from the save, wake and fork: %q", got)
	}
	if err := b.Exec(ctx, io.Discard, "false"); err == nil {
		t.Fatal("a failing command is no error")
	}
	must(t, "close", b.Close())
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("bare directory left: %v", err)
	}
}
