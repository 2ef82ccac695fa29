package main

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/spacesandbox/space/internal/config"
	"github.com/spacesandbox/space/internal/server"
)

// host decides which runtimes this binary offers on this host.
func host(ctx context.Context, cfg *config.Serve, log *slog.Logger) (server.Host, error) {
	if h, ok, err := testHost(ctx, cfg, log); ok || err != nil {
		return h, err
	}
	switch cfg.Runtime {
	case "auto":
		// No runtime is built in yet: the server runs, reports not ready,
		// and says why.
		log.Warn("no sandbox runtime available in this build: the vm and gvisor runtimes are not implemented yet")
		return server.Host{}, nil
	case "vm", "gvisor":
		return server.Host{}, fmt.Errorf("runtime %q is not implemented in this build yet", cfg.Runtime)
	}
	return server.Host{}, fmt.Errorf("unknown runtime %q (want auto, vm or gvisor)", cfg.Runtime)
}
