package lifecycle_test

import (
	"context"
	"path/filepath"
	"testing"
	"testing/synctest"
	"time"

	"github.com/spacesandbox/space/internal/lifecycle"
	"github.com/spacesandbox/space/internal/runtime"
	"github.com/spacesandbox/space/internal/runtime/fakeruntime"
	"github.com/spacesandbox/space/internal/sandbox"
	"github.com/spacesandbox/space/internal/store"
	"github.com/spacesandbox/space/internal/store/sqlite"
)

// idleWorld is an engine over SQLite and the FAKE runtime with a fast idle
// sweep.
func idleWorld(t *testing.T, pausedLimit time.Duration) *world {
	dir := t.TempDir()
	st, err := sqlite.Open(context.Background(), filepath.Join(dir, "db"))
	if err != nil {
		t.Fatal(err)
	}
	rt, _ := fakeruntime.New(fakeruntime.Config{Dir: filepath.Join(dir, "fake")})
	eng, err := lifecycle.New(lifecycle.Config{Store: st, Runtimes: []runtime.Runtime{rt}, Templates: fakeruntime.Templates{},
		SnapshotRoot: dir, IdleInterval: 50 * time.Millisecond, SuspendPausedAfter: pausedLimit})
	if err != nil {
		t.Fatal(err)
	}
	eng.Start(context.Background())
	w := &world{dir: dir, store: st, rt: rt, eng: eng}
	t.Cleanup(w.close)
	return w
}

