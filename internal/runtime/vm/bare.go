//go:build linux

package vm

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/spacesandbox/space/internal/agent/proto"
	"github.com/spacesandbox/space/internal/agentclient"
	"github.com/spacesandbox/space/internal/runtime"
	"github.com/spacesandbox/space/internal/sandbox"
)

// Bare is one VM run by QEMU alone — the floor `space bench --baseline`
// compares SPACE with: the same QEMU, machine, devices, memory backend (a
// shared RAM file), kernel, initramfs and template disk image as SPACE's
// sandboxes, started, stopped, saved and restored through QMP directly,
// with none of SPACE (no server, store, operations or network). It boots
// cold: SPACE's create starts from a template snapshot instead, which the
// bench says when it compares the two. A VMM has no exec, so commands run
// through the guest's agent over its virtio-serial channel, the one way
// into this guest, without SPACE's API, data plane or stream in between.
type Bare struct {
	r    *Runtime
	spec runtime.Spec
	seq  int
}

// bareID names the bare VM (its files, sockets and cgroup).
const bareID = "bare-vm"

// NewBare readies a bare VM of the template root rootfs with the given
// resources; cfg is the server's QEMU, kernel, modules, agent and
// acceleration, with Dir a directory of the bare VM's own (its initramfs,
// the template's disk image, RAM file, overlay and save), which Close
// removes. The template's disk image is made here, not in Create.
func NewBare(ctx context.Context, cfg Config, digest, rootfs string, res sandbox.Resources) (*Bare, error) {
	cfg.Templates = runtime.FixedTemplate(rootfs)
	cfg.NoTemplateSnapshots = true
	cfg.SocketDir = ""
	r, err := New(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("bare vm: %w", err)
	}
	b := &Bare{r: r, spec: runtime.Spec{SandboxID: bareID, Template: sandbox.TemplateRef{Digest: digest},
		Resources: res, SnapshotDir: filepath.Join(cfg.Dir, "save")}}
	if _, err := r.image(ctx, b.spec); err != nil {
		b.Close()
		return nil, fmt.Errorf("bare vm: %w", err)
	}
	return b, nil
}

// Create boots the VM cold (a copy-on-write overlay over the template's
// image, an empty RAM file, QEMU) until its guest's agent answers: the
// first moment the guest can run a command.
func (b *Bare) Create(ctx context.Context) error { return b.r.boot(ctx, b.spec) }

// Exec runs argv in the guest through its agent, stdout copied to w, and
// waits for it to exit (non-zero is an error).
func (b *Bare) Exec(ctx context.Context, w io.Writer, argv ...string) error {
	return b.exec(ctx, b.spec, w, argv...)
}

func (b *Bare) exec(ctx context.Context, spec runtime.Spec, w io.Writer, argv ...string) error {
	c, err := b.r.Agent(ctx, spec)
	if err != nil {
		return err
	}
	b.seq++
	id := fmt.Sprintf("bare-%d", b.seq)
	if _, err := c.CreateProcess(ctx, proto.ProcessSpec{ID: id, Argv: argv}); err != nil {
		return fmt.Errorf("exec %v: %w", argv, err)
	}
	const sub = "bare"
	if _, err := c.StartProcessFor(ctx, proto.StartRequest{ID: id, Subscriber: sub}); err != nil {
		return fmt.Errorf("exec %v: %w", argv, err)
	}
	// The next batch is asked for while this one is written, as SPACE's
	// own reader does: the floor, not a slower path.
	type batch struct {
		out agentclient.Output
		err error
	}
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	batches := make(chan batch, 1)
	go func() {
		var after uint64
		for {
			out, err := c.ReadOutput(rctx, id, after, 1<<20, 10*time.Second, sub)
			select {
			case batches <- batch{out, err}:
			case <-rctx.Done():
				return
			}
			if err != nil || out.Exited != nil {
				return
			}
			if n := len(out.Chunks); n > 0 {
				after = out.Chunks[n-1].Seq
			}
		}
	}()
	for b := range batches {
		if b.err != nil {
			return fmt.Errorf("exec %v: %w", argv, b.err)
		}
		data := b.out.Data
		for _, ch := range b.out.Chunks {
			if ch.Stream == "stdout" {
				if _, err := w.Write(data[:ch.Len]); err != nil {
					return err
				}
			}
			data = data[ch.Len:]
		}
		if p := b.out.Exited; p != nil {
			if p.ExitCode == nil || *p.ExitCode != 0 {
				return fmt.Errorf("exec %v: exit code %v, signal %q", argv, p.ExitCode, p.Signal)
			}
			return nil
		}
	}
	return ctx.Err()
}

