package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/spacesandbox/space/internal/agentclient"
	"github.com/spacesandbox/space/internal/errdefs"
	"github.com/spacesandbox/space/internal/runtime"
	"github.com/spacesandbox/space/internal/sandbox"
	"github.com/spacesandbox/space/internal/store"
)

// quickOp is how long an operation runs before it is recorded running.
const quickOp = 50 * time.Millisecond

// submit runs op in the background unless this process already runs it.
func (e *Engine) submit(op sandbox.Operation) {
	e.mu.Lock()
	if e.running[op.ID] || e.life.Err() != nil {
		e.mu.Unlock()
		return
	}
	e.running[op.ID] = true
	e.wg.Add(1)
	e.mu.Unlock()
	go func() {
		defer e.wg.Done()
		defer func() {
			e.mu.Lock()
			delete(e.running, op.ID)
			delete(e.resumed, op.ID)
			e.mu.Unlock()
		}()
		if e.turns != nil {
			select {
			case e.turns <- struct{}{}:
				defer func() { <-e.turns }()
			case <-e.life.Done():
				return // resumed at the next start
			}
		}
		e.execute(op)
	}()
}

// execute drives one operation to a terminal state. When the engine is
// closing, it leaves the operation as recorded so the next Start resumes it.
func (e *Engine) execute(op sandbox.Operation) {
	log := e.log.With("operation_id", op.ID, "sandbox_id", op.SandboxID, "kind", op.Kind)
	start := time.Now()
	ctx, cancel := context.WithTimeout(e.life, e.cfg.OperationTimeout)
	defer cancel()
	// Bookkeeping writes must land even while the operation's own context
	// is cancelled by a timeout; only engine shutdown stops them.
	bk := context.WithoutCancel(e.life)

	if e.cfg.Cluster != nil {
		// Handed over by a control replica and found by the inbox too: the
		// second turn finds it done.
		if cur, err := e.store.GetOperation(bk, op.ID); err == nil && cur.State.Terminal() {
			return
		}
	}
	sb, err := e.store.GetSandbox(bk, op.SandboxID)
	if err != nil {
		log.Error("load sandbox for operation", "err", err)
		return
	}
	if e.cfg.Cluster != nil && !e.runsHere(sb.Node) {
		log.Info("operation's sandbox is on another node; leaving it to that node", "node", sb.Node)
		return
	}
	rt, ok := e.runtimes[sb.Runtime]
	if !ok {
		gone := &sandbox.ErrorInfo{Code: errdefs.Unavailable.Code, Message: fmt.Sprintf("runtime %q is not available on this server", sb.Runtime)}
		if op.Kind == sandbox.OpSnapshot {
			e.finishWith(log, op, start, store.Finish{OperationID: op.ID, State: sandbox.OpFailed, Error: gone, SandboxState: op.From,
				Snapshot: &store.SnapshotOutcome{SnapshotID: op.Snapshot, State: sandbox.SnapshotFailed, Error: gone}})
			return
		}
		if op.Kind == sandbox.OpFork {
			var others []store.Outcome
			for _, id := range op.Sandboxes {
				others = append(others, store.Outcome{SandboxID: id, State: sandbox.Failed, Error: gone})
			}
			e.finishFork(log, op, start, sandbox.OpFailed, gone, nil, others)
			return
		}
		e.finish(log, op, start, sandbox.OpFailed, gone, op.From, nil)
		return
	}
	// The operation is recorded running once it has taken longer than
	// quickOp, beside the runtime's work and waited for before the
	// outcome: a create or a wake does not wait for that transaction
	// before it starts, and a quick one (a pause, a resume, a delete)
	// costs one transaction — its outcome's — instead of two. Nothing
	// reads the difference but a client listing operations: a crash
	// resumes a pending and a running operation alike. A fork or a
	// snapshot, which record their outcome in their own way, are marked
	// first.
	var marked chan error
	var acted chan struct{}
	// settled ends the wait to mark and reports whether the operation may
	// record its outcome.
	settled := func() bool {
		if marked == nil {
			return true
		}
		close(acted)
		err := <-marked
		marked = nil
		if err != nil {
			log.Error("mark operation running", "err", err)
			return false
		}
		return true
	}
	if op.State == sandbox.OpPending {
		mark := func() error { return e.store.UpdateOperationState(bk, op.ID, sandbox.OpRunning, e.now()) }
		if op.Kind != sandbox.OpFork && op.Kind != sandbox.OpSnapshot {
			marked, acted = make(chan error, 1), make(chan struct{})
			go func() {
				select {
				case <-acted:
					marked <- nil
				case <-time.After(quickOp):
					marked <- mark()
				}
			}()
		} else if err := mark(); err != nil {
			log.Error("mark operation running", "err", err)
			return
		}
	}
	switch op.Kind {
	case sandbox.OpFork:
		e.executeFork(ctx, log, op, sb, rt, start)
		return
	case sandbox.OpSnapshot:
		e.executeSnapshot(ctx, log, op, sb, rt, start)
		return
	}
	spec := e.spec(sb)
	if op.Kind == sandbox.OpWake && op.From == sandbox.Suspended {
		err := e.fetchSnapshot(ctx, sb.ID, spec.SnapshotDir)
		if err == nil {
			err = e.fetchTemplate(ctx, sb.Template.Digest)
		}
		if err != nil {
			if e.life.Err() != nil {
				log.Info("operation interrupted by shutdown; it resumes at next start")
				return
			}
			// Nothing changed on the host: the sandbox stays suspended,
			// and a later wake tries again.
			log.Error("operation failed", "err", err)
			if !settled() {
				return
			}
			e.finish(log, op, start, sandbox.OpFailed, operationError(op, err), sandbox.Suspended, nil)
			return
		}
	}
	if op.Kind == sandbox.OpCreate {
		err = e.fetchTemplate(ctx, sb.Template.Digest)
	}
	if err == nil && (op.Kind == sandbox.OpCreate || (op.Kind == sandbox.OpWake && op.From == sandbox.Suspended)) {
		err = e.attach(ctx, rt, sb, &spec, true)
	}
	if err == nil {
		if op.Kind == sandbox.OpCreate && sb.Snapshot != "" {
			err = e.createFromSnapshot(ctx, rt, spec, sb.Snapshot)
		} else {
			err = e.act(ctx, rt, op, spec)
		}
	}
	if !settled() {
		return
	}
	if e.life.Err() != nil {
		log.Info("operation interrupted by shutdown; it resumes at next start")
		return
	}
	if err == nil {
		err = e.lookAgain(ctx, rt, op, spec, op.Kind.Target())
	}
	if err == nil {
		e.finish(log, op, start, sandbox.OpSucceeded, nil, op.Kind.Target(), nil)
		if op.Kind == sandbox.OpDelete {
			// Nothing of the sandbox runs any more: what is left of it
			// on the host — its network (links, namespace, firewall
			// chains: 20–40 ms, most of it kernel grace periods), its
			// snapshot files and stored snapshot — goes once its delete
			// is recorded, not while its client waits. A crash in
			// between leaves them to the next start's sweeps
			// (pruneNetworks, sweepSnapshotRoot, sweepArchive).
			e.detach(bk, sb.ID)
			if rmErr := os.RemoveAll(spec.SnapshotDir); rmErr != nil {
				log.Warn("remove snapshot directory", "err", rmErr)
			}
			e.forgetSnapshot(bk, sb.ID)
		}
		return
	}
	log.Error("operation failed", "err", err)
	e.fail(ctx, log, rt, op, spec, start, err)
}

