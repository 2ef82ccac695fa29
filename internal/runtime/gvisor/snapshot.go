//go:build linux

package gvisor

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spacesandbox/space/internal/agentclient"
	"github.com/spacesandbox/space/internal/errdefs"
	"github.com/spacesandbox/space/internal/procfs"
	"github.com/spacesandbox/space/internal/runtime"
)

var _ runtime.Snapshotter = (*Runtime)(nil)

// Snapshot saves a running or paused sandbox, which runs on: runsc
// checkpoints it with --leave-running (a failed save — a full disk — leaves
// it as it was), and its processes go on from the instant of the save. The
// save closes the agent's host connection without the agent hearing of it
// (gVisor drops host sockets at a checkpoint and wakes no one), so the host
// sends SIGCONT and the agent dials again (agent.ServeUnix). A sandbox whose
// agent predates that, or does not come back, is instead ended and restored
// from the save in place under the same id, bundle and network (about a
// second; what it did after the save is done again). The image holds
// memory, kernel state and the overlay's files, and the agent's key
// (host-only), so a copy can prove itself to its own endpoint. With
// spec.Saved the image is published in dir as soon as it is complete, so the
// caller's copies restore beside the source.
func (r *Runtime) Snapshot(ctx context.Context, spec runtime.Spec, dir string) error {
	id := spec.SandboxID
	t0 := time.Now()
	if err := r.awaitEarlierRunsc(ctx, id); err != nil {
		return err
	}
	// A paused source runs for the save (runsc checkpoints running
	// containers) and is paused again after. hold records that across a
	// crash: a retry finds it running and must still leave it paused.
	hold := r.holdPausedMark(id)
	_, herr := os.Stat(hold)
	held := herr == nil
	if _, err := os.Stat(dir); err == nil {
		if savedThisBoot(dir) {
			// Saved already: a retry after a crash. One between the save
			// and the agent's redial left the agent waiting on a
			// connection the save closed; tell it to look (it changes
			// nothing otherwise).
			r.signal(ctx, id, r.redialSignal)
			if held {
				if err := r.pauseAfterSave(ctx, spec); err != nil {
					return fmt.Errorf("pause %s again after its save: %w", id, err)
				}
				os.Remove(hold)
			}
			return nil
		}
		// An ephemeral save from before the host restarted: its pages may
		// never have reached the disk. Not to be trusted (and its source
		// did not live through the restart either).
		if err := os.RemoveAll(dir); err != nil {
			return err
		}
	}
	// A sandbox surely running (the common case) is not asked about
	// through runsc (a process start, 10 ms): a checkpoint that fails
	// looks properly.
	st := &containerState{Status: "running"}
	if !r.surelyRunning(id) {
		var err error
		if st, err = r.state(ctx, spec); err != nil {
			return err
		}
	}
	if st == nil || (st.Status != "running" && st.Status != "paused") {
		return fmt.Errorf("snapshot %s: %w", id, runtime.ErrNotFound)
	}
	tmp := dir + ".tmp"
	os.RemoveAll(tmp)
	if err := os.MkdirAll(tmp, 0o700); err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	how, err := r.frozen(ctx, spec, st)
	if err != nil {
		return err
	}
	wasPaused := how != "" || held
	if how != "" {
		if !held {
			if err := os.WriteFile(hold, nil, 0o600); err != nil {
				return fmt.Errorf("hold mark of %s: %w", id, err)
			}
			if err := syncDir(r.sandboxDir(id)); err != nil {
				return err
			}
		}
		// runsc checkpoints running containers.
		if err := r.resumeSandbox(ctx, spec); err != nil {
			return err
		}
	}
	repause := func() {
		if wasPaused {
			r.pauseSandbox(context.WithoutCancel(ctx), spec)
			os.Remove(hold)
		}
	}
	if err := r.roomToSave(spec, tmp, "copy"); err != nil {
		repause()
		return err
	}
	// A sandbox whose agent dials again when told runs on through the save:
	// its processes go on from the instant of the save. Otherwise its
	// process is replaced (ended and restored from the save). The agent's
	// endpoint stays as it is (the same socket file): the checkpoint drops
	// the agent's connection and the agent dials that socket again (a
	// re-created socket file would not be reached).
	agent := r.redialingAgent(ctx, id)
	restart := agent == nil
	t1 := time.Now()
	var mem cgroupMemory
	cached := false
	if spec.Ephemeral {
		mem, cached = throughCache(id)
	}
	stopFlush := func() {}
	if !spec.Ephemeral {
		stopFlush = flushWhileWritten(tmp) // sealSave's fsync then has only the tail
	}
	_, err = r.runsc(ctx, spec, r.checkpoint(cached, "--leave-running", "--image-path", tmp, id)...)
	stopFlush()
	if err != nil {
		repause()
		if strings.Contains(err.Error(), "no space left") {
			return errdefs.Wrap(errdefs.InsufficientStorage, err, "not enough disk space to copy the sandbox; it runs on as before")
		}
		if st, serr := r.state(ctx, spec); serr == nil && (st == nil || (st.Status != "running" && st.Status != "paused")) {
			return fmt.Errorf("snapshot %s: %w", id, errors.Join(runtime.ErrNotFound, err))
		}
		return err
	}
	if restart {
		// End it at once: what it does between the save and this delete is
		// done again after the restore (output included), so that window is
		// kept as short as possible.
		if err := r.endForRestart(ctx, spec); err != nil {
			return err
		}
	}
	if err := copyFile(filepath.Join(r.sandboxDir(id), "agent.key"), filepath.Join(tmp, "agent.key")); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("keep agent key: %w", err)
	}
	if err := r.keepAgentRecord(id, tmp); err != nil {
		return err
	}
	if cached {
		if err := markCached(tmp); err != nil {
			return err
		}
	}
	if err := sealSave(tmp, spec.Ephemeral); err != nil {
		return fmt.Errorf("seal the save: %w", err)
	}
	// The image is complete: a caller that asked is told now, so copies
	// restore from it while the source gets its agent back (or is restored
	// in place) beside them (restores only read an image, through links of
	// their own).
	image := tmp
	if spec.Saved != nil {
		if err := publish(tmp, dir, spec.Ephemeral); err != nil {
			return err
		}
		image = dir
		spec.Saved()
	}
	r.log.Debug("gvisor: saved", "sandbox_id", id, "cached", cached, "usage_mib", mem.usage>>20, "shmem_mib", mem.shmem>>20, "before", t1.Sub(t0), "checkpoint", time.Since(t1))
	if !restart {
		if err := r.redial(ctx, spec, agent); err != nil {
			// Unreachable as it is: the save is what it was a moment ago.
			r.log.Warn("gvisor: the agent did not dial again after the save; restoring the sandbox from it", "sandbox_id", id, "err", err)
			if err := r.endForRestart(ctx, spec); err != nil {
				return err
			}
			restart = true
		}
	}
	if restart {
		if err := r.restartFrom(ctx, spec, image, dir); err != nil {
			return err
		}
	}
	repause()
	if image == dir {
		return nil
	}
	return publish(tmp, dir, spec.Ephemeral)
}

