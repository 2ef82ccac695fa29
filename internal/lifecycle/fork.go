package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/spacesandbox/space/internal/errdefs"
	"github.com/spacesandbox/space/internal/ids"
	"github.com/spacesandbox/space/internal/runtime"
	"github.com/spacesandbox/space/internal/sandbox"
	"github.com/spacesandbox/space/internal/store"
)

// ForkRender makes the idempotent response of a fork from its records as
// they will be committed (nil: no idempotency key).
type ForkRender func(op *sandbox.Operation, forks []*sandbox.Sandbox) *store.Completion

// Fork records count new sandboxes, copies of sandbox id, and the fork
// operation that makes them. The copies start "starting"; the operation
// saves the source once (it goes on where it was, held still only for the
// save: Snapshotter) and starts every copy from that save. All copies start or none
// does. A running or paused source can be forked; a suspended one is
// refused (wake it first).
func (e *Engine) Fork(ctx context.Context, id string, count int, render ForkRender) (*sandbox.Operation, []*sandbox.Sandbox, error) {
	if count < 1 || count > sandbox.MaxForks {
		return nil, nil, errdefs.New(errdefs.InvalidArgument, "count must be between 1 and %d", sandbox.MaxForks).WithDetails(map[string]any{"field": "count"})
	}
	if err := e.Ready(); err != nil {
		return nil, nil, errdefs.Wrap(errdefs.Unavailable, err, "the server cannot create sandboxes now: %v", err)
	}
	src, err := e.copySource(ctx, id, "fork")
	if err != nil {
		return nil, nil, err
	}
	now := e.now()
	op := &sandbox.Operation{ID: ids.New(ids.Operation), Kind: sandbox.OpFork, SandboxID: id, State: sandbox.OpPending, CreatedAt: now, UpdatedAt: now}
	forks := make([]*sandbox.Sandbox, count)
	for i := range forks {
		f := &sandbox.Sandbox{
			ID: ids.New(ids.Sandbox), State: sandbox.Starting, Template: src.Template, Runtime: src.Runtime,
			Resources: src.Resources, Env: maps.Clone(src.Env), Metadata: maps.Clone(src.Metadata), AutoLifecycle: src.AutoLifecycle,
			ForkOf: id, CreatedAt: now, UpdatedAt: now, LastActiveAt: now, ActiveOperation: op.ID, Node: src.Node, Project: src.Project,
		}
		if f.Network = src.Network.Clone(); f.Network != nil {
			f.Network.IngressToken = ""
		}
		forks[i] = f
		op.Sandboxes = append(op.Sandboxes, f.ID)
	}
	// The copies start on the source's node, from its save.
	_, maxActive, err := e.place(ctx, Need{Runtime: src.Runtime, Prefer: src.Node})
	if err != nil {
		return nil, nil, err
	}
	_, err = e.store.BeginFork(ctx, op, forks, maxActive, func(sb *sandbox.Sandbox, o *sandbox.Operation) (*store.Completion, error) {
		if err := holdSource(sb, o); err != nil {
			return nil, err
		}
		if render == nil {
			return nil, nil
		}
		return render(o, forks), nil
	})
	if err != nil {
		return nil, nil, err
	}
	e.log.Info("sandbox fork accepted", "sandbox_id", id, "operation_id", op.ID, "count", count)
	e.dispatch(*op, src.Node)
	return op, forks, nil
}

// copySource loads the sandbox a fork or snapshot copies (verb names the
// copy in errors): a pool sandbox is not found; a runtime that cannot save a
// live sandbox is refused up front.
func (e *Engine) copySource(ctx context.Context, id, verb string) (*sandbox.Sandbox, error) {
	src, err := e.store.GetSandbox(ctx, id)
	if err != nil {
		return nil, err
	}
	if src.Pool != "" {
		return nil, errdefs.New(errdefs.NotFound, "sandbox %s not found", id)
	}
	if rt, ok := e.runtimes[src.Runtime]; ok {
		if _, ok := rt.(runtime.Snapshotter); !ok {
			return nil, errdefs.New(errdefs.FailedPrecondition, "the %s runtime cannot %s sandboxes on this server", src.Runtime, verb).
				WithDetails(map[string]any{"runtime": src.Runtime})
		}
	}
	return src, nil
}

