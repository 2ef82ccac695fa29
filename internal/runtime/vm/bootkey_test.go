//go:build linux

package vm

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/spacesandbox/space/internal/runtime/runtimetest"
	"github.com/spacesandbox/space/internal/templates"
)

// Template snapshots are keyed by what the saved machine runs: the same
// kernel, agent, QEMU and acceleration give the same key in any data
// directory (so a restart reuses its snapshots); another acceleration (or
// agent) gives another.
func TestBootKeyIsStableAndSpecific(t *testing.T) {
	const guest = "/usr/local/lib/space/guest"
	qemu, err := exec.LookPath("qemu-system-x86_64")
	if _, kerr := os.Stat(filepath.Join(guest, "vmlinuz")); err != nil || kerr != nil {
		if os.Getenv("SPACE_REQUIRE_VM") == "1" {
			t.Fatalf("SPACE_REQUIRE_VM=1 but QEMU or the guest kernel is missing: %v %v", err, kerr)
		}
		t.Skip("QEMU or the guest kernel is missing (scripts/install-deps)")
	}
	agent := runtimetest.BuildAgent(t)
	store, err := templates.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	key := func(accel string) string {
		r, err := New(context.Background(), Config{QEMU: qemu, Kernel: filepath.Join(guest, "vmlinuz"),
			Modules: filepath.Join(guest, "modules"), AgentBin: agent, Dir: t.TempDir(), Templates: store, Accel: accel})
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		return r.bootKey
	}
	a, b, c := key("tcg"), key("tcg"), key("kvm")
	if a == "" || a != b {
		t.Fatalf("boot keys of identical runtimes: %q %q", a, b)
	}
	if a == c {
		t.Fatalf("tcg and kvm share the boot key %q", a)
	}
}
