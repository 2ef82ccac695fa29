//go:build linux

package gvisor_test

import (
	"context"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/spacesandbox/space/internal/runtime"
	"github.com/spacesandbox/space/internal/runtime/gvisor"
	"github.com/spacesandbox/space/internal/runtime/runtimetest"
	"github.com/spacesandbox/space/internal/sandbox"
)

// requireGVisor skips where gVisor cannot run — unless SPACE_REQUIRE_GVISOR=1
// (CI), where a missing runsc or root is a failure, never a silent skip.
func requireGVisor(t *testing.T) string {
	t.Helper()
	runsc, fail := runtimetest.RequireRunsc(t)
	if err := gvisor.Probe(context.Background(), runsc); err != nil {
		fail("runsc cannot start a sandbox here: %v", err)
	}
	return runsc
}

func TestGVisorConformance(t *testing.T) {
	runsc := requireGVisor(t)
	agent := runtimetest.BuildAgent(t)
	store, tpl := runtimetest.TestTemplate(t)
	runtimetest.Run(t, func(t *testing.T) runtimetest.Harness {
		dir := t.TempDir()
		// runsc keeps a network-namespace mount in its state directory.
		t.Cleanup(func() { syscall.Unmount(filepath.Join(dir, "runsc", "null-netns"), syscall.MNT_DETACH) })
		open := func(t *testing.T) runtime.Runtime {
			r, err := gvisor.New(gvisor.Config{Runsc: runsc, Dir: dir, AgentBin: agent, Templates: store})
			if err != nil {
				t.Fatal(err)
			}
			return r
		}
		return runtimetest.Harness{
			Runtime: open(t), Reopen: open, HasAgent: true,
			Template: sandbox.TemplateRef{Ref: "test:latest", Digest: tpl.Digest},
			AssertGone: func(t *testing.T, spec runtime.Spec) {
				runtimetest.AssertNothingLeft(t, spec.SandboxID, "space", filepath.Join(dir, "sandboxes", spec.SandboxID))
			},
		}
	})
}

// Bare runs a sandbox with runsc alone through every step `space bench
// --baseline` times, and leaves nothing behind.
func TestBare(t *testing.T) {
	b, dir := newBare(t)
	runtimetest.RunBare(t, context.Background(), b, dir)
}

// newBare readies a bare sandbox of the test template in a directory of
// its own.
func newBare(t *testing.T) (*gvisor.Bare, string) {
	t.Helper()
	runsc := requireGVisor(t)
	store, tpl := runtimetest.TestTemplate(t)
	rootfs, err := store.RootfsPath(tpl.Digest)
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "bare")
	b, err := gvisor.NewBare(runsc, "", dir, rootfs, sandbox.Resources{VCPUs: 1, MemoryMiB: 256, DiskMiB: 256})
	if err != nil {
		t.Fatal(err)
	}
	return b, dir
}

// A bare sandbox runs as SPACE's do, with runsc's netstack over eth0 of a
// namespace of its own (--network sandbox): eth0 has its address after a
// create and again after a wake from the save.
func TestBareNetwork(t *testing.T) {
	b, _ := newBare(t)
	defer b.Close()
	ctx := context.Background()
	addr := func(step string) {
		t.Helper()
		var out strings.Builder
		if err := b.Exec(ctx, &out, "ip", "-4", "addr", "show", "eth0"); err != nil {
			t.Fatalf("%s: %v", step, err)
		}
		if !strings.Contains(out.String(), "198.19.255.2/30") {
			t.Fatalf("%s: eth0 = %q, want 198.19.255.2/30", step, out.String())
		}
	}
	if err := b.Create(ctx); err != nil {
		t.Fatal(err)
	}
	addr("after create")
	if err := b.Suspend(ctx); err != nil {
		t.Fatal(err)
	}
	if err := b.Wake(ctx); err != nil {
		t.Fatal(err)
	}
	addr("after wake")
}
