//go:build linux

package gvisor

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"

	"github.com/spacesandbox/space/internal/runtime"
	"github.com/spacesandbox/space/internal/sandbox"
)

// Bare is one sandbox run by runsc alone — the floor `space bench
// --baseline` compares SPACE with: the same runsc, platform, global flags,
// OCI bundle (mounts, limits, namespaces) and template root file system as
// SPACE's sandboxes, with `sleep infinity` as init instead of the agent,
// and a network namespace laid out as SPACE's (bareNet), made once: runsc
// runs it with --network sandbox, SPACE's flag, and its start and restore
// set up the same netstack. Commands run by `runsc exec` with their stdio
// on host pipes, as a user of bare gVisor would run them.
type Bare struct {
	r      *Runtime
	spec   runtime.Spec
	dir    string
	rootfs string
	// net is the sandbox's namespace, copy the one of its copies (a
	// fork's copy runs beside it); both addresses are the benchmark
	// range's, seen by no host.
	net, copy *bareNet
}

// NewBare readies a bare sandbox of the template root rootfs with the given
// resources; its bundle, runsc state and checkpoints live under dir, which
// Close removes.
func NewBare(runsc, platform, dir, rootfs string, res sandbox.Resources) (*Bare, error) {
	if platform == "" {
		platform = "systrap"
	}
	r := &Runtime{cfg: Config{Runsc: runsc, Dir: dir, SocketDir: filepath.Join(dir, "s"), Templates: runtime.FixedTemplate(rootfs), Platform: platform}, direct: directIO(dir), moveCgroup: os.Rename}
	for _, d := range []string{filepath.Join(dir, "runsc"), r.cfg.SocketDir} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("bare gvisor: %w", err)
		}
	}
	b := &Bare{r: r, dir: dir, rootfs: rootfs, spec: runtime.Spec{SandboxID: "bare", Resources: res, SnapshotDir: filepath.Join(dir, "checkpoint")}}
	var err error
	if b.net, err = newBareNet(filepath.Join(dir, "netns"), netip.MustParsePrefix("198.19.255.2/30"), netip.MustParseAddr("198.19.255.1")); err != nil {
		b.Close()
		return nil, err
	}
	if b.copy, err = newBareNet(filepath.Join(dir, "netns-copy"), netip.MustParsePrefix("198.19.255.6/30"), netip.MustParseAddr("198.19.255.5")); err != nil {
		b.Close()
		return nil, err
	}
	b.spec.Net = b.net.spec()
	if err := r.writeBundle(b.spec, rootfs, ""); err != nil {
		b.Close()
		return nil, fmt.Errorf("bare gvisor: bundle: %w", err)
	}
	return b, nil
}

// Create runs the sandbox (runsc run --detach) and its first command
// (runsc exec true): the work SPACE's create does before its operation
// succeeds.
func (b *Bare) Create(ctx context.Context) error {
	if err := b.net.configure(); err != nil {
		return err
	}
	if err := b.r.start(ctx, b.spec, "run", "--detach", "--bundle", b.r.bundleDir(b.spec.SandboxID), b.spec.SandboxID); err != nil {
		return err
	}
	return b.Exec(ctx, io.Discard, "true")
}

// Exec runs argv in the sandbox with runsc exec, its stdout copied to w
// through a host pipe, and waits for it to exit (non-zero is an error).
func (b *Bare) Exec(ctx context.Context, w io.Writer, argv ...string) error {
	return b.exec(ctx, b.spec, w, argv...)
}

func (b *Bare) exec(ctx context.Context, spec runtime.Spec, w io.Writer, argv ...string) error {
	args := append(b.r.globalFlags(spec), append([]string{"exec", spec.SandboxID}, argv...)...)
	cmd := exec.CommandContext(ctx, b.r.cfg.Runsc, args...)
	cmd.Stdout = w
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("runsc exec %v: %w", argv, err)
	}
	return nil
}

// Pause and Resume are runsc pause and resume.
func (b *Bare) Pause(ctx context.Context) error  { return b.r.freeze(ctx, b.spec, "pause", "paused") }
func (b *Bare) Resume(ctx context.Context) error { return b.r.freeze(ctx, b.spec, "resume", "running") }

