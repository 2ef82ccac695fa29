package lifecycle

import (
	"context"
	"errors"
	"fmt"

	"github.com/spacesandbox/space/internal/errdefs"
	"github.com/spacesandbox/space/internal/runtime"
	"github.com/spacesandbox/space/internal/sandbox"
)

// A sandbox's network is made before its runtime starts it (create, and
// wake from suspend, which re-makes whatever a host reboot took) and
// removed after its runtime deleted it. The policy is the sandbox record's;
// UpdateNetwork changes both.

// attach makes the sandbox's network when its runtime takes one and fills
// in spec.Net; starting: the runtime is about to start the sandbox.
func (e *Engine) attach(ctx context.Context, rt runtime.Runtime, sb *sandbox.Sandbox, spec *runtime.Spec, starting bool) error {
	kind := rt.Capabilities().Net
	if e.cfg.Network == nil || kind == runtime.NetNone || sb.Network == nil {
		return nil
	}
	n, err := e.cfg.Network.Attach(ctx, sb.ID, kind, *sb.Network, starting)
	if err != nil {
		return fmt.Errorf("attach network: %w", err)
	}
	spec.Net = n
	return nil
}

// renetwork is a Spec.Renetwork for sb: its network made ready for a start
// again, as before a restore.
func (e *Engine) renetwork(rt runtime.Runtime, sb *sandbox.Sandbox) func(context.Context) error {
	return func(ctx context.Context) error {
		var spec runtime.Spec
		return e.attach(ctx, rt, sb, &spec, true)
	}
}

// detach removes the sandbox's network, logging a failure (the sandbox is
// gone either way; the next start's prune retries).
func (e *Engine) detach(ctx context.Context, id string) {
	if e.cfg.Network == nil {
		return
	}
	if err := e.cfg.Network.Detach(ctx, id); err != nil {
		e.log.Warn("remove sandbox network", "sandbox_id", id, "err", err)
	}
}

// UpdateNetwork replaces a sandbox's network policy; a running sandbox's
// new connections follow it at once.
func (e *Engine) UpdateNetwork(ctx context.Context, id string, n sandbox.Network) (*sandbox.Sandbox, error) {
	if err := NormalizeNetwork(&n, e.defaultEgress()); err != nil {
		return nil, err
	}
	sb, err := e.store.UpdateSandbox(ctx, id, func(sb *sandbox.Sandbox) error {
		switch sb.State {
		case sandbox.Deleted, sandbox.Deleting, sandbox.Failed:
			return errdefs.New(errdefs.FailedPrecondition, "sandbox %s is %s", id, sb.State).WithDetails(map[string]any{"state": string(sb.State)})
		}
		if sb.Network == nil {
			return errdefs.New(errdefs.FailedPrecondition, "sandbox %s was created without a network", id)
		}
		sb.Network = &n
		sb.UpdatedAt = e.now()
		return nil
	})
	if err != nil {
		return nil, err
	}
	if e.cfg.Network != nil {
		if err := e.cfg.Network.Apply(ctx, id, n); err != nil {
			return nil, fmt.Errorf("apply network policy: %w", err)
		}
	}
	return sb, nil
}

func (e *Engine) defaultEgress() string {
	if e.cfg.DefaultEgress == "" {
		return "none"
	}
	return e.cfg.DefaultEgress
}

// pruneNetworks removes the networks of sandboxes that are gone (deleted or
// failed, or unknown) — left by a crash between a delete and its cleanup.
func (e *Engine) pruneNetworks(ctx context.Context) {
	k, ok := e.cfg.Network.(interface{ Known() []string })
	if !ok {
		return
	}
	for _, id := range k.Known() {
		sb, err := e.store.GetSandbox(ctx, id)
		if err == nil && sb.State != sandbox.Deleted && sb.State != sandbox.Failed && sb.Node == e.cfg.Node {
			continue
		}
		if err != nil && !errors.Is(err, errdefs.NotFound) {
			continue
		}
		e.detach(ctx, id)
	}
}
