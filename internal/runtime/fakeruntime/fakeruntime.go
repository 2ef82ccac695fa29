// Package fakeruntime is an in-process FAKE runtime for tests: it runs
// nothing, and keeps each sandbox's status in a small file so that a server
// restart sees it again. It exists for fault injection (slow or failing
// lifecycle steps, a server killed in the middle of one) that a real runtime
// cannot produce on demand. Production builds of `space` never include it;
// only binaries built with the `spacefake` tag offer it.
package fakeruntime

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/spacesandbox/space/internal/runtime"
)

// Name is the API name of the fake runtime.
const Name = "fake"

// Config tunes the fake.
type Config struct {
	// Dir holds one status file per sandbox.
	Dir string
	// Delay is how long every lifecycle step takes.
	Delay time.Duration
	// Fail names lifecycle steps ("create", "pause", …) that fail after the
	// delay without changing anything.
	Fail map[string]bool
}

// Runtime is the fake. Safe for concurrent use.
type Runtime struct {
	cfg Config
	mu  sync.Mutex // guards files in cfg.Dir
}

var _ runtime.Runtime = (*Runtime)(nil)

// New returns a fake runtime keeping state in cfg.Dir.
func New(cfg Config) (*Runtime, error) {
	if err := os.MkdirAll(cfg.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("fake runtime dir: %w", err)
	}
	return &Runtime{cfg: cfg}, nil
}

// ParseFail parses a comma-separated list of step names.
func ParseFail(s string) map[string]bool {
	m := map[string]bool{}
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			m[f] = true
		}
	}
	return m
}

func (r *Runtime) Name() string { return Name }

func (r *Runtime) Capabilities() runtime.Capabilities {
	return runtime.Capabilities{Pause: true, Suspend: true, Detail: "fake runtime for tests: runs nothing"}
}

// ErrInjected is returned by steps configured to fail.
var ErrInjected = errors.New("injected failure")

func (r *Runtime) step(ctx context.Context, name string) error {
	if r.cfg.Delay > 0 {
		t := time.NewTimer(r.cfg.Delay)
		defer t.Stop()
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
	if r.cfg.Fail[name] {
		return fmt.Errorf("%s: %w", name, ErrInjected)
	}
	return nil
}

func (r *Runtime) path(id string) string { return filepath.Join(r.cfg.Dir, id) }

func (r *Runtime) get(id string) runtime.Status {
	b, err := os.ReadFile(r.path(id))
	if err != nil {
		return runtime.StatusAbsent
	}
	return runtime.Status(strings.TrimSpace(string(b)))
}

func (r *Runtime) set(id string, s runtime.Status) error {
	if s == runtime.StatusAbsent {
		if err := os.Remove(r.path(id)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
		return nil
	}
	tmp := r.path(id) + ".tmp"
	if err := os.WriteFile(tmp, []byte(s), 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, r.path(id))
}

// transition moves id from one of the accepted statuses to to. Being in to
// already is success (idempotent).
func (r *Runtime) transition(ctx context.Context, name, id string, to runtime.Status, accept ...runtime.Status) error {
	if err := r.step(ctx, name); err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	cur := r.get(id)
	if cur == to {
		return nil
	}
	for _, a := range accept {
		if cur == a {
			return r.set(id, to)
		}
	}
	if cur == runtime.StatusAbsent {
		return fmt.Errorf("%s %s: %w", name, id, runtime.ErrNotFound)
	}
	return fmt.Errorf("%s %s: sandbox is %s", name, id, cur)
}

func (r *Runtime) Create(ctx context.Context, spec runtime.Spec) error {
	return r.transition(ctx, "create", spec.SandboxID, runtime.StatusRunning, runtime.StatusAbsent)
}

func (r *Runtime) Pause(ctx context.Context, spec runtime.Spec) error {
	return r.transition(ctx, "pause", spec.SandboxID, runtime.StatusPaused, runtime.StatusRunning)
}

func (r *Runtime) Resume(ctx context.Context, spec runtime.Spec) error {
	return r.transition(ctx, "resume", spec.SandboxID, runtime.StatusRunning, runtime.StatusPaused)
}

func (r *Runtime) Suspend(ctx context.Context, spec runtime.Spec) error {
	return r.transition(ctx, "suspend", spec.SandboxID, runtime.StatusSuspended, runtime.StatusRunning, runtime.StatusPaused)
}

func (r *Runtime) Restore(ctx context.Context, spec runtime.Spec) error {
	return r.transition(ctx, "restore", spec.SandboxID, runtime.StatusRunning, runtime.StatusSuspended)
}

func (r *Runtime) Delete(ctx context.Context, spec runtime.Spec) error {
	return r.transition(ctx, "delete", spec.SandboxID, runtime.StatusAbsent, runtime.StatusRunning, runtime.StatusPaused, runtime.StatusSuspended)
}

func (r *Runtime) Recover(ctx context.Context, spec runtime.Spec) (runtime.Status, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.get(spec.SandboxID), nil
}

func (r *Runtime) Stats(ctx context.Context, spec runtime.Spec) (runtime.Stats, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.get(spec.SandboxID) == runtime.StatusAbsent {
		return runtime.Stats{}, runtime.ErrNotFound
	}
	return runtime.Stats{}, nil
}
