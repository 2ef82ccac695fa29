package lifecycle_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"testing/synctest"
	"time"

	"github.com/spacesandbox/space/internal/errdefs"
	"github.com/spacesandbox/space/internal/runtime/fakeruntime"
	"github.com/spacesandbox/space/internal/sandbox"
	"github.com/spacesandbox/space/internal/store"
)

func TestFork(t *testing.T) { synctest.Test(t, testFork) }

func testFork(t *testing.T) {
	w := newWorld(t, t.TempDir(), fakeruntime.Config{})
	ctx := context.Background()
	src := create(t, w)
	op, forks, err := w.eng.Fork(ctx, src.ID, 3, nil)
	if err != nil {
		t.Fatal(err)
	}
	if op.Kind != sandbox.OpFork || op.SandboxID != src.ID || len(forks) != 3 || len(op.Sandboxes) != 3 {
		t.Fatalf("fork = %+v, %d sandboxes", op, len(forks))
	}
	for _, f := range forks {
		if f.State != sandbox.Starting || f.ForkOf != src.ID || f.Template != src.Template || f.Resources != src.Resources {
			t.Fatalf("fork record %+v", f)
		}
	}
	if got := wait(t, w, op.ID); got.State != sandbox.OpSucceeded {
		t.Fatalf("fork op = %+v", got)
	}
	for _, f := range forks {
		sb, err := w.eng.Get(ctx, f.ID)
		if err != nil || sb.State != sandbox.Running || sb.ActiveOperation != "" {
			t.Fatalf("fork %s after the operation: %+v %v", f.ID, sb, err)
		}
	}
	if sb, _ := w.eng.Get(ctx, src.ID); sb.State != sandbox.Running || sb.ActiveOperation != "" {
		t.Fatalf("source after the fork: %+v", sb)
	}
	// Each fork is a sandbox like any other.
	if d, err := w.eng.Delete(ctx, forks[0].ID, nil); err != nil || wait(t, w, d.ID).State != sandbox.OpSucceeded {
		t.Fatalf("delete a fork: %v", err)
	}
}

func TestForkRefusals(t *testing.T) { synctest.Test(t, testForkRefusals) }

func testForkRefusals(t *testing.T) {
	w := newWorld(t, t.TempDir(), fakeruntime.Config{})
	ctx := context.Background()
	src := create(t, w)
	for _, n := range []int{0, 17, -1} {
		if _, _, err := w.eng.Fork(ctx, src.ID, n, nil); !errors.Is(err, errdefs.InvalidArgument) {
			t.Errorf("count %d: %v, want invalid_argument", n, err)
		}
	}
	sus, err := w.eng.Suspend(ctx, src.ID, nil)
	if err != nil || wait(t, w, sus.ID).State != sandbox.OpSucceeded {
		t.Fatal(err)
	}
	if _, _, err := w.eng.Fork(ctx, src.ID, 1, nil); !errors.Is(err, errdefs.FailedPrecondition) {
		t.Errorf("fork of a suspended sandbox: %v, want failed_precondition", err)
	}
	page, _ := w.eng.List(ctx, store.SandboxQuery{})
	if len(page.Items) != 1 {
		t.Fatalf("%d sandboxes after refused forks, want 1", len(page.Items))
	}
}

// FAKE-runtime fault injection: a save that fails (a full disk) leaves the
// source as it was and every copy failed with the reason; so does a copy
// that cannot start.
func TestForkFailureInjectedLeavesSourceRunning(t *testing.T) {
	synctest.Test(t, testForkFailureInjectedLeavesSourceRunning)
}

func testForkFailureInjectedLeavesSourceRunning(t *testing.T) {
	for _, step := range []string{"snapshot", "create_from"} {
		w := newWorld(t, t.TempDir(), fakeruntime.Config{Fail: map[string]bool{step: true}})
		ctx := context.Background()
		src := create(t, w)
		op, forks, err := w.eng.Fork(ctx, src.ID, 2, nil)
		if err != nil {
			t.Fatal(err)
		}
		if got := wait(t, w, op.ID); got.State != sandbox.OpFailed || got.Error == nil {
			t.Fatalf("%s: fork op = %+v", step, got)
		}
		if state(t, w, src.ID) != sandbox.Running {
			t.Fatalf("%s: source not running after a failed fork", step)
		}
		for _, f := range forks {
			sb, _ := w.eng.Get(ctx, f.ID)
			if sb.State != sandbox.Failed || sb.Error == nil || sb.ActiveOperation != "" {
				t.Fatalf("%s: fork after a failed fork: %+v", step, sb)
			}
		}
		// The source takes operations again.
		if p, err := w.eng.Pause(ctx, src.ID, nil); err != nil || wait(t, w, p.ID).State != sandbox.OpSucceeded {
			t.Fatalf("%s: pause the source after a failed fork: %v", step, err)
		}
	}
}

// A fork the server was stopped in the middle of finishes at the next
// start.
func TestForkResumesAfterRestart(t *testing.T) {
	synctest.Test(t, func(t *testing.T) { testForkResumesAfterRestart(t, false) })
}

// A fork stopped after its save was complete adopts that save at the next
// start: the runtime returns without announcing it (no Saved call), and the
// fork must still start its copies and finish (it waited forever for the
// source once, when it had already read the source's result).
func TestForkResumesWithItsSaveComplete(t *testing.T) {
	synctest.Test(t, func(t *testing.T) { testForkResumesAfterRestart(t, true) })
}

// stopWhileRunning creates a sandbox, starts an operation on it (start) on
// a server whose runtime steps never end, waits until the operation is
// recorded running and stops that server: the next one over dir resumes it.
func stopWhileRunning(t *testing.T, dir string, start func(*world, *sandbox.Sandbox) (*sandbox.Operation, error)) (*sandbox.Sandbox, *sandbox.Operation) {
	t.Helper()
	w := newWorld(t, dir, fakeruntime.Config{})
	src := create(t, w)
	w.close()
	w = newWorld(t, dir, fakeruntime.Config{Delay: time.Hour})
	op, err := start(w, src)
	if err != nil {
		t.Fatal(err)
	}
	for {
		got, _ := w.eng.Operation(context.Background(), op.ID)
		if got.State == sandbox.OpRunning {
			break
		}
		time.Sleep(time.Millisecond)
	}
	w.close()
	return src, op
}

// testForkResumesAfterRestart stops a server while a 2-way fork runs (with
// saveComplete, the fork's save is on disk when the next server starts)
// and checks the next server finishes it with both copies running.
func testForkResumesAfterRestart(t *testing.T, saveComplete bool) {
	dir := t.TempDir()
	var forks []*sandbox.Sandbox
	_, op := stopWhileRunning(t, dir, func(w *world, src *sandbox.Sandbox) (op *sandbox.Operation, err error) {
		op, forks, err = w.eng.Fork(context.Background(), src.ID, 2, nil)
		return op, err
	})
	if saveComplete {
		if err := os.MkdirAll(filepath.Join(dir, "snapshots", op.ID), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	w2 := newWorld(t, dir, fakeruntime.Config{})
	if got := wait(t, w2, op.ID); got.State != sandbox.OpSucceeded {
		t.Fatalf("resumed fork = %+v", got)
	}
	for _, f := range forks {
		if state(t, w2, f.ID) != sandbox.Running {
			t.Fatalf("fork %s not running after the resumed fork", f.ID)
		}
	}
}
