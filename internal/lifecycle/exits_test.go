package lifecycle_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/spacesandbox/space/internal/lifecycle"
	"github.com/spacesandbox/space/internal/runtime"
	"github.com/spacesandbox/space/internal/runtime/fakeruntime"
	"github.com/spacesandbox/space/internal/sandbox"
)

// dyingRuntime is the FAKE runtime whose sandboxes die at the end of a
// pause (FAULT INJECTED): the runtime's part has succeeded, and the death
// is reported while the engine has not yet recorded the pause.
type dyingRuntime struct {
	*fakeruntime.Runtime
	onExit func(runtime.Exit)
}

func (d *dyingRuntime) OnExit(f func(runtime.Exit)) { d.onExit = f }

func (d *dyingRuntime) Pause(ctx context.Context, spec runtime.Spec) error {
	if err := d.Runtime.Pause(ctx, spec); err != nil {
		return err
	}
	if err := d.Runtime.Delete(ctx, spec); err != nil { // gone from the host
		return err
	}
	d.onExit(runtime.Exit{SandboxID: spec.SandboxID, Reason: "killed", Message: "killed from outside"})
	return nil
}

// A sandbox whose process dies during an operation that does not see the
// death (it came after the runtime's part: a fork's source killed while its
// copies start, found by the runtime-kill suite) is not shown as the
// operation would have left it: the death is reported before the outcome,
// so the operation asks the runtime first, fails, and the sandbox is failed
// with the death's reason.
func TestDeathDuringAnOperationFailsItAndTheSandboxFaultInjected(t *testing.T) {
	failures := &failureCounter{}
	w := newWorldWith(t, t.TempDir(), fakeruntime.Config{}, func(c *lifecycle.Config) {
		c.Runtimes = []runtime.Runtime{&dyingRuntime{Runtime: c.Runtimes[0].(*fakeruntime.Runtime)}}
		c.Observer = failures
	})
	ctx := context.Background()
	sb := create(t, w)
	op, err := w.eng.Pause(ctx, sb.ID, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := wait(t, w, op.ID); got.State != sandbox.OpFailed || got.Error == nil || got.Error.Code == "" {
		t.Fatalf("pause = %+v %+v, want failed with a reason", got, got.Error)
	}
	got, err := w.eng.Get(ctx, sb.ID)
	if err != nil || got.State != sandbox.Failed {
		t.Fatalf("the dead sandbox is %+v (%v), want failed", got, err)
	}
	if got.Error == nil || got.Error.Code != "killed" {
		t.Fatalf("failed with %+v, want the death's reason", got.Error)
	}
	if got := failures.reasons(); len(got) != 1 || got[0] != "killed" {
		t.Fatalf("failures counted: %v, want one, killed", got)
	}
}

// failureCounter is an Observer that keeps the reasons of the sandboxes
// that failed on their own.
type failureCounter struct {
	mu   sync.Mutex
	seen []string
}

func (*failureCounter) OperationFinished(sandbox.OpKind, sandbox.OpState, time.Duration) {}

func (f *failureCounter) SandboxFailed(_, reason string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.seen = append(f.seen, reason)
}

func (f *failureCounter) reasons() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.seen...)
}

// unconfigurableRuntime is the FAKE runtime whose sandboxes are killed
// right after its create returns (FAULT INJECTED), before the engine
// configures them, and whose death is not reported (an exit report races
// the agent's going away; here it never comes).
type unconfigurableRuntime struct{ *fakeruntime.Runtime }

func (u *unconfigurableRuntime) Create(ctx context.Context, spec runtime.Spec) error {
	if err := u.Runtime.Create(ctx, spec); err != nil {
		return err
	}
	return u.Runtime.Delete(ctx, spec)
}

