package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/spacesandbox/space/client"

	"github.com/spacesandbox/space/internal/runtime/gvisor"
)

var (
	gvisorOnce sync.Once
	gvisorWhy  string // why gVisor cannot run here ("" = it can)
)

// gvisorAvailable reports whether the gvisor runtime can run here.
func gvisorAvailable() (bool, string) {
	gvisorOnce.Do(func() {
		runsc, err := exec.LookPath("runsc")
		switch {
		case err != nil:
			gvisorWhy = "runsc is not installed"
		case os.Geteuid() != 0:
			gvisorWhy = "gVisor needs root"
		default:
			if err := gvisor.Probe(context.Background(), runsc); err != nil {
				gvisorWhy = err.Error()
			}
		}
	})
	return gvisorWhy == "", gvisorWhy
}

// vmAvailable reports whether the vm runtime can run here (QEMU, the guest
// kernel, root).
func vmAvailable() (bool, string) {
	switch {
	case os.Geteuid() != 0:
		return false, "the vm runtime needs root"
	}
	if _, err := exec.LookPath("qemu-system-x86_64"); err != nil {
		return false, "qemu-system-x86_64 is not installed"
	}
	if _, err := os.Stat("/usr/local/lib/space/guest/vmlinuz"); err != nil {
		return false, "no guest kernel in /usr/local/lib/space/guest"
	}
	return true, ""
}

// e2eRuntimes lists the runtimes the suites run on here. With
// SPACE_REQUIRE_GVISOR=1 / SPACE_REQUIRE_VM=1 (CI), a runtime missing fails
// the test instead of being skipped.
func e2eRuntimes(t *testing.T) []string {
	rts := []string{"fake"}
	if ok, why := gvisorAvailable(); ok {
		rts = append(rts, "gvisor")
	} else if os.Getenv("SPACE_REQUIRE_GVISOR") == "1" {
		t.Fatalf("SPACE_REQUIRE_GVISOR=1 but gVisor cannot run: %s", why)
	} else {
		t.Logf("gvisor runtime not tested here: %s", why)
	}
	if ok, why := vmAvailable(); ok {
		rts = append(rts, "vm")
	} else if os.Getenv("SPACE_REQUIRE_VM") == "1" {
		t.Fatalf("SPACE_REQUIRE_VM=1 but the vm runtime cannot run: %s", why)
	} else {
		t.Logf("vm runtime not tested here: %s", why)
	}
	return rts
}

// suiteCase is one test of a suite that runs on several runtimes.
type suiteCase struct {
	name string
	fn   func(*testing.T, string)
}

// runOnRuntimes runs suite on each runtime of rts, the runtimes at the
// same time (each on its own server) and the cases of one runtime in
// order. The slowest runtime starts first (vm, which under TCG keeps a
// core busy; then gvisor, whose tests mostly wait; then the fake), so
// with go test's default -parallel (one per core) the others share the
// second core while it runs.
func runOnRuntimes(t *testing.T, rts []string, suite []suiteCase) {
	t.Helper()
	order := map[string]int{"vm": 0, "gvisor": 1, "fake": 2}
	rts = slices.Clone(rts)
	slices.SortStableFunc(rts, func(a, b string) int { return order[a] - order[b] })
	for _, rt := range rts {
		t.Run(rt, func(t *testing.T) {
			t.Parallel()
			for _, tc := range suite {
				t.Run(tc.name, func(t *testing.T) { tc.fn(t, rt) })
			}
		})
	}
}

// requireVM skips (or, in CI, fails) a vm-only test.
func requireVM(t *testing.T) {
	t.Helper()
	if ok, why := vmAvailable(); !ok {
		if os.Getenv("SPACE_REQUIRE_VM") == "1" {
			t.Fatalf("SPACE_REQUIRE_VM=1 but the vm runtime cannot run: %s", why)
		}
		t.Skipf("the vm runtime cannot run here: %s", why)
	}
}

// requireRoot skips (or, in CI, fails) a test that must mount a file system.
func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		if os.Getenv("CI") != "" {
			t.Fatal("CI runs as root, but this test runs without it: it mounts a small file system")
		}
		t.Skip("needs root to mount a small file system")
	}
}

// requireGVisor skips (or, in CI, fails) a gVisor-only test.
func requireGVisor(t *testing.T) {
	t.Helper()
	if ok, why := gvisorAvailable(); !ok {
		if os.Getenv("SPACE_REQUIRE_GVISOR") == "1" {
			t.Fatalf("SPACE_REQUIRE_GVISOR=1 but gVisor cannot run: %s", why)
		}
		t.Skipf("gVisor cannot run here: %s", why)
	}
}

// startRuntimeServer starts a server whose sandboxes run on rt. For gvisor
// it is the production binary with the `test` template built into its
// data directory first.
func startRuntimeServer(t *testing.T, rt string, extra ...string) *server {
	t.Helper()
	return startRuntimeServerEnv(t, rt, nil, extra...)
}

