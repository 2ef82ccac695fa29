package lifecycle_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"go.uber.org/goleak"

	"github.com/spacesandbox/space/internal/agentclient"
	"github.com/spacesandbox/space/internal/errdefs"
	"github.com/spacesandbox/space/internal/ids"
	"github.com/spacesandbox/space/internal/lifecycle"
	"github.com/spacesandbox/space/internal/runtime"
	"github.com/spacesandbox/space/internal/runtime/fakeruntime"
	"github.com/spacesandbox/space/internal/sandbox"
	"github.com/spacesandbox/space/internal/store"
	"github.com/spacesandbox/space/internal/store/sqlite"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction("database/sql.(*DB).connectionOpener"))
}

type world struct {
	dir   string
	store store.Store
	rt    *fakeruntime.Runtime
	eng   *lifecycle.Engine
}

// newWorld builds an engine over a real SQLite store and the FAKE runtime.
func newWorld(t *testing.T, dir string, fake fakeruntime.Config) *world {
	t.Helper()
	return newWorldWith(t, dir, fake, nil)
}

// newWorldWith is newWorld with the engine's configuration changed by set.
func newWorldWith(t *testing.T, dir string, fake fakeruntime.Config, set func(*lifecycle.Config)) *world {
	t.Helper()
	st, err := sqlite.Open(context.Background(), filepath.Join(dir, "space.db"))
	if err != nil {
		t.Fatal(err)
	}
	fake.Dir = filepath.Join(dir, "fake")
	rt, err := fakeruntime.New(fake)
	if err != nil {
		t.Fatal(err)
	}
	cfg := lifecycle.Config{Store: st, Runtimes: []runtime.Runtime{rt}, Templates: fakeruntime.Templates{}, SnapshotRoot: filepath.Join(dir, "snapshots"), OperationTimeout: 5 * time.Second}
	if set != nil {
		set(&cfg)
	}
	eng, err := lifecycle.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := eng.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	w := &world{dir: dir, store: st, rt: rt, eng: eng}
	t.Cleanup(w.close)
	return w
}

func (w *world) close() {
	w.eng.Close()
	w.store.Close()
}

func wait(t *testing.T, w *world, opID string) *sandbox.Operation {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		op, err := w.eng.Operation(context.Background(), opID)
		if err != nil {
			t.Fatal(err)
		}
		if op.State.Terminal() {
			return op
		}
		time.Sleep(2 * time.Millisecond)
	}
	t.Fatalf("operation %s did not finish", opID)
	return nil
}

// eventually polls cond every 5 ms for up to within, and reports whether it
// came to hold.
func eventually(within time.Duration, cond func() bool) bool {
	for deadline := time.Now().Add(within); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			return false
		}
	}
	return true
}

