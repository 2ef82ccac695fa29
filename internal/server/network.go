package server

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"path/filepath"

	"github.com/spacesandbox/space/internal/config"
	"github.com/spacesandbox/space/internal/network"
	"github.com/spacesandbox/space/internal/runtime"
)

// NetworkDir holds each sandbox's network allocation.
const NetworkDir = "network"

// startNetwork sets up the sandbox network when a runtime takes one and it
// is not turned off; nil without one.
func startNetwork(ctx context.Context, cfg *config.Serve, h Host, log *slog.Logger) (*network.Manager, error) {
	if cfg.SandboxNetwork == "off" {
		log.Warn("sandbox networking is off (--sandbox-network off): sandboxes have no network at all")
		return nil, nil
	}
	wants := false
	for _, r := range h.Runtimes {
		wants = wants || r.Capabilities().Net != runtime.NetNone
	}
	if !wants {
		return nil, nil
	}
	rng, err := netip.ParsePrefix(cfg.SandboxNetwork)
	if err != nil {
		return nil, fmt.Errorf("--sandbox-network: %w", err)
	}
	open, err := cfg.OpenPrivate()
	if err != nil {
		return nil, err
	}
	ncfg := network.Config{Range: rng, Uplink: cfg.EgressUplink, DNS: cfg.EgressDNS, OpenPrivate: open,
		StateDir: filepath.Join(cfg.DataDir, NetworkDir), Logger: log}
	if cfg.EgressGateway != "" {
		if ncfg.Gateway, err = netip.ParseAddr(cfg.EgressGateway); err != nil {
			return nil, fmt.Errorf("--egress-gateway: %w", err)
		}
	}
	m, err := network.New(ctx, ncfg)
	if err != nil {
		return nil, fmt.Errorf("sandbox network (--sandbox-network off runs sandboxes without one): %w", err)
	}
	return m, nil
}
