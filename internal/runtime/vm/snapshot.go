//go:build linux

package vm

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/spacesandbox/space/internal/errdefs"
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

// Live copies (fork, named snapshots): runtime.Snapshotter.

var _ runtime.Snapshotter = (*Runtime)(nil)

// Snapshot saves a running or paused VM into dir and lets it go on: the VM
// is stopped while its device state is written and its RAM file and disk
// overlay are copied (reflinks where the file system shares blocks, else
// only their data extents: the disk overlay holds what the sandbox changed
// over its template, the RAM file the pages the guest touched), then runs
// on in its QEMU from the instant of the save: nothing it did is done
// twice. dir holds vmstate, mem, disk.qcow2 (whose backing file is the
// template's image or snapshot, kept while a snapshot uses the template)
// and the agent's key, so a copy's agent proves itself to its own endpoint.
func (r *Runtime) Snapshot(ctx context.Context, spec runtime.Spec, dir string) (err error) {
	id := spec.SandboxID
	// A paused source runs for the save (its agent must leave first) and
	// is stopped again after; a running one is stopped for the save and
	// runs on after. The marks record which across a crash: a retry may
	// find a paused source running, and must still leave it paused, or a
	// running one stopped, and must still let it run.
	hold := filepath.Join(r.sandboxDir(id), "hold-paused")
	running := filepath.Join(r.sandboxDir(id), "save-running")
	held, wasRunning := exists(hold), exists(running)
	if exists(dir) {
		// Saved already (a retry after a crash).
		if held || wasRunning {
			if err := r.settleAfterSave(ctx, id, held); err != nil {
				return err
			}
		}
		os.Remove(hold)
		os.Remove(running)
		return nil
	}
	if r.qemuPID(id) == 0 {
		return fmt.Errorf("snapshot %s: %w", id, runtime.ErrNotFound)
	}
	q, err := r.qmp(ctx, id)
	if err != nil {
		return fmt.Errorf("snapshot %s: %w", id, err)
	}
	defer q.close()
	if st, err := q.status(ctx); err != nil {
		return fmt.Errorf("snapshot %s: %w", id, err)
	} else if !held && !wasRunning {
		mark := running
		if st == "paused" {
			mark, held = hold, true
		} else {
			wasRunning = true
		}
		if err := os.WriteFile(mark, nil, 0o600); err != nil {
			return err
		}
		if err := fsync(r.sandboxDir(id)); err != nil {
			return err
		}
	}
	tmp := dir + ".tmp"
	os.RemoveAll(tmp)
	if err := os.MkdirAll(tmp, 0o700); err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	was, err := r.leaveAgent(ctx, q, id)
	if err != nil {
		return err
	}
	switch {
	case held:
		was = "paused"
	case wasRunning: // (stopped by a save a crash cut short)
		was = "running"
	}
	t0 := time.Now()
	err = r.copyStopped(ctx, q, id, tmp)
	published := false
	if err == nil && spec.Saved != nil {
		// Complete: a caller that asked starts copies from it while this
		// VM runs on.
		if err = os.Rename(tmp, dir); err == nil {
			if err = fsync(filepath.Dir(dir)); err == nil {
				published = true
				spec.Saved()
			}
		}
	}
	// The VM goes on as it was, in its QEMU.
	bk := context.WithoutCancel(ctx)
	if err != nil {
		q.execute(bk, "migrate_cancel", nil)
	}
	_, cerr := q.execute(bk, "cont", nil)
	if _, eerr := r.endpoint(id); eerr == nil {
		r.reconnectAgent(bk, q, id)
	}
	if err == nil && cerr == nil {
		err = r.waitAgent(ctx, id)
	}
	if was == "paused" {
		q.execute(bk, "stop", nil)
	}
	os.Remove(hold)
	os.Remove(running)
	if err != nil {
		if lowSpace(filepath.Dir(dir)) {
			return errdefs.Wrap(errdefs.InsufficientStorage, err, "not enough disk space to copy the sandbox; it runs on as before")
		}
		return err
	}
	if cerr != nil {
		return cerr
	}
	r.log.Debug("vm: snapshot", "sandbox_id", id, "held", time.Since(t0))
	if published {
		return nil
	}
	if err := os.Rename(tmp, dir); err != nil {
		return err
	}
	return fsync(filepath.Dir(dir))
}

// settleAfterSave leaves a VM whose save a crash cut short after it was
// complete as it was before the save: paused (held), or running, with its
// agent back.
func (r *Runtime) settleAfterSave(ctx context.Context, id string, held bool) error {
	q, err := r.qmp(ctx, id)
	if err != nil {
		return fmt.Errorf("settle %s after its save: %w", id, err)
	}
	defer q.close()
	if held {
		if _, err := q.execute(ctx, "stop", nil); err != nil {
			return fmt.Errorf("pause %s again after its save: %w", id, err)
		}
		return nil
	}
	if st, err := q.status(ctx); err != nil {
		return fmt.Errorf("settle %s after its save: %w", id, err)
	} else if st == "running" {
		return nil
	}
	if _, err := q.execute(ctx, "cont", nil); err != nil {
		return fmt.Errorf("run %s on after its save: %w", id, err)
	}
	if _, err := r.endpoint(id); err == nil {
		r.reconnectAgent(context.WithoutCancel(ctx), q, id)
	}
	return r.waitAgent(ctx, id)
}

