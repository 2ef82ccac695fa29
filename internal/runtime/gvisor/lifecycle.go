//go:build linux

package gvisor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/spacesandbox/space/internal/runtime"
)

// completeMarker is written into a snapshot directory once a checkpoint
// finished; a directory without it holds no usable snapshot.
const completeMarker = "space-snapshot-complete"

func snapshotComplete(dir string) bool {
	_, err := os.Stat(filepath.Join(dir, completeMarker))
	return err == nil
}

// Create boots a sandbox and waits for its agent. A half-made sandbox of the
// same id (a crash during create) is removed and made again.
func (r *Runtime) Create(ctx context.Context, spec runtime.Spec) error {
	id := spec.SandboxID
	st, err := r.state(ctx, spec)
	if err != nil {
		return err
	}
	if st != nil && st.Status == "running" {
		return r.waitAgent(ctx, id)
	}
	if st != nil {
		if err := r.destroy(ctx, spec); err != nil {
			return err
		}
	}
	rootfs, err := r.cfg.Templates.RootfsPath(spec.Template.Digest)
	if err != nil {
		return fmt.Errorf("template of %s: %w", id, err)
	}
	if err := r.writeBundle(spec, rootfs); err != nil {
		return fmt.Errorf("write bundle: %w", err)
	}
	if _, err := r.endpoint(id); err != nil {
		return err
	}
	if err := r.start(ctx, spec, "run", "--detach", "--bundle", r.bundleDir(id), id); err != nil {
		return err
	}
	return r.waitAgent(ctx, id)
}

// Pause freezes every task of the sandbox.
func (r *Runtime) Pause(ctx context.Context, spec runtime.Spec) error {
	st, err := r.state(ctx, spec)
	if err != nil {
		return err
	}
	switch {
	case st == nil:
		return fmt.Errorf("pause %s: %w", spec.SandboxID, runtime.ErrNotFound)
	case st.Status == "paused":
		return nil
	}
	_, err = r.runsc(ctx, spec, "pause", spec.SandboxID)
	return err
}

// Resume unfreezes a paused sandbox.
func (r *Runtime) Resume(ctx context.Context, spec runtime.Spec) error {
	st, err := r.state(ctx, spec)
	if err != nil {
		return err
	}
	switch {
	case st == nil:
		return fmt.Errorf("resume %s: %w", spec.SandboxID, runtime.ErrNotFound)
	case st.Status == "running":
		return nil
	}
	_, err = r.runsc(ctx, spec, "resume", spec.SandboxID)
	return err
}

