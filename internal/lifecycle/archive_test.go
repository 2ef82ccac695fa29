package lifecycle_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spacesandbox/space/internal/errdefs"
	"github.com/spacesandbox/space/internal/ids"
	"github.com/spacesandbox/space/internal/lifecycle"
	"github.com/spacesandbox/space/internal/runtime/fakeruntime"
	"github.com/spacesandbox/space/internal/sandbox"
)

// fakeArchive is a FAKE blob store (the real one, over versitygw, is tested
// in internal/blobstore and end to end): it injects failures the real
// server cannot be made to produce on cue.
type fakeArchive struct {
	mu      sync.Mutex
	stored  map[string]bool
	putErr  error
	getErr  error
	gets    int
	deleted []string
	pruned  []string
}

func (a *fakeArchive) Put(_ context.Context, key, _ string) (int64, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.putErr != nil {
		return 0, a.putErr
	}
	a.stored[key] = true
	return 1, nil
}

func (a *fakeArchive) Get(_ context.Context, key, _ string) (int64, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.gets++
	if a.getErr != nil {
		return 0, a.getErr
	}
	if !a.stored[key] {
		return 0, errdefs.New(errdefs.NotFound, "no snapshot")
	}
	return 1, nil
}

func (a *fakeArchive) Has(_ context.Context, key string) (bool, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.stored[key], nil
}

func (a *fakeArchive) Delete(_ context.Context, key string) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(a.stored, key)
	a.deleted = append(a.deleted, key)
	return nil
}

func (a *fakeArchive) Prune(_ context.Context, key string) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.pruned = append(a.pruned, key)
	return nil
}

func (a *fakeArchive) Keys(context.Context) ([]string, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	var keys []string
	for k := range a.stored {
		keys = append(keys, k)
	}
	return keys, nil
}

func newArchiveWorld(t *testing.T, dir string, a *fakeArchive) *world {
	t.Helper()
	return newWorldWith(t, dir, fakeruntime.Config{}, func(c *lifecycle.Config) { c.Archive = a })
}

func lifecycleOp(t *testing.T, w *world, kind, id string) *sandbox.Operation {
	t.Helper()
	var op *sandbox.Operation
	var err error
	switch kind {
	case "suspend":
		op, err = w.eng.Suspend(context.Background(), id, nil)
	case "wake":
		op, err = w.eng.Wake(context.Background(), id, nil)
	case "delete":
		op, err = w.eng.Delete(context.Background(), id, nil)
	}
	if err != nil {
		t.Fatal(err)
	}
	return wait(t, w, op.ID)
}

