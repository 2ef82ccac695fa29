//go:build linux

package gvisor_test

import (
	"context"
	"os"
	"os/exec"
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
	fail := t.Skipf
	if os.Getenv("SPACE_REQUIRE_GVISOR") == "1" {
		fail = t.Fatalf
	}
	if os.Geteuid() != 0 {
		fail("the gvisor runtime needs root")
	}
	runsc, err := exec.LookPath("runsc")
	if err != nil {
		fail("runsc not installed (scripts/install-deps installs it)")
	}
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
				assertGone(t, dir, spec.SandboxID)
			},
		}
	})
}

// assertGone proves nothing of a sandbox is left on the host: no process
// naming it, no mount, no cgroup, no directory.
func assertGone(t *testing.T, dir, id string) {
	t.Helper()
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		b, _ := os.ReadFile(p)
		if strings.Contains(string(b), id) {
			t.Errorf("process %s still mentions %s: %q", filepath.Dir(p), id, strings.ReplaceAll(string(b), "\x00", " "))
		}
	}
	if b, _ := os.ReadFile("/proc/self/mountinfo"); strings.Contains(string(b), id) {
		t.Errorf("a mount still mentions %s", id)
	}
	cgroups, _ := filepath.Glob("/sys/fs/cgroup/*/space/" + id)
	cg2, _ := filepath.Glob("/sys/fs/cgroup/space/" + id)
	if len(cgroups)+len(cg2) > 0 {
		t.Errorf("cgroups left: %v %v", cgroups, cg2)
	}
	if matches, _ := filepath.Glob(filepath.Join(dir, "sandboxes", id)); len(matches) > 0 {
		t.Errorf("sandbox directory left: %v", matches)
	}
}