// executeFork saves the source into a directory of the operation's own and
// starts every copy from it. Each step may run again after a crash: a
// complete save is kept, a copy already running is kept.
func (e *Engine) executeFork(ctx context.Context, log interface {
	Error(string, ...any)
	Warn(string, ...any)
}, op sandbox.Operation, srcSb *sandbox.Sandbox, rt runtime.Runtime, start time.Time) {
	bk := context.WithoutCancel(e.life)
	dir := filepath.Join(e.cfg.SnapshotRoot, op.ID)
	defer func() {
		if e.life.Err() == nil {
			os.RemoveAll(dir)
		}
	}()
	failAll := func(cause error) {
		if e.life.Err() != nil {
			return // shutting down: the next start resumes the fork
		}
		opErr := operationError(op, cause)
		var others []store.Outcome
		for _, id := range op.Sandboxes {
			spec := e.forkSpec(bk, id)
			if err := rt.Delete(bk, spec); err != nil {
				log.Error("clean up failed fork", "fork_id", id, "err", err)
			}
			e.detach(bk, id)
			os.RemoveAll(spec.SnapshotDir)
			others = append(others, store.Outcome{SandboxID: id, State: sandbox.Failed, Error: opErr})
		}
		var srcErr *sandbox.ErrorInfo
		op.From, srcErr = e.sourceAfterFailure(bk, rt, srcSb, op)
		e.finishFork(log, op, start, sandbox.OpFailed, opErr, srcErr, others)
	}
	snap, ok := rt.(runtime.Snapshotter)
	if !ok {
		failAll(errdefs.New(errdefs.FailedPrecondition, "the %s runtime cannot copy live sandboxes", rt.Name()))
		return
	}
	// The copies start as soon as the save is complete, while the runtime
	// brings the source back (gVisor restores it in place: as long as a
	// copy's start).
	t0 := time.Now()
	var saved time.Duration
	// Both channels are closed, never sent on: each may be waited on twice
	// (a runtime that adopts a save already complete — a fork resumed after
	// a restart — returns without calling Saved).
	savedCh, sourceDone := make(chan struct{}), make(chan struct{})
	var once sync.Once
	markSaved := func() { once.Do(func() { saved = time.Since(t0); close(savedCh) }) }
	var sourceErr error // written before sourceDone is closed
	go func() {
		defer close(sourceDone)
		sourceErr = e.saveSource(ctx, rt, srcSb, op.ID, dir, markSaved)
	}()
	// saveDone waits for the save: false when it failed (the copies are
	// then not started).
	saveDone := func() bool {
		select {
		case <-savedCh:
			return true
		case <-sourceDone:
			// sourceErr may be read only here and after the last wait:
			// while the save goes on it is being written.
			if sourceErr != nil {
				return false
			}
			markSaved()
			return true
		}
	}
	// Each copy is attached to its network and, where the runtime can,
	// prepared (its host side started) while the source is being saved;
	// it starts from the save once that is complete.
	prep, _ := rt.(runtime.CopyPreparer)
	source := e.spec(srcSb)
	var wg sync.WaitGroup
	errs := make([]error, len(op.Sandboxes))
	for i, id := range op.Sandboxes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			fsb, err := e.store.GetSandbox(bk, id)
			if err != nil {
				errs[i] = err
				return
			}
			spec := e.spec(fsb)
			spec.TakeImage = len(op.Sandboxes) == 1
			if err := e.attach(ctx, rt, fsb, &spec, true); err != nil {
				errs[i] = err
				return
			}
			if prep != nil {
				if err := prep.PrepareCopy(ctx, spec, source); err != nil {
					errs[i] = fmt.Errorf("prepare fork %s: %w", id, err)
					return
				}
			}
			if !saveDone() {
				return
			}
			if err := snap.CreateFrom(ctx, spec, dir); err != nil {
				errs[i] = fmt.Errorf("start fork %s: %w", id, err)
				return
			}
			e.identify(ctx, rt, spec, copied)
			// A copy that died as it started (doubted) fails the fork.
			errs[i] = e.lookAgain(ctx, rt, op, spec, sandbox.Running)
		}()
	}
	if !saveDone() {
		wg.Wait()
		log.Error("fork: save the source", "err", sourceErr)
		failAll(sourceErr)
		return
	}
	wg.Wait()
	<-sourceDone
	if sourceErr != nil {
		sourceErr = fmt.Errorf("bring the source back after saving it: %w", sourceErr)
	}
	if e.life.Err() != nil {
		return // resumed at the next start
	}
	if err := errors.Join(append(errs, sourceErr)...); err != nil {
		log.Error("fork: start the copies", "err", err)
		failAll(err)
		return
	}
	var others []store.Outcome
	for _, id := range op.Sandboxes {
		others = append(others, store.Outcome{SandboxID: id, State: sandbox.Running})
	}
	// The copies run whatever became of their source since the save.
	var srcErr *sandbox.ErrorInfo
	if err := e.lookAgain(ctx, rt, op, source, op.From); err != nil {
		log.Error("fork: its source is gone", "err", err)
		op.From, srcErr = sandbox.Failed, lostDuring(op.Kind)
	}
	e.log.Info("sandbox forked", "sandbox_id", op.SandboxID, "operation_id", op.ID, "count", len(op.Sandboxes), "save", saved, "total", time.Since(start))
	e.finishFork(log, op, start, sandbox.OpSucceeded, nil, srcErr, others)
}

