//go:build linux

package gvisor

import (
	"context"
	"errors"
	"fmt"
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
// can prove itself to its own endpoint.
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
	if _, err := r.runsc(ctx, spec, "checkpoint", "--leave-running", "--image-path", tmp, id); err != nil {
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
	if err := syncDir(tmp); err != nil {
		return fmt.Errorf("sync snapshot: %w", err)
	}
	err = nil
	if spec.Renetwork != nil {
		// runsc took the interface's address over when the sandbox started;
		// a start again needs it back on the interface.
		err = spec.Renetwork(ctx)
	}
	if err == nil {
		err = r.restoreInPlace(ctx, spec, tmp)
	}
	if err != nil {
		// The save is the sandbox now: keep it as its suspend snapshot, so
		// the sandbox is suspended (and wakes from it), never lost.
		gen := fmt.Sprintf("gen-%d", time.Now().UnixNano())
		if os.MkdirAll(spec.SnapshotDir, 0o700) == nil && os.Rename(tmp, filepath.Join(spec.SnapshotDir, gen)) == nil {
			markCurrent(spec.SnapshotDir, gen)
		}
		return fmt.Errorf("restore %s after saving it (it is suspended now): %w", id, err)
	}
	repause()
	if err := os.Rename(tmp, dir); err != nil {
		return err
	}
	return syncDir(filepath.Dir(dir))
}

// restoreInPlace starts sandbox spec again from image (all of it read
// before it returns, so the image may move afterwards).
func (r *Runtime) restoreInPlace(ctx context.Context, spec runtime.Spec, image string) error {
	id := spec.SandboxID
	if _, err := r.endpoint(id); err != nil {
		return err
	}
	if err := r.start(ctx, spec, "restore", "--detach", "--pid-file", r.pidPath(id), "--image-path", image, "--bundle", r.bundleDir(id), id); err != nil {
		return err
	}
	return r.ready(ctx, spec, true)
}

// CreateFrom restores a Snapshot image as a new container: its own bundle
// (hostname, cgroup, agent socket directory, network namespace) and its
// own overlay, so nothing it writes reaches the source or other copies. The
// restore is not --background: every page is read before it returns, so the
// image may go right after.
func (r *Runtime) CreateFrom(ctx context.Context, spec runtime.Spec, dir string) error {
	id := spec.SandboxID
	if _, err := os.Stat(filepath.Join(dir, "checkpoint.img")); err != nil {
		return fmt.Errorf("create %s from %s: %w", id, dir, err)
	}
	if done, err := r.prepare(ctx, spec, dir); done || err != nil {
		return err
	}
	if err := r.start(ctx, spec, "restore", "--detach", "--pid-file", r.pidPath(id), "--image-path", dir, "--bundle", r.bundleDir(id), id); err != nil {
		return err
	}
	return r.ready(ctx, spec, true)
}

func copyFile(from, to string) error {
	b, err := os.ReadFile(from)
	if err != nil {
		return err
	}
	return os.WriteFile(to, b, 0o600)
}
