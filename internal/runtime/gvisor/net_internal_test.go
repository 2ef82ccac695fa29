//go:build linux

package gvisor

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spacesandbox/space/internal/runtime"
)

// testNetns makes a network namespace holding one end of a veth pair
// whose other end sits in a second namespace: a sandbox's eth0 that
// reaches nothing beyond the test. It returns the first namespace's path
// and a function that addresses its eth0 (192.0.2.2/30, documentation
// range), as SPACE's network does before a sandbox starts or wakes (runsc
// takes the address off the host's link into its own stack); both
// namespaces go at the end of the test.
func testNetns(t *testing.T) (path string, address func()) {
	t.Helper()
	if _, err := exec.LookPath("ip"); err != nil {
		t.Fatal("ip (iproute2) is needed to build the sandbox's namespace: scripts/install-deps installs it")
	}
	tag := fmt.Sprintf("spacetest-%d", time.Now().UnixNano()%1e9)
	in, out := tag+"-in", tag+"-out"
	ip := func(args ...string) {
		t.Helper()
		if b, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, b)
		}
	}
	ip("netns", "add", in)
	t.Cleanup(func() { exec.Command("ip", "netns", "del", in).Run() })
	ip("netns", "add", out)
	t.Cleanup(func() { exec.Command("ip", "netns", "del", out).Run() })
	ip("link", "add", "eth0", "netns", in, "type", "veth", "peer", "name", "peer0", "netns", out)
	ip("-n", in, "link", "set", "eth0", "up")
	ip("-n", out, "addr", "add", "192.0.2.1/30", "dev", "peer0")
	ip("-n", out, "link", "set", "peer0", "up")
	return filepath.Join("/run/netns", in), func() { ip("-n", in, "addr", "replace", "192.0.2.2/30", "dev", "eth0") }
}

// A networked sandbox's kernel state stays the size it was across wakes.
// runsc made a link's packet processors by GOMAXPROCS, which a restore
// raises by its 128 page-loading threads while it makes the link: every
// woken 1-vCPU sandbox got 130, its next save held them all (an image of
// 417 KB where the first was 230) and its next restore decoded them again.
func TestNetworkedSandboxKeepsItsStateSizeAcrossWakes(t *testing.T) {
	open, newSpec := testRuntime(t)
	r := open()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	spec := newSpec()
	spec.Resources.MemoryMiB = 512
	netns, address := testNetns(t)
	spec.Net = &runtime.Net{Kind: runtime.NetNamespace, Netns: netns}
	address()
	if err := r.Create(ctx, spec); err != nil {
		t.Fatal(err)
	}
	c, err := r.Agent(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	// Pages to load after each restore, so the loader's threads are
	// there while the link is made: with fillMemory's 150 MB of zeros,
	// or 100 MB of random bytes, the old flags grew the state in only
	// some runs; with these, in every run tried (4 of 4, 5 suspends each).
	fillFrom(ctx, t, c, "/dev/urandom", 250000000)
	var sizes []int64
	for i := 0; i < 5; i++ {
		if err := r.Suspend(ctx, spec); err != nil {
			t.Fatalf("suspend %d: %v", i+1, err)
		}
		st, err := os.Stat(filepath.Join(snapshotGen(spec.SnapshotDir), "checkpoint.img"))
		if err != nil {
			t.Fatal(err)
		}
		sizes = append(sizes, st.Size())
		address()
		if err := r.Restore(ctx, spec); err != nil {
			t.Fatalf("wake %d: %v", i+1, err)
		}
	}
	t.Logf("kernel state saved by each suspend: %v bytes", sizes)
	for i, s := range sizes[1:] {
		if s > sizes[0]+sizes[0]/5 {
			t.Errorf("suspend %d after %d wakes saved %d bytes of kernel state, the first %d: the sandbox's state grew with its wakes", i+2, i+1, s, sizes[0])
		}
	}
}