// pauseAfterSave pauses again a source whose save a crash cut short after
// it was complete. One still running gets its agent back first, so that it
// is not frozen between the save's close of its connection and its redial.
func (r *Runtime) pauseAfterSave(ctx context.Context, spec runtime.Spec) error {
	how, err := r.frozen(ctx, spec, nil)
	if err != nil || how != "" {
		return err
	}
	wctx, cancel := context.WithTimeout(ctx, r.redialWait)
	r.waitAgent(wctx, spec.SandboxID)
	cancel()
	return r.pauseSandbox(ctx, spec)
}

// ephemeralMark, in an ephemeral save, holds the host's boot id: such a
// save is sealed without an fsync, so after a host restart it may be
// incomplete on disk.
const ephemeralMark = "ephemeral.boot"

// sealSave makes a complete save in dir durable, or, if ephemeral, marks
// it with the host's boot instead.
func sealSave(dir string, ephemeral bool) error {
	if !ephemeral {
		return syncDir(dir)
	}
	boot, err := procfs.BootID()
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, ephemeralMark), []byte(boot), 0o600)
}

// publish moves a sealed save from tmp to dir (durably, unless ephemeral).
func publish(tmp, dir string, ephemeral bool) error {
	if err := os.Rename(tmp, dir); err != nil {
		return err
	}
	if ephemeral {
		return nil
	}
	return syncDir(filepath.Dir(dir))
}

