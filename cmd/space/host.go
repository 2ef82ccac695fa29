package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"

	"github.com/spacesandbox/space/internal/config"
	"github.com/spacesandbox/space/internal/runtime"
	"github.com/spacesandbox/space/internal/runtime/gvisor"
	"github.com/spacesandbox/space/internal/server"
	"github.com/spacesandbox/space/internal/templates"
)

// host decides which runtimes this binary offers on this host, and opens
// the template store.
func host(ctx context.Context, cfg *config.Serve, log *slog.Logger) (server.Host, error) {
	if h, ok, err := testHost(ctx, cfg, log); ok || err != nil {
		return h, err
	}
	store, err := templates.Open(filepath.Join(cfg.DataDir, "templates"))
	if err != nil {
		return server.Host{}, err
	}
	h := server.Host{Templates: store, TemplateStore: store}
	switch cfg.Runtime {
	case "auto", "gvisor":
	case "vm":
		return server.Host{}, fmt.Errorf("runtime vm is not implemented in this build yet")
	default:
		return server.Host{}, fmt.Errorf("unknown runtime %q (want auto, vm or gvisor)", cfg.Runtime)
	}
	rt, why := newGVisor(ctx, cfg, store, log)
	if rt == nil {
		if cfg.Runtime == "gvisor" {
			return server.Host{}, fmt.Errorf("runtime gvisor unavailable: %s", why)
		}
		log.Warn("no sandbox runtime available on this host", "gvisor", why, "vm", "not implemented yet")
		return h, nil
	}
	log.Info("runtime gvisor selected", "why", "the vm runtime is not implemented yet; gVisor runs here at full speed", "detail", rt.Capabilities().Detail)
	h.Runtimes = []runtime.Runtime{rt}
	return h, nil
}

// newGVisor returns the gvisor runtime, or nil and the reason it cannot run.
func newGVisor(ctx context.Context, cfg *config.Serve, store *templates.Store, log *slog.Logger) (runtime.Runtime, string) {
	runsc := cfg.Runsc
	if runsc == "" {
		p, err := exec.LookPath("runsc")
		if err != nil {
			return nil, "runsc not found (make deps installs it)"
		}
		runsc = p
	}
	agent, err := agentBinary(cfg)
	if err != nil {
		return nil, err.Error()
	}
	if os.Geteuid() != 0 {
		return nil, "runsc needs root"
	}
	if err := gvisor.Probe(ctx, runsc); err != nil {
		return nil, err.Error()
	}
	rt, err := gvisor.New(gvisor.Config{Runsc: runsc, Dir: filepath.Join(cfg.DataDir, server.RuntimeDir, "gvisor"), AgentBin: agent, Templates: store, Logger: log})
	if err != nil {
		return nil, err.Error()
	}
	return rt, ""
}

// agentBinary finds the static space-agent: the flag, beside this binary,
// or on PATH.
func agentBinary(cfg *config.Serve) (string, error) {
	if cfg.AgentBin != "" {
		return cfg.AgentBin, nil
	}
	if exe, err := os.Executable(); err == nil {
		cand := filepath.Join(filepath.Dir(exe), "space-agent")
		if fi, err := os.Stat(cand); err == nil && fi.Mode().IsRegular() {
			return cand, nil
		}
	}
	if p, err := exec.LookPath("space-agent"); err == nil {
		return p, nil
	}
	return "", fmt.Errorf("space-agent not found beside space or on PATH (make build builds it)")
}
