//go:build linux

// Package vm is the `vm` runtime: one QEMU `microvm` per sandbox, its own
// kernel, virtio-mmio devices. The guest boots the Debian cloud kernel with
// an initramfs whose /init is the space-agent: it loads the virtio modules,
// mounts the sandbox's disk — a qcow2 copy-on-write overlay over the
// template's ext4 image — as root and serves the host on the virtio-serial
// port "space.agent". QEMU dials the host's unix socket for that port (the
// host stays the listener, so a restored or re-adopted VM reconnects).
// Guest RAM is a file (memory-backend-file, share=on): pause is QMP stop;
// suspend is stop + a migration of the device state only (x-ignore-shared)
// into the snapshot directory, fsync of RAM file and overlay, and QEMU's
// exit; wake starts QEMU with -incoming defer over the same RAM file.
// Acceleration is KVM where a probe boot shows it can run the guest, TCG
// otherwise. A sandbox with a network runs its QEMU inside the sandbox's
// network namespace, whose tap backs the virtio-net card.
package vm

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/spacesandbox/space/internal/agentclient"
	"github.com/spacesandbox/space/internal/procfs"
	"github.com/spacesandbox/space/internal/runtime"
	"github.com/spacesandbox/space/internal/runtime/exitwatch"
)

// Name is the runtime's API name.
const Name = "vm"

// Config configures the runtime.
type Config struct {
	QEMU    string // qemu-system-x86_64
	QEMUImg string // qemu-img
	Kernel  string // the guest kernel (bzImage)
	// Modules is the kernel's module tree (lib/modules/<version>).
	Modules  string
	AgentBin string
	// Dir holds images, the initramfs and per-sandbox state.
	Dir string
	// SocketDir holds per-sandbox sockets; it must be short.
	SocketDir string
	Templates runtime.Templates
	// Accel is "kvm", "tcg" or "" (probe).
	Accel string
	// NoTemplateSnapshots boots every sandbox cold instead of starting it
	// from its template's snapshot.
	NoTemplateSnapshots bool
	Logger              *slog.Logger
}

// Runtime runs sandboxes as QEMU microVMs.
type Runtime struct {
	cfg       Config
	log       *slog.Logger
	accel     string
	accelWhy  string
	initramfs string
	// bootKey identifies what a saved machine depends on besides its
	// template (see snapKey).
	bootKey string

	endpoints *agentclient.Endpoints
	// exits notices a sandbox's QEMU ending unexpectedly.
	exits *exitwatch.Watcher

	images imageBuilds

	// removing counts background removals of deleted sandboxes' files
	// (aside.go); asideSeq names what Delete moves aside.
	removing sync.WaitGroup
	asideSeq atomic.Uint64
}

var _ runtime.Runtime = (*Runtime)(nil)

// New checks the configuration, builds the initramfs and picks the
// acceleration.
func New(ctx context.Context, cfg Config) (*Runtime, error) {
	if cfg.QEMU == "" || cfg.Kernel == "" || cfg.AgentBin == "" || cfg.Dir == "" || cfg.Templates == nil {
		return nil, errors.New("vm: qemu, kernel, agent binary, dir and templates are required")
	}
	if cfg.QEMUImg == "" {
		cfg.QEMUImg = "qemu-img"
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.SocketDir == "" {
		cfg.SocketDir = shortDir("/run/space-vm-", cfg.Dir)
	}
	for _, d := range []string{cfg.Dir, filepath.Join(cfg.Dir, "images"), filepath.Join(cfg.Dir, "sandboxes"), cfg.SocketDir} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("vm: %w", err)
		}
	}
	r := &Runtime{cfg: cfg, log: cfg.Logger, exits: exitwatch.New(cfg.Logger)}
	r.endpoints = agentclient.NewEndpoints(r.agentPath, cfg.Logger)
	// Each sandbox's agent is bound to a key kept beside its RAM file — not
	// a template's VM, whose memory every sandbox of the template restores
	// (those agents are bound on their own first connection).
	r.endpoints.KeyFile = func(id string) string {
		if strings.HasPrefix(id, templateVMPrefix) {
			return ""
		}
		return filepath.Join(r.sandboxDir(id), "agent.key")
	}
	if err := r.sweepEnded(); err != nil {
		return nil, fmt.Errorf("vm: %w", err)
	}
	r.pruneImages(ctx)
	r.initramfs = filepath.Join(cfg.Dir, "initramfs.cpio")
	initramfsSum, err := r.buildInitramfs()
	if err != nil {
		return nil, err
	}
	r.accel, r.accelWhy = cfg.Accel, "configured"
	if r.accel == "" {
		r.accel, r.accelWhy = r.probeAccel(ctx)
	}
	if r.bootKey, err = r.makeBootKey(initramfsSum); err != nil {
		return nil, err
	}
	r.log.Info("vm runtime ready", "accel", r.accel, "why", r.accelWhy, "kernel", cfg.Kernel)
	return r, nil
}