// startRuntimeServerEnv is startRuntimeServer with more environment.
func startRuntimeServerEnv(t *testing.T, rt string, env []string, extra ...string) *server {
	t.Helper()
	if rt == "fake" {
		return startServer(t, serverOpts{args: append([]string{"--runtime", "fake"}, extra...)})
	}
	dataDir := t.TempDir()
	cmd := exec.Command(spaceBin, "template", "build", "test", "--data-dir", dataDir)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build test template: %v\n%s", err, out)
	}
	t.Cleanup(func() { killGVisorLeftovers(dataDir) }) // runs after the server stopped
	s := startServer(t, serverOpts{bin: spaceBin, dataDir: dataDir, template: "test:latest", env: env,
		args: append([]string{"--runtime", rt, "--build-seed=false", "--agent-bin", filepath.Join(filepath.Dir(spaceBin), "space-agent")}, extra...)})
	t.Cleanup(func() { cleanupGVisor(s) }) // runs first, while the server runs
	if rt == "vm" {
		// A server's first create boots the template cold and saves its
		// snapshot: 4 s unloaded here, but under TCG beside the other
		// suites on two cores it was seen to take over a minute (two agent
		// handshakes timed out before the test gave up); the server itself
		// waits its ten-minute operation timeout.
		s.opWait = 3 * time.Minute
	}
	return s
}

// cleanupGVisor leaves nothing of a gvisor server's sandboxes on the host:
// it deletes every sandbox through the API while the server runs (the
// product's own cleanup), then kills any runsc process still naming the data
// directory and removes what runsc could not (its namespace mount, cgroups).
func cleanupGVisor(s *server) {
	if s != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		c := s.client()
		for _, state := range []string{"", "failed"} {
			page, err := c.ListSandboxes(ctx, state, client.ListOptions{Limit: 500})
			if err != nil {
				break
			}
			for _, sb := range page.Items {
				if op, _, err := c.Lifecycle(ctx, "delete", sb.ID, ""); err == nil {
					c.WaitOperation(ctx, op.ID)
				}
			}
		}
	}
}

// killGVisorLeftovers kills runsc processes that mention dataDir and
// releases runsc's namespace mount and the sandboxes' cgroups.
func killGVisorLeftovers(dataDir string) {
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		b, _ := os.ReadFile(p)
		if strings.Contains(string(b), dataDir) && (strings.Contains(string(b), "runsc") || strings.Contains(string(b), "qemu")) {
			var pid int
			fmt.Sscan(filepath.Base(filepath.Dir(p)), &pid)
			if pid > 1 {
				syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	}
	time.Sleep(200 * time.Millisecond) // let the killed processes go
	// Concurrent first runsc starts can each bind the namespace: unmount
	// until nothing is left.
	for i := 0; i < 16; i++ {
		if exec.Command("umount", "-l", filepath.Join(dataDir, "runtime", "gvisor", "runsc", "null-netns")).Run() != nil {
			break
		}
	}
}

func splitLines(s string) []string {
	var out []string
	start := 0
	for i := 0; i <= len(s); i++ {
		if i == len(s) || s[i] == '\n' {
			if i > start {
				out = append(out, s[start:i])
			}
			start = i + 1
		}
	}
	return out
}

// seed:latest is built once per run (its build takes about a minute) into
// the binaries' directory, and each test that needs it gets a copy of the
// template store in a data directory of its own. TestSeedTemplate builds
// it once more and wants the same digest: it tests the build.
var (
	seedOnce   sync.Once
	seedErr    error
	seedOut    []byte // the build's log
	seedDigest string
)

// buildSeed builds seed:latest into dataDir and returns its digest, with
// the build's output for a failure's message.
func buildSeed(dataDir string) (digest string, log []byte, err error) {
	var stderr bytes.Buffer
	cmd := exec.Command(spaceBin, "template", "build", "seed", "--data-dir", dataDir, "--json")
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	log = append(out, stderr.Bytes()...)
	if err != nil {
		return "", log, err
	}
	var tpl struct{ Digest string }
	if err := json.Unmarshal(out, &tpl); err != nil {
		return "", log, err
	}
	if tpl.Digest == "" {
		return "", log, errors.New("the build printed no digest")
	}
	return tpl.Digest, log, nil
}

// sharedSeed builds the run's seed:latest once and returns the data
// directory that holds it and its digest.
func sharedSeed(t *testing.T) (dataDir, digest string) {
	t.Helper()
	cache := filepath.Join(filepath.Dir(spaceBin), "seed-data")
	seedOnce.Do(func() { seedDigest, seedOut, seedErr = buildSeed(cache) })
	if seedErr != nil {
		t.Fatalf("build seed: %v\n%s", seedErr, seedOut)
	}
	return cache, seedDigest
}

// seedDataDir returns a new data directory that holds seed:latest.
func seedDataDir(t *testing.T) string {
	t.Helper()
	cache, _ := sharedSeed(t)
	dataDir := t.TempDir()
	if out, err := exec.Command("cp", "-a", filepath.Join(cache, "templates"), dataDir+"/").CombinedOutput(); err != nil {
		t.Fatalf("copy seed:latest: %v\n%s", err, out)
	}
	return dataDir
}

// startSeedServer starts a production server on rt ("gvisor", "vm" or
// "auto") that creates from seed:latest, in a new data directory.
func startSeedServer(t *testing.T, rt string) *server {
	t.Helper()
	dataDir := seedDataDir(t)
	t.Cleanup(func() { killGVisorLeftovers(dataDir) })
	s := startServer(t, serverOpts{bin: spaceBin, dataDir: dataDir, template: "seed:latest",
		args: []string{"--runtime", rt, "--build-seed=false", "--agent-bin", filepath.Join(filepath.Dir(spaceBin), "space-agent")}})
	t.Cleanup(func() { cleanupGVisor(s) })
	return s
}