// ephemeralSave reports whether the save in dir is ephemeral (a fork's).
func ephemeralSave(dir string) bool {
	_, err := os.Stat(filepath.Join(dir, ephemeralMark))
	return err == nil
}

// savedThisBoot reports whether the save in dir can be trusted: a durable
// one, or an ephemeral one made since the host last started.
func savedThisBoot(dir string) bool {
	b, err := os.ReadFile(filepath.Join(dir, ephemeralMark))
	if errors.Is(err, os.ErrNotExist) {
		return true
	}
	boot, berr := procfs.BootID()
	return err == nil && berr == nil && string(b) == boot
}

// redialingAgent returns the client of the sandbox's agent if that agent
// dials again when SIGCONT finds its connection gone (proto.Hello.Redials;
// agents older than that do not), else nil.
func (r *Runtime) redialingAgent(ctx context.Context, id string) *agentclient.Client {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	c, err := r.endpoints.Client(ctx, id)
	if err != nil || !c.Hello().Redials {
		return nil
	}
	return c
}

// redial gets back the agent of a sandbox a checkpoint left running: the
// save closed its host connection (old) without the agent hearing of it,
// so it is told with a signal to look, and dials again.
func (r *Runtime) redial(ctx context.Context, spec runtime.Spec, old *agentclient.Client) error {
	ctx, cancel := context.WithTimeout(ctx, r.redialWait)
	defer cancel()
	select {
	case <-old.Done():
	case <-ctx.Done():
		return errors.New("its connection stayed open through the save")
	}
	if err := r.signal(ctx, spec.SandboxID, r.redialSignal); err != nil {
		return fmt.Errorf("signal the agent: %w", err)
	}
	return r.waitAgent(ctx, spec.SandboxID)
}

// endForRestart ends the sandbox's process so that restartFrom starts it
// again from its save: not a death to report.
func (r *Runtime) endForRestart(ctx context.Context, spec runtime.Spec) error {
	r.exits.Stop(spec.SandboxID)
	if _, err := r.runsc(ctx, spec, "delete", "--force", spec.SandboxID); err != nil && !notExist(err) {
		return err
	}
	return nil
}

// restartFrom starts the source of a save again from its image, under the
// same id, bundle and network. If that fails the save is the sandbox now:
// it is kept as its suspend snapshot, made durable first (a fork's save was
// not), so the sandbox is suspended (and wakes from it), never lost. An
// image published in dir stays where it is for the copies (linked).
func (r *Runtime) restartFrom(ctx context.Context, spec runtime.Spec, image, dir string) error {
	var err error
	if spec.Renetwork != nil {
		// runsc took the interface's address over when the sandbox started;
		// a start again needs it back on the interface.
		err = spec.Renetwork(ctx)
	}
	if err == nil {
		err = r.restoreInPlace(ctx, spec, image)
	}
	if err != nil {
		gen := fmt.Sprintf("gen-%d", time.Now().UnixNano())
		keep := func(to string) error { return os.Rename(image, to) }
		if image == dir {
			keep = func(to string) error { return linkImage(image, to) }
		}
		kept := filepath.Join(spec.SnapshotDir, gen)
		if os.MkdirAll(spec.SnapshotDir, 0o700) == nil && keep(kept) == nil && syncDir(kept) == nil {
			markCurrent(spec.SnapshotDir, gen)
		}
		return fmt.Errorf("restore %s after saving it (it is suspended now): %w", spec.SandboxID, err)
	}
	return nil
}

// restoreInPlace starts sandbox spec again from image, which may move or
// go once it returns.
func (r *Runtime) restoreInPlace(ctx context.Context, spec runtime.Spec, image string) error {
	if _, err := r.endpoint(spec.SandboxID); err != nil {
		return err
	}
	// What an earlier restore of this sandbox paged in from is no longer
	// read: that sandbox was ended.
	if ents, err := os.ReadDir(spec.SnapshotDir); err == nil {
		for _, e := range ents {
			if strings.HasPrefix(e.Name(), restoreImagePrefix) {
				os.RemoveAll(filepath.Join(spec.SnapshotDir, e.Name()))
			}
		}
	}
	return r.restoreFrom(ctx, spec, image)
}

