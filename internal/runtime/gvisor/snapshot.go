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

	"github.com/spacesandbox/space/internal/errdefs"
	"github.com/spacesandbox/space/internal/runtime"
)

var _ runtime.Snapshotter = (*Runtime)(nil)

// Snapshot saves a running or paused sandbox and brings it back from the
// save in place: runsc checkpoints it (--leave-running, so a failed save —
// a full disk — leaves it as it was), ends it, and restores it from the
// image under the same id, bundle and network; its processes go on. The
// sandbox is held still for the save and the restore (about a second), not
// left running through the checkpoint: a gVisor sandbox left running by
// `checkpoint --leave-running` can no longer connect to host sockets, so
// its agent could never dial the host again. The image holds memory, kernel
// state and the overlay's files, and the agent's key (host-only), so a copy
// can prove itself to its own endpoint. With spec.Saved the image is
// published in dir as soon as it is complete, before the restore in place,
// so the caller's copies restore beside the source.
func (r *Runtime) Snapshot(ctx context.Context, spec runtime.Spec, dir string) error {
	id := spec.SandboxID
	if err := r.awaitEarlierRunsc(ctx, id); err != nil {
		return err
	}
	if _, err := os.Stat(dir); err == nil {
		return nil // saved already (a retry after a crash)
	}
	st, err := r.state(ctx, spec)
	if err != nil {
		return err
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
	wasPaused := st.Status == "paused"
	if wasPaused {
		// runsc checkpoints running containers.
		if _, err := r.runsc(ctx, spec, "resume", id); err != nil {
			return err
		}
	}
	repause := func() {
		if wasPaused {
			r.runsc(context.WithoutCancel(ctx), spec, "pause", id)
		}
	}
	if err := r.roomToSave(spec, tmp, "copy"); err != nil {
		repause()
		return err
	}
	// From here the sandbox's process is replaced: not a death to report.
	// The agent's endpoint stays as it is (the same socket file): the
	// checkpoint drops the agent's connection and the restored agent dials
	// that socket again (a re-created socket file would not be reached).
	r.exits.Stop(id)
	if _, err := r.runsc(ctx, spec, r.checkpoint("--leave-running", "--image-path", tmp, id)...); err != nil {
		r.watch(ctx, spec, false)
		repause()
		if strings.Contains(err.Error(), "no space left") {
			return errdefs.Wrap(errdefs.InsufficientStorage, err, "not enough disk space to copy the sandbox; it runs on as before")
		}
		return err
	}
	// End it at once: what it does between the save and this delete is
	// done again after the restore (output included), so that window is
	// kept as short as possible.
	if _, err := r.runsc(ctx, spec, "delete", "--force", id); err != nil && !notExist(err) {
		return err
	}
	if err := copyFile(filepath.Join(r.sandboxDir(id), "agent.key"), filepath.Join(tmp, "agent.key")); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("keep agent key: %w", err)
	}
	if err := r.keepAgentRecord(id, tmp); err != nil {
		return err
	}
	if err := syncDir(tmp); err != nil {
		return fmt.Errorf("sync snapshot: %w", err)
	}
	// The image is complete: a caller that asked is told now, so copies
	// restore from it while the source is restored in place beside them
	// (restores only read an image, through links of their own).
	image := tmp
	if spec.Saved != nil {
		if err := os.Rename(tmp, dir); err != nil {
			return err
		}
		if err := syncDir(filepath.Dir(dir)); err != nil {
			return err
		}
		image = dir
		spec.Saved()
	}
	err = nil
	if spec.Renetwork != nil {
		// runsc took the interface's address over when the sandbox started;
		// a start again needs it back on the interface.
		err = spec.Renetwork(ctx)
	}
	if err == nil {
		err = r.restoreInPlace(ctx, spec, image)
	}
	if err != nil {
		// The save is the sandbox now: keep it as its suspend snapshot, so
		// the sandbox is suspended (and wakes from it), never lost. A
		// published image stays where it is for the copies: linked.
		gen := fmt.Sprintf("gen-%d", time.Now().UnixNano())
		keep := func(to string) error { return os.Rename(image, to) }
		if image == dir {
			keep = func(to string) error { return linkImage(image, to) }
		}
		if os.MkdirAll(spec.SnapshotDir, 0o700) == nil && keep(filepath.Join(spec.SnapshotDir, gen)) == nil {
			markCurrent(spec.SnapshotDir, gen)
		}
		return fmt.Errorf("restore %s after saving it (it is suspended now): %w", id, err)
	}
	repause()
	if image == dir {
		return nil
	}
	if err := os.Rename(tmp, dir); err != nil {
		return err
	}
	return syncDir(filepath.Dir(dir))
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
	if done, err := r.prepare(ctx, spec, dir); done || err != nil {
		return err
	}
	return r.restoreFrom(ctx, spec, dir)
}

// restoreImagePrefix names an image a sandbox restored from (in its own
// snapshot directory; not a generation of its suspend state).
const restoreImagePrefix = "restore-"

// restoreFrom starts a prepared sandbox from image with --background: it
// runs once the image's kernel state is loaded, and its memory pages in
// while it runs. The pages are read from the sandbox's own links to the
// image's files (in its snapshot directory, removed at its next checkpoint
// or delete), so image itself may go as soon as this returns.
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
