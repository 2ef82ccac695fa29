//go:build linux

package gvisor

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spacesandbox/space/internal/runtime"
)

// cpuQuota reads the CFS quota on a sandbox's cgroup ("-1" or "max": none).
func cpuQuota(t *testing.T, id string) string {
	t.Helper()
	if b, err := os.ReadFile(filepath.Join("/sys/fs/cgroup/space", id, "cpu.max")); err == nil {
		return strings.Fields(string(b))[0]
	}
	b, err := os.ReadFile(filepath.Join("/sys/fs/cgroup/cpu/space", id, "cpu.cfs_quota_us"))
	if err != nil {
		t.Fatalf("no CPU controller for sandbox %s: %v", id, err)
	}
	return strings.TrimSpace(string(b))
}

// A restore runs without the sandbox's CPU limit (cpu.go) and the limit is
// on the sandbox again once it runs: after a wake, in a copy started from a
// snapshot, in the source the snapshot restored in place, and — for a
// server that ended between a restore and the limit — after the next
// server's Recover. The sandbox sees the CPUs it booted with throughout.
func TestRestoredSandboxesAreCPULimited(t *testing.T) {
	open, newSpec := testRuntime(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	r := open()
	online := func(spec runtime.Spec) string {
		t.Helper()
		c, err := r.Agent(ctx, spec)
		if err != nil {
			t.Fatal(err)
		}
		_, b, err := c.ReadFile(ctx, "/sys/devices/system/cpu/online", 0, 100)
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(string(b))
	}
	const limited = "100000" // 1 vCPU of a 100 ms period

	spec := newSpec()
	if err := r.Create(ctx, spec); err != nil {
		t.Fatal(err)
	}
	if q := cpuQuota(t, spec.SandboxID); q != limited {
		t.Fatalf("created: CPU quota %s, want %s", q, limited)
	}
	cpus := online(spec)

	if err := r.Suspend(ctx, spec); err != nil {
		t.Fatal(err)
	}
	if err := r.Restore(ctx, spec); err != nil {
		t.Fatal(err)
	}
	if q := cpuQuota(t, spec.SandboxID); q != limited {
		t.Fatalf("woken: CPU quota %s, want %s", q, limited)
	}
	if got := online(spec); got != cpus {
		t.Fatalf("woken: CPUs online %q, booted with %q", got, cpus)
	}
	if b, err := os.ReadFile(filepath.Join(r.bundleDir(spec.SandboxID), "config.json")); err != nil || !strings.Contains(string(b), `"quota"`) {
		t.Fatalf("the sandbox's own bundle lost its CPU limit: %v", err)
	}

	img := filepath.Join(t.TempDir(), "image")
	if err := r.Snapshot(ctx, spec, img); err != nil {
		t.Fatal(err)
	}
	cp := newSpec()
	if err := r.CreateFrom(ctx, cp, img); err != nil {
		t.Fatal(err)
	}
	for _, s := range []runtime.Spec{spec, cp} {
		if q := cpuQuota(t, s.SandboxID); q != limited {
			t.Fatalf("after the snapshot, sandbox %s: CPU quota %s, want %s", s.SandboxID, q, limited)
		}
	}
	if got := online(cp); got != cpus {
		t.Fatalf("copy: CPUs online %q, source booted with %q", got, cpus)
	}

	// The server ended between a restore and its limit: the next server's
	// Recover puts it on, as does a wake retried on a sandbox it finds
	// restored already.
	unlimit := func(id string) {
		t.Helper()
		os.WriteFile(filepath.Join("/sys/fs/cgroup/cpu/space", id, "cpu.cfs_quota_us"), []byte("-1"), 0)
		os.WriteFile(filepath.Join("/sys/fs/cgroup/space", id, "cpu.max"), []byte("max 100000"), 0)
		if q := cpuQuota(t, id); q == limited {
			t.Fatal("the limit could not be lifted to simulate the ended server")
		}
	}
	unlimit(cp.SandboxID)
	r.Close()
	r = open()
	if st, err := r.Recover(ctx, cp); err != nil || st != runtime.StatusRunning {
		t.Fatalf("recover: %v %v", st, err)
	}
	if q := cpuQuota(t, cp.SandboxID); q != limited {
		t.Fatalf("recovered: CPU quota %s, want %s", q, limited)
	}
	unlimit(spec.SandboxID)
	if err := r.Restore(ctx, spec); err != nil {
		t.Fatalf("wake retried on a sandbox restored already: %v", err)
	}
	if q := cpuQuota(t, spec.SandboxID); q != limited {
		t.Fatalf("wake retried on a sandbox restored already: CPU quota %s, want %s", q, limited)
	}
}