// forkSpec is the runtime spec of a fork by id (its record when readable).
func (e *Engine) forkSpec(ctx context.Context, id string) runtime.Spec {
	if sb, err := e.store.GetSandbox(ctx, id); err == nil {
		return e.spec(sb)
	}
	return runtime.Spec{SandboxID: id, SnapshotDir: e.snapshotDir(id)}
}

// saveSource saves a fork's or snapshot's source into dir through the
// runtime's Snapshotter and gives a running source its clock and fresh
// entropy again (a VM's clock stood still during the save, and the copies
// start from its RNG's state); its hostname and address are its own still,
// also where the runtime saved it by restoring it in place (gVisor: in its
// own namespace). A save with saved set is a fork's: its copies start from
// it at once and it is removed after, so it need not be durable
// (Ephemeral).
//
// An operation resumed at this start (opID) may find its source gone with
// the server that began it: the runtime is asked first, and the agent of a
// source it no longer has is not called (each call would wait out its
// timeout for an agent that never dials in). The save is still asked for:
// one complete before the crash is adopted, and the copies start from it.
func (e *Engine) saveSource(ctx context.Context, rt runtime.Runtime, src *sandbox.Sandbox, opID, dir string, saved func()) error {
	snap, ok := rt.(runtime.Snapshotter)
	if !ok {
		return errdefs.New(errdefs.FailedPrecondition, "the %s runtime cannot copy live sandboxes", rt.Name())
	}
	spec := e.spec(src)
	spec.Renetwork = e.renetwork(rt, src)
	spec.Saved = saved
	spec.Ephemeral = saved != nil
	running := src.State == sandbox.Running
	if running && e.wasResumed(opID) {
		if st, err := rt.Recover(ctx, spec); err == nil && st == runtime.StatusAbsent {
			running = false
		}
	}
	if err := os.MkdirAll(e.cfg.SnapshotRoot, 0o700); err != nil {
		return fmt.Errorf("make snapshot directory: %w", err)
	}
	if err := snap.Snapshot(ctx, spec, dir); err != nil {
		return err
	}
	if running {
		e.identify(ctx, rt, spec, woken)
	}
	return nil
}

// sourceAfterFailure is the state a source ends in after a failed fork or
// snapshot (op): as it was (op.From), unless the runtime lost it meanwhile
// (failed, with the reason) or kept it only as its save (suspended: it
// wakes from there).
func (e *Engine) sourceAfterFailure(ctx context.Context, rt runtime.Runtime, src *sandbox.Sandbox, op sandbox.Operation) (sandbox.State, *sandbox.ErrorInfo) {
	st, err := rt.Recover(ctx, e.spec(src))
	switch {
	case err != nil:
		return op.From, nil
	case st == runtime.StatusAbsent:
		return sandbox.Failed, lostDuring(op.Kind)
	case st == runtime.StatusSuspended:
		return sandbox.Suspended, nil
	}
	return op.From, nil
}

// finishFork records a fork's outcome: the source as op.From says (with
// srcErr if it failed), each copy in its state.
func (e *Engine) finishFork(log interface{ Error(string, ...any) }, op sandbox.Operation, start time.Time, state sandbox.OpState, opErr, srcErr *sandbox.ErrorInfo, others []store.Outcome) {
	e.finishWith(log, op, start, store.Finish{OperationID: op.ID, State: state, Error: opErr, SandboxState: op.From, SandboxError: srcErr, Others: others})
}

// finishWith records an operation's outcome f (its time is now).
func (e *Engine) finishWith(log interface{ Error(string, ...any) }, op sandbox.Operation, start time.Time, f store.Finish) {
	f.At = e.now()
	if err := e.store.FinishOperation(context.WithoutCancel(e.life), f); err != nil {
		log.Error("record operation outcome", "err", err)
		return
	}
	op.State = f.State
	if op.SandboxID != "" {
		e.takeDoubt(op.SandboxID) // looked at, or failed: a later operation starts afresh
	}
	e.notifyFinished()
	e.observe(op, time.Since(start))
	if op.SandboxID == "" {
		e.log.Info("operation finished", "operation_id", op.ID, "kind", op.Kind, "template", op.Template, "state", f.State, "duration", time.Since(start))
		return
	}
	e.log.Info("operation finished", "operation_id", op.ID, "sandbox_id", op.SandboxID, "kind", op.Kind,
		"state", f.State, "sandbox_state", f.SandboxState, "duration", time.Since(start))
}