// act performs op's step on the runtime. Runtime steps are idempotent, so
// re-running a step interrupted by a crash is safe.
func (e *Engine) act(ctx context.Context, rt runtime.Runtime, op sandbox.Operation, spec runtime.Spec) error {
	switch op.Kind {
	case sandbox.OpCreate:
		if err := rt.Create(ctx, spec); err != nil {
			return err
		}
		e.identify(ctx, rt, spec, booted)
		return nil
	case sandbox.OpPause:
		return rt.Pause(ctx, spec)
	case sandbox.OpSuspend:
		if err := os.MkdirAll(spec.SnapshotDir, 0o700); err != nil {
			return fmt.Errorf("make snapshot directory: %w", err)
		}
		if err := rt.Suspend(ctx, spec); err != nil {
			return err
		}
		return e.archiveSnapshot(ctx, spec.SandboxID, spec.SnapshotDir)
	case sandbox.OpWake:
		var err error
		if op.From == sandbox.Suspended {
			err = rt.Restore(ctx, spec)
		} else {
			err = rt.Resume(ctx, spec)
		}
		// A restored sandbox gets the time and fresh entropy; a resumed
		// one only needs its clock set, unless it reads the host's.
		if err == nil && (op.From == sandbox.Suspended || !rt.Capabilities().HostClock) {
			e.identify(ctx, rt, spec, woken)
		}
		return err
	case sandbox.OpDelete:
		return rt.Delete(ctx, spec)
	}
	return fmt.Errorf("unknown operation kind %q", op.Kind)
}

