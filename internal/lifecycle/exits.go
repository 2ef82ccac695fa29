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
// waiting for an agent that will not come. A sandbox with an operation in
// flight is left to that operation, which sees the same death.
func (e *Engine) sandboxExited(x runtime.Exit) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	log := e.log.With("sandbox_id", x.SandboxID)
	sb, err := e.store.UpdateSandbox(ctx, x.SandboxID, func(cur *sandbox.Sandbox) error {
		if cur.ActiveOperation != "" || (cur.State != sandbox.Running && cur.State != sandbox.Paused) {
			return errdefs.New(errdefs.Conflict, "sandbox is %s with operation %q", cur.State, cur.ActiveOperation)
		}
		cur.State, cur.UpdatedAt = sandbox.Failed, e.now()
		cur.Error = &sandbox.ErrorInfo{Code: x.Reason, Message: x.Message}
		return nil
	})
	if err != nil {
		log.Info("sandbox's process ended; its state stands", "reason", x.Reason, "why", err)
		return
	}
	log.Warn("sandbox failed", "event", "sandbox_failed", "reason", x.Reason, "message", x.Message, "runtime", sb.Runtime)
	if fo, ok := e.cfg.Observer.(FailureObserver); ok {
		fo.SandboxFailed(sb.Runtime, x.Reason)
	}
	e.kickPools()
}