// Note says what the bench's rows measured on a bare VM, where that is
// not what they measure on a bare gVisor (bench.BareNoter).
func (b *Bare) Note(row string) string {
	switch row {
	case "create":
		return "cold boot until the guest's agent answers (SPACE starts from the template's snapshot or a warm pool)"
	case "exec", "stdout_dd", "stdout_head":
		return "through the guest's agent over virtio-serial, without SPACE's server (a VMM has no exec)"
	case "delete":
		return "QMP quit, then its cgroup and files removed before it returns (SPACE removes them in the background)"
	case "wake":
		return "QEMU -incoming over the RAM file + device state, until the guest's agent answers"
	case "fork":
		return "stop + device state + copies of RAM file and disk + cont, then a second QEMU from them until its agent answers"
	case "from_save":
		return "copies of a save's RAM file and disk (the save stays as it was), QEMU -incoming over them, until the guest's agent answers"
	}
	return ""
}

// Pause and Resume are QMP stop and cont.
func (b *Bare) Pause(ctx context.Context) error  { return b.r.runState(ctx, b.spec, "stop", "paused") }
func (b *Bare) Resume(ctx context.Context) error { return b.r.runState(ctx, b.spec, "cont", "running") }

// Suspend stops the VM, migrates its device state (not its RAM: that is
// the RAM file) into a file, ends QEMU and flushes RAM file and disk — the
// vm runtime's save without the engine around it. The agent channel is
// closed first, as any host channel of this guest must be before a save.
func (b *Bare) Suspend(ctx context.Context) error { return b.r.save(ctx, b.spec) }

// Wake starts QEMU waiting for the saved device state over the same RAM
// file, loads it and runs it until the guest's agent answers again.
func (b *Bare) Wake(ctx context.Context) error {
	return b.r.load(ctx, b.spec, statePath(b.spec))
}

// Fork saves the running VM (stop, device state, copies of RAM file and
// disk, cont), starts a second VM from those copies until its agent
// answers, then deletes the copy.
func (b *Bare) Fork(ctx context.Context) error {
	img := filepath.Join(b.r.cfg.Dir, "fork-image")
	os.RemoveAll(img)
	defer os.RemoveAll(img)
	if err := b.r.Snapshot(ctx, b.spec, img); err != nil {
		return err
	}
	cp := b.spec
	cp.SandboxID, cp.SnapshotDir = bareID+"-fork", filepath.Join(b.r.cfg.Dir, "fork-save")
	defer b.r.deleteNow(context.WithoutCancel(ctx), cp)
	if err := os.MkdirAll(b.r.sandboxDir(cp.SandboxID), 0o700); err != nil {
		return err
	}
	// The copy runs on the save's files themselves: a bare user forking
	// once copies once.
	for _, f := range []struct{ from, to string }{{"mem", b.r.memPath(cp.SandboxID)}, {"disk.qcow2", b.r.diskPath(cp.SandboxID)}, {"agent.key", filepath.Join(b.r.sandboxDir(cp.SandboxID), "agent.key")}} {
		if err := os.Rename(filepath.Join(img, f.from), f.to); err != nil && !os.IsNotExist(err) {
			return err
		}
	}
	return b.r.load(ctx, cp, filepath.Join(img, "vmstate"))
}

// FromSave starts a second VM from the last Suspend's save until its agent
// answers, then deletes it: copies of the RAM file and disk (the VM writes
// into both, and the save must stay as it was for the next start), QEMU
// -incoming loading the saved device state.
func (b *Bare) FromSave(ctx context.Context) error {
	cp := b.spec
	cp.SandboxID, cp.SnapshotDir = bareID+"-copy", filepath.Join(b.r.cfg.Dir, "copy-save")
	defer b.r.deleteNow(context.WithoutCancel(ctx), cp)
	if err := os.MkdirAll(b.r.sandboxDir(cp.SandboxID), 0o700); err != nil {
		return err
	}
	for _, f := range []struct{ from, to string }{{b.r.memPath(b.spec.SandboxID), b.r.memPath(cp.SandboxID)}, {b.r.diskPath(b.spec.SandboxID), b.r.diskPath(cp.SandboxID)}} {
		if err := copySparse(f.from, f.to); err != nil {
			return err
		}
	}
	if err := copySparse(filepath.Join(b.r.sandboxDir(b.spec.SandboxID), "agent.key"), filepath.Join(b.r.sandboxDir(cp.SandboxID), "agent.key")); err != nil && !os.IsNotExist(err) {
		return err
	}
	return b.r.load(ctx, cp, statePath(b.spec))
}

// Delete ends the VM and removes its files before it returns, as a bare
// QEMU user freeing the VM's disk would (absent is success); SPACE's
// delete leaves that removal to the background.
func (b *Bare) Delete(ctx context.Context) error { return b.r.deleteNow(ctx, b.spec) }

// Close deletes the VM and removes the bare VM's directory.
func (b *Bare) Close() error {
	b.r.deleteNow(context.Background(), b.spec)
	b.r.Close()
	return os.RemoveAll(b.r.cfg.Dir)
}
