//go:build linux

package vm_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spacesandbox/space/internal/runtime"
	"github.com/spacesandbox/space/internal/runtime/runtimetest"
	"github.com/spacesandbox/space/internal/runtime/vm"
	"github.com/spacesandbox/space/internal/sandbox"
)

// GuestDir is where scripts/install-deps unpacks the guest kernel.
const guestDir = "/usr/local/lib/space/guest"

// requireVM skips where QEMU or the guest kernel is missing — unless
// SPACE_REQUIRE_VM=1 (CI), where that is a failure, never a silent skip.
func requireVM(t *testing.T) (qemu string) {
	t.Helper()
	fail := runtimetest.Need(t, "SPACE_REQUIRE_VM")
	if os.Geteuid() != 0 {
		fail("the vm runtime needs root (cgroups)")
	}
	qemu, err := exec.LookPath("qemu-system-x86_64")
	if err != nil {
		fail("qemu-system-x86_64 not installed (scripts/install-deps installs it)")
	}
	if _, err := os.Stat(filepath.Join(guestDir, "vmlinuz")); err != nil {
		fail("no guest kernel in %s (scripts/install-deps unpacks it)", guestDir)
	}
	return qemu
}

// The conformance suite on real QEMU microVMs (TCG where KVM cannot boot
// the guest, as on this project's PVM build hosts).
func TestVMConformance(t *testing.T) {
	qemu := requireVM(t)
	agent := runtimetest.BuildAgent(t)
	store, tpl := runtimetest.TestTemplate(t)
	runtimetest.Run(t, func(t *testing.T) runtimetest.Harness {
		dir := t.TempDir()
		var cur *vm.Runtime
		open := func(t *testing.T) runtime.Runtime {
			if cur != nil {
				cur.Close() // as the old server process's death would
			}
			r, err := vm.New(context.Background(), vm.Config{QEMU: qemu, Kernel: filepath.Join(guestDir, "vmlinuz"),
				Modules: filepath.Join(guestDir, "modules"), AgentBin: agent, Dir: dir, Templates: store})
			if err != nil {
				t.Fatal(err)
			}
			cur = r
			return r
		}
		r := open(t)
		t.Logf("vm runtime: %s", r.Capabilities().Detail)
		return runtimetest.Harness{
			Runtime: r, Reopen: open, HasAgent: true, Timeout: 3 * time.Minute,
			Template: sandbox.TemplateRef{Ref: "test:latest", Digest: tpl.Digest},
			AssertGone: func(t *testing.T, spec runtime.Spec) {
				runtimetest.AssertNothingLeft(t, spec.SandboxID, "space-vm", filepath.Join(dir, "sandboxes", spec.SandboxID), "/run/space-vm-*/"+spec.SandboxID)
			},
		}
	})
}

