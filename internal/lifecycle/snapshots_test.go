package lifecycle_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/spacesandbox/space/internal/agentclient"
	"github.com/spacesandbox/space/internal/errdefs"
	"github.com/spacesandbox/space/internal/lifecycle"
	"github.com/spacesandbox/space/internal/runtime"
	"github.com/spacesandbox/space/internal/runtime/fakeruntime"
	"github.com/spacesandbox/space/internal/sandbox"
	"github.com/spacesandbox/space/internal/store"
)

// A snapshot outlives its source and a server restart, and sandboxes made
// from it start with its files (the FAKE runtime saves files only).
func TestSnapshotRoundTrip(t *testing.T) { synctest.Test(t, testSnapshotRoundTrip) }

func testSnapshotRoundTrip(t *testing.T) {
	dir := t.TempDir()
	w := newWorld(t, dir, fakeruntime.Config{})
	ctx := context.Background()
	src := create(t, w)
	os.MkdirAll(w.rt.RootDir(src.ID), 0o755)
	if err := os.WriteFile(filepath.Join(w.rt.RootDir(src.ID), "state.txt"), []byte("warm"), 0o644); err != nil {
		t.Fatal(err)
	}
	op, snap, err := w.eng.CreateSnapshot(ctx, src.ID, "warm-env", nil)
	if err != nil {
		t.Fatal(err)
	}
	if snap.State != sandbox.SnapshotCreating || op.Kind != sandbox.OpSnapshot || op.Snapshot != snap.ID || snap.SandboxID != src.ID {
		t.Fatalf("snapshot = %+v, op %+v", snap, op)
	}
	if got := wait(t, w, op.ID); got.State != sandbox.OpSucceeded {
		t.Fatalf("snapshot op = %+v", got)
	}
	got, err := w.eng.GetSnapshot(ctx, snap.ID)
	if err != nil || got.State != sandbox.SnapshotReady || got.SizeBytes == 0 || got.Resources != src.Resources {
		t.Fatalf("snapshot after the operation = %+v, %v", got, err)
	}
	if state(t, w, src.ID) != sandbox.Running {
		t.Fatal("source not running after its snapshot")
	}
	del, err := w.eng.Delete(ctx, src.ID, nil)
	if err != nil || wait(t, w, del.ID).State != sandbox.OpSucceeded {
		t.Fatalf("delete the source: %v", err)
	}
	w.close()
	w = newWorld(t, dir, fakeruntime.Config{})
	for range 2 {
		sb, cop, err := w.eng.Create(ctx, lifecycle.CreateRequest{Snapshot: snap.ID, Metadata: map[string]string{"from": "snapshot"}}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if o := wait(t, w, cop.ID); o.State != sandbox.OpSucceeded {
			t.Fatalf("create from the snapshot: %+v", o)
		}
		if sb.Snapshot != snap.ID || sb.Template != src.Template || sb.Resources != src.Resources {
			t.Fatalf("sandbox from the snapshot: %+v", sb)
		}
		if b, err := os.ReadFile(filepath.Join(w.rt.RootDir(sb.ID), "state.txt")); err != nil || string(b) != "warm" {
			t.Fatalf("file from the snapshot: %q %v", b, err)
		}
	}
	page, err := w.eng.ListSnapshots(ctx, store.SnapshotQuery{SandboxID: src.ID})
	if err != nil || len(page.Items) != 1 || page.Items[0].ID != snap.ID {
		t.Fatalf("list by source: %+v %v", page, err)
	}
	if err := w.eng.DeleteSnapshot(ctx, snap.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "snapshots", snap.ID)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("snapshot image left after delete: %v", err)
	}
	if _, _, err := w.eng.Create(ctx, lifecycle.CreateRequest{Snapshot: snap.ID}, nil); !errors.Is(err, errdefs.NotFound) {
		t.Fatalf("create from a deleted snapshot: %v", err)
	}
	if err := w.eng.DeleteSnapshot(ctx, snap.ID); !errors.Is(err, errdefs.NotFound) {
		t.Fatalf("delete twice: %v", err)
	}
}

func TestSnapshotRefusals(t *testing.T) { synctest.Test(t, testSnapshotRefusals) }