// fail records a failed step. The sandbox lands in the state the runtime
// actually observes: a failed pause of a running sandbox leaves it running;
// a sandbox the runtime has lost is failed.
func (e *Engine) fail(ctx context.Context, log interface {
	Error(string, ...any)
	Warn(string, ...any)
}, rt runtime.Runtime, op sandbox.Operation, spec runtime.Spec, start time.Time, cause error) {
	opErr := operationError(op, cause)
	// failed is the error of the sandbox the operation leaves failed: the
	// reported exit's where its process ended under the operation (counted
	// as a sandbox failed on its own), else fallback.
	failed := func(fallback *sandbox.ErrorInfo) *sandbox.ErrorInfo {
		x := exitOf(cause)
		if x == nil {
			return fallback
		}
		e.sandboxFailed(rt.Name(), x.Reason)
		return &sandbox.ErrorInfo{Code: x.Reason, Message: x.Message}
	}
	// Observe under a fresh bounded context: the operation's may have expired.
	octx, cancel := context.WithTimeout(context.WithoutCancel(e.life), time.Minute)
	defer cancel()
	if op.Kind == sandbox.OpCreate {
		// Leave nothing behind on the host for a sandbox that never started.
		if err := rt.Delete(octx, spec); err != nil {
			log.Error("clean up failed create", "err", err)
		}
		e.detach(octx, spec.SandboxID)
		os.RemoveAll(spec.SnapshotDir)
		e.finish(log, op, start, sandbox.OpFailed, opErr, sandbox.Failed, failed(opErr))
		return
	}
	status, err := rt.Recover(octx, spec)
	if err != nil {
		log.Error("observe sandbox after failed operation", "err", err)
		e.finish(log, op, start, sandbox.OpFailed, opErr, sandbox.Failed, opErr)
		return
	}
	switch {
	case status == runtime.StatusAbsent && op.Kind == sandbox.OpDelete:
		// Gone, but what the runtime keeps of it on the host may not be
		// (its delete was cut short): once more, on nothing to stop.
		if err := rt.Delete(octx, spec); err != nil {
			log.Error("clean up after a failed delete", "err", err)
		}
		e.detach(octx, spec.SandboxID)
		os.RemoveAll(spec.SnapshotDir)
		e.forgetSnapshot(octx, spec.SandboxID)
		e.finish(log, op, start, sandbox.OpSucceeded, nil, sandbox.Deleted, nil)
	case status == runtime.StatusAbsent:
		e.finish(log, op, start, sandbox.OpFailed, opErr, sandbox.Failed, failed(lostDuring(op.Kind)))
	default:
		e.finish(log, op, start, sandbox.OpFailed, opErr, runtime.StateOf(status), nil)
	}
}

// lostDuring is the error of a sandbox the runtime no longer had after a
// failed operation of kind.
func lostDuring(kind sandbox.OpKind) *sandbox.ErrorInfo {
	return &sandbox.ErrorInfo{Code: errdefs.Internal.Code, Message: "the runtime lost the sandbox during " + string(kind)}
}

// operationError is the client-visible error of a failed operation. Host
// details stay in the server log.
func operationError(op sandbox.Operation, cause error) *sandbox.ErrorInfo {
	var kerr *errdefs.Error
	switch {
	case errors.As(cause, &kerr):
		return &sandbox.ErrorInfo{Code: kerr.Kind.Code, Message: kerr.Message}
	case errors.Is(cause, context.DeadlineExceeded):
		return &sandbox.ErrorInfo{Code: errdefs.Unavailable.Code, Message: fmt.Sprintf("%s did not finish in time", op.Kind)}
	case errors.As(cause, new(endedDuring)):
		return &sandbox.ErrorInfo{Code: errdefs.Internal.Code, Message: fmt.Sprintf("%s failed: the sandbox's process ended before the %s was complete; the server log has the details for operation %s", op.Kind, op.Kind, op.ID)}
	case errors.Is(cause, agentclient.ErrHostEnded):
		// The sandbox's own process died as it started (out of memory,
		// killed on the host): not a fault a retry of the same step mends.
		return &sandbox.ErrorInfo{Code: errdefs.Internal.Code, Message: fmt.Sprintf("%s failed: the sandbox's process ended before its agent answered; the server log has the details for operation %s", op.Kind, op.ID)}
	}
	return &sandbox.ErrorInfo{Code: errdefs.Internal.Code, Message: fmt.Sprintf("%s failed in the runtime; the server log has the details for operation %s", op.Kind, op.ID)}
}

func (e *Engine) finish(log interface{ Error(string, ...any) }, op sandbox.Operation, start time.Time, state sandbox.OpState, opErr *sandbox.ErrorInfo, sbState sandbox.State, sbErr *sandbox.ErrorInfo) {
	e.finishWith(log, op, start, store.Finish{OperationID: op.ID, State: state, Error: opErr, SandboxState: sbState, SandboxError: sbErr})
}
