//go:build linux

package vm

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/spacesandbox/space/internal/runtime"
)

// Template snapshots. The first create of a template (at a given disk,
// memory and vCPU count) boots a VM to readiness and saves it: its disk
// overlay, its RAM file and its device state. Every later create starts
// from that instead of booting: a qcow2 overlay over the snapshot's disk, a
// copy of the RAM file (only its data extents are copied), and QEMU with
// -incoming defer loading the device state. The engine then gives the new
// sandbox its own identity (hostname, entropy, clock), as after any wake.

// snapKey names a snapshot: everything the saved machine depends on — the
// template and resources, and the boot key (kernel, initramfs with the
// agent, QEMU, acceleration), so an upgraded agent or QEMU makes new
// snapshots instead of restoring old agents or device-state formats.
func (r *Runtime) snapKey(spec runtime.Spec) string {
	return fmt.Sprintf("%s-%dM-%dM-%dcpu-%s", strings.TrimPrefix(spec.Template.Digest, "sha256:"),
		spec.Resources.DiskMiB, spec.Resources.MemoryMiB, spec.Resources.VCPUs, r.bootKey)
}

// templateVMPrefix starts the id of a VM booted to make a template snapshot.
const templateVMPrefix = "tpl-"

func (r *Runtime) snapDir(spec runtime.Spec) string {
	return filepath.Join(r.cfg.Dir, "images", r.snapKey(spec)+".snap")
}

// templateSnapshot returns the template's snapshot directory, making it
// first if needed. Errors mean: boot cold instead.
func (r *Runtime) templateSnapshot(ctx context.Context, spec runtime.Spec) (string, error) {
	dir := r.snapDir(spec)
	l := r.images.lock(dir)
	l.Lock()
	defer l.Unlock()
	if _, err := os.Stat(filepath.Join(dir, "vmstate")); err == nil {
		return dir, nil
	}
	start := time.Now()
	// Boot a VM of the template under a private id, then save it.
	tmpl := spec
	tmpl.SandboxID = templateVMPrefix + r.snapKey(spec)[:16] + fmt.Sprintf("-%d", time.Now().UnixNano()%1e6)
	tmpl.Env = nil
	tmpl.SnapshotDir = dir + ".tmp"
	// The template VM goes, whatever happens: Delete ends QEMU and removes
	// its cgroup, directories, sockets and the unfinished snapshot.
	defer r.Delete(context.WithoutCancel(ctx), tmpl)
	os.RemoveAll(tmpl.SnapshotDir)
	if err := r.boot(ctx, tmpl); err != nil {
		return "", fmt.Errorf("boot the template: %w", err)
	}
	if err := r.save(ctx, tmpl); err != nil {
		return "", fmt.Errorf("save the template: %w", err)
	}
	for _, f := range []string{"mem", "disk.qcow2"} {
		if err := os.Rename(filepath.Join(r.sandboxDir(tmpl.SandboxID), f), filepath.Join(tmpl.SnapshotDir, f)); err != nil {
			return "", err
		}
	}
	if err := os.Rename(tmpl.SnapshotDir, dir); err != nil {
		return "", err
	}
	r.log.Info("vm: template snapshot made", "template", spec.Template.Digest, "dir", dir, "duration", time.Since(start).Round(time.Millisecond))
	return dir, nil
}

// fromSnapshot makes a sandbox's disk and RAM from a template snapshot and
// starts it there.
func (r *Runtime) fromSnapshot(ctx context.Context, spec runtime.Spec, snap string) error {
	id := spec.SandboxID
	t0 := time.Now()
	out, err := exec.CommandContext(ctx, r.cfg.QEMUImg, "create", "-q", "-f", "qcow2", "-b", filepath.Join(snap, "disk.qcow2"), "-F", "qcow2",
		r.diskPath(id), fmt.Sprintf("%dM", spec.Resources.DiskMiB)).CombinedOutput()
	if err != nil {
		return fmt.Errorf("create disk overlay: %v: %s", err, strings.TrimSpace(string(out)))
	}
	t1 := time.Now()
	if err := copySparse(filepath.Join(snap, "mem"), r.memPath(id)); err != nil {
		return fmt.Errorf("copy the template's RAM: %w", err)
	}
	t2 := time.Now()
	err = r.load(ctx, spec, filepath.Join(snap, "vmstate"))
	r.log.Debug("vm: created from the template snapshot", "sandbox_id", id, "disk", t1.Sub(t0), "ram_copy", t2.Sub(t1), "load_and_agent", time.Since(t2))
	return err
}

// copySparse copies a file: a reflink where the file system shares blocks
// (XFS, Btrfs), else its data extents only (a RAM file is mostly holes).
func copySparse(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	fi, err := in.Stat()
	if err != nil {
		return err
	}
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	defer out.Close()
	if unix.IoctlFileClone(int(out.Fd()), int(in.Fd())) == nil {
		return out.Close()
	}
	if err := out.Truncate(fi.Size()); err != nil {
		return err
	}
	buf := make([]byte, 1<<20)
	var off int64
	for off < fi.Size() {
		data, err := unix.Seek(int(in.Fd()), off, unix.SEEK_DATA)
		if err != nil {
			if errors.Is(err, unix.ENXIO) {
				break // only a hole is left
			}
			return err
		}
		hole, err := unix.Seek(int(in.Fd()), data, unix.SEEK_HOLE)
		if err != nil {
			return err
		}
		for pos := data; pos < hole; {
			n := min(int64(len(buf)), hole-pos)
			if _, err := in.ReadAt(buf[:n], pos); err != nil && err != io.EOF {
				return err
			}
			if _, err := out.WriteAt(buf[:n], pos); err != nil {
				return err
			}
			pos += n
		}
		off = hole
	}
	return out.Close()
}