// Suspend checkpoints the sandbox (memory, kernel state and the overlay's
// writable layer) into spec.SnapshotDir and removes the running sandbox.
func (r *Runtime) Suspend(ctx context.Context, spec runtime.Spec) error {
	id, dir := spec.SandboxID, spec.SnapshotDir
	st, err := r.state(ctx, spec)
	if err != nil {
		return err
	}
	if st == nil || st.Status == "stopped" {
		if snapshotComplete(dir) {
			if st != nil {
				r.runsc(ctx, spec, "delete", "--force", id)
			}
			r.closeEndpoint(id)
			return nil // already suspended
		}
		return fmt.Errorf("suspend %s: %w", id, runtime.ErrNotFound)
	}
	if st.Status == "paused" {
		if _, err := r.runsc(ctx, spec, "resume", id); err != nil {
			return err
		}
	}
	os.Remove(filepath.Join(dir, completeMarker))
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	if _, err := r.runsc(ctx, spec, "checkpoint", "--image-path", dir, id); err != nil {
		return err
	}
	if err := syncDir(dir); err != nil {
		return fmt.Errorf("sync snapshot: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, completeMarker), nil, 0o600); err != nil {
		return err
	}
	syncDir(dir)
	if _, err := r.runsc(ctx, spec, "delete", "--force", id); err != nil && !notExist(err) {
		return err
	}
	r.closeEndpoint(id)
	return nil
}

// Restore brings a suspended sandbox back from spec.SnapshotDir.
func (r *Runtime) Restore(ctx context.Context, spec runtime.Spec) error {
	id, dir := spec.SandboxID, spec.SnapshotDir
	st, err := r.state(ctx, spec)
	if err != nil {
		return err
	}
	if st != nil && st.Status == "running" {
		return r.waitAgent(ctx, id)
	}
	if st != nil {
		r.runsc(ctx, spec, "delete", "--force", id)
	}
	if !snapshotComplete(dir) {
		return fmt.Errorf("restore %s: no complete snapshot: %w", id, runtime.ErrNotFound)
	}
	if _, err := r.endpoint(id); err != nil {
		return err
	}
	if err := r.start(ctx, spec, "restore", "--detach", "--image-path", dir, "--bundle", r.bundleDir(id), id); err != nil {
		return err
	}
	if err := r.waitAgent(ctx, id); err != nil {
		return err
	}
	// The snapshot is consumed: the sandbox runs again from it.
	clearDir(dir)
	return nil
}

// Delete removes the sandbox's processes, runsc state, cgroup, bundle,
// overlay and socket directory. Absent is success.
func (r *Runtime) Delete(ctx context.Context, spec runtime.Spec) error {
	return r.destroy(ctx, spec)
}

func (r *Runtime) destroy(ctx context.Context, spec runtime.Spec) error {
	id := spec.SandboxID
	r.closeEndpoint(id)
	if st, err := r.state(ctx, spec); err != nil {
		return err
	} else if st != nil {
		if st.Status != "stopped" {
			r.runsc(ctx, spec, "kill", "--all", id, "KILL")
		}
		if _, err := r.runsc(ctx, spec, "delete", "--force", id); err != nil && !notExist(err) {
			return err
		}
	}
	var errs []error
	for _, d := range []string{r.sandboxDir(id), r.socketDir(id), spec.SnapshotDir} {
		if d == "" {
			continue
		}
		if err := os.RemoveAll(d); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func notExist(err error) bool {
	return err != nil && strings.Contains(err.Error(), "not exist")
}

// Recover reports what is on the host and listens for the agent again.
func (r *Runtime) Recover(ctx context.Context, spec runtime.Spec) (runtime.Status, error) {
	st, err := r.state(ctx, spec)
	if err != nil {
		return "", err
	}
	switch {
	case st != nil && st.Status == "running":
		if _, err := r.endpoint(spec.SandboxID); err != nil {
			return "", err
		}
		return runtime.StatusRunning, nil
	case st != nil && st.Status == "paused":
		if _, err := r.endpoint(spec.SandboxID); err != nil {
			return "", err
		}
		return runtime.StatusPaused, nil
	case snapshotComplete(spec.SnapshotDir):
		return runtime.StatusSuspended, nil
	}
	return runtime.StatusAbsent, nil
}

// Stats reports the sandbox's memory and CPU use from runsc.
func (r *Runtime) Stats(ctx context.Context, spec runtime.Spec) (runtime.Stats, error) {
	st, err := r.state(ctx, spec)
	if err != nil {
		return runtime.Stats{}, err
	}
	if st == nil {
		return runtime.Stats{}, runtime.ErrNotFound
	}
	out, err := r.runsc(ctx, spec, "events", "--stats", spec.SandboxID)
	if err != nil {
		return runtime.Stats{}, nil // stats are best effort (a paused sandbox may not answer)
	}
	var ev struct {
		Data struct {
			CPU struct {
				Usage struct {
					Total uint64 `json:"total"`
				} `json:"usage"`
			} `json:"cpu"`
			Memory struct {
				Usage struct {
					Usage uint64 `json:"usage"`
				} `json:"usage"`
			} `json:"memory"`
		} `json:"data"`
	}
	json.Unmarshal(out, &ev)
	return runtime.Stats{MemoryBytes: ev.Data.Memory.Usage.Usage, CPUSeconds: float64(ev.Data.CPU.Usage.Total) / 1e9}, nil
}

func syncDir(dir string) error {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range ents {
		if f, err := os.Open(filepath.Join(dir, e.Name())); err == nil {
			f.Sync()
			f.Close()
		}
	}
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

func clearDir(dir string) {
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		os.RemoveAll(filepath.Join(dir, e.Name()))
	}
}
