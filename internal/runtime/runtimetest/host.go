package runtimetest

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// Need returns how a test reports that this host lacks what it needs: a skip,
// or — when the environment variable env is "1" (CI sets SPACE_REQUIRE_GVISOR
// and SPACE_REQUIRE_VM) — a failure, so a runtime meant to be tested never
// silently did not run.
func Need(t *testing.T, env string) func(format string, args ...any) {
	if os.Getenv(env) == "1" {
		return t.Fatalf
	}
	return t.Skipf
}

// RequireRunsc returns runsc's path, or skips (fails with
// SPACE_REQUIRE_GVISOR=1) where there is no runsc or no root.
func RequireRunsc(t *testing.T) (runsc string, fail func(format string, args ...any)) {
	t.Helper()
	fail = Need(t, "SPACE_REQUIRE_GVISOR")
	if os.Geteuid() != 0 {
		fail("the gvisor runtime needs root")
	}
	runsc, err := exec.LookPath("runsc")
	if err != nil {
		fail("runsc not installed (scripts/install-deps installs it)")
	}
	return runsc, fail
}

// AssertNothingLeft proves nothing of sandbox id is left on the host: no
// process whose command line names it, no mount naming it, no cgroup
// <cgroup>/<id> or <cgroup>/<id>.… (moved aside; v1 or v2 layout), and
// nothing matching the globs (each with the id already in it).
func AssertNothingLeft(t *testing.T, id, cgroup string, globs ...string) {
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
	cg1, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup/*", cgroup, id+"*"))
	cg2, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", cgroup, id+"*"))
	if len(cg1)+len(cg2) > 0 {
		t.Errorf("cgroups left: %v %v", cg1, cg2)
	}
	for _, g := range globs {
		if matches, _ := filepath.Glob(g); len(matches) > 0 {
			t.Errorf("left on the host: %v", matches)
		}
	}
}
