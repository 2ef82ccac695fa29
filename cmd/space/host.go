package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/spacesandbox/space/internal/config"
	"github.com/spacesandbox/space/internal/runtime"
	"github.com/spacesandbox/space/internal/runtime/gvisor"
	"github.com/spacesandbox/space/internal/runtime/vm"
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
	case "auto", "gvisor", "vm":
	default:
		return server.Host{}, fmt.Errorf("unknown runtime %q (want auto, vm or gvisor)", cfg.Runtime)
	}
	var gv, vmrt runtime.Runtime
	var gvWhy, vmWhy string
	if cfg.Runtime != "vm" {
		gv, gvWhy = newGVisor(ctx, cfg, store, log)
		if gv == nil && cfg.Runtime == "gvisor" {
			return server.Host{}, fmt.Errorf("runtime gvisor unavailable: %s", gvWhy)
		}
	}
	kvm := false
	if cfg.Runtime != "gvisor" {
		var accel string
		vmrt, accel, vmWhy = newVM(ctx, cfg, store, log)
		if vmrt == nil && cfg.Runtime == "vm" {
			return server.Host{}, fmt.Errorf("runtime vm unavailable: %s", vmWhy)
		}
		kvm = accel == "kvm"
	}
	// Every runtime that works is offered; the default is a microVM where
	// KVM runs it, else gVisor (TCG emulation is correct but slow).
	switch {
	case vmrt != nil && (kvm || gv == nil):
		h.Runtimes, h.Default = append(h.Runtimes, vmrt), vm.Name
	case gv != nil:
		h.Runtimes, h.Default = append(h.Runtimes, gv), gvisor.Name
	}
	if vmrt != nil && h.Default != vm.Name {
		h.Runtimes = append(h.Runtimes, vmrt)
	}
	if gv != nil && h.Default != gvisor.Name {
		h.Runtimes = append(h.Runtimes, gv)
	}
	if len(h.Runtimes) == 0 {
		log.Warn("no sandbox runtime available on this host", "gvisor", gvWhy, "vm", vmWhy)
		return h, nil
	}
	for _, r := range h.Runtimes {
		log.Info("runtime available", "runtime", r.Name(), "default", r.Name() == h.Default, "detail", r.Capabilities().Detail)
	}
	if gv == nil && gvWhy != "" {
		log.Info("runtime gvisor not offered", "why", gvWhy)
	}
	if vmrt == nil && vmWhy != "" {
		log.Info("runtime vm not offered", "why", vmWhy)
	}
	return h, nil
}

// newVM returns the vm runtime and its acceleration, or nil and the reason
// it cannot run.
func newVM(ctx context.Context, cfg *config.Serve, store *templates.Store, log *slog.Logger) (runtime.Runtime, string, string) {
	qemu, err := exec.LookPath(cfg.QEMU)
	if err != nil {
		return nil, "", "QEMU not found (make deps installs qemu-system-x86)"
	}
	if _, err := os.Stat(cfg.VMKernel); err != nil {
		return nil, "", "no guest kernel at " + cfg.VMKernel + " (make deps unpacks it)"
	}
	if os.Geteuid() != 0 {
		return nil, "", "the vm runtime needs root"
	}
	agent, err := agentBinary(cfg.AgentBin)
	if err != nil {
		return nil, "", err.Error()
	}
	accel := cfg.VMAccel
	if accel == "auto" {
		accel = ""
	}
	rt, err := vm.New(ctx, vm.Config{QEMU: qemu, Kernel: cfg.VMKernel, Modules: cfg.VMModules, AgentBin: agent,
		Dir: filepath.Join(cfg.DataDir, server.RuntimeDir, "vm"), Templates: store, Accel: accel, Logger: log})
	if err != nil {
		return nil, "", err.Error()
	}
	a, _ := rt.Accel()
	return rt, a, ""
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
	agent, err := agentBinary(cfg.AgentBin)
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
	warnHostLimits(log, cfg.MaxSandboxes)
	return rt, ""
}

// tasksPerSandbox is about how many kernel tasks (threads and processes)
// one idle gVisor sandbox holds on the host: the sentry's threads, the
// gofer's, and systrap's stub processes (measured: 25–50).
const tasksPerSandbox = 48

// streamSendBuffer is the least host default send buffer with which a
// gVisor sandbox's output streams at full speed: its agent's socket to the
// server is made by gVisor's gofer with net.core.wmem_default, and the
// sentry sends at most that much at a time (measured: dd of 1 GiB at
// 674-855 MiB/s with 1 MiB, 578-631 with the kernel's 208 KiB).
const streamSendBuffer = 1 << 20

// warnHostLimits says when the host's task limit, not memory, would stop
// the server short of --max-sandboxes gVisor sandboxes (every thread counts
// against kernel.pid_max, 32,768 by default without systemd), and when the
// host's default send buffer slows command output.
func warnHostLimits(log *slog.Logger, maxSandboxes int) {
	if pidMax, ok := hostSysctl("kernel/pid_max"); ok && maxSandboxes > 0 && pidMax < maxSandboxes*tasksPerSandbox {
		log.Warn("kernel.pid_max allows fewer gVisor sandboxes than --max-sandboxes; raise it: sysctl -w kernel.pid_max=4194304 (make deps does, persistently)",
			"pid_max", pidMax, "sandboxes_it_allows", pidMax/tasksPerSandbox, "max_sandboxes", maxSandboxes)
	}
	if wmem, ok := hostSysctl("net/core/wmem_default"); ok && wmem < streamSendBuffer {
		log.Warn("net.core.wmem_default is below 1 MiB: command output leaves gVisor sandboxes about a quarter slower; raise it: sysctl -w net.core.wmem_default=1048576 (make deps does, persistently)",
			"wmem_default", wmem)
	}
}

// hostSysctl reads an integer under /proc/sys (a variable: tests give it
// the values of another host).
var hostSysctl = func(name string) (int, bool) {
	b, err := os.ReadFile("/proc/sys/" + name)
	if err != nil {
		return 0, false
	}
	v, err := strconv.Atoi(strings.TrimSpace(string(b)))
	return v, err == nil
}

// agentBinary finds the static space-agent: the flag, beside this binary,
// or on PATH.
func agentBinary(configured string) (string, error) {
	if configured != "" {
		return configured, nil
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