// buildInitramfs writes the initramfs (streamed: the agent is not held in
// memory) to a new file and renames it over the old one; running VMs loaded
// theirs at boot. It returns the SHA-256 of what it wrote.
func (r *Runtime) buildInitramfs() ([]byte, error) {
	tmp := r.initramfs + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return nil, err
	}
	bw := bufio.NewWriterSize(f, 256<<10)
	h := sha256.New()
	err = BuildInitramfs(io.MultiWriter(bw, h), r.cfg.AgentBin, r.cfg.Modules)
	if err == nil {
		err = bw.Flush()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(tmp)
		return nil, fmt.Errorf("vm: build initramfs: %w", err)
	}
	return h.Sum(nil), os.Rename(tmp, r.initramfs)
}

func (r *Runtime) Name() string { return Name }

// Close lets go of every agent channel (the VMs keep running; a new
// runtime over the same directory re-adopts them).
// Close lets go of the host: agent listeners, the socket directories of
// sandboxes whose QEMU no longer runs, and the socket directory itself when
// none runs. Running VMs keep theirs and are re-adopted by the next server.
func (r *Runtime) Close() {
	r.endpoints.CloseAll()
	r.removing.Wait()
	running := 0
	ents, _ := os.ReadDir(r.cfg.SocketDir)
	for _, e := range ents {
		if r.qemuPID(e.Name()) != 0 {
			running++
			continue
		}
		os.RemoveAll(filepath.Join(r.cfg.SocketDir, e.Name()))
	}
	if running == 0 {
		os.Remove(r.cfg.SocketDir)
	}
}

func (r *Runtime) Capabilities() runtime.Capabilities {
	return runtime.Capabilities{Net: runtime.NetTap,
		Detail: fmt.Sprintf("QEMU microvm, accel=%s (%s)", r.accel, r.accelWhy)}
}

// Accel is the acceleration in use and why.
func (r *Runtime) Accel() (string, string) { return r.accel, r.accelWhy }

func (r *Runtime) sandboxDir(id string) string { return filepath.Join(r.cfg.Dir, "sandboxes", id) }
func (r *Runtime) socketDir(id string) string  { return filepath.Join(r.cfg.SocketDir, id) }
func (r *Runtime) qmpPath(id string) string    { return filepath.Join(r.socketDir(id), "qmp.sock") }
func (r *Runtime) agentPath(id string) string  { return filepath.Join(r.socketDir(id), "agent.sock") }
func (r *Runtime) memPath(id string) string    { return filepath.Join(r.sandboxDir(id), "mem") }
func (r *Runtime) diskPath(id string) string   { return filepath.Join(r.sandboxDir(id), "disk.qcow2") }
func (r *Runtime) pidPath(id string) string    { return filepath.Join(r.sandboxDir(id), "qemu.pid") }
func statePath(spec runtime.Spec) string       { return filepath.Join(spec.SnapshotDir, "vmstate") }