// Suspend saves the sandbox to disk and ends it: runsc checkpoint, then
// delete (what SPACE's suspend does, without its bookkeeping).
func (b *Bare) Suspend(ctx context.Context) error {
	os.RemoveAll(b.spec.SnapshotDir)
	if err := os.MkdirAll(b.spec.SnapshotDir, 0o700); err != nil {
		return err
	}
	if _, err := b.r.runsc(ctx, b.spec, b.r.checkpoint(false, "--image-path", b.spec.SnapshotDir, b.spec.SandboxID)...); err != nil {
		return err
	}
	_, err := b.r.runsc(ctx, b.spec, "delete", "--force", b.spec.SandboxID)
	return err
}

// Wake restores the checkpoint (runsc restore --detach, memory paged in the
// background as SPACE asks for) and runs the first command.
func (b *Bare) Wake(ctx context.Context) error {
	if err := b.net.configure(); err != nil {
		return err
	}
	if err := b.r.restore(ctx, b.spec, b.spec.SnapshotDir, ""); err != nil {
		return err
	}
	return b.Exec(ctx, io.Discard, "true")
}

// Fork saves the running sandbox with runsc checkpoint --leave-running
// (with SPACE's flags, as SPACE saves a fork's source: through the page
// cache unless the sandbox's cgroup is too full for it), restores the
// save as a second sandbox (its own bundle and overlay) and runs its first
// command, then deletes the copy and the save.
func (b *Bare) Fork(ctx context.Context) error {
	img := filepath.Join(b.dir, "fork-image")
	os.RemoveAll(img)
	if err := os.MkdirAll(img, 0o700); err != nil {
		return err
	}
	_, cached := throughCache(b.spec.SandboxID)
	if _, err := b.r.runsc(ctx, b.spec, b.r.checkpoint(cached, "--leave-running", "--image-path", img, b.spec.SandboxID)...); err != nil {
		return err
	}
	defer os.RemoveAll(img)
	if cached {
		if err := markCached(img); err != nil {
			return err
		}
	}
	return b.runCopy(ctx, "bare-fork", img)
}

// FromSave restores the last Suspend's save as a second sandbox and runs
// its first command, then deletes the copy (runsc only reads the image).
func (b *Bare) FromSave(ctx context.Context) error {
	return b.runCopy(ctx, "bare-copy", b.spec.SnapshotDir)
}

// runCopy restores image as sandbox id (its own bundle and overlay), runs
// its first command and deletes it.
func (b *Bare) runCopy(ctx context.Context, id, image string) error {
	cp := b.spec
	cp.SandboxID, cp.Net = id, b.copy.spec()
	if err := b.copy.configure(); err != nil {
		return err
	}
	if err := b.r.writeBundle(cp, b.rootfs, ""); err != nil {
		return err
	}
	defer func() {
		b.r.runsc(context.WithoutCancel(ctx), cp, "delete", "--force", cp.SandboxID)
		os.RemoveAll(b.r.sandboxDir(cp.SandboxID))
	}()
	if err := b.r.restore(ctx, cp, image, ""); err != nil {
		return err
	}
	return b.exec(ctx, cp, io.Discard, "true")
}

// Delete ends the sandbox with runsc delete --force, as a user of bare
// gVisor would (absent is success); the bundle stays for the
// next Create.
func (b *Bare) Delete(ctx context.Context) error {
	if _, err := b.r.runsc(ctx, b.spec, "delete", "--force", b.spec.SandboxID); err != nil && !notExist(err) {
		return err
	}
	return nil
}

// Close deletes the sandbox, lets go of its namespaces and removes its
// directory.
func (b *Bare) Close() error {
	b.Delete(context.Background())
	b.r.unmountNullNetns()
	var err error
	for _, n := range []*bareNet{b.net, b.copy} {
		if n != nil {
			err = errors.Join(err, n.close())
		}
	}
	return errors.Join(err, os.RemoveAll(b.dir))
}
