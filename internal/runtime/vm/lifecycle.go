//go:build linux

package vm

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/spacesandbox/space/internal/errdefs"
	"github.com/spacesandbox/space/internal/procfs"
	"github.com/spacesandbox/space/internal/runtime"
)

// Create makes a sandbox from the template's snapshot (made by booting the
// template once, on its first create), or boots it cold when no snapshot
// can be had. A half-made sandbox is torn down first.
func (r *Runtime) Create(ctx context.Context, spec runtime.Spec) error {
	if err := r.create(ctx, spec); err != nil {
		return err
	}
	r.watch(spec)
	return nil
}

func (r *Runtime) create(ctx context.Context, spec runtime.Spec) error {
	id := spec.SandboxID
	if made, err := r.startOver(ctx, id); made || err != nil {
		return err
	}
	if !r.cfg.NoTemplateSnapshots {
		snap, err := r.templateSnapshot(ctx, spec)
		if err == nil {
			if err = r.fromSnapshot(ctx, spec, snap); err == nil {
				return nil
			}
		}
		r.log.Warn("vm: no template snapshot; booting cold", "sandbox_id", id, "err", err)
		r.reset(ctx, id)
		if err := os.MkdirAll(r.sandboxDir(id), 0o700); err != nil {
			return err
		}
	}
	return r.boot(ctx, spec)
}

// startOver reports a sandbox an earlier attempt made already (its VM runs
// and its agent answers); anything else an earlier attempt left (a QEMU
// still waiting for its incoming state, or never continued) it removes,
// leaving an empty sandbox directory to make the sandbox in.
func (r *Runtime) startOver(ctx context.Context, id string) (made bool, _ error) {
	if r.qemuPID(id) != 0 && r.vmRunning(ctx, id) {
		wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		err := r.waitAgent(wctx, id)
		cancel()
		if err == nil {
			return true, nil
		}
	}
	r.reset(ctx, id)
	return false, os.MkdirAll(r.sandboxDir(id), 0o700)
}

// reset removes whatever an earlier attempt left of a sandbox.
func (r *Runtime) reset(ctx context.Context, id string) {
	r.closeEndpoint(id)
	r.stopQEMU(ctx, id)
	os.RemoveAll(r.sandboxDir(id))
}

