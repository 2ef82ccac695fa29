//go:build linux

package network

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/spacesandbox/space/internal/network/nettest"
)

// A namespace SPACE pins is still SPACE's to remove after another program's
// first `ip netns add` on the host: the removal leaves no mount of it
// behind (it used to leave the pin hidden under ip's bind of /run/netns,
// holding the namespace until a reboot). The test runs again in a private
// mount namespace of its own, where /run/netns is made a plain directory as
// on a host that has not run `ip netns` yet; nothing it mounts is seen
// outside.
func TestNetnsPinOutlivesIPNetnsAdd(t *testing.T) {
	nettest.Root(t)
	if os.Getenv("SPACE_TEST_NETNS_CHILD") == "" {
		if _, err := exec.LookPath("unshare"); err != nil {
			t.Fatalf("unshare (util-linux) is needed: %v", err)
		}
		cmd := exec.Command("unshare", "--mount", "--propagation", "private", os.Args[0], "-test.run=^TestNetnsPinOutlivesIPNetnsAdd$", "-test.v")
		cmd.Env = append(os.Environ(), "SPACE_TEST_NETNS_CHILD=1")
		out, err := cmd.CombinedOutput()
		if err != nil || !strings.Contains(string(out), "--- PASS: TestNetnsPinOutlivesIPNetnsAdd") {
			t.Fatalf("in a mount namespace of its own: %v\n%s", err, out)
		}
		return
	}
	// The host's /run/netns as a plain directory, without the pins the
	// host's own mounts put there (copies: unmounting them here leaves the
	// host's alone).
	for unix.Unmount(netnsDir, unix.MNT_DETACH) == nil {
	}
	ents, _ := os.ReadDir(netnsDir)
	for _, e := range ents {
		unix.Unmount(filepath.Join(netnsDir, e.Name()), unix.MNT_DETACH)
	}
	suffix := fmt.Sprint(os.Getpid())
	name, other := "netnsdir-test-pin-"+suffix, "netnsdir-test-other-"+suffix
	path := filepath.Join(netnsDir, name)
	pin := func() {
		t.Helper()
		if err := inThread(func() error {
			h, err := netns.NewNamed(name)
			if err == nil {
				h.Close()
			}
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() { removeNetns(path) })
	// A plain directory that pins a namespace already is left plain: a
	// bind now would hide that pin.
	pin()
	if err := shareNetnsDir(); err == nil || mountPoint(t, netnsDir) {
		t.Fatalf("with a namespace pinned in the plain directory: %v, mount point %v; want it left plain, with the reason", err, mountPoint(t, netnsDir))
	}
	if err := removeNetns(path); err != nil {
		t.Fatal(err)
	}
	if err := shareNetnsDir(); err != nil || !mountPoint(t, netnsDir) {
		t.Fatalf("share %s: %v (mount point %v)", netnsDir, err, mountPoint(t, netnsDir))
	}
	pin()
	if out, err := exec.Command("ip", "netns", "add", other).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add: %v: %s", err, out)
	}
	t.Cleanup(func() { exec.Command("ip", "netns", "del", other).Run() })
	if !isNetns(path) {
		t.Fatalf("%s is no namespace after ip netns add", path)
	}
	if err := removeNetns(path); err != nil {
		t.Fatalf("remove the pin after ip netns add: %v", err)
	}
	if mountPoint(t, path) {
		t.Fatalf("%s is still pinned after its removal", path)
	}
}

// mountPoint says whether something is mounted at path in this process's
// mount namespace (hidden under a later mount or not).
func mountPoint(t *testing.T, path string) bool {
	t.Helper()
	mounts, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(mounts), "\n") {
		if f := strings.Fields(line); len(f) > 4 && f[4] == path {
			return true
		}
	}
	return false
}
