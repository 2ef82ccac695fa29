package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spacesandbox/space/internal/errdefs"
	"github.com/spacesandbox/space/internal/ids"
	"github.com/spacesandbox/space/internal/runtime"
	"github.com/spacesandbox/space/internal/sandbox"
	"github.com/spacesandbox/space/internal/store"
)

// Start reconciles recorded state with the runtimes and resumes every
// operation a previous process left in flight. Sandboxes at rest are
// re-adopted by their runtime; one the runtime no longer has becomes failed
// with a reason. Start returns once every sandbox at rest was checked; the
// resumed operations run in the background.
func (e *Engine) Start(ctx context.Context) error {
	runs := len(e.runtimes) > 0 // (a control replica runs no sandbox)
	var ops []sandbox.Operation
	if runs {
		for _, st := range []sandbox.State{sandbox.Running, sandbox.Paused, sandbox.Suspended} {
			if err := store.EachSandboxOn(ctx, e.store, &e.cfg.Node, st, func(sb *sandbox.Sandbox) { e.readopt(ctx, sb) }); err != nil {
				return fmt.Errorf("list %s sandboxes: %w", st, err)
			}
		}
		if e.cfg.Cluster != nil {
			e.releaseLost(ctx)
		}
		e.pruneNetworks(ctx)
		var err error
		if ops, err = e.store.UnfinishedOperations(ctx, e.cfg.Node); err != nil {
			return fmt.Errorf("list unfinished operations: %w", err)
		}
		e.sweepSnapshotRoot(ctx)
	}
	e.mu.Lock()
	e.started = true
	e.mu.Unlock()
	if runs {
		e.loops.Add(2)
		go e.runIdle(e.cfg.IdleInterval)
		go e.runPools()
		if e.cfg.Cluster != nil {
			e.loops.Add(1)
			go e.runInbox(e.cfg.InboxInterval)
		}
	}
	if e.cfg.Cluster == nil || !runs {
		// (Once per cluster would do; every control replica doing it is
		// harmless.)
		e.loops.Add(1)
		go func() {
			defer e.loops.Done()
			e.sweepArchive(e.life)
		}()
	}
	for _, op := range ops {
		if op.Kind == sandbox.OpBuild {
			e.failInterruptedBuild(ctx, op)
			continue
		}
		e.log.Info("resuming operation left in flight", "operation_id", op.ID, "sandbox_id", op.SandboxID, "kind", op.Kind, "state", op.State)
		e.mu.Lock()
		e.resumed[op.ID] = true
		e.mu.Unlock()
		e.submit(op)
	}
	return nil
}

// wasResumed reports whether op was resumed at this process's Start.
func (e *Engine) wasResumed(opID string) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.resumed[opID]
}

// doubt notes that sandbox id's process may have ended while an operation
// had it: x is its reported exit, or nil where only its agent went away.
// takeDoubt reports and forgets it (ok: doubted).
func (e *Engine) doubt(id string, x *runtime.Exit) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if x != nil || e.doubted[id] == nil {
		e.doubted[id] = x
	}
}

func (e *Engine) takeDoubt(id string) (x *runtime.Exit, ok bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	x, ok = e.doubted[id]
	delete(e.doubted, id)
	return x, ok
}

// endedDuring is an operation's error when the sandbox it was to leave
// running ended under it, with the exit the runtime reported, if any.
type endedDuring struct{ exit *runtime.Exit }

func (endedDuring) Error() string { return "the sandbox's process ended during the operation" }

// exitOf is the exit reported for a sandbox whose process ended under the
// operation that ended with cause, or nil.
func exitOf(cause error) *runtime.Exit {
	var ended endedDuring
	if errors.As(cause, &ended) && ended.exit != nil && ended.exit.Reason != "" {
		return ended.exit
	}
	return nil
}

// lookAgain asks the runtime about a sandbox an operation is about to
// record running or paused (to), when the operation was resumed at this
// start or the sandbox was doubted during it; one the host no longer has is
// an error, so that the operation fails and the sandbox is failed with the
// reason instead of shown running. A resumed operation's sandbox was
// skipped by Start, and a step that finds its work done (a save complete
// before the crash) may not look at it at all; a doubted one's process
// ended, or its agent went away, before the outcome. A sandbox meant to run
// on is watched by its runtime from here on.
func (e *Engine) lookAgain(ctx context.Context, rt runtime.Runtime, op sandbox.Operation, spec runtime.Spec, to sandbox.State) error {
	exit, doubted := e.takeDoubt(spec.SandboxID)
	resumed := e.wasResumed(op.ID)
	if (!resumed && !doubted) || (to != sandbox.Running && to != sandbox.Paused) {
		return nil
	}
	status, err := rt.Recover(ctx, spec)
	if err != nil || status != runtime.StatusAbsent {
		return nil
	}
	if resumed {
		return fmt.Errorf("%s after a restart: the runtime has nothing of %s on the host: %w", op.Kind, spec.SandboxID, runtime.ErrNotFound)
	}
	return fmt.Errorf("%s of %s: %w", op.Kind, spec.SandboxID, endedDuring{exit})
}

