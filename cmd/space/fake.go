//go:build spacefake

package main

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/spacesandbox/space/internal/config"
	"github.com/spacesandbox/space/internal/runtime"
	"github.com/spacesandbox/space/internal/runtime/fakeruntime"
	"github.com/spacesandbox/space/internal/server"
)

// testHost offers the FAKE runtime with --runtime fake. Only binaries built
// with the spacefake tag (the fault-injection end-to-end tests) contain it.
// SPACE_FAKE_DELAY slows every step; SPACE_FAKE_FAIL lists failing steps;
// SPACE_AGENT_BIN=off runs sandboxes without an agent (records only: a
// fleet of thousands for the console's tests).
func testHost(ctx context.Context, cfg *config.Serve, log *slog.Logger) (server.Host, bool, error) {
	if cfg.Runtime != fakeruntime.Name {
		return server.Host{}, false, nil
	}
	delay, _ := time.ParseDuration(os.Getenv("SPACE_FAKE_DELAY"))
	agentBin := os.Getenv("SPACE_AGENT_BIN")
	switch agentBin {
	case "off":
		agentBin = ""
	case "":
		if exe, err := os.Executable(); err == nil {
			if cand := filepath.Join(filepath.Dir(exe), "space-agent"); fileExists(cand) {
				agentBin = cand
			}
		}
	}
	rt, err := fakeruntime.New(fakeruntime.Config{
		Dir:      filepath.Join(cfg.DataDir, server.RuntimeDir, "fake"),
		Delay:    delay,
		Fail:     fakeruntime.ParseFail(os.Getenv("SPACE_FAKE_FAIL")),
		AgentBin: agentBin,
		Logger:   log,
	})
	if err != nil {
		return server.Host{}, true, err
	}
	log.Warn("running the FAKE runtime: no isolation, the agent runs as a host process (test build)", "delay", delay, "agent", agentBin)
	return server.Host{Runtimes: []runtime.Runtime{rt}, Templates: fakeruntime.Templates{}}, true, nil
}

func fileExists(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.Mode().IsRegular()
}