// FaultInjection: a snapshot the blob store does not take fails the
// suspend (the sandbox stays suspended on the node); a damaged one fails
// the wake (the sandbox stays suspended); a sandbox whose only copy is in
// the blob store survives a restart; delete and the start-up sweep remove
// stored snapshots.
func TestArchive_FaultInjection(t *testing.T) {
	dir := t.TempDir()
	a := &fakeArchive{stored: map[string]bool{"sbx_gone": true}}
	w := newArchiveWorld(t, dir, a)
	// The start-up sweep removes what belongs to no sandbox.
	if !eventually(5*time.Second, func() bool { a.mu.Lock(); defer a.mu.Unlock(); return !a.stored["sbx_gone"] }) {
		t.Fatal("the sweep kept a snapshot of no sandbox")
	}

	sb := create(t, w)
	if op := lifecycleOp(t, w, "suspend", sb.ID); op.State != sandbox.OpSucceeded || !a.stored[sb.ID] {
		t.Fatalf("suspend = %+v, stored %v", op, a.stored[sb.ID])
	}
	if op := lifecycleOp(t, w, "wake", sb.ID); op.State != sandbox.OpSucceeded || a.gets != 1 {
		t.Fatalf("wake without a local copy = %+v after %d fetches", op, a.gets)
	}

	a.putErr = errors.New("bucket unreachable")
	op := lifecycleOp(t, w, "suspend", sb.ID)
	if op.State != sandbox.OpFailed || !strings.Contains(op.Error.Message, "blob store") || state(t, w, sb.ID) != sandbox.Suspended {
		t.Fatalf("suspend the blob store refused = %+v, sandbox %s", op.Error, state(t, w, sb.ID))
	}
	a.putErr = nil
	// The snapshot stored at the first suspend is stale now: it is gone, so
	// a wake without the local copy fails instead of going back in time.
	if a.stored[sb.ID] {
		t.Fatal("a stale snapshot stayed in the blob store after a failed upload")
	}
	op = lifecycleOp(t, w, "wake", sb.ID)
	if op.State != sandbox.OpFailed || state(t, w, sb.ID) != sandbox.Suspended {
		t.Fatalf("wake without any copy = %+v, sandbox %s", op, state(t, w, sb.ID))
	}
	a.stored[sb.ID] = true // (as if the local copy were there)

	a.getErr = errdefs.New(errdefs.FailedPrecondition, "the stored snapshot of %s is damaged", sb.ID)
	for try := 0; try < 2; try++ {
		op = lifecycleOp(t, w, "wake", sb.ID)
		if op.State != sandbox.OpFailed || !strings.Contains(op.Error.Message, "damaged") || state(t, w, sb.ID) != sandbox.Suspended {
			t.Fatalf("wake from a damaged snapshot = %+v, sandbox %s", op.Error, state(t, w, sb.ID))
		}
	}
	a.getErr = nil

	// A restart does not take a suspended sandbox whose snapshot is only in
	// the blob store for lost.
	a.stored[sb.ID] = true
	w.close()
	os.RemoveAll(filepath.Join(dir, "fake")) // the node lost everything of it
	w = newArchiveWorld(t, dir, a)
	if s := state(t, w, sb.ID); s != sandbox.Suspended {
		t.Fatalf("after a restart the sandbox is %s", s)
	}
	if op := lifecycleOp(t, w, "delete", sb.ID); op.State != sandbox.OpSucceeded {
		t.Fatalf("delete = %+v", op)
	}
	// (Removed just after the delete is recorded.)
	if !eventually(5*time.Second, func() bool { a.mu.Lock(); defer a.mu.Unlock(); return !a.stored[sb.ID] }) {
		t.Fatal("delete left the snapshot in the blob store")
	}
}

// NamedSnapshotsFakeArchive: the start-up sweep keeps a named snapshot's
// stored image while the snapshot exists and removes one whose snapshot is
// gone; deleting the snapshot removes its stored image. (The fake runtime
// is not portable, so the image is put in the FAKE archive by hand; the
// upload itself runs end to end in TestCluster, on gVisor and versitygw.)
func TestArchive_NamedSnapshotsFakeArchive(t *testing.T) {
	dir := t.TempDir()
	a := &fakeArchive{stored: map[string]bool{}}
	w := newArchiveWorld(t, dir, a)
	ctx := context.Background()
	src := create(t, w)
	op, snap, err := w.eng.CreateSnapshot(ctx, src.ID, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := wait(t, w, op.ID); got.State != sandbox.OpSucceeded {
		t.Fatalf("snapshot op = %+v", got)
	}
	orphan := ids.New(ids.Snapshot)
	a.mu.Lock()
	if a.stored[snap.ID] {
		t.Fatal("an image of a runtime that restores only on its own node was put in the blob store")
	}
	a.stored[snap.ID], a.stored[orphan] = true, true
	a.mu.Unlock()
	w.close()
	w = newArchiveWorld(t, dir, a) // its start sweeps
	swept := func() bool {
		a.mu.Lock()
		defer a.mu.Unlock()
		return slices.Contains(a.deleted, orphan) && (slices.Contains(a.pruned, snap.ID) || slices.Contains(a.deleted, snap.ID))
	}
	if !eventually(5*time.Second, swept) {
		t.Fatalf("the sweep did not look at both stored images: deleted %v, pruned %v", a.deleted, a.pruned)
	}
	a.mu.Lock()
	kept := a.stored[snap.ID]
	a.mu.Unlock()
	if !kept {
		t.Fatal("the sweep removed the stored image of a snapshot that exists")
	}
	if err := w.eng.DeleteSnapshot(ctx, snap.ID); err != nil {
		t.Fatal(err)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.stored[snap.ID] {
		t.Fatal("deleting the snapshot left its image in the blob store")
	}
}