// CreateFrom restores a Snapshot image as a new container: its own bundle
// (hostname, cgroup, agent socket directory, network namespace) and its
// own overlay, so nothing it writes reaches the source or other copies.
func (r *Runtime) CreateFrom(ctx context.Context, spec runtime.Spec, dir string) error {
	id := spec.SandboxID
	if _, err := os.Stat(filepath.Join(dir, "checkpoint.img")); err != nil {
		return fmt.Errorf("create %s from %s: %w", id, dir, err)
	}
	if _, ok := r.prepared.LoadAndDelete(id); !ok {
		if done, err := r.prepare(ctx, spec, dir); done || err != nil {
			return err
		}
	}
	return r.restoreFrom(ctx, spec, dir)
}

var _ runtime.CopyPreparer = (*Runtime)(nil)

// PrepareCopy does a copy's `runsc create` while its source is being
// saved: the sandbox process, its gofer and the sentry's boot (about 75 ms
// here) are then done when the image is complete, and the copy's `runsc
// restore` only loads it (about 145 ms instead of 210 for 200 MiB). The
// copy's bundle is made as CreateFrom makes it, with the agent and key of
// the source's own record (the save copies those). A copy found running
// or created already (a fork resumed after a restart) is kept.
func (r *Runtime) PrepareCopy(ctx context.Context, spec, source runtime.Spec) error {
	id := spec.SandboxID
	t0 := time.Now()
	if _, err := os.Stat(r.sandboxDir(id)); err == nil {
		st, err := r.state(ctx, spec)
		if err != nil {
			return err
		}
		if st != nil && (st.Status == "created" || st.Status == "running") {
			if st.Status == "created" {
				r.prepared.Store(id, true)
			}
			return nil
		}
	}
	if done, err := r.prepare(ctx, spec, r.sandboxDir(source.SandboxID)); done || err != nil {
		return err
	}
	bundle, err := r.restoreBundle(id)
	if err != nil {
		return err
	}
	if err := r.start(ctx, spec, "create", "--pid-file", r.pidPath(id), "--bundle", bundle, id); err != nil {
		return fmt.Errorf("create %s for its image: %w", id, err)
	}
	r.prepared.Store(id, true)
	r.log.Debug("gvisor: copy prepared", "sandbox_id", id, "took", time.Since(t0))
	return nil
}

// restoreImagePrefix names an image a sandbox restored from (in its own
// snapshot directory; not a generation of its suspend state).
const restoreImagePrefix = "restore-"

// restoreFrom starts a prepared sandbox from image with --background: it
// runs once the image's kernel state is loaded, and its memory pages in
// while it runs. The pages are read from the sandbox's own links to the
// image's files (in its snapshot directory, removed at its next checkpoint
// or delete), so image itself may go as soon as this returns. The links to
// an ephemeral image go as soon as runsc has opened it (when its restore
// returns): the sandbox reads its pages through the open file, and once
// every copy has, the image (removed by its fork) is gone from the page
// cache without having been written to the disk.
func (r *Runtime) restoreFrom(ctx context.Context, spec runtime.Spec, image string) error {
	id := spec.SandboxID
	t0 := time.Now()
	own := filepath.Join(spec.SnapshotDir, fmt.Sprintf("%s%d", restoreImagePrefix, time.Now().UnixNano()))
	if err := linkImage(image, own); err != nil {
		return fmt.Errorf("link the image: %w", err)
	}
	t1 := time.Now()
	if err := r.restore(ctx, spec, own, r.pidPath(id)); err != nil {
		return err
	}
	if ephemeralSave(own) {
		os.RemoveAll(own)
	}
	t2 := time.Now()
	err := r.ready(ctx, spec, true)
	r.log.Debug("gvisor: restored", "sandbox_id", id, "link", t1.Sub(t0), "runsc_restore", t2.Sub(t1), "agent", time.Since(t2))
	return err
}

// linkImage makes dir hold hard links to the files of image (copies where
// links cannot be made): checkpoint images are never written again, so
// links share them safely and cost nothing.
func linkImage(image, dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	ents, err := os.ReadDir(image)
	if err != nil {
		return err
	}
	for _, e := range ents {
		if !e.Type().IsRegular() {
			continue
		}
		from, to := filepath.Join(image, e.Name()), filepath.Join(dir, e.Name())
		if err := os.Link(from, to); err != nil {
			if err := copyFile(from, to); err != nil {
				return err
			}
		}
	}
	return nil
}

func copyFile(from, to string) error {
	in, err := os.Open(from)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(to, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
