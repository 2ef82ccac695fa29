package lifecycle_test

import (
	"context"
	"fmt"
	"testing"
	"testing/synctest"

	"github.com/spacesandbox/space/internal/lifecycle"
	"github.com/spacesandbox/space/internal/runtime/fakeruntime"
)

// Watch names every sandbox and operation the engine writes — a create
// and its end, a pause — each once per batch however often it changed,
// and stops when its context ends.
func TestWatchTellsOfEveryWrite(t *testing.T) { synctest.Test(t, testWatchTellsOfEveryWrite) }

func testWatchTellsOfEveryWrite(t *testing.T) {
	w := newWorld(t, t.TempDir(), fakeruntime.Config{})
	ctx, stop := context.WithCancel(context.Background())
	changes := w.eng.Watch(ctx)
	sb := create(t, w)
	synctest.Wait()
	seen := map[lifecycle.Change]int{}
	named := false
	taken, lost := changes.Take()
	if lost {
		t.Fatal("changes lost")
	}
	for _, c := range taken {
		seen[c]++
		named = named || c.Sandbox == sb.ID
	}
	if !named {
		t.Fatalf("create: the sandbox is not named in %+v", seen)
	}
	for c, n := range seen {
		if n != 1 {
			t.Fatalf("change %+v taken %d times in one batch", c, n)
		}
		if c.Sandbox != "" && c.Sandbox != sb.ID {
			t.Fatalf("change of another sandbox: %+v", c)
		}
	}
	op, err := w.eng.Pause(context.Background(), sb.ID, nil)
	if err != nil {
		t.Fatal(err)
	}
	wait(t, w, op.ID)
	synctest.Wait()
	select {
	case <-changes.C():
	default:
		t.Fatal("no signal after a pause")
	}
	var sawOp, sawSandbox bool
	taken, _ = changes.Take()
	for _, c := range taken {
		sawOp = sawOp || c.Operation == op.ID
		sawSandbox = sawSandbox || c.Sandbox == sb.ID
	}
	if !sawOp || !sawSandbox {
		t.Fatalf("pause: operation seen %v, sandbox seen %v", sawOp, sawSandbox)
	}
	if taken, _ := changes.Take(); len(taken) != 0 {
		t.Fatal("Take did not forget what it returned")
	}
	stop()
	synctest.Wait()
	op, err = w.eng.Wake(context.Background(), sb.ID, nil)
	if err != nil {
		t.Fatal(err)
	}
	wait(t, w, op.ID)
	synctest.Wait()
	if got, _ := changes.Take(); len(got) != 0 {
		t.Fatalf("changes after the watch ended: %+v", got)
	}
}

// A watcher that does not read keeps at most MaxPendingChanges, and then
// learns that it lost some.
func TestWatcherThatDoesNotReadIsBounded(t *testing.T) {
	var h lifecycle.Hub
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	w := h.Watch(ctx)
	for i := range lifecycle.MaxPendingChanges + 5 {
		h.Publish(lifecycle.Change{Operation: fmt.Sprint("op", i)})
	}
	got, lost := w.Take()
	if !lost || len(got) > lifecycle.MaxPendingChanges {
		t.Fatalf("took %d, lost %v", len(got), lost)
	}
	h.Publish(lifecycle.Change{Operation: "again"})
	if got, lost := w.Take(); lost || len(got) != 1 {
		t.Fatalf("after: took %d, lost %v", len(got), lost)
	}
}
