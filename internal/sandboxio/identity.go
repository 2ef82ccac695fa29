package sandboxio

import (
	"context"
	"net/netip"
	"time"

	"github.com/spacesandbox/space/internal/agent/proto"
)

// Identity is what makes a sandbox itself after a boot or a restore: its
// hostname (on create), the host's clock, its network, and fresh entropy so
// copies of one snapshot never share RNG state.
type Identity struct {
	Hostname string    // "": unchanged
	Now      time.Time // sets the wall clock
	// Address, Gateway and DNS configure the network (Address invalid: none).
	Address      netip.Prefix
	Gateway, DNS netip.Addr
	Entropy      []byte // mixed into the kernel's pool
}

// Configure gives the sandbox its identity.
func (a *Agent) Configure(ctx context.Context, id Identity) error {
	cfg := proto.Configure{Hostname: id.Hostname, UnixNano: id.Now.UnixNano()}
	if id.Address.IsValid() {
		cfg.Network = &proto.NetConfig{Address: id.Address.String(), Gateway: id.Gateway.String(), DNS: id.DNS.String()}
	}
	_, err := a.c.Configure(ctx, cfg, id.Entropy)
	return fail("configure", err)
}

// Sync writes the sandbox's file systems to disk (before a suspend).
func (a *Agent) Sync(ctx context.Context) error {
	return fail("sync", a.c.Sync(ctx))
}