// A create whose sandbox is gone by the time its agent is to be configured
// fails, and the sandbox with it, instead of being shown running (the
// runtime-kill suite found a create reported succeeded and its sandbox
// failed a moment later).
func TestCreateWhoseSandboxDiesBeforeItIsConfiguredFailsFaultInjected(t *testing.T) {
	w := newWorldWith(t, t.TempDir(), fakeruntime.Config{}, func(c *lifecycle.Config) {
		c.Runtimes = []runtime.Runtime{&unconfigurableRuntime{Runtime: c.Runtimes[0].(*fakeruntime.Runtime)}}
	})
	ctx := context.Background()
	sb, op, err := w.eng.Create(ctx, lifecycle.CreateRequest{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := wait(t, w, op.ID); got.State != sandbox.OpFailed || got.Error == nil || got.Error.Code == "" {
		t.Fatalf("create = %+v, want failed with a reason", got)
	}
	got, err := w.eng.Get(ctx, sb.ID)
	if err != nil || got.State != sandbox.Failed || got.Error == nil {
		t.Fatalf("the dead sandbox: %+v %v, want failed with a reason", got, err)
	}
}

// lostRuntime is the FAKE runtime whose sandboxes are killed during a
// snapshot's save (FAULT INJECTED): the save fails and the sandbox is gone.
type lostRuntime struct{ *fakeruntime.Runtime }

func (l *lostRuntime) Snapshot(ctx context.Context, spec runtime.Spec, dir string) error {
	l.Runtime.Delete(ctx, spec)
	return errors.New("checkpoint: the sandbox's process was killed")
}

// A snapshot whose source dies during the save fails, and so does its
// source, with a reason (it was failed without one).
func TestSourceLostDuringASnapshotFailsWithAReasonFaultInjected(t *testing.T) {
	w := newWorldWith(t, t.TempDir(), fakeruntime.Config{}, func(c *lifecycle.Config) {
		c.Runtimes = []runtime.Runtime{&lostRuntime{Runtime: c.Runtimes[0].(*fakeruntime.Runtime)}}
	})
	ctx := context.Background()
	sb := create(t, w)
	op, _, err := w.eng.CreateSnapshot(ctx, sb.ID, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := wait(t, w, op.ID); got.State != sandbox.OpFailed {
		t.Fatalf("snapshot = %+v", got)
	}
	got, err := w.eng.Get(ctx, sb.ID)
	if err != nil || got.State != sandbox.Failed || got.Error == nil || got.Error.Code == "" {
		t.Fatalf("the lost source: %+v %v, want failed with a reason", got, err)
	}
}

// uncopyableRuntime is the FAKE runtime whose copies are killed right after
// they start from a save (FAULT INJECTED), before the engine configures
// them, with no exit reported.
type uncopyableRuntime struct{ *fakeruntime.Runtime }

func (u *uncopyableRuntime) CreateFrom(ctx context.Context, spec runtime.Spec, dir string) error {
	if err := u.Runtime.CreateFrom(ctx, spec, dir); err != nil {
		return err
	}
	return u.Runtime.Delete(ctx, spec)
}

// A fork whose copy is gone by the time it is configured fails, all or
// none: no copy is shown running, and the source runs on.
func TestForkWhoseCopyDiesAsItStartsFailsFaultInjected(t *testing.T) {
	w := newWorldWith(t, t.TempDir(), fakeruntime.Config{}, func(c *lifecycle.Config) {
		c.Runtimes = []runtime.Runtime{&uncopyableRuntime{Runtime: c.Runtimes[0].(*fakeruntime.Runtime)}}
	})
	ctx := context.Background()
	src := create(t, w)
	op, copies, err := w.eng.Fork(ctx, src.ID, 1, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := wait(t, w, op.ID); got.State != sandbox.OpFailed || got.Error == nil || got.Error.Code == "" {
		t.Fatalf("fork = %+v, want failed with a reason", got)
	}
	for _, c := range copies {
		if got, err := w.eng.Get(ctx, c.ID); err != nil || got.State != sandbox.Failed {
			t.Fatalf("copy %s: %+v %v, want failed", c.ID, got, err)
		}
	}
	if got, err := w.eng.Get(ctx, src.ID); err != nil || got.State != sandbox.Running {
		t.Fatalf("source: %+v %v, want running", got, err)
	}
}
