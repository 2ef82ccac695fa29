package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"

	"github.com/spacesandbox/space/internal/bench"
	"github.com/spacesandbox/space/internal/cli"
	"github.com/spacesandbox/space/internal/runtime/gvisor"
	"github.com/spacesandbox/space/internal/runtime/vm"
	"github.com/spacesandbox/space/internal/sandbox"
	"github.com/spacesandbox/space/internal/server"
	"github.com/spacesandbox/space/internal/templates"
)

// baseline makes the bare runtime `space bench --baseline` compares a
// server's rows with, on this host, from the server's data directory (its
// template files).
func baseline(ctx context.Context, rt string, cfg cli.BaselineConfig, spec bench.BareSpec) (bench.Bare, error) {
	rootfs, err := templates.RootfsIn(filepath.Join(cfg.DataDir, "templates"), spec.TemplateDigest)
	if err != nil {
		return nil, fmt.Errorf("the template's files (is --data-dir the server's?): %w", err)
	}
	dir, err := newBenchDir(filepath.Join(cfg.DataDir, server.RuntimeDir))
	if err != nil {
		return nil, err
	}
	res := sandbox.Resources{VCPUs: spec.Resources.VCPUs, MemoryMiB: spec.Resources.MemoryMiB, DiskMiB: spec.Resources.DiskMiB}
	switch rt {
	case gvisor.Name:
		runsc := cfg.Runsc
		if runsc == "" {
			if runsc, err = exec.LookPath("runsc"); err != nil {
				os.RemoveAll(dir)
				return nil, fmt.Errorf("runsc not found")
			}
		}
		b, err := gvisor.NewBare(runsc, cfg.Platform, dir, rootfs, res)
		if err != nil {
			os.RemoveAll(dir)
		}
		return b, err
	case vm.Name:
		qemu, err := exec.LookPath(cfg.QEMU)
		if err != nil {
			os.RemoveAll(dir)
			return nil, fmt.Errorf("QEMU not found: %w", err)
		}
		agent, err := agentBinary(cfg.AgentBin)
		if err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
		accel := cfg.VMAccel
		if accel == "auto" {
			accel = ""
		}
		b, err := vm.NewBare(ctx, vm.Config{QEMU: qemu, Kernel: cfg.VMKernel, Modules: cfg.VMModules, AgentBin: agent, Accel: accel, Dir: dir},
			spec.TemplateDigest, rootfs, res)
		if err != nil {
			os.RemoveAll(dir)
		}
		return b, err
	}
	os.RemoveAll(dir)
	return nil, fmt.Errorf("no bare baseline for runtime %q", rt)
}
