package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/spacesandbox/space/internal/errdefs"
	"github.com/spacesandbox/space/internal/ids"
	"github.com/spacesandbox/space/internal/sandbox"
	"github.com/spacesandbox/space/internal/store"
)

// StartBuild records a build operation for the template ref and runs build
// in the background under the engine's lifetime. The operation ends
// succeeded when build returns nil, failed with its (client-safe) error
// otherwise. A build interrupted by shutdown or a crash is failed at the
// next start; builds leave nothing behind when they fail.
func (e *Engine) StartBuild(ctx context.Context, project, ref string, render Render, build func(ctx context.Context) error) (*sandbox.Operation, error) {
	now := e.now()
	op := &sandbox.Operation{ID: ids.New(ids.Operation), Project: project, Kind: sandbox.OpBuild, Template: ref, State: sandbox.OpPending, CreatedAt: now, UpdatedAt: now}
	if err := e.store.CreateOperation(ctx, op, render.completion(nil, op)); err != nil {
		return nil, fmt.Errorf("record build: %w", err)
	}
	e.mu.Lock()
	if e.life.Err() != nil {
		e.mu.Unlock()
		return op, nil // the next start fails it
	}
	e.wg.Add(1)
	e.mu.Unlock()
	go func() {
		defer e.wg.Done()
		start := time.Now()
		log := e.log.With("operation_id", op.ID, "template", ref)
		bk := context.WithoutCancel(e.life)
		if err := e.store.UpdateOperationState(bk, op.ID, sandbox.OpRunning, e.now()); err != nil {
			log.Error("mark build running", "err", err)
			return
		}
		if e.cfg.Cluster != nil {
			// Other replicas take a build whose record stops changing for
			// one its replica died with (FailOrphanBuilds).
			stop := make(chan struct{})
			defer close(stop)
			go func() {
				t := time.NewTicker(buildBeat)
				defer t.Stop()
				for {
					select {
					case <-stop:
						return
					case <-t.C:
						e.store.UpdateOperationState(bk, op.ID, sandbox.OpRunning, e.now())
					}
				}
			}()
		}
		err := build(e.life)
		if e.life.Err() != nil {
			log.Info("build interrupted by shutdown; it is failed at next start")
			return
		}
		if err != nil {
			log.Error("template build failed", "err", err)
			e.finish(log, *op, start, sandbox.OpFailed, buildError(err), "", nil)
			return
		}
		e.finish(log, *op, start, sandbox.OpSucceeded, nil, "", nil)
	}()
	return op, nil
}

// buildError is the client-visible error of a failed build: builds fail for
// reasons the user must see (a package that does not exist, a broken image),
// so kinded errors keep their message.
func buildError(err error) *sandbox.ErrorInfo {
	var kerr *errdefs.Error
	if errors.As(err, &kerr) {
		return &sandbox.ErrorInfo{Code: kerr.Kind.Code, Message: kerr.Error()}
	}
	return &sandbox.ErrorInfo{Code: errdefs.Internal.Code, Message: err.Error()}
}

// buildBeat is how often a cluster replica's build says it still runs;
// OrphanBuildAfter is how long a build may not say so before another
// replica fails it.
const (
	buildBeat        = 10 * time.Second
	OrphanBuildAfter = 6 * buildBeat
)

// FailOrphanBuilds fails the builds whose replica stopped running them (its
// record has not changed for OrphanBuildAfter): in a cluster, no start of
// the same process comes to fail them.
func (e *Engine) FailOrphanBuilds(ctx context.Context) (int, error) {
	ops, err := e.store.UnfinishedOperations(ctx, "")
	if err != nil {
		return 0, err
	}
	n := 0
	for _, op := range ops {
		if op.Kind == sandbox.OpBuild && e.now().Sub(op.UpdatedAt) > OrphanBuildAfter {
			e.failInterruptedBuild(ctx, op)
			n++
		}
	}
	return n, nil
}

// failInterruptedBuild ends a build a previous process left in flight.
func (e *Engine) failInterruptedBuild(ctx context.Context, op sandbox.Operation) {
	err := e.store.FinishOperation(ctx, store.Finish{OperationID: op.ID, State: sandbox.OpFailed, At: e.now(),
		Error: &sandbox.ErrorInfo{Code: errdefs.Unavailable.Code, Message: "the build was interrupted by a server restart; nothing of it was kept; build again"}})
	if err != nil {
		e.log.Error("fail interrupted build", "operation_id", op.ID, "err", err)
	}
}
