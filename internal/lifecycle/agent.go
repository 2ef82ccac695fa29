package lifecycle

import (
	"context"
	"crypto/rand"
	"strings"
	"time"

	"github.com/spacesandbox/space/internal/agentclient"
	"github.com/spacesandbox/space/internal/errdefs"
	"github.com/spacesandbox/space/internal/runtime"
	"github.com/spacesandbox/space/internal/sandbox"
	"github.com/spacesandbox/space/internal/sandboxio"
)

// Agent returns the agent of a running sandbox (commands.Agents); the
// work it is fetched for keeps the sandbox awake.
func (e *Engine) Agent(ctx context.Context, id string) (*sandboxio.Agent, *sandbox.Sandbox, error) {
	return e.agent(ctx, id, true)
}

// PeekAgent returns the agent of a running sandbox without counting as
// activity: for the usage sampler, which must not keep sandboxes awake.
func (e *Engine) PeekAgent(ctx context.Context, id string) (*sandboxio.Agent, *sandbox.Sandbox, error) {
	return e.agent(ctx, id, false)
}

func (e *Engine) agent(ctx context.Context, id string, touch bool) (*sandboxio.Agent, *sandbox.Sandbox, error) {
	sb, err := e.store.GetSandbox(ctx, id)
	if err != nil {
		return nil, nil, err
	}
	if sb.State != sandbox.Running {
		return nil, nil, notRunning(sb)
	}
	rt, ok := e.runtimes[sb.Runtime]
	if !ok || !e.runsHere(sb.Node) {
		return nil, nil, errdefs.New(errdefs.Unavailable, "sandbox %s does not run on this server", id)
	}
	if touch {
		e.Touch(id) // work on a sandbox keeps it awake (see idle.go)
	}
	c, err := e.waitAgent(ctx, rt, sb)
	if err != nil {
		return nil, nil, err
	}
	return sandboxio.Wrap(c).WhenLost(func(err error) error { return e.explainLost(id, err) }), sb, nil
}

// notRunning refuses a command or file call on sandbox sb, which is not
// running: 409 with its state.
func notRunning(sb *sandbox.Sandbox) error {
	return errdefs.New(errdefs.FailedPrecondition, "sandbox %s is %s; only a running sandbox accepts commands and file calls", sb.ID, sb.State).
		WithDetails(map[string]any{"state": string(sb.State)})
}

// explainLost answers a call whose agent connection went away (err, an
// Unavailable): when an operation took the sandbox (a suspend, a delete)
// it is already in that operation's state, and when the sandbox died its
// exit watch fails it within moments. Either way the call is refused as on
// a sandbox that is not running, with its state, rather than with a 503 a
// client would retry. A sandbox that runs on with an operation in flight
// (a fork's or snapshot's save closes the agent's connection, and the
// agent dials again) keeps err at once: a command stream reaches the agent
// again without waiting. One still running a second later keeps err too.
func (e *Engine) explainLost(id string, err error) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	for {
		sb, gerr := e.store.GetSandbox(ctx, id)
		switch {
		case gerr != nil:
		case sb.State != sandbox.Running:
			return notRunning(sb)
		case sb.ActiveOperation != "":
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// waitAgent returns the agent of running sandbox sb: at once when it is
// connected, else once it connects, for up to 15 seconds. A sandbox that
// stops running meanwhile (its process died: sandboxExited) ends the wait
// with the state it is in, not with a timeout.
func (e *Engine) waitAgent(ctx context.Context, rt runtime.Runtime, sb *sandbox.Sandbox) (*agentclient.Client, error) {
	spec := e.spec(sb)
	now, cancel := context.WithCancel(ctx)
	cancel()
	if c, err := rt.Agent(now, spec); err == nil {
		return c, nil
	}
	actx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	var left *sandbox.Sandbox // the sandbox as the watch last saw it stop running
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		t := time.NewTicker(200 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-actx.Done():
				return
			case <-t.C:
				if cur, err := e.store.GetSandbox(actx, sb.ID); err == nil && cur.State != sandbox.Running {
					left = cur
					cancel()
					return
				}
			}
		}
	}()
	c, err := rt.Agent(actx, spec)
	if err == nil {
		return c, nil
	}
	cancel()
	<-watched
	if left != nil && ctx.Err() == nil {
		return nil, notRunning(left)
	}
	return nil, errdefs.Wrap(errdefs.Unavailable, err, "the agent of sandbox %s is not answering", sb.ID)
}

// Hostname is the hostname a sandbox gets: its id in a form hostnames allow.
func Hostname(id string) string {
	return "sbx-" + strings.TrimPrefix(id, "sbx_")[:12]
}

// identity is what identify gives a sandbox besides the clock and fresh
// entropy.
type identity int

const (
	// woken: nothing more (a resumed, restored or claimed sandbox).
	woken identity = iota
	// copied: its hostname and network too (a new sandbox started from a
	// save: a fork, a snapshot).
	copied
	// booted: as copied, for a sandbox the runtime has just created; a
	// runtime that attaches it through a network namespace (gVisor) gave
	// its link the address and route at boot.
	booted
)

// identify gives a freshly created or woken sandbox its own identity: the
// hostname and network (a new sandbox), the host's clock, and fresh entropy
// so copies of one snapshot never share RNG state. Failures are logged: a
// sandbox whose agent cannot be configured still runs, but it is doubted
// (lookAgain): its agent may have gone with it.
func (e *Engine) identify(ctx context.Context, rt runtime.Runtime, spec runtime.Spec, what identity) {
	actx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	c, err := rt.Agent(actx, spec)
	if err != nil {
		e.log.Debug("no agent to configure", "sandbox_id", spec.SandboxID, "err", err)
		e.doubt(spec.SandboxID, nil)
		return
	}
	id := sandboxio.Identity{Now: time.Now(), Entropy: make([]byte, 64), CPUs: spec.Resources.VCPUs}
	if what >= copied {
		id.Hostname = Hostname(spec.SandboxID)
		if n := spec.Net; n != nil {
			id.Address, id.Gateway, id.DNS = n.Address, n.Gateway, n.DNS
			id.NetworkGiven = what == booted && n.Kind == runtime.NetNamespace
		}
	}
	rand.Read(id.Entropy)
	if err := sandboxio.Wrap(c).Configure(actx, id); err != nil {
		e.log.Warn("configure sandbox identity", "sandbox_id", spec.SandboxID, "err", err)
		e.doubt(spec.SandboxID, nil)
	}
}