func createIdle(t *testing.T, w *world, timeout, action string) string {
	t.Helper()
	sb, op, err := w.eng.Create(context.Background(), lifecycle.CreateRequest{AutoLifecycle: &sandbox.AutoLifecycle{IdleTimeout: timeout, IdleAction: action}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	wait(t, w, op.ID)
	return sb.ID
}

// waitState waits for a sandbox to reach want and returns how long it took.
func waitState(t *testing.T, w *world, id string, want sandbox.State, within time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	for time.Since(start) < within {
		if state(t, w, id) == want {
			return time.Since(start)
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("%s not %s within %s (is %s)", id, want, within, state(t, w, id))
	return 0
}

func autoOps(t *testing.T, w *world, id string, kind sandbox.OpKind) int {
	ops, _ := w.eng.Operations(context.Background(), store.OperationQuery{SandboxID: id})
	n := 0
	for _, op := range ops.Items {
		if op.Kind == kind && op.State == sandbox.OpSucceeded {
			n++
		}
	}
	return n
}

func TestIdlePauseAndSuspendHappen(t *testing.T) { synctest.Test(t, testIdlePauseAndSuspendHappen) }

func testIdlePauseAndSuspendHappen(t *testing.T) {
	w := idleWorld(t, 0)
	p := createIdle(t, w, "1s", "pause")
	s := createIdle(t, w, "1s", "suspend")
	n := createIdle(t, w, "1s", "none")
	waitState(t, w, p, sandbox.Paused, 5*time.Second)
	waitState(t, w, s, sandbox.Suspended, 5*time.Second)
	if autoOps(t, w, p, sandbox.OpPause) != 1 || autoOps(t, w, s, sandbox.OpSuspend) != 1 {
		t.Fatal("automatic actions are not recorded as operations")
	}
	if state(t, w, n) != sandbox.Running {
		t.Fatal("idle_action none acted")
	}
}

func TestActivityAndAttachedStreamsKeepAwake(t *testing.T) {
	synctest.Test(t, testActivityAndAttachedStreamsKeepAwake)
}

func testActivityAndAttachedStreamsKeepAwake(t *testing.T) {
	w := idleWorld(t, 0)
	touched := createIdle(t, w, "1s", "pause")
	attached := createIdle(t, w, "1s", "pause")
	release := w.eng.Attached(attached)
	for end := time.Now().Add(2500 * time.Millisecond); time.Now().Before(end); time.Sleep(200 * time.Millisecond) {
		w.eng.Touch(touched)
	}
	if state(t, w, touched) != sandbox.Running || state(t, w, attached) != sandbox.Running {
		t.Fatal("activity did not keep sandboxes awake")
	}
	release()
	waitState(t, w, touched, sandbox.Paused, 5*time.Second)
	waitState(t, w, attached, sandbox.Paused, 5*time.Second)
	// last_active_at was persisted.
	sb, _ := w.eng.Get(context.Background(), touched)
	if time.Since(sb.LastActiveAt) > 4*time.Second {
		t.Fatalf("last_active_at %v not recorded", sb.LastActiveAt)
	}
}

func TestWakeRestartsIdleClock(t *testing.T) { synctest.Test(t, testWakeRestartsIdleClock) }

func testWakeRestartsIdleClock(t *testing.T) {
	w := idleWorld(t, 0)
	id := createIdle(t, w, "1s", "pause")
	waitState(t, w, id, sandbox.Paused, 5*time.Second)
	time.Sleep(1500 * time.Millisecond) // paused time must not count
	op, err := w.eng.Wake(context.Background(), id, nil)
	if err != nil {
		t.Fatal(err)
	}
	wait(t, w, op.ID)
	time.Sleep(600 * time.Millisecond)
	if state(t, w, id) != sandbox.Running {
		t.Fatal("paused time counted towards idleness after wake")
	}
	waitState(t, w, id, sandbox.Paused, 5*time.Second)
	if autoOps(t, w, id, sandbox.OpPause) != 2 {
		t.Fatal("second automatic pause not recorded")
	}
}

func TestLongPausedGetsSuspended(t *testing.T) { synctest.Test(t, testLongPausedGetsSuspended) }

func testLongPausedGetsSuspended(t *testing.T) {
	w := idleWorld(t, time.Second)
	id := createIdle(t, w, "10m", "none")
	op, _ := w.eng.Pause(context.Background(), id, nil)
	wait(t, w, op.ID)
	waitState(t, w, id, sandbox.Suspended, 5*time.Second)
}

// 100 concurrent creates against a pool of 10: all succeed, no sandbox is
// handed out twice, and the pool refills.
func TestWarmPoolConcurrentClaims(t *testing.T) { synctest.Test(t, testWarmPoolConcurrentClaims) }

func testWarmPoolConcurrentClaims(t *testing.T) {
	w := idleWorld(t, 0)
	ctx := context.Background()
	if _, err := w.eng.SetWarmPool(ctx, "", "seed:latest", 10); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		wp, _ := w.eng.WarmPool(ctx, "", "seed:latest")
		if wp.Ready == 10 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("pool never filled: %+v", wp)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if page, _ := w.eng.List(ctx, store.SandboxQuery{}); len(page.Items) != 0 {
		t.Fatalf("pool sandboxes are listed: %d", len(page.Items))
	}
	type result struct {
		id     string
		pooled bool
		err    error
	}
	results := make(chan result, 100)
	for i := 0; i < 100; i++ {
		go func() {
			sb, op, err := w.eng.Create(ctx, lifecycle.CreateRequest{Metadata: map[string]string{"n": "x"}}, nil)
			if err != nil {
				results <- result{err: err}
				return
			}
			results <- result{id: sb.ID, pooled: op.State == sandbox.OpSucceeded && sb.State == sandbox.Running}
			if !op.State.Terminal() {
				wait(t, w, op.ID)
			}
		}()
	}
	seen := map[string]bool{}
	pooled := 0
	for i := 0; i < 100; i++ {
		r := <-results
		if r.err != nil {
			t.Fatal(r.err)
		}
		if seen[r.id] {
			t.Fatalf("%s handed out twice", r.id)
		}
		seen[r.id] = true
		if r.pooled {
			pooled++
		}
	}
	if pooled < 10 {
		t.Fatalf("only %d creates came from the pool of 10", pooled)
	}
	deadline = time.Now().Add(15 * time.Second)
	for {
		page, _ := w.eng.List(ctx, store.SandboxQuery{Limit: 500})
		running := 0
		for _, sb := range page.Items {
			if sb.State == sandbox.Running {
				running++
			}
		}
		wp, _ := w.eng.WarmPool(ctx, "", "seed:latest")
		if running == 100 && wp.Ready == 10 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of 100 running, pool %+v", running, wp)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A server-default pool fills without any API call; a pool set through the
// API (even to 0) overrides it.
func TestDefaultWarmPool(t *testing.T) { synctest.Test(t, testDefaultWarmPool) }

func testDefaultWarmPool(t *testing.T) {
	dir := t.TempDir()
	st, err := sqlite.Open(context.Background(), filepath.Join(dir, "db"))
	if err != nil {
		t.Fatal(err)
	}
	rt, _ := fakeruntime.New(fakeruntime.Config{Dir: filepath.Join(dir, "fake")})
	eng, err := lifecycle.New(lifecycle.Config{Store: st, Runtimes: []runtime.Runtime{rt}, Templates: fakeruntime.Templates{},
		SnapshotRoot: dir, DefaultWarmPools: map[string]int{"seed:latest": 2}})
	if err != nil {
		t.Fatal(err)
	}
	eng.Start(context.Background())
	w := &world{dir: dir, store: st, rt: rt, eng: eng}
	t.Cleanup(w.close)
	ctx := context.Background()
	if wp, _ := eng.WarmPool(ctx, "", "seed:latest"); wp.MinReady != 2 {
		t.Fatalf("default pool setting = %+v", wp)
	}
	waitPool(t, eng, "seed:latest", 2)
	if _, err := eng.SetWarmPool(ctx, "", "seed:latest", 0); err != nil {
		t.Fatal(err)
	}
	waitPool(t, eng, "seed:latest", 0)
}

// waitPool waits until the pool of template ref has ready sandboxes ready
// and none starting.
func waitPool(t *testing.T, eng *lifecycle.Engine, ref string, ready int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		wp, _ := eng.WarmPool(context.Background(), "", ref)
		if wp.Ready == ready && wp.Starting == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("pool = %+v, want %d ready", wp, ready)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
