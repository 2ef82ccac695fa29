package runtimetest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
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
// mount naming it and nothing matching the globs (each with the id already
// in it) once its delete returned, and within TeardownBound no process
// whose command line names it and no cgroup <cgroup>/<id> or
// <cgroup>/<id>.… (moved aside; v1 or v2 layout). A delete ends a
// sandbox's processes and leaves their teardown — memory given back,
// threads ended, cgroups removed once empty — to the background.
func AssertNothingLeft(t *testing.T, id, cgroup string, globs ...string) {
	t.Helper()
	if b, _ := os.ReadFile("/proc/self/mountinfo"); strings.Contains(string(b), id) {
		t.Errorf("a mount still mentions %s", id)
	}
	for _, g := range globs {
		if matches, _ := filepath.Glob(g); len(matches) > 0 {
			t.Errorf("left on the host: %v", matches)
		}
	}
	deadline := time.Now().Add(TeardownBound)
	for {
		left := ProcessesAndCgroups(id, cgroup)
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("still on the host %v after the delete: %s", TeardownBound, strings.Join(left, "; "))
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TeardownBound is how long a deleted sandbox's processes and cgroups may
// take to go (its teardown runs in the background).
const TeardownBound = 10 * time.Second

// ProcessesAndCgroups lists the processes whose command line names id and
// the cgroups <cgroup>/<id>* (v1 or v2 layout).
func ProcessesAndCgroups(id, cgroup string) []string {
	var left []string
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		b, _ := os.ReadFile(p)
		if strings.Contains(string(b), id) {
			left = append(left, fmt.Sprintf("process %s: %q", filepath.Dir(p), strings.ReplaceAll(string(b), "\x00", " ")))
		}
	}
	cg1, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup/*", cgroup, id+"*"))
	cg2, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", cgroup, id+"*"))
	for _, cg := range append(cg1, cg2...) {
		left = append(left, "cgroup "+cg)
	}
	return left
}
