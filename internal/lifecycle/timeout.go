package lifecycle

import (
	"context"
	"time"

	"github.com/spacesandbox/space/internal/errdefs"
	"github.com/spacesandbox/space/internal/sandbox"
	"github.com/spacesandbox/space/internal/store"
)

// The timeout rule. A sandbox with auto_lifecycle.timeout has, each time it
// becomes running, until then + timeout (expires_at); paused and suspended
// time never counts. At expires_at its timeout_action runs as an ordinary
// operation: delete, or suspend (a later wake starts a fresh timeout).

// SetTimeout replaces a sandbox's timeout: a running sandbox's deadline
// becomes now + d (which may shorten it); others get d when they next run.
func (e *Engine) SetTimeout(ctx context.Context, id string, d time.Duration) (*sandbox.Sandbox, error) {
	if d <= 0 || d > MaxTimeout {
		return nil, errdefs.New(errdefs.InvalidArgument, "timeout must be between 1s and %s", MaxTimeout).WithDetails(map[string]any{"field": "timeout"})
	}
	now := e.now()
	return e.store.UpdateSandbox(ctx, id, func(sb *sandbox.Sandbox) error {
		if sb.State == sandbox.Deleted || sb.Pool != "" {
			return errdefs.New(errdefs.NotFound, "no sandbox %s", id)
		}
		sb.AutoLifecycle.Timeout = d.String()
		if sb.AutoLifecycle.TimeoutAction == "" {
			sb.AutoLifecycle.TimeoutAction = "delete"
		}
		if sb.State == sandbox.Running {
			t := now.Add(d)
			sb.ExpiresAt = &t
		}
		return nil
	})
}

// ExtendTimeout makes a running sandbox's deadline at least now + d; it
// never shortens it. A sandbox without a timeout keeps having none.
func (e *Engine) ExtendTimeout(ctx context.Context, id string, d time.Duration) (*sandbox.Sandbox, error) {
	now := e.now()
	return e.store.UpdateSandbox(ctx, id, func(sb *sandbox.Sandbox) error {
		if sb.State == sandbox.Running && sb.ExpiresAt != nil {
			if t := now.Add(d); t.After(*sb.ExpiresAt) {
				sb.ExpiresAt = &t
			}
		}
		return nil
	})
}

// expireSweep runs the timeout action of every running sandbox past its
// deadline.
func (e *Engine) expireSweep(ctx context.Context, now time.Time) {
	store.EachSandboxOn(ctx, e.store, &e.cfg.Node, sandbox.Running, func(sb *sandbox.Sandbox) {
		if sb.Pool != "" || sb.ActiveOperation != "" || sb.ExpiresAt == nil || now.Before(*sb.ExpiresAt) {
			return
		}
		var op *sandbox.Operation
		var err error
		if sb.AutoLifecycle.TimeoutAction == "suspend" {
			op, err = e.Suspend(ctx, sb.ID, nil)
		} else {
			op, err = e.Delete(ctx, sb.ID, nil)
		}
		if err == nil {
			e.log.Info("sandbox timed out: automatic "+sb.AutoLifecycle.TimeoutAction, "sandbox_id", sb.ID, "operation_id", op.ID, "expired_at", sb.ExpiresAt)
		}
	})
}