func testSnapshotRefusals(t *testing.T) {
	w := newWorld(t, t.TempDir(), fakeruntime.Config{})
	ctx := context.Background()
	src := create(t, w)
	if _, _, err := w.eng.CreateSnapshot(ctx, src.ID, "bad name!", nil); !errors.Is(err, errdefs.InvalidArgument) {
		t.Errorf("bad name: %v", err)
	}
	op, snap, err := w.eng.CreateSnapshot(ctx, src.ID, "", nil)
	if err != nil || wait(t, w, op.ID).State != sandbox.OpSucceeded {
		t.Fatal(err)
	}
	for name, req := range map[string]lifecycle.CreateRequest{
		"malformed id":    {Snapshot: "snap_nope"},
		"other resources": {Snapshot: snap.ID, Resources: &sandbox.Resources{MemoryMiB: 1024}},
		"other template":  {Snapshot: snap.ID, Template: "other:latest"},
		"other runtime":   {Snapshot: snap.ID, Runtime: "gvisor"},
		"its own env":     {Snapshot: snap.ID, Env: map[string]string{"A": "b"}},
	} {
		if _, _, err := w.eng.Create(ctx, req, nil); !errors.Is(err, errdefs.InvalidArgument) {
			t.Errorf("%s: %v, want invalid_argument", name, err)
		}
	}
	if _, _, err := w.eng.Create(ctx, lifecycle.CreateRequest{Snapshot: "snap_aaaaaaaaaaaaaaaaaaaaaaaaaa"}, nil); !errors.Is(err, errdefs.NotFound) {
		t.Errorf("unknown snapshot: %v", err)
	}
	// Same resources, spelled out, are fine.
	if _, cop, err := w.eng.Create(ctx, lifecycle.CreateRequest{Snapshot: snap.ID, Resources: &sandbox.Resources{VCPUs: src.Resources.VCPUs}}, nil); err != nil || wait(t, w, cop.ID).State != sandbox.OpSucceeded {
		t.Errorf("create with the snapshot's resources: %v", err)
	}
	sus, err := w.eng.Suspend(ctx, src.ID, nil)
	if err != nil || wait(t, w, sus.ID).State != sandbox.OpSucceeded {
		t.Fatal(err)
	}
	if _, _, err := w.eng.CreateSnapshot(ctx, src.ID, "", nil); !errors.Is(err, errdefs.FailedPrecondition) {
		t.Errorf("snapshot of a suspended sandbox: %v", err)
	}
}

// FAKE-runtime fault injection: a save that fails leaves the source running
// and the snapshot failed with the reason, and a failed snapshot cannot be
// used.
func TestSnapshotFailureInjected(t *testing.T) { synctest.Test(t, testSnapshotFailureInjected) }

