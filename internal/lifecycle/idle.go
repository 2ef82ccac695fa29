package lifecycle

import (
	"context"
	"sync"
	"time"

	"github.com/spacesandbox/space/internal/sandbox"
	"github.com/spacesandbox/space/internal/store"
)

// The idle rule. A running sandbox is idle when, for its idle_timeout, none
// of these happened: a control-plane request naming it (commands, files,
// processes, lifecycle), a data-plane request for one of its sessions, or an
// attached event stream being open. The clock starts at the later of the last
// such activity and the moment the sandbox last became running, so paused and
// suspended time never counts and a wake restarts it. When idle, its
// idle_action (pause or suspend) runs as an ordinary operation. Optionally,
// a sandbox paused for longer than SuspendPausedAfter is suspended.

// activity tracks what keeps sandboxes awake. Safe for concurrent use.
type activity struct {
	mu       sync.Mutex // guards last, attached, dirty
	last     map[string]time.Time
	attached map[string]int
	dirty    map[string]bool // last changed since it was persisted
}

func newActivity() *activity {
	return &activity{last: map[string]time.Time{}, attached: map[string]int{}, dirty: map[string]bool{}}
}

// Touch records activity on a sandbox now.
func (e *Engine) Touch(id string) {
	a := e.activity
	a.mu.Lock()
	a.last[id] = e.now()
	a.dirty[id] = true
	a.mu.Unlock()
}

// Attached records an open event stream on a sandbox until release is
// called; while any is open the sandbox is never idle.
func (e *Engine) Attached(id string) (release func()) {
	e.Touch(id)
	a := e.activity
	a.mu.Lock()
	a.attached[id]++
	a.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			a.mu.Lock()
			if a.attached[id]--; a.attached[id] <= 0 {
				delete(a.attached, id)
			}
			a.mu.Unlock()
			e.Touch(id)
		})
	}
}

// idleSince is when sb's idle clock started, and whether a stream holds it.
func (e *Engine) idleSince(sb *sandbox.Sandbox) (time.Time, bool) {
	a := e.activity
	a.mu.Lock()
	defer a.mu.Unlock()
	since := sb.UpdatedAt // when it last became running
	if sb.LastActiveAt.After(since) {
		since = sb.LastActiveAt
	}
	if t, ok := a.last[sb.ID]; ok && t.After(since) {
		since = t
	}
	return since, a.attached[sb.ID] > 0
}

// runIdle applies the idle policy until the engine closes.
func (e *Engine) runIdle(interval time.Duration) {
	defer e.loops.Done()
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-e.life.Done():
			return
		case <-t.C:
		}
		e.idleSweep(e.life)
	}
}

func (e *Engine) idleSweep(ctx context.Context) {
	now := e.now()
	e.flushActivity(ctx)
	e.expireSweep(ctx, now)
	// A sweep that cannot list sandboxes tries again at its next run.
	store.EachSandboxOn(ctx, e.store, &e.cfg.Node, sandbox.Running, func(sb *sandbox.Sandbox) {
		if sb.Pool != "" || sb.ActiveOperation != "" || sb.AutoLifecycle.IdleAction == "" || sb.AutoLifecycle.IdleAction == "none" {
			return
		}
		timeout, err := time.ParseDuration(sb.AutoLifecycle.IdleTimeout)
		if err != nil || timeout <= 0 {
			return
		}
		since, held := e.idleSince(sb)
		if held || now.Sub(since) < timeout {
			return
		}
		var op *sandbox.Operation
		if sb.AutoLifecycle.IdleAction == "pause" {
			op, err = e.Pause(ctx, sb.ID, nil)
		} else {
			op, err = e.Suspend(ctx, sb.ID, nil)
		}
		if err == nil {
			e.log.Info("idle sandbox: automatic "+sb.AutoLifecycle.IdleAction, "sandbox_id", sb.ID, "operation_id", op.ID, "idle_for", now.Sub(since).Round(time.Millisecond))
		}
	})
	if limit := e.cfg.SuspendPausedAfter; limit > 0 {
		store.EachSandboxOn(ctx, e.store, &e.cfg.Node, sandbox.Paused, func(sb *sandbox.Sandbox) {
			if sb.ActiveOperation == "" && now.Sub(sb.UpdatedAt) >= limit {
				if op, err := e.Suspend(ctx, sb.ID, nil); err == nil {
					e.log.Info("paused too long: automatic suspend", "sandbox_id", sb.ID, "operation_id", op.ID)
				}
			}
		})
	}
}

// flushActivity persists recent activity as last_active_at.
func (e *Engine) flushActivity(ctx context.Context) {
	a := e.activity
	a.mu.Lock()
	pending := map[string]time.Time{}
	for id := range a.dirty {
		pending[id] = a.last[id]
	}
	clear(a.dirty)
	a.mu.Unlock()
	for id, t := range pending {
		e.store.TouchSandbox(ctx, id, t)
	}
}