func state(t *testing.T, w *world, id string) sandbox.State {
	t.Helper()
	sb, err := w.eng.Get(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	return sb.State
}

func create(t *testing.T, w *world) *sandbox.Sandbox {
	t.Helper()
	sb, op, err := w.eng.Create(context.Background(), lifecycle.CreateRequest{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if sb.State != sandbox.Starting || op.Kind != sandbox.OpCreate {
		t.Fatalf("create returned %s / %s", sb.State, op.Kind)
	}
	if got := wait(t, w, op.ID); got.State != sandbox.OpSucceeded {
		t.Fatalf("create op = %+v", got)
	}
	return sb
}

func TestLifecycleWithFakeRuntime(t *testing.T) { synctest.Test(t, testLifecycleWithFakeRuntime) }

func testLifecycleWithFakeRuntime(t *testing.T) {
	w := newWorld(t, t.TempDir(), fakeruntime.Config{})
	ctx := context.Background()
	sb := create(t, w)
	if state(t, w, sb.ID) != sandbox.Running {
		t.Fatal("not running after create")
	}
	if sb.Template.Digest == "" || sb.Runtime != fakeruntime.Name || sb.Resources != lifecycle.DefaultResources {
		t.Fatalf("defaults not applied: %+v", sb)
	}
	steps := []struct {
		do   func(context.Context, string, lifecycle.Render) (*sandbox.Operation, error)
		want sandbox.State
		rt   runtime.Status
	}{
		{w.eng.Pause, sandbox.Paused, runtime.StatusPaused},
		{w.eng.Wake, sandbox.Running, runtime.StatusRunning},
		{w.eng.Suspend, sandbox.Suspended, runtime.StatusSuspended},
		{w.eng.Wake, sandbox.Running, runtime.StatusRunning},
		{w.eng.Pause, sandbox.Paused, runtime.StatusPaused},
		{w.eng.Suspend, sandbox.Suspended, runtime.StatusSuspended},
		{w.eng.Wake, sandbox.Running, runtime.StatusRunning},
		{w.eng.Delete, sandbox.Deleted, runtime.StatusAbsent},
	}
	for i, s := range steps {
		op, err := s.do(ctx, sb.ID, nil)
		if err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		if got := wait(t, w, op.ID); got.State != sandbox.OpSucceeded || got.CompletedAt == nil {
			t.Fatalf("step %d: op = %+v", i, got)
		}
		if st := state(t, w, sb.ID); st != s.want {
			t.Fatalf("step %d: state %s, want %s", i, st, s.want)
		}
		if st, _ := w.rt.Recover(ctx, runtime.Spec{SandboxID: sb.ID}); st != s.rt {
			t.Fatalf("step %d: runtime status %s, want %s", i, st, s.rt)
		}
	}
	// Delete again: not found.
	if _, err := w.eng.Delete(ctx, sb.ID, nil); !errors.Is(err, errdefs.NotFound) {
		t.Fatalf("second delete = %v", err)
	}
	ops, _ := w.eng.Operations(ctx, store.OperationQuery{SandboxID: sb.ID})
	if len(ops.Items) != 1+len(steps) {
		t.Fatalf("%d operations recorded, want %d", len(ops.Items), 1+len(steps))
	}
}

func TestWakeOfRunningSucceedsAtOnce(t *testing.T) { synctest.Test(t, testWakeOfRunningSucceedsAtOnce) }

func testWakeOfRunningSucceedsAtOnce(t *testing.T) {
	w := newWorld(t, t.TempDir(), fakeruntime.Config{})
	sb := create(t, w)
	op, err := w.eng.Wake(context.Background(), sb.ID, nil)
	if err != nil {
		t.Fatal(err)
	}
	if op.State != sandbox.OpSucceeded || op.CompletedAt == nil {
		t.Fatalf("wake of running = %+v", op)
	}
	got, _ := w.eng.Operation(context.Background(), op.ID)
	if got.State != sandbox.OpSucceeded {
		t.Fatalf("stored wake = %+v", got)
	}
}

func TestInvalidTransitionsChangeNothing(t *testing.T) {
	synctest.Test(t, testInvalidTransitionsChangeNothing)
}

func testInvalidTransitionsChangeNothing(t *testing.T) {
	w := newWorld(t, t.TempDir(), fakeruntime.Config{})
	ctx := context.Background()
	sb := create(t, w)
	op, _ := w.eng.Pause(ctx, sb.ID, nil)
	wait(t, w, op.ID)
	before, _ := w.eng.Operations(ctx, store.OperationQuery{SandboxID: sb.ID})
	if _, err := w.eng.Pause(ctx, sb.ID, nil); !errors.Is(err, errdefs.FailedPrecondition) {
		t.Fatalf("pause of paused = %v", err)
	}
	after, _ := w.eng.Operations(ctx, store.OperationQuery{SandboxID: sb.ID})
	if len(after.Items) != len(before.Items) || state(t, w, sb.ID) != sandbox.Paused {
		t.Fatal("refused transition changed something")
	}
	if _, err := w.eng.Pause(ctx, ids.New(ids.Sandbox), nil); !errors.Is(err, errdefs.NotFound) {
		t.Fatalf("pause of unknown = %v", err)
	}
}

func TestOneOperationInFlight(t *testing.T) { synctest.Test(t, testOneOperationInFlight) }

func testOneOperationInFlight(t *testing.T) {
	w := newWorld(t, t.TempDir(), fakeruntime.Config{Delay: 200 * time.Millisecond})
	ctx := context.Background()
	sb := create(t, w)
	op, err := w.eng.Suspend(ctx, sb.ID, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []func(context.Context, string, lifecycle.Render) (*sandbox.Operation, error){w.eng.Pause, w.eng.Wake, w.eng.Delete, w.eng.Suspend} {
		if _, err := f(ctx, sb.ID, nil); !errors.Is(err, errdefs.Conflict) {
			t.Fatalf("second operation while one in flight = %v", err)
		}
	}
	if state(t, w, sb.ID) != sandbox.Suspending {
		t.Fatalf("state while suspending = %s", state(t, w, sb.ID))
	}
	wait(t, w, op.ID)
	if state(t, w, sb.ID) != sandbox.Suspended {
		t.Fatal("not suspended")
	}
}

func TestFailedStepLeavesObservedState(t *testing.T) {
	synctest.Test(t, testFailedStepLeavesObservedState)
}

func testFailedStepLeavesObservedState(t *testing.T) {
	w := newWorld(t, t.TempDir(), fakeruntime.Config{Fail: fakeruntime.ParseFail("pause")})
	sb := create(t, w)
	op, err := w.eng.Pause(context.Background(), sb.ID, nil)
	if err != nil {
		t.Fatal(err)
	}
	got := wait(t, w, op.ID)
	if got.State != sandbox.OpFailed || got.Error == nil || got.Error.Code != "internal" {
		t.Fatalf("failed pause op = %+v", got)
	}
	if state(t, w, sb.ID) != sandbox.Running {
		t.Fatalf("sandbox after failed pause = %s, want running", state(t, w, sb.ID))
	}
}

func TestFailedCreateCleansUp(t *testing.T) { synctest.Test(t, testFailedCreateCleansUp) }

func testFailedCreateCleansUp(t *testing.T) {
	w := newWorld(t, t.TempDir(), fakeruntime.Config{Fail: fakeruntime.ParseFail("create")})
	sb, op, err := w.eng.Create(context.Background(), lifecycle.CreateRequest{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := wait(t, w, op.ID); got.State != sandbox.OpFailed {
		t.Fatalf("create = %+v", got)
	}
	got, _ := w.eng.Get(context.Background(), sb.ID)
	if got.State != sandbox.Failed || got.Error == nil {
		t.Fatalf("sandbox = %+v", got)
	}
	if st, _ := w.rt.Recover(context.Background(), runtime.Spec{SandboxID: sb.ID}); st != runtime.StatusAbsent {
		t.Fatalf("failed create left %s on the host", st)
	}
	// A failed sandbox can be deleted.
	del, err := w.eng.Delete(context.Background(), sb.ID, nil)
	if err != nil {
		t.Fatal(err)
	}
	if d := wait(t, w, del.ID); d.State != sandbox.OpSucceeded {
		t.Fatalf("delete of failed = %+v", d)
	}
}

func TestTimeoutFailsOperation(t *testing.T) { synctest.Test(t, testTimeoutFailsOperation) }

func testTimeoutFailsOperation(t *testing.T) {
	dir := t.TempDir()
	st, _ := sqlite.Open(context.Background(), filepath.Join(dir, "db"))
	defer st.Close()
	rt, _ := fakeruntime.New(fakeruntime.Config{Dir: filepath.Join(dir, "fake"), Delay: time.Second})
	eng, _ := lifecycle.New(lifecycle.Config{Store: st, Runtimes: []runtime.Runtime{rt}, Templates: fakeruntime.Templates{}, SnapshotRoot: dir, OperationTimeout: 50 * time.Millisecond})
	defer eng.Close()
	eng.Start(context.Background())
	_, op, err := eng.Create(context.Background(), lifecycle.CreateRequest{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	w := &world{eng: eng}
	got := wait(t, w, op.ID)
	if got.State != sandbox.OpFailed || got.Error.Code != "unavailable" {
		t.Fatalf("timed-out create = %+v", got.Error)
	}
}

// A server stopping in the middle of an operation leaves it recorded as
// running; the next engine over the same store and host resumes it to a
// terminal state without doing anything twice.
func TestRestartResumesInterruptedOperations(t *testing.T) {
	synctest.Test(t, testRestartResumesInterruptedOperations)
}

func testRestartResumesInterruptedOperations(t *testing.T) {
	dir := t.TempDir()
	w := newWorld(t, dir, fakeruntime.Config{Delay: time.Hour})
	ctx := context.Background()
	sb, op, err := w.eng.Create(ctx, lifecycle.CreateRequest{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		got, _ := w.eng.Operation(ctx, op.ID)
		if got.State == sandbox.OpRunning {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("operation never started")
		}
		time.Sleep(time.Millisecond)
	}
	w.close()
	if got, _ := w.store.(interface {
		GetOperation(context.Context, string) (*sandbox.Operation, error)
	}).GetOperation(ctx, op.ID); got != nil && got.State.Terminal() {
		t.Fatal("shutdown finished the operation instead of leaving it for recovery")
	}
	w2 := newWorld(t, dir, fakeruntime.Config{})
	if got := wait(t, w2, op.ID); got.State != sandbox.OpSucceeded {
		t.Fatalf("resumed op = %+v", got)
	}
	if state(t, w2, sb.ID) != sandbox.Running {
		t.Fatal("sandbox not running after resumed create")
	}
	page, _ := w2.eng.List(ctx, store.SandboxQuery{})
	if len(page.Items) != 1 {
		t.Fatalf("%d sandboxes after restart, want 1", len(page.Items))
	}
}

// A sandbox the host lost while the server was down becomes failed, with a
// reason, instead of claiming to run.
func TestRestartMarksLostSandboxFailed(t *testing.T) {
	synctest.Test(t, testRestartMarksLostSandboxFailed)
}

func testRestartMarksLostSandboxFailed(t *testing.T) {
	dir := t.TempDir()
	w := newWorld(t, dir, fakeruntime.Config{})
	sb := create(t, w)
	w.rt.Delete(context.Background(), runtime.Spec{SandboxID: sb.ID}) // the host loses it
	w.close()
	w2 := newWorld(t, dir, fakeruntime.Config{})
	got, _ := w2.eng.Get(context.Background(), sb.ID)
	if got.State != sandbox.Failed || got.Error == nil {
		t.Fatalf("lost sandbox = %s %+v", got.State, got.Error)
	}
}

// hungAgent is the FAKE runtime whose sandboxes' agents, once hung is
// set, accept a connection and never answer (a wedged agent no test can
// make on cue): every Agent call waits until its context ends, and is
// counted.
type hungAgent struct {
	*fakeruntime.Runtime
	hung  atomic.Bool
	calls atomic.Int32
}

func (h *hungAgent) Agent(ctx context.Context, spec runtime.Spec) (*agentclient.Client, error) {
	if h.hung.Load() {
		h.calls.Add(1)
		<-ctx.Done()
		return nil, ctx.Err()
	}
	return h.Runtime.Agent(ctx, spec)
}

// A suspend saves the sandbox without its agent: memory and disk are saved
// as one pair, so nothing needs writing out first, and a sandbox whose
// agent no longer answers is suspended all the same. (A flush through the
// agent before every save waited out its 10 s for such a sandbox, past the
// operation's own timeout.)
func TestSuspendDoesNotNeedTheAgentFaultInjection(t *testing.T) {
	h := &hungAgent{}
	w := newWorldWith(t, t.TempDir(), fakeruntime.Config{}, func(c *lifecycle.Config) {
		h.Runtime = c.Runtimes[0].(*fakeruntime.Runtime)
		c.Runtimes = []runtime.Runtime{h}
	})
	sb := create(t, w)
	h.hung.Store(true)
	op, err := w.eng.Suspend(context.Background(), sb.ID, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := wait(t, w, op.ID); got.State != sandbox.OpSucceeded {
		t.Fatalf("suspend of a sandbox whose agent hangs: %+v", got.Error)
	}
	if s := state(t, w, sb.ID); s != sandbox.Suspended {
		t.Fatalf("after the suspend: %s", s)
	}
	if n := h.calls.Load(); n != 0 {
		t.Fatalf("the suspend waited on the hung agent %d times", n)
	}
}

func TestCreateValidation(t *testing.T) { synctest.Test(t, testCreateValidation) }

func testCreateValidation(t *testing.T) {
	w := newWorld(t, t.TempDir(), fakeruntime.Config{})
	ctx := context.Background()
	bad := []lifecycle.CreateRequest{
		{Template: "Bad Name"},
		{Runtime: "nope"},
		{Runtime: "BAD!"},
		{Resources: &sandbox.Resources{VCPUs: 99}},
		{Resources: &sandbox.Resources{MemoryMiB: 1}},
		{Resources: &sandbox.Resources{DiskMiB: -5}},
		{Env: map[string]string{"1X": "y"}},
		{Env: map[string]string{"X": "a\x00b"}},
		{Metadata: map[string]string{"": "y"}},
		{AutoLifecycle: &sandbox.AutoLifecycle{IdleTimeout: "forever"}},
		{AutoLifecycle: &sandbox.AutoLifecycle{IdleAction: "explode"}},
	}
	for _, r := range bad {
		if _, _, err := w.eng.Create(ctx, r, nil); !errors.Is(err, errdefs.InvalidArgument) {
			t.Errorf("Create(%+v) = %v, want invalid_argument", r, err)
		}
	}
	if _, _, err := w.eng.Create(ctx, lifecycle.CreateRequest{Template: "missing:latest"}, nil); !errors.Is(err, errdefs.NotFound) {
		t.Errorf("unknown template = %v", err)
	}
	page, _ := w.eng.List(ctx, store.SandboxQuery{})
	if len(page.Items) != 0 {
		t.Fatalf("rejected creates stored %d sandboxes", len(page.Items))
	}
}

func TestNotReadyWithoutRuntime(t *testing.T) { synctest.Test(t, testNotReadyWithoutRuntime) }

func testNotReadyWithoutRuntime(t *testing.T) {
	dir := t.TempDir()
	st, _ := sqlite.Open(context.Background(), filepath.Join(dir, "db"))
	defer st.Close()
	eng, err := lifecycle.New(lifecycle.Config{Store: st, SnapshotRoot: dir, Templates: fakeruntime.Templates{}})
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close()
	eng.Start(context.Background())
	if eng.Ready() == nil {
		t.Fatal("ready with no runtime")
	}
	if _, _, err := eng.Create(context.Background(), lifecycle.CreateRequest{}, nil); !errors.Is(err, errdefs.Unavailable) {
		t.Fatalf("create without runtime = %v", err)
	}
}

// An operation is recorded running only once it has taken longer than a
// quick one does (its running record is a transaction of its own, which
// the runtime's work need not wait for): one that ends within that time
// goes from pending to succeeded; a slow one is seen running while it
// works. So for a create, a pause and a delete.
func TestOperationRecordedRunningOnlyWhenSlow(t *testing.T) {
	ctx := context.Background()
	for _, k := range []struct {
		name  string
		start func(*testing.T, *world) (*sandbox.Operation, error)
	}{
		{"create", func(_ *testing.T, w *world) (*sandbox.Operation, error) {
			_, op, err := w.eng.Create(ctx, lifecycle.CreateRequest{}, nil)
			return op, err
		}},
		{"pause", func(t *testing.T, w *world) (*sandbox.Operation, error) {
			return w.eng.Pause(ctx, create(t, w).ID, nil)
		}},
		{"delete", func(t *testing.T, w *world) (*sandbox.Operation, error) {
			return w.eng.Delete(ctx, create(t, w).ID, nil)
		}},
	} {
		synctest.Test(t, func(t *testing.T) {
			for _, c := range []struct {
				delay time.Duration
				want  sandbox.OpState
			}{{20 * time.Millisecond, sandbox.OpPending}, {time.Second, sandbox.OpRunning}} {
				w := newWorld(t, t.TempDir(), fakeruntime.Config{Delay: c.delay})
				op, err := k.start(t, w)
				if err != nil {
					t.Fatal(err)
				}
				time.Sleep(c.delay / 2)
				synctest.Wait()
				if got, _ := w.eng.Operation(ctx, op.ID); got.State != c.want {
					t.Fatalf("a %s taking %v, half-way: %s, want %s", k.name, c.delay, got.State, c.want)
				}
				if got := wait(t, w, op.ID); got.State != sandbox.OpSucceeded {
					t.Fatalf("%s taking %v = %+v", k.name, c.delay, got)
				}
				w.close()
			}
		})
	}
}

// What a crash leaves in the snapshot directory after its owner ended — a
// finished fork's save, a deleted snapshot's or sandbox's image, an
// unfinished save (".tmp") whose operation is over — is removed at the next
// start; the saves of live records and names it does not know are kept.
func TestRestartSweepsSavesLeftByACrash(t *testing.T) {
	dir := t.TempDir()
	w := newWorld(t, dir, fakeruntime.Config{})
	ctx := context.Background()
	src := create(t, w)
	fop, _, err := w.eng.Fork(ctx, src.ID, 1, nil)
	if err != nil || wait(t, w, fop.ID).State != sandbox.OpSucceeded {
		t.Fatalf("fork: %v", err)
	}
	snap := func() string {
		op, sn, err := w.eng.CreateSnapshot(ctx, src.ID, "", nil)
		if err != nil || wait(t, w, op.ID).State != sandbox.OpSucceeded {
			t.Fatalf("snapshot: %v", err)
		}
		return sn.ID
	}
	kept, gone := snap(), snap()
	if err := w.eng.DeleteSnapshot(ctx, gone); err != nil {
		t.Fatal(err)
	}
	deleted := create(t, w)
	dop, err := w.eng.Delete(ctx, deleted.ID, nil)
	if err != nil || wait(t, w, dop.ID).State != sandbox.OpSucceeded {
		t.Fatalf("delete: %v", err)
	}
	w.close()
	root := filepath.Join(dir, "snapshots")
	stale := []string{fop.ID, gone, deleted.ID, src.ID + ".tmp", kept + ".tmp", ids.New(ids.Operation)}
	live := []string{kept, src.ID, "notes"}
	for _, name := range append(append([]string{}, stale...), live...) {
		if err := os.MkdirAll(filepath.Join(root, name), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, name, "mem"), []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	newWorld(t, dir, fakeruntime.Config{})
	for _, name := range stale {
		if _, err := os.Stat(filepath.Join(root, name)); !os.IsNotExist(err) {
			t.Errorf("%s: left after the restart (%v)", name, err)
		}
	}
	for _, name := range live {
		if _, err := os.Stat(filepath.Join(root, name, "mem")); err != nil {
			t.Errorf("%s: removed: %v", name, err)
		}
	}
}