// readopt asks the sandbox's runtime to re-adopt it and repairs the record
// when the host disagrees.
func (e *Engine) readopt(ctx context.Context, sb *sandbox.Sandbox) {
	if sb.ActiveOperation != "" {
		return // its operation is resumed separately
	}
	log := e.log.With("sandbox_id", sb.ID)
	rt, ok := e.runtimes[sb.Runtime]
	if !ok {
		log.Warn("sandbox's runtime is not available on this server; leaving it as recorded", "runtime", sb.Runtime)
		return
	}
	rctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	spec := e.spec(sb)
	// Its network and policy, re-made where a host reboot took them.
	if err := e.attach(rctx, rt, sb, &spec, false); err != nil {
		log.Error("re-attach sandbox network", "err", err)
	}
	status, err := rt.Recover(rctx, spec)
	if err != nil {
		log.Error("re-adopt sandbox", "err", err)
		return
	}
	want := runtime.StatusOf(sb.State)
	if status == want {
		return
	}
	if status == runtime.StatusAbsent && e.archived(sb) && !hasFiles(spec.SnapshotDir) {
		return // its snapshot is in the blob store: a wake fetches it
	}
	to, info := runtime.StateOf(status), (*sandbox.ErrorInfo)(nil)
	if status == runtime.StatusAbsent {
		to = sandbox.Failed
		info = &sandbox.ErrorInfo{Code: errdefs.Internal.Code, Message: fmt.Sprintf("sandbox was %s but the runtime found nothing on the host after a restart", sb.State)}
	}
	log.Warn("sandbox state repaired after restart", "recorded", sb.State, "observed", status, "now", to)
	_, err = e.store.UpdateSandbox(ctx, sb.ID, func(cur *sandbox.Sandbox) error {
		if cur.State != sb.State || cur.ActiveOperation != "" {
			return errdefs.New(errdefs.Conflict, "sandbox changed while being reconciled")
		}
		cur.State, cur.Error, cur.UpdatedAt = to, info, e.now()
		return nil
	})
	if err != nil {
		log.Error("repair sandbox record", "err", err)
	}
}

// sweepSnapshotRoot removes what a crash left in the snapshot directory
// after the record that owned it ended: the save of a fork that finished,
// the image of a deleted snapshot or sandbox, an unfinished save (".tmp")
// whose operation is over. It runs before any operation resumes; anything
// it cannot account for (an unknown name, a store error) is left alone.
func (e *Engine) sweepSnapshotRoot(ctx context.Context) {
	entries, err := os.ReadDir(e.cfg.SnapshotRoot)
	if err != nil {
		return
	}
	for _, ent := range entries {
		id, suffix, _ := strings.Cut(ent.Name(), ".")
		partial := suffix != ""
		var stale bool
		var err error
		switch {
		case ids.Valid(ids.Operation, id):
			var op *sandbox.Operation
			op, err = e.store.GetOperation(ctx, id)
			stale = err == nil && op.State.Terminal()
		case ids.Valid(ids.Snapshot, id):
			var snap *sandbox.Snapshot
			snap, err = e.store.GetSnapshot(ctx, id)
			stale = err == nil && (snap.State == sandbox.SnapshotFailed || (partial && snap.State != sandbox.SnapshotCreating))
		case ids.Valid(ids.Sandbox, id):
			var sb *sandbox.Sandbox
			sb, err = e.store.GetSandbox(ctx, id)
			stale = err == nil && (sb.State == sandbox.Deleted || (partial && sb.ActiveOperation == ""))
		default:
			continue
		}
		if errors.Is(err, errdefs.NotFound) {
			stale, err = true, nil
		}
		if err != nil || !stale {
			continue
		}
		path := filepath.Join(e.cfg.SnapshotRoot, ent.Name())
		if err := os.RemoveAll(path); err != nil {
			e.log.Warn("remove a save left by a crash", "path", path, "err", err)
			continue
		}
		e.log.Info("removed a save left by a crash", "path", path)
	}
}
