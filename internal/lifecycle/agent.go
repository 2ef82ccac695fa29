package lifecycle

import (
	"context"
	"crypto/rand"
	"strings"
	"time"

	"github.com/spacesandbox/space/internal/agent/proto"
	"github.com/spacesandbox/space/internal/agentclient"
	"github.com/spacesandbox/space/internal/errdefs"
	"github.com/spacesandbox/space/internal/runtime"
	"github.com/spacesandbox/space/internal/sandbox"
)

// Agent returns the agent of a running sandbox (commands.Agents).
func (e *Engine) Agent(ctx context.Context, id string) (*agentclient.Client, *sandbox.Sandbox, error) {
	sb, err := e.store.GetSandbox(ctx, id)
	if err != nil {
		return nil, nil, err
	}
	if sb.State != sandbox.Running {
		return nil, nil, errdefs.New(errdefs.FailedPrecondition, "sandbox %s is %s; only a running sandbox accepts commands and file calls", id, sb.State).
			WithDetails(map[string]any{"state": string(sb.State)})
	}
	rt, ok := e.runtimes[sb.Runtime]
	if !ok {
		return nil, nil, errdefs.New(errdefs.Unavailable, "runtime %q of sandbox %s is not available on this server", sb.Runtime, id)
	}
	e.Touch(id) // work on a sandbox keeps it awake (see idle.go)
	actx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	c, err := rt.Agent(actx, e.spec(sb))
	if err != nil {
		return nil, nil, errdefs.Wrap(errdefs.Unavailable, err, "the agent of sandbox %s is not answering", id)
	}
	return c, sb, nil
}

// Hostname is the hostname a sandbox gets: its id in a form hostnames allow.
func Hostname(id string) string {
	return "sbx-" + strings.TrimPrefix(id, "sbx_")[:12]
}

// identify gives a freshly created or woken sandbox its own identity: the
// hostname (on create), the host's clock, and fresh entropy so copies of one
// snapshot never share RNG state. Failures are logged: a sandbox whose agent
// cannot be configured still runs.
func (e *Engine) identify(ctx context.Context, rt runtime.Runtime, spec runtime.Spec, withHostname bool) {
	actx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	c, err := rt.Agent(actx, spec)
	if err != nil {
		e.log.Debug("no agent to configure", "sandbox_id", spec.SandboxID, "err", err)
		return
	}
	cfg := proto.Configure{UnixNano: time.Now().UnixNano()}
	if withHostname {
		cfg.Hostname = Hostname(spec.SandboxID)
		if n := spec.Net; n != nil {
			cfg.Network = &proto.NetConfig{Address: n.Address.String(), Gateway: n.Gateway.String(), DNS: n.DNS.String()}
		}
	}
	entropy := make([]byte, 64)
	rand.Read(entropy)
	if _, err := c.Configure(actx, cfg, entropy); err != nil {
		e.log.Warn("configure sandbox identity", "sandbox_id", spec.SandboxID, "err", err)
	}
}

// flush asks the agent to write everything to disk before a suspend.
func (e *Engine) flush(ctx context.Context, rt runtime.Runtime, spec runtime.Spec) {
	actx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	c, err := rt.Agent(actx, spec)
	if err != nil {
		return
	}
	if err := c.Sync(actx); err != nil {
		e.log.Warn("flush filesystems before suspend", "sandbox_id", spec.SandboxID, "err", err)
	}
}