// boot makes a sandbox's disk (an overlay over the template's image) and
// empty RAM file and boots it to a ready agent.
func (r *Runtime) boot(ctx context.Context, spec runtime.Spec) error {
	id := spec.SandboxID
	if err := os.MkdirAll(r.sandboxDir(id), 0o700); err != nil {
		return err
	}
	base, err := r.image(ctx, spec)
	if err != nil {
		return err
	}
	out, err := exec.CommandContext(ctx, r.cfg.QEMUImg, "create", "-q", "-f", "qcow2", "-b", base, "-F", "raw",
		r.diskPath(id), fmt.Sprintf("%dM", spec.Resources.DiskMiB)).CombinedOutput()
	if err != nil {
		return fmt.Errorf("create disk overlay: %v: %s", err, strings.TrimSpace(string(out)))
	}
	f, err := os.OpenFile(r.memPath(id), os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	err = f.Truncate(int64(spec.Resources.MemoryMiB) << 20)
	f.Close()
	if err != nil {
		return fmt.Errorf("size the RAM file: %w", err)
	}
	if _, err := r.endpoint(id); err != nil {
		return err
	}
	q, err := r.startQEMU(ctx, spec, false)
	if err != nil {
		return err
	}
	q.close()
	return r.waitAgent(ctx, id)
}

func (r *Runtime) Pause(ctx context.Context, spec runtime.Spec) error {
	return r.runState(ctx, spec, "stop", "paused")
}

// Resume runs a paused VM's vCPUs again. It does not wait for the agent to
// answer (under TCG its first answer after a cont takes milliseconds): the
// agent's connection lives on through the pause, and the next call on it
// waits as any call does.
func (r *Runtime) Resume(ctx context.Context, spec runtime.Spec) error {
	return r.runState(ctx, spec, "cont", "running")
}

// runState sends stop or cont unless the VM is already in want. A pause
// or resume asked for now settles what an interrupted save was to restore
// (Snapshot's hold-paused and save-running).
func (r *Runtime) runState(ctx context.Context, spec runtime.Spec, cmd, want string) error {
	os.Remove(filepath.Join(r.sandboxDir(spec.SandboxID), "hold-paused"))
	os.Remove(filepath.Join(r.sandboxDir(spec.SandboxID), "save-running"))
	q, err := r.qmp(ctx, spec.SandboxID)
	if err != nil {
		return fmt.Errorf("%s: %w", cmd, runtime.ErrNotFound)
	}
	defer q.close()
	if st, err := q.status(ctx); err == nil && st == want {
		return nil
	}
	if _, err := q.execute(ctx, cmd, nil); err != nil {
		return err
	}
	return nil
}

// Suspend saves the device state next to the RAM file and disk, flushes
// them, and ends QEMU.
func (r *Runtime) Suspend(ctx context.Context, spec runtime.Spec) error {
	id := spec.SandboxID
	if r.qemuPID(id) == 0 {
		if _, err := os.Stat(statePath(spec)); err == nil {
			return r.finishSave(spec) // saved already
		}
		return fmt.Errorf("suspend: %w", runtime.ErrNotFound)
	}
	// Saving ends QEMU: not a death to report.
	r.exits.Stop(id)
	err := r.save(ctx, spec)
	if err != nil && r.qemuPID(id) != 0 {
		// A suspend that fails leaves the sandbox running as before.
		os.Remove(statePath(spec)) // not the state: the VM runs on
		os.Remove(savingPath(spec))
		if q, qerr := r.qmp(ctx, id); qerr == nil {
			q.execute(ctx, "migrate_cancel", nil)
			q.execute(ctx, "cont", nil)
			q.close()
		}
		r.endpoint(id)
		r.watch(spec)
		if lowSpace(spec.SnapshotDir) {
			err = errdefs.Wrap(errdefs.InsufficientStorage, err, "not enough disk space to save the sandbox; it runs on as before")
		}
	}
	return err
}

// vmRunning reports whether the sandbox's QEMU answers QMP with its guest
// running.
func (r *Runtime) vmRunning(ctx context.Context, id string) bool {
	q, err := r.qmp(ctx, id)
	if err != nil {
		return false
	}
	defer q.close()
	st, err := q.status(ctx)
	return err == nil && st == "running"
}

// waitEither waits up to d for okPath (true) or failPath (false) to exist.
func waitEither(ctx context.Context, okPath, failPath string, d time.Duration) (bool, error) {
	deadline := time.Now().Add(d)
	for {
		if _, err := os.Stat(okPath); err == nil {
			return true, nil
		}
		if _, err := os.Stat(failPath); err == nil {
			return false, nil
		}
		if time.Now().After(deadline) {
			return false, fmt.Errorf("neither %s nor %s appeared", filepath.Base(okPath), filepath.Base(failPath))
		}
		select {
		case <-ctx.Done():
			return false, ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// lowSpace reports whether dir's file system has (almost) no space left.
func lowSpace(dir string) bool {
	var st syscall.Statfs_t
	return syscall.Statfs(dir, &st) == nil && st.Bavail*uint64(st.Bsize) < 4<<20
}

// save stops the VM, migrates its device state (not its RAM, which is the
// RAM file) to statePath, ends QEMU and flushes RAM file, disk and state.
func (r *Runtime) save(ctx context.Context, spec runtime.Spec) error {
	if err := r.saveUnflushed(ctx, spec); err != nil {
		return err
	}
	return r.flushSave(spec)
}

// saveUnflushed is save up to the end of QEMU.
func (r *Runtime) saveUnflushed(ctx context.Context, spec runtime.Spec) error {
	id := spec.SandboxID
	q, err := r.qmp(ctx, id)
	if err != nil {
		return err
	}
	defer q.close()
	if _, err := r.leaveAgent(ctx, q, id); err != nil {
		return err
	}
	if err := os.MkdirAll(spec.SnapshotDir, 0o700); err != nil {
		return err
	}
	boot, err := procfs.BootID()
	if err != nil {
		return err
	}
	if err := os.WriteFile(savingPath(spec), []byte(boot), 0o600); err != nil {
		return err
	}
	// The device state is complete once stored: it is the sandbox's state
	// before QEMU goes, so a server killed from here on finds the sandbox
	// saved (the RAM file and disk are final: the VM is stopped), and
	// finishes the flush (finishSave).
	if err := writeState(ctx, q, statePath(spec)); err != nil {
		os.Remove(savingPath(spec))
		return err
	}
	q.execute(ctx, "quit", nil)
	r.stopQEMU(ctx, id)
	if err := removeCgroup(id); err != nil {
		r.log.Warn("vm: suspend", "sandbox_id", id, "err", err)
	}
	return nil
}

// savingPath, beside the device state, holds the host's boot id while a
// suspend's RAM file and disk are not yet flushed: written before the
// device state, removed with the flush's last step. A device state found
// with it was saved by a server killed before the flush: in the same boot
// of the host the files are whole in the page cache and the flush is
// finished (finishSave); after a restart of the host they may have lost
// writes, and the save is not trusted.
func savingPath(spec runtime.Spec) string { return statePath(spec) + ".saving" }

// flushSave flushes a suspended sandbox's RAM file and disk, then marks the
// save flushed: savingPath's removal, made durable with the device state's
// name by the directory's fsync.
func (r *Runtime) flushSave(spec runtime.Spec) error {
	for _, p := range []string{r.memPath(spec.SandboxID), r.diskPath(spec.SandboxID)} {
		if err := fsync(p); err != nil {
			return fmt.Errorf("flush %s: %w", filepath.Base(p), err)
		}
	}
	if err := os.Remove(savingPath(spec)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return fsync(spec.SnapshotDir)
}

// savedInEarlierBoot reports whether a suspend's save was left unflushed
// in an earlier boot of the host (savingPath).
func savedInEarlierBoot(spec runtime.Spec) bool {
	b, err := os.ReadFile(savingPath(spec))
	if err != nil {
		return false
	}
	boot, err := procfs.BootID()
	return err == nil && string(b) != boot
}

// finishSave finishes the suspend of a sandbox whose QEMU a killed server
// ended after saving its device state: its files are flushed, unless they
// were left unflushed before the host restarted (then the sandbox is not
// found: its save cannot be trusted).
func (r *Runtime) finishSave(spec runtime.Spec) error {
	if savedInEarlierBoot(spec) {
		return fmt.Errorf("suspend: the save was not flushed before the host restarted: %w", runtime.ErrNotFound)
	}
	if _, err := os.Stat(savingPath(spec)); err != nil {
		return nil // flushed
	}
	r.log.Warn("vm: flushing the save a killed server left unflushed", "sandbox_id", spec.SandboxID)
	return r.flushSave(spec)
}

// leaveAgent closes the agent channel while the guest runs, so the agent
// sees the host leave at a frame boundary and waits for the next hello; it
// returns the run state the VM had. A paused VM runs on for the moment it
// takes; so does one a killed server had already migrated ("postmigrate":
// QEMU will not migrate it again before it runs).
func (r *Runtime) leaveAgent(ctx context.Context, q *qmp, id string) (string, error) {
	st, err := q.status(ctx)
	if err != nil {
		return "", err
	}
	if st == "paused" || st == "postmigrate" {
		if _, err := q.execute(ctx, "cont", nil); err != nil {
			return st, err
		}
	}
	// Held, not just closed: no caller may listen again (and let the
	// agent start a session the save would catch half-way) before the
	// runtime does.
	r.endpoints.Hold(id)
	time.Sleep(20 * time.Millisecond)
	return st, nil
}

// writeState stops the VM and migrates its device state (not its RAM,
// which is the RAM file) into path, which exists only once it is complete
// and flushed. QEMU is left stopped, in "postmigrate" ("cont" runs it on).
func writeState(ctx context.Context, q *qmp, path string) error {
	tmp := path + ".tmp"
	os.Remove(tmp + ".ok")
	os.Remove(tmp + ".fail")
	if err := q.run(ctx, qmpStep{"stop", nil}, ignoreShared,
		// QEMU only knows the pipe took the stream: cat says whether the
		// file did (a full disk), leaving tmp.ok or tmp.fail behind.
		qmpStep{"migrate", map[string]any{"uri": "exec:cat > " + shellQuote(tmp) + " && : > " + shellQuote(tmp+".ok") + " || : > " + shellQuote(tmp+".fail")}}); err != nil {
		return err
	}
	if err := q.waitMigration(ctx); err != nil {
		return err
	}
	ok, err := waitEither(ctx, tmp+".ok", tmp+".fail", 30*time.Second)
	os.Remove(tmp + ".ok")
	os.Remove(tmp + ".fail")
	if err != nil || !ok {
		os.Remove(tmp)
		return fmt.Errorf("write device state: %v (cat failed)", err)
	}
	if err := fsync(tmp); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("flush device state: %w", err)
	}
	return os.Rename(tmp, path)
}

// Restore starts QEMU over the saved RAM file, loads the device state and
// lets it run.
func (r *Runtime) Restore(ctx context.Context, spec runtime.Spec) error {
	if err := r.restore(ctx, spec); err != nil {
		return err
	}
	r.watch(spec)
	return nil
}

// restore is Restore without the exit watch. The saved device state is
// spent once the guest runs, since the guest changes the RAM file and disk
// from then on. It is removed just before the guest runs, so a retry after
// a crash never loads it over files that moved on. A retry finds the QEMU
// a crash cut short: one running is adopted, and one that loaded the state
// and is paused before running is let run (its state file may already be
// gone). Any other QEMU is stopped and the state loaded again.
func (r *Runtime) restore(ctx context.Context, spec runtime.Spec) error {
	id := spec.SandboxID
	state := statePath(spec)
	if r.qemuPID(id) != 0 {
		q, err := r.qmp(ctx, id)
		if err == nil {
			st, _ := q.status(ctx)
			if st == "paused" {
				if _, err := q.execute(ctx, "cont", nil); err == nil {
					st = "running"
				}
			}
			q.close()
			if st == "running" {
				os.Remove(state)
				return r.waitAgent(ctx, id)
			}
		}
		r.stopQEMU(ctx, id) // a restore that died half-way
	}
	if _, err := os.Stat(state); err != nil {
		return fmt.Errorf("restore: no saved state: %w", runtime.ErrNotFound)
	}
	return r.loadThen(ctx, spec, state, func() error {
		if err := os.Remove(state); err != nil {
			return fmt.Errorf("mark the saved state spent: %w", err)
		}
		return fsync(filepath.Dir(state))
	})
}

// load starts QEMU waiting for an incoming migration, feeds it the device
// state in stateFile (RAM is the sandbox's RAM file), lets it run and waits
// for the agent.
func (r *Runtime) load(ctx context.Context, spec runtime.Spec, stateFile string) error {
	return r.loadThen(ctx, spec, stateFile, nil)
}

// loadThen is load calling beforeRun (when set) once the device state is
// in, before the guest runs and so changes its RAM file and disk.
func (r *Runtime) loadThen(ctx context.Context, spec runtime.Spec, stateFile string, beforeRun func() error) error {
	id := spec.SandboxID
	if _, err := r.endpoint(id); err != nil {
		return err
	}
	q, err := r.startQEMU(ctx, spec, true)
	if err != nil {
		return err
	}
	defer q.close()
	if err := q.run(ctx, ignoreShared, qmpStep{"migrate-incoming", map[string]any{"uri": "exec:cat " + shellQuote(stateFile)}}); err != nil {
		return err
	}
	if err := q.waitMigration(ctx); err != nil {
		return err
	}
	if beforeRun != nil {
		if err := beforeRun(); err != nil {
			return err
		}
	}
	t0 := time.Now()
	if _, err := q.execute(ctx, "cont", nil); err != nil {
		return err
	}
	err = r.waitAgent(ctx, id)
	r.log.Debug("vm: loaded", "sandbox_id", id, "agent_after_cont", time.Since(t0))
	return err
}

// Delete ends QEMU and removes its sockets at once; its cgroup and the
// sandbox's files (RAM file, disk overlay, save), moved out of the
// sandbox's name, are removed in the background (aside.go): nothing of the
// sandbox runs any more, and their removal — the cgroup empties only once
// the kernel has torn down QEMU's memory, 10–16 ms here, and a 512 MiB RAM
// file's unlink takes 10–14 ms on a virtual disk — is not the client's wait.
func (r *Runtime) Delete(ctx context.Context, spec runtime.Spec) error {
	return r.delete(ctx, spec, false)
}

// deleteNow is Delete that removes everything before it returns: what a
// bare QEMU user ending a VM and freeing its disk does (Bare).
func (r *Runtime) deleteNow(ctx context.Context, spec runtime.Spec) error {
	return r.delete(ctx, spec, true)
}

func (r *Runtime) delete(ctx context.Context, spec runtime.Spec, now bool) error {
	id := spec.SandboxID
	r.exits.Stop(id)
	r.closeEndpoint(id)
	r.stopQEMU(ctx, id)
	errs := []error{os.RemoveAll(r.socketDir(id))}
	dirs := []string{r.sandboxDir(id)}
	if spec.SnapshotDir != "" {
		dirs = append(dirs, spec.SnapshotDir)
	}
	if now {
		errs = append(errs, removeCgroup(id))
		for _, d := range dirs {
			errs = append(errs, os.RemoveAll(d))
		}
		return errors.Join(errs...)
	}
	var aside []string
	for _, d := range dirs {
		to, err := r.moveAside(id, d)
		errs = append(errs, err)
		if to != "" {
			aside = append(aside, to)
		}
	}
	r.removeLater(id, aside)
	return errors.Join(errs...)
}

// Recover re-adopts a running or paused VM through its QMP socket (QEMU
// reconnects its agent channel to the new listener by itself).
func (r *Runtime) Recover(ctx context.Context, spec runtime.Spec) (runtime.Status, error) {
	id := spec.SandboxID
	if r.qemuPID(id) != 0 {
		q, err := r.qmp(ctx, id)
		if err != nil {
			return runtime.StatusAbsent, fmt.Errorf("qemu runs but QMP does not answer: %w", err)
		}
		st, err := q.status(ctx)
		q.close()
		if err != nil {
			return runtime.StatusAbsent, err
		}
		if _, err := r.endpoint(id); err != nil {
			return runtime.StatusAbsent, err
		}
		switch st {
		case "running":
			r.watch(spec)
			return runtime.StatusRunning, nil
		case "paused":
			r.watch(spec)
			return runtime.StatusPaused, nil
		}
		return runtime.StatusAbsent, fmt.Errorf("qemu is %s", st)
	}
	if _, err := os.Stat(statePath(spec)); err == nil && !savedInEarlierBoot(spec) {
		return runtime.StatusSuspended, nil
	}
	return runtime.StatusAbsent, nil
}

func fsync(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}

func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }
