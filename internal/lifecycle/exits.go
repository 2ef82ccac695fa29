package lifecycle

import (
	"context"
	"time"

	"github.com/spacesandbox/space/internal/errdefs"
	"github.com/spacesandbox/space/internal/runtime"
	"github.com/spacesandbox/space/internal/sandbox"
)

// FailureObserver is told of every sandbox that failed on its own (for
// metrics); an Observer may implement it.
type FailureObserver interface {
	SandboxFailed(runtime, reason string)
}

// sandboxExited moves a sandbox whose processes ended on their own (a
// runtime.ExitReporter noticed) to failed with the reason, at once: it no
// longer counts against the limit, and calls on it answer 409 instead of
// waiting for an agent that will not come.
//
// A sandbox with an operation in flight is left to that operation, which
// mostly sees the same death. Not always: the death may come after the
// runtime's part of it (a fork's source killed while its copies start, a
// created sandbox killed as it is configured). So the sandbox is doubted:
// an operation about to record it running or paused asks the runtime first
// (lookAgain); and once that operation is over, the runtime is asked again
// (recheckExit), for a death after that look.
func (e *Engine) sandboxExited(x runtime.Exit) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	log := e.log.With("sandbox_id", x.SandboxID)
	var inFlight string
	sb, err := e.store.UpdateSandbox(ctx, x.SandboxID, func(cur *sandbox.Sandbox) error {
		inFlight = cur.ActiveOperation
		if cur.ActiveOperation != "" || (cur.State != sandbox.Running && cur.State != sandbox.Paused) {
			return errdefs.New(errdefs.Conflict, "sandbox is %s with operation %q", cur.State, cur.ActiveOperation)
		}
		cur.State, cur.UpdatedAt = sandbox.Failed, e.now()
		cur.Error = &sandbox.ErrorInfo{Code: x.Reason, Message: x.Message}
		return nil
	})
	if err != nil {
		log.Info("sandbox's process ended; its state stands", "reason", x.Reason, "why", err, "operation_id", inFlight)
		if inFlight != "" {
			e.doubt(x.SandboxID, &x)
			e.recheckExit(x, inFlight)
		}
		return
	}
	log.Warn("sandbox failed", "event", "sandbox_failed", "reason", x.Reason, "message", x.Message, "runtime", sb.Runtime)
	e.sandboxFailed(sb.Runtime, x.Reason)
}

// sandboxFailed counts a sandbox that failed on its own and lets the warm
// pools refill.
func (e *Engine) sandboxFailed(rtName, reason string) {
	if fo, ok := e.cfg.Observer.(FailureObserver); ok {
		fo.SandboxFailed(rtName, reason)
	}
	e.kickPools()
}

// recheckExit waits for operation opID, in flight when sandbox x.SandboxID's
// process ended, and then asks the runtime about the sandbox: one the
// operation left running or paused that the runtime no longer has is
// failed with the exit's reason. (One the operation started again — a
// source restored in place — is found alive and stands.)
func (e *Engine) recheckExit(x runtime.Exit, opID string) {
	if e.life.Err() != nil {
		return // the next start recovers every sandbox from the runtime
	}
	e.loops.Add(1)
	go func() {
		defer e.loops.Done()
		log := e.log.With("sandbox_id", x.SandboxID, "operation_id", opID)
		if _, err := e.WaitOperation(e.life, opID); err != nil {
			return
		}
		sb, err := e.store.GetSandbox(e.life, x.SandboxID)
		if err != nil || sb.ActiveOperation != "" || (sb.State != sandbox.Running && sb.State != sandbox.Paused) {
			return // gone, failed, suspended, or in a later operation's hands
		}
		rt, ok := e.runtimes[sb.Runtime]
		if !ok {
			return
		}
		st, err := rt.Recover(e.life, e.spec(sb))
		if err != nil {
			log.Warn("ask the runtime about a sandbox whose process ended during an operation", "err", err)
			return
		}
		if st == runtime.StatusAbsent {
			e.sandboxExited(x)
		}
	}()
}