// qemuArgs is the command line of a sandbox's VM; restore uses the same one
// with -incoming defer.
func (r *Runtime) qemuArgs(spec runtime.Spec, incoming bool) []string {
	id := spec.SandboxID
	mem := spec.Resources.MemoryMiB
	env, workdir := r.cfg.Templates.Config(spec.Template.Digest)
	merged := map[string]string{}
	for k, v := range env {
		merged[k] = v
	}
	for k, v := range spec.Env {
		merged[k] = v
	}
	envJSON, _ := json.Marshal(merged)
	cmdline := []string{"console=ttyS0", "panic=-1", "quiet", "random.trust_cpu=on",
		"space.env=" + base64.RawURLEncoding.EncodeToString(envJSON)}
	if workdir != "" {
		cmdline = append(cmdline, "space.workdir="+base64.RawURLEncoding.EncodeToString([]byte(workdir)))
	}
	cpu := "host"
	if r.accel == "tcg" {
		// TCG's TSC calibration takes seconds without these.
		cmdline = append(cmdline, "tsc_early_khz=2000000", "lpj=2000000")
		cpu = "max"
	}
	args := []string{
		"-name", "space-" + id,
		"-M", "microvm,x-option-roms=off,pit=off,pic=off,isa-serial=on,rtc=on",
		"-accel", r.accel, "-cpu", cpu,
		"-m", fmt.Sprintf("%dM", mem), "-smp", strconv.Itoa(spec.Resources.VCPUs),
		"-object", fmt.Sprintf("memory-backend-file,id=mem,size=%dM,mem-path=%s,share=on", mem, r.memPath(id)),
		"-machine", "memory-backend=mem",
		"-kernel", r.cfg.Kernel, "-initrd", r.initramfs, "-append", strings.Join(cmdline, " "),
		"-nodefaults", "-no-user-config", "-nographic", "-no-reboot",
		// Appended to: a restore (a new QEMU) keeps what the guest said before.
		"-chardev", "file,id=console,append=on,path=" + filepath.Join(r.sandboxDir(id), "console.log"),
		"-serial", "chardev:console",
		"-drive", "id=root,file=" + r.diskPath(id) + ",format=qcow2,if=none,discard=unmap",
		"-device", "virtio-blk-device,drive=root",
		"-device", "virtio-serial-device",
		"-chardev", "socket,id=agent,path=" + r.agentPath(id) + ",reconnect=1",
		"-device", "virtserialport,chardev=agent,name=space.agent",
		"-device", "virtio-rng-device",
		// Every VM has the same network card (template snapshots restore
		// into any sandbox): a tap when the sandbox has a network, else a
		// hub port that leads nowhere.
		"-netdev", netdev(spec),
		"-device", "virtio-net-device,netdev=net0,mac=02:53:50:00:00:01",
		"-qmp", "unix:" + r.qmpPath(id) + ",server=on,wait=off",
		"-pidfile", r.pidPath(id),
	}
	if incoming {
		args = append(args, "-incoming", "defer")
	}
	return args
}

func netdev(spec runtime.Spec) string {
	if spec.Net != nil && spec.Net.Tap != "" {
		return "tap,id=net0,ifname=" + spec.Net.Tap + ",script=no,downscript=no"
	}
	return "hubport,id=net0,hubid=0"
}

