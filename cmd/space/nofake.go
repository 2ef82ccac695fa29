//go:build !spacefake

package main

import (
	"context"
	"log/slog"

	"github.com/spacesandbox/space/internal/config"
	"github.com/spacesandbox/space/internal/server"
)

// testHost offers nothing in production builds.
func testHost(context.Context, *config.Serve, *slog.Logger) (server.Host, bool, error) {
	return server.Host{}, false, nil
}