func testSnapshotFailureInjected(t *testing.T) {
	w := newWorld(t, t.TempDir(), fakeruntime.Config{Fail: map[string]bool{"snapshot": true}})
	ctx := context.Background()
	src := create(t, w)
	op, snap, err := w.eng.CreateSnapshot(ctx, src.ID, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := wait(t, w, op.ID); got.State != sandbox.OpFailed {
		t.Fatalf("op = %+v", got)
	}
	if got, _ := w.eng.GetSnapshot(ctx, snap.ID); got.State != sandbox.SnapshotFailed || got.Error == nil {
		t.Fatalf("snapshot = %+v", got)
	}
	if state(t, w, src.ID) != sandbox.Running {
		t.Fatal("source not running")
	}
	if _, _, err := w.eng.Create(ctx, lifecycle.CreateRequest{Snapshot: snap.ID}, nil); !errors.Is(err, errdefs.FailedPrecondition) {
		t.Fatalf("create from a failed snapshot: %v", err)
	}
	if err := w.eng.DeleteSnapshot(ctx, snap.ID); err != nil {
		t.Fatalf("delete a failed snapshot: %v", err)
	}
}

// A snapshot tagged as a template starts that template's creates and its
// warm pool; a template-store name is refused; a tagged snapshot cannot be
// deleted; untagged, the template is gone and its pool's sandboxes go.
// (The FAKE template store holds every name but "missing…" ones.)
func TestSnapshotAsTemplate(t *testing.T) { synctest.Test(t, testSnapshotAsTemplate) }

func testSnapshotAsTemplate(t *testing.T) {
	w := newWorld(t, t.TempDir(), fakeruntime.Config{})
	ctx := context.Background()
	src := create(t, w)
	os.MkdirAll(w.rt.RootDir(src.ID), 0o755)
	os.WriteFile(filepath.Join(w.rt.RootDir(src.ID), "state.txt"), []byte("warm"), 0o644)
	op, snap, err := w.eng.CreateSnapshot(ctx, src.ID, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.eng.TagSnapshot(ctx, snap.ID, "missingwarm"); !errors.Is(err, errdefs.FailedPrecondition) {
		t.Fatalf("tag a snapshot still being made: %v", err)
	}
	wait(t, w, op.ID)
	if _, err := w.eng.TagSnapshot(ctx, snap.ID, "seed:latest"); !errors.Is(err, errdefs.Conflict) {
		t.Fatalf("tag as a template-store name: %v", err)
	}
	if _, err := w.eng.TagSnapshot(ctx, snap.ID, "Bad Ref"); !errors.Is(err, errdefs.InvalidArgument) {
		t.Fatalf("tag as a malformed name: %v", err)
	}
	if got, err := w.eng.TagSnapshot(ctx, snap.ID, "missingwarm"); err != nil || got.Tag != "missingwarm:latest" {
		t.Fatalf("tag = %+v, %v", got, err)
	}
	if err := w.eng.DeleteSnapshot(ctx, snap.ID); !errors.Is(err, errdefs.Conflict) {
		t.Fatalf("delete a tagged snapshot: %v", err)
	}
	sb, cop, err := w.eng.Create(ctx, lifecycle.CreateRequest{Template: "missingwarm:latest"}, nil)
	if err != nil || wait(t, w, cop.ID).State != sandbox.OpSucceeded || sb.Snapshot != snap.ID || sb.Template != src.Template {
		t.Fatalf("create of the tagged template = %+v, %v", sb, err)
	}
	if b, err := os.ReadFile(filepath.Join(w.rt.RootDir(sb.ID), "state.txt")); err != nil || string(b) != "warm" {
		t.Fatalf("file from the snapshot: %q %v", b, err)
	}
	if _, _, err := w.eng.Create(ctx, lifecycle.CreateRequest{Template: "missingwarm", Env: map[string]string{"A": "b"}}, nil); !errors.Is(err, errdefs.InvalidArgument) {
		t.Fatalf("create of the tagged template with env: %v", err)
	}
	// Its warm pool: ready copies of the snapshot, claimed by a create.
	if _, err := w.eng.SetWarmPool(ctx, "", "missingwarm", 2); err != nil {
		t.Fatal(err)
	}
	waitPool(t, w.eng, "missingwarm", 2)
	claimed, cop, err := w.eng.Create(ctx, lifecycle.CreateRequest{Template: "missingwarm"}, nil)
	if err != nil || cop.State != sandbox.OpSucceeded || claimed.Snapshot != snap.ID || claimed.State != sandbox.Running {
		t.Fatalf("create from the pool = %+v %+v, %v", claimed, cop, err)
	}
	if b, err := os.ReadFile(filepath.Join(w.rt.RootDir(claimed.ID), "state.txt")); err != nil || string(b) != "warm" {
		t.Fatalf("file in the claimed sandbox: %q %v", b, err)
	}
	waitPool(t, w.eng, "missingwarm", 2)
	// Untagged: the template is gone, and so are its pool's sandboxes.
	if got, err := w.eng.TagSnapshot(ctx, snap.ID, ""); err != nil || got.Tag != "" {
		t.Fatalf("untag = %+v, %v", got, err)
	}
	if _, _, err := w.eng.Create(ctx, lifecycle.CreateRequest{Template: "missingwarm"}, nil); !errors.Is(err, errdefs.NotFound) {
		t.Fatalf("create of an untagged template: %v", err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		keys, _ := w.store.PoolKeys(ctx)
		if len(keys) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the stale pool keeps sandboxes: %v", keys)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// The pool of the gone template is still reported, can be stopped but
	// not grown; a template that neither exists nor has a pool is not found.
	if wp, err := w.eng.WarmPool(ctx, "", "missingwarm"); err != nil || wp.MinReady != 2 || wp.Ready != 0 {
		t.Fatalf("pool of a gone template = %+v, %v", wp, err)
	}
	if _, err := w.eng.SetWarmPool(ctx, "", "missingwarm", 3); !errors.Is(err, errdefs.NotFound) {
		t.Fatalf("grow the pool of a gone template: %v", err)
	}
	if wp, err := w.eng.SetWarmPool(ctx, "", "missingwarm", 0); err != nil || wp.MinReady != 0 {
		t.Fatalf("stop the pool of a gone template = %+v, %v", wp, err)
	}
	if _, err := w.eng.WarmPool(ctx, "", "missingother:v1"); !errors.Is(err, errdefs.NotFound) {
		t.Fatalf("pool of a template that does not exist: %v", err)
	}
	if _, err := w.eng.SetWarmPool(ctx, "", "missingother:v1", 0); !errors.Is(err, errdefs.NotFound) {
		t.Fatalf("stop the pool of a template that does not exist: %v", err)
	}
	if err := w.eng.DeleteSnapshot(ctx, snap.ID); err != nil {
		t.Fatal(err)
	}
}

// A snapshot that a sandbox is still starting from cannot be deleted until
// it runs (Conflict, naming it): its image is what the start reads.
func TestDeleteSnapshotWhileStartingFromIt(t *testing.T) {
	synctest.Test(t, testDeleteSnapshotWhileStartingFromIt)
}

func testDeleteSnapshotWhileStartingFromIt(t *testing.T) {
	w := newWorld(t, t.TempDir(), fakeruntime.Config{Delay: time.Second})
	ctx := context.Background()
	src := create(t, w)
	op, snap, err := w.eng.CreateSnapshot(ctx, src.ID, "", nil)
	if err != nil || wait(t, w, op.ID).State != sandbox.OpSucceeded {
		t.Fatalf("snapshot: %v", err)
	}
	sb, cop, err := w.eng.Create(ctx, lifecycle.CreateRequest{Snapshot: snap.ID}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.eng.DeleteSnapshot(ctx, snap.ID); !errors.Is(err, errdefs.Conflict) || !strings.Contains(err.Error(), sb.ID) {
		t.Fatalf("delete while %s starts from it: %v", sb.ID, err)
	}
	if got := wait(t, w, cop.ID); got.State != sandbox.OpSucceeded {
		t.Fatalf("create from the snapshot = %+v", got)
	}
	if err := w.eng.DeleteSnapshot(ctx, snap.ID); err != nil {
		t.Fatalf("delete once it runs: %v", err)
	}
}

// A snapshot or fork whose save was complete when the server stopped
// succeeds at the next start without touching its source, but a source the
// host lost meanwhile (the server and the sandbox died together) must not be
// left shown running: the resumed operation looks at it, as Start looks at
// every sandbox at rest, and fails it with the reason. (A fork's copies run
// from the save, a snapshot is ready.) The lost source's agent is not
// called: on gVisor each call waits 10 s for an agent that never dials in.
func TestResumedCopyLooksAtItsSourceAgain(t *testing.T) {
	for _, kind := range []string{"snapshot", "fork"} {
		t.Run(kind, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) { testResumedCopyLooksAtItsSourceAgain(t, kind) })
		})
	}
}

func testResumedCopyLooksAtItsSourceAgain(t *testing.T, kind string) {
	dir := t.TempDir()
	ctx := context.Background()
	var save string // where the save is complete
	var forks []*sandbox.Sandbox
	src, op := stopWhileRunning(t, dir, func(w *world, src *sandbox.Sandbox) (op *sandbox.Operation, err error) {
		if kind == "snapshot" {
			var snap *sandbox.Snapshot
			if op, snap, err = w.eng.CreateSnapshot(ctx, src.ID, "", nil); err == nil {
				save = snap.ID
			}
			return op, err
		}
		if op, forks, err = w.eng.Fork(ctx, src.ID, 1, nil); err == nil {
			save = op.ID
		}
		return op, err
	})
	if err := os.MkdirAll(filepath.Join(dir, "snapshots", save), 0o700); err != nil {
		t.Fatal(err)
	}
	host, err := fakeruntime.New(fakeruntime.Config{Dir: filepath.Join(dir, "fake")})
	if err != nil {
		t.Fatal(err)
	}
	if err := host.Delete(ctx, runtime.Spec{SandboxID: src.ID}); err != nil {
		t.Fatal(err)
	}

	var counted *agentCounter
	w2 := newWorldWith(t, dir, fakeruntime.Config{}, func(c *lifecycle.Config) {
		counted = &agentCounter{Runtime: c.Runtimes[0].(*fakeruntime.Runtime), calls: map[string]int{}}
		c.Runtimes = []runtime.Runtime{counted}
	})
	if got := wait(t, w2, op.ID); got.State != sandbox.OpSucceeded {
		t.Fatalf("resumed %s = %+v", kind, got)
	}
	if n := counted.of(src.ID); n != 0 {
		t.Fatalf("the agent of a source the host lost was called %d times by the resumed %s", n, kind)
	}
	if sb, _ := w2.eng.Get(ctx, src.ID); sb.State != sandbox.Failed || sb.Error == nil || sb.Error.Message == "" {
		t.Fatalf("a source the host lost is %s %+v after its resumed %s, want failed with a reason", sb.State, sb.Error, kind)
	}
	if kind == "snapshot" {
		if got, err := w2.eng.GetSnapshot(ctx, save); err != nil || got.State != sandbox.SnapshotReady {
			t.Fatalf("snapshot after the resumed save: %v %+v", err, got)
		}
	}
	for _, f := range forks {
		if state(t, w2, f.ID) != sandbox.Running {
			t.Fatalf("fork %s not running after the resumed fork", f.ID)
		}
	}
}

// agentCounter is the FAKE runtime counting the agent calls it is asked for,
// by sandbox.
type agentCounter struct {
	*fakeruntime.Runtime
	mu    sync.Mutex
	calls map[string]int
}

func (a *agentCounter) Agent(ctx context.Context, spec runtime.Spec) (*agentclient.Client, error) {
	a.mu.Lock()
	a.calls[spec.SandboxID]++
	a.mu.Unlock()
	return a.Runtime.Agent(ctx, spec)
}

func (a *agentCounter) of(id string) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.calls[id]
}