// startQEMU starts a sandbox's QEMU in its own session (it outlives this
// server) and waits for its QMP socket.
func (r *Runtime) startQEMU(ctx context.Context, spec runtime.Spec, incoming bool) (*qmp, error) {
	id := spec.SandboxID
	os.Remove(r.qmpPath(id))
	logf, err := os.OpenFile(filepath.Join(r.sandboxDir(id), "qemu.log"), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	cmd := exec.Command(r.cfg.QEMU, r.qemuArgs(spec, incoming)...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	start := cmd.Start
	if spec.Net != nil && spec.Net.Netns != "" {
		// QEMU lives in the sandbox's network namespace, where its tap is.
		start = func() error { return startInNetns(cmd, spec.Net.Netns) }
	}
	if err := start(); err != nil {
		return nil, fmt.Errorf("start qemu: %w", err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }() // reaps it
	if err := joinCgroup(id, cmd.Process.Pid, spec.Resources); err != nil {
		r.log.Warn("vm: cgroup", "sandbox_id", id, "err", err)
	}
	for {
		q, err := dialQMP(ctx, r.qmpPath(id))
		if err == nil {
			return q, nil
		}
		select {
		case <-exited:
			b, _ := os.ReadFile(filepath.Join(r.sandboxDir(id), "qemu.log"))
			return nil, fmt.Errorf("qemu exited at start: %s", lastLine(string(b)))
		case <-ctx.Done():
			cmd.Process.Kill()
			return nil, fmt.Errorf("qemu did not answer on QMP: %w", ctx.Err())
		case <-time.After(5 * time.Millisecond):
		}
	}
}

func lastLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		return s[i+1:]
	}
	return s
}

// qemuPID is the sandbox's running QEMU process (0 when there is none).
func (r *Runtime) qemuPID(id string) int {
	b, err := os.ReadFile(r.pidPath(id))
	if err != nil {
		return 0
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 {
		return 0
	}
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil || !bytes.Contains(cmdline, []byte("space-"+id)) {
		return 0
	}
	if p, err := procfs.Stat(pid); err == nil && p.Gone() {
		return 0 // exited, not yet reaped
	}
	return pid
}

// OnExit tells f when a sandbox's QEMU ends unexpectedly
// (runtime.ExitReporter): killed from outside, crashed, or taken by the
// host's OOM killer at its cgroup's limit. Inside the guest, the guest
// kernel's OOM killer ends the process that exceeds memory, not the VM.
func (r *Runtime) OnExit(f func(runtime.Exit)) { r.exits.OnExit(f) }

// watch starts watching a running sandbox's QEMU.
func (r *Runtime) watch(spec runtime.Spec) {
	id := spec.SandboxID
	pid := r.qemuPID(id)
	if pid == 0 {
		r.log.Warn("vm: no QEMU to watch", "sandbox_id", id)
		return
	}
	mem := spec.Resources.MemoryMiB
	err := r.exits.Watch(id, pid, func() (string, string) {
		if exitwatch.OOMKilled("space-vm/" + id) {
			return runtime.ExitOutOfMemory, fmt.Sprintf("the sandbox's VM reached its memory limit (%d MiB + QEMU's overhead) and was killed", mem)
		}
		return "", ""
	})
	if err != nil {
		r.log.Warn("vm: cannot watch QEMU", "sandbox_id", id, "err", err)
	}
}

// qmp connects to a running sandbox's QMP socket.
func (r *Runtime) qmp(ctx context.Context, id string) (*qmp, error) {
	if r.qemuPID(id) == 0 {
		return nil, errNoQMP
	}
	return dialQMP(ctx, r.qmpPath(id))
}

// stopQEMU ends a sandbox's QEMU: quit over QMP, else SIGKILL; it waits
// until the process is gone.
func (r *Runtime) stopQEMU(ctx context.Context, id string) {
	r.exits.Stop(id) // ended by us: not a death to report
	pid := r.qemuPID(id)
	if pid == 0 {
		return
	}
	if q, err := r.qmp(ctx, id); err == nil {
		q.execute(ctx, "quit", nil)
		q.close()
	}
	deadline := time.Now().Add(5 * time.Second)
	for r.qemuPID(id) != 0 {
		if time.Now().After(deadline) {
			syscall.Kill(pid, syscall.SIGKILL)
			deadline = time.Now().Add(5 * time.Second)
		}
		time.Sleep(time.Millisecond)
	}
}

// endpoint returns the sandbox's agent endpoint, listening if needed.
func (r *Runtime) endpoint(id string) (*agentclient.Endpoint, error) { return r.endpoints.Get(id) }

func (r *Runtime) closeEndpoint(id string) { r.endpoints.Close(id) }

// waitAgent waits until the agent answers, or until the VM's QEMU ends:
// then it fails at once, not at ctx's end (as it does when no QEMU runs
// for the sandbox any more: a VM killed before the wait began).
func (r *Runtime) waitAgent(ctx context.Context, id string) error {
	if err := r.endpoints.WaitAlive(ctx, id, func() bool { return r.qemuPID(id) != 0 }); err != nil {
		b, _ := os.ReadFile(filepath.Join(r.sandboxDir(id), "console.log"))
		return fmt.Errorf("%w (console: %s)", err, lastLine(string(b)))
	}
	return nil
}

func (r *Runtime) Agent(ctx context.Context, spec runtime.Spec) (*agentclient.Client, error) {
	return r.endpoints.Client(ctx, spec.SandboxID)
}

func shortDir(prefix, seed string) string {
	h := uint32(2166136261)
	for i := 0; i < len(seed); i++ {
		h = (h ^ uint32(seed[i])) * 16777619
	}
	return fmt.Sprintf("%s%08x", prefix, h)
}

// makeBootKey hashes the kernel, the initramfs's hash (the agent and
// modules, hashed as it was written), the QEMU binary's identity and the
// acceleration.
func (r *Runtime) makeBootKey(initramfsSum []byte) (string, error) {
	h := sha256.New()
	f, err := os.Open(r.cfg.Kernel)
	if err != nil {
		return "", fmt.Errorf("vm: %w", err)
	}
	_, err = io.Copy(h, f)
	f.Close()
	if err != nil {
		return "", fmt.Errorf("vm: hash %s: %w", r.cfg.Kernel, err)
	}
	h.Write(initramfsSum)
	qemu, err := exec.LookPath(r.cfg.QEMU)
	if err != nil {
		return "", fmt.Errorf("vm: %w", err)
	}
	fi, err := os.Stat(qemu)
	if err != nil {
		return "", fmt.Errorf("vm: %w", err)
	}
	fmt.Fprintf(h, "\x00%s\x00%d\x00%d\x00%s", qemu, fi.Size(), fi.ModTime().UnixNano(), r.accel)
	return hex.EncodeToString(h.Sum(nil))[:12], nil
}