// Starting the runtime drops what it derived from templates the store no
// longer holds, and what an interrupted template-snapshot build left; it
// keeps the images of templates that exist.
func TestPruneDerivedImages(t *testing.T) {
	qemu := requireVM(t)
	agent := runtimetest.BuildAgent(t)
	store, tpl := runtimetest.TestTemplate(t)
	kept := strings.TrimPrefix(tpl.Digest, "sha256:")
	removed := strings.Repeat("ab", 32)
	dir := t.TempDir()
	mk := func(p string, isDir bool) {
		p = filepath.Join(dir, p)
		if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
			t.Fatal(err)
		}
		var err error
		if isDir {
			err = os.MkdirAll(p, 0o700)
		} else {
			err = os.WriteFile(p, []byte("x"), 0o600)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	keep := []string{"images/" + kept + "-1024M.ext4", "images/" + kept + "-1024M-512M-1cpu.snap/"}
	gone := []string{"images/" + removed + "-1024M.ext4", "images/" + removed + "-1024M-512M-1cpu.snap/",
		"images/" + kept + "-2048M-512M-1cpu.snap.tmp/", "sandboxes/tpl-0123456789abcdef-42/"}
	for _, p := range append(append([]string{}, keep...), gone...) {
		mk(strings.TrimSuffix(p, "/"), strings.HasSuffix(p, "/"))
	}
	r, err := vm.New(context.Background(), vm.Config{QEMU: qemu, Kernel: filepath.Join(guestDir, "vmlinuz"),
		Modules: filepath.Join(guestDir, "modules"), AgentBin: agent, Dir: dir, Templates: store, Accel: "tcg"})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	for _, p := range keep {
		if _, err := os.Stat(filepath.Join(dir, p)); err != nil {
			t.Errorf("%s: removed, but its template exists: %v", p, err)
		}
	}
	for _, p := range gone {
		if _, err := os.Stat(filepath.Join(dir, p)); !os.IsNotExist(err) {
			t.Errorf("%s: still there (%v)", p, err)
		}
	}
}

// The bare VM `space bench --baseline` measures SPACE against runs every
// row's work on real QEMU: a cold boot, commands through the guest's agent,
// pause, resume, a save and restore that keep the guest's files, a fork,
// and Close leaves nothing behind.
func TestBare(t *testing.T) {
	qemu := requireVM(t)
	agent := runtimetest.BuildAgent(t)
	store, tpl := runtimetest.TestTemplate(t)
	rootfs, err := store.RootfsPath(tpl.Digest)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	dir := filepath.Join(t.TempDir(), "bare")
	b, err := vm.NewBare(ctx, vm.Config{QEMU: qemu, Kernel: filepath.Join(guestDir, "vmlinuz"),
		Modules: filepath.Join(guestDir, "modules"), AgentBin: agent, Dir: dir}, tpl.Digest, rootfs,
		sandbox.Resources{VCPUs: 1, MemoryMiB: 256, DiskMiB: 512})
	if err != nil {
		t.Fatal(err)
	}
	runtimetest.RunBare(t, ctx, b, dir)
	runtimetest.AssertNothingLeft(t, "bare-vm", "space-vm")
	runtimetest.AssertNothingLeft(t, "bare-vm-fork", "space-vm")
}

// A delete moves the sandbox's files out of its name at once and removes
// them, and its cgroup, in the background; Close waits for that. What a
// server that stopped before the removal left — files moved aside, the
// cgroup they name — the next start removes.
func TestDeleteLeavesRemovalToTheBackgroundAndAStartSweepsIt(t *testing.T) {
	qemu := requireVM(t)
	agent := runtimetest.BuildAgent(t)
	store, _ := runtimetest.TestTemplate(t)
	dir := t.TempDir()
	open := func() *vm.Runtime {
		r, err := vm.New(context.Background(), vm.Config{QEMU: qemu, Kernel: filepath.Join(guestDir, "vmlinuz"),
			Modules: filepath.Join(guestDir, "modules"), AgentBin: agent, Dir: dir, Templates: store, Accel: "tcg"})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	// A sandbox at rest (no QEMU), as a suspended one is: its files, its
	// save, an (empty) cgroup.
	made := func(id string) (runtime.Spec, []string) {
		spec := runtime.Spec{SandboxID: id, SnapshotDir: filepath.Join(dir, "saves", id)}
		files := []string{filepath.Join(dir, "sandboxes", id, "mem"), filepath.Join(spec.SnapshotDir, "vmstate")}
		for _, f := range files {
			if err := os.MkdirAll(filepath.Dir(f), 0o700); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(f, make([]byte, 1<<20), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		cg := filepath.Join(cgroupOf(), id)
		if err := os.MkdirAll(cg, 0o755); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.Remove(cg) })
		return spec, append(files, cg)
	}
	assertGone := func(paths []string) {
		t.Helper()
		for _, p := range paths {
			if _, err := os.Stat(p); !os.IsNotExist(err) {
				t.Errorf("%s: still there (%v)", p, err)
			}
		}
	}
	ended := func() []os.DirEntry {
		ents, err := os.ReadDir(filepath.Join(dir, "ended"))
		if err != nil {
			t.Fatal(err)
		}
		return ents
	}

	r := open()
	spec, paths := made("sbx-deleted")
	if err := r.Delete(context.Background(), spec); err != nil {
		t.Fatal(err)
	}
	assertGone(paths[:2]) // out of the sandbox's name at once
	r.Close()
	assertGone(paths)
	if left := ended(); len(left) != 0 {
		t.Errorf("Close returned with %d deleted sandbox files left", len(left))
	}

	// A server that stopped between a delete and its removal.
	spec, paths = made("sbx-cut")
	left := filepath.Join(dir, "ended", "sbx-cut.ended-1-1")
	if err := os.Rename(filepath.Join(dir, "sandboxes", "sbx-cut"), left); err != nil {
		t.Fatal(err)
	}
	os.RemoveAll(spec.SnapshotDir)
	r = open()
	r.Close()
	assertGone(append(paths, left))
}

// cgroupOf is the parent of the vm runtime's cgroups (v2, or v1's memory
// controller).
func cgroupOf() string {
	if _, err := os.Stat("/sys/fs/cgroup/cgroup.controllers"); err == nil {
		return "/sys/fs/cgroup/space-vm"
	}
	return "/sys/fs/cgroup/memory/space-vm"
}