// exists reports whether path exists.
func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// copyStopped stops the VM, writes its device state into dir and copies
// its RAM file, disk and agent key there, all flushed. QEMU is left
// stopped.
func (r *Runtime) copyStopped(ctx context.Context, q *qmp, id, dir string) error {
	if err := writeState(ctx, q, filepath.Join(dir, "vmstate")); err != nil {
		return err
	}
	// Stopped and migrated: QEMU has flushed the disk and lets go of it
	// until it runs again, so both files are final.
	for _, f := range []struct{ from, to string }{{r.memPath(id), "mem"}, {r.diskPath(id), "disk.qcow2"}, {filepath.Join(r.sandboxDir(id), "agent.key"), "agent.key"}} {
		to := filepath.Join(dir, f.to)
		if err := copySparse(f.from, to); err != nil {
			if f.to == "agent.key" && errors.Is(err, os.ErrNotExist) {
				continue // a sandbox whose agent is not bound
			}
			return fmt.Errorf("copy %s: %w", f.to, err)
		}
		if err := fsync(to); err != nil {
			return fmt.Errorf("flush %s: %w", f.to, err)
		}
	}
	return fsync(dir)
}

// CreateFrom starts a new sandbox from a Snapshot dir: a copy of its disk
// overlay and RAM file of its own (so nothing it writes reaches the source
// or other copies, and dir may go once it returns), and QEMU loading the
// saved device state. The engine then gives it its own identity.
func (r *Runtime) CreateFrom(ctx context.Context, spec runtime.Spec, dir string) error {
	id := spec.SandboxID
	if _, err := os.Stat(filepath.Join(dir, "vmstate")); err != nil {
		return fmt.Errorf("create %s from %s: %w", id, dir, err)
	}
	if made, err := r.startOver(ctx, id); err != nil {
		return err
	} else if made {
		r.watch(spec)
		return nil
	}
	// A taken image is run in place: once its guest ran, it is no longer
	// the save. ran marks that instant, so that a retry after a crash (one
	// whose VM did not survive to be adopted above) refuses it rather than
	// start from RAM and disk that moved on from the device state.
	var beforeRun func() error
	if spec.TakeImage {
		ran := filepath.Join(dir, "ran-"+id)
		if _, err := os.Stat(ran); err == nil {
			return fmt.Errorf("create %s from %s: an interrupted start already ran its image", id, dir)
		}
		beforeRun = func() error {
			if err := os.WriteFile(ran, nil, 0o600); err != nil {
				return err
			}
			return fsync(dir)
		}
	}
	for _, f := range []struct{ from, to string }{{"mem", r.memPath(id)}, {"disk.qcow2", r.diskPath(id)}, {"agent.key", filepath.Join(r.sandboxDir(id), "agent.key")}} {
		from := filepath.Join(dir, f.from)
		if spec.TakeImage {
			// The image is this copy's alone: its RAM file and disk are
			// linked, not copied (the copy a fork of one would otherwise
			// make twice). Linked, not moved: a retry after a crash finds
			// them where they were.
			err := os.Link(from, f.to)
			switch {
			case err == nil, f.from == "agent.key" && errors.Is(err, os.ErrNotExist):
				continue
			case !errors.Is(err, syscall.EXDEV):
				return fmt.Errorf("take %s: %w", f.from, err)
			} // on another file system: copied
		}
		if err := copySparse(from, f.to); err != nil {
			if f.from == "agent.key" && errors.Is(err, os.ErrNotExist) {
				continue // saved from a sandbox whose agent is not bound
			}
			if lowSpace(r.sandboxDir(id)) {
				return errdefs.Wrap(errdefs.InsufficientStorage, err, "not enough disk space to copy the snapshot")
			}
			return fmt.Errorf("copy %s: %w", f.from, err)
		}
	}
	if err := r.loadThen(ctx, spec, filepath.Join(dir, "vmstate"), beforeRun); err != nil {
		return err
	}
	r.watch(spec)
	return nil
}

// reconnectAgent has QEMU dial the agent's endpoint again at once, unless
// its agent channel is connected already: QEMU's own reconnect timer waits
// a second, and sometimes never fires again after the host closed the
// channel while the VM was stopped; replacing the channel's backend with an
// identical one dials now. Best effort.
func (r *Runtime) reconnectAgent(ctx context.Context, q *qmp, id string) {
	raw, err := q.execute(ctx, "query-chardev", nil)
	if err != nil {
		return
	}
	var devs []struct {
		Label    string `json:"label"`
		Filename string `json:"filename"`
	}
	json.Unmarshal(raw, &devs)
	for _, d := range devs {
		if d.Label == "agent" && !strings.HasPrefix(d.Filename, "disconnected:") {
			return
		}
	}
	_, err = q.execute(ctx, "chardev-change", map[string]any{"id": "agent", "backend": agentBackend(r.agentPath(id))})
	if err != nil {
		r.log.Warn("vm: redial the agent channel", "sandbox_id", id, "err", err)
	}
}

// agentBackend is the QMP form of the agent channel's -chardev option.
func agentBackend(path string) map[string]any {
	return map[string]any{"type": "socket", "data": map[string]any{
		"addr":   map[string]any{"type": "unix", "data": map[string]any{"path": path}},
		"server": false, "reconnect": 1,
	}}
}
