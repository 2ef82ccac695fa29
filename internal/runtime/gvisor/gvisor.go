//go:build linux

// Package gvisor is the `gvisor` runtime: one gVisor sandbox (runsc,
// systrap platform) per SPACE sandbox, from an OCI bundle over the
// template's root file system with a private writable overlay whose upper
// layer is capped at the sandbox's disk size. The agent is bind-mounted
// read-only at /.space/agent and runs as the container's init; it dials the
// host through a unix socket in a per-sandbox directory mounted read-only
// at /.space/run, and dials again after a restore (gVisor closes host socket
// connections on checkpoint). Pause is the sentry's pause asked on runsc's
// control socket (control.go); suspend is runsc
// checkpoint (memory, and with it the writable layer) into the snapshot
// directory followed by deleting the sandbox; wake restores it.
package gvisor

import (
	"bytes"
	"context"
	"crypto/sha256"
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
	"syscall"
	"time"

	"github.com/spacesandbox/space/internal/agentclient"
	"github.com/spacesandbox/space/internal/runtime"
	"github.com/spacesandbox/space/internal/runtime/exitwatch"
)

// Name is the runtime's API name.
const Name = "gvisor"

// Config configures the runtime.
type Config struct {
	// Runsc is the runsc binary.
	Runsc string
	// Dir holds per-sandbox bundles and runsc's state.
	Dir string
	// SocketDir holds per-sandbox agent sockets; it must be short (unix
	// socket paths are limited to 108 bytes).
	SocketDir string
	// AgentBin is the static space-agent binary mounted into sandboxes.
	AgentBin  string
	Templates runtime.Templates
	// Platform is runsc's platform (systrap unless told otherwise).
	Platform string
	Logger   *slog.Logger
}

// Validate checks the configuration and the binaries it names.
func (c *Config) Validate() error {
	if c.Runsc == "" || c.Dir == "" || c.AgentBin == "" || c.Templates == nil {
		return errors.New("gvisor: runsc, dir, agent binary and templates are required")
	}
	for _, b := range []string{c.Runsc, c.AgentBin} {
		if fi, err := os.Stat(b); err != nil || fi.Mode()&0o111 == 0 {
			return fmt.Errorf("gvisor: %s is not an executable", b)
		}
	}
	if c.Platform == "" {
		c.Platform = "systrap"
	}
	if c.SocketDir == "" {
		sum := sha256.Sum256([]byte(c.Dir))
		c.SocketDir = "/run/space-" + hex.EncodeToString(sum[:4])
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return nil
}

// Runtime runs sandboxes under gVisor.
type Runtime struct {
	cfg Config
	log *slog.Logger

	endpoints *agentclient.Endpoints
	// exits notices a sandbox's process ending unexpectedly.
	exits *exitwatch.Watcher
	// earlierChecked holds the sandboxes checked for a runsc a previous
	// server left running on them (awaitEarlierRunsc).
	earlierChecked sync.Map

	// agentDigest is the agent new sandboxes run; legacyDigest the one of
	// sandboxes and saves without a record (agents.go).
	agentDigest, legacyDigest string
	// direct: checkpoints write, and restores read, their pages file with
	// O_DIRECT.
	direct bool
	// ending counts the removals of suspended containers' remains that run
	// in the background (clearAway).
	ending sync.WaitGroup
	// prepared holds the copies PrepareCopy created, waiting for their
	// image (snapshot.go).
	prepared sync.Map

	// firstStart serialises starts of sandboxes without a network until
	// runsc has made its shared empty network-namespace mount; concurrent
	// first starts would each mount it.
	firstStart sync.Mutex

	// redialSignal and redialWait: how a sandbox left running by a save is
	// told to dial again, and how long it is given (snapshot.go). Tests
	// change them to stand for an agent that does not.
	redialSignal syscall.Signal
	redialWait   time.Duration
	// moveCgroup moves a cgroup aside (clearAway): os.Rename, which a
	// cgroup v2 host refuses; tests refuse it to stand for one.
	moveCgroup func(from, to string) error
}

var _ runtime.Runtime = (*Runtime)(nil)

// New returns the runtime.
func New(cfg Config) (*Runtime, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	for _, d := range []string{cfg.Dir, filepath.Join(cfg.Dir, "runsc"), cfg.SocketDir} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("gvisor: %w", err)
		}
	}
	r := &Runtime{cfg: cfg, log: cfg.Logger, exits: exitwatch.New(cfg.Logger), direct: directIO(cfg.Dir), redialSignal: syscall.SIGCONT, redialWait: 10 * time.Second, moveCgroup: os.Rename}
	// Before any operation can start a sandbox of its own.
	if orphans := r.sweepOrphans(); len(orphans) > 0 {
		r.log.Warn("gvisor: ended sandboxes that run from this runtime's directory but that runsc has no record of (their files were removed under them?)", "sandboxes", orphans)
	}
	// What an earlier server discarded but had not removed yet.
	go os.RemoveAll(r.trashDir())
	go func() {
		if n := sweepCgroups(); n > 0 {
			r.log.Info("gvisor: removed cgroups no sandbox runs in", "cgroups", n)
		}
	}()
	var err error
	if r.agentDigest, err = r.keepAgent(); err != nil {
		return nil, err
	}
	if r.legacyDigest, err = r.legacyAgent(); err != nil {
		return nil, err
	}
	if err := r.pinLegacyAgents(); err != nil {
		return nil, err
	}
	r.endpoints = agentclient.NewEndpoints(r.socketPath, cfg.Logger)
	// The agent's key lives on the host only, never under /.space/run.
	r.endpoints.KeyFile = func(id string) string { return filepath.Join(r.sandboxDir(id), "agent.key") }
	return r, nil
}

// Close lets go of the host: agent listeners, the socket directories of
// sandboxes that no longer run, and — when no sandbox runs at all — runsc's
// shared empty-network mount and the socket directory itself. Sandboxes
// that run keep what they need and are re-adopted by the next server.
func (r *Runtime) Close() {
	r.endpoints.CloseAll()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ended := make(chan struct{})
	go func() { r.ending.Wait(); close(ended) }()
	select {
	case <-ended:
	case <-ctx.Done():
	}
	out, err := exec.CommandContext(ctx, r.cfg.Runsc, "--root", filepath.Join(r.cfg.Dir, "runsc"), "list", "--quiet").Output()
	if err != nil {
		r.log.Warn("gvisor: list sandboxes at close", "err", err)
		return
	}
	alive := map[string]bool{}
	for _, id := range strings.Fields(string(out)) {
		alive[id] = true
	}
	ents, _ := os.ReadDir(r.cfg.SocketDir)
	for _, e := range ents {
		if !alive[e.Name()] {
			os.RemoveAll(filepath.Join(r.cfg.SocketDir, e.Name()))
		}
	}
	if len(alive) > 0 {
		return
	}
	os.Remove(r.cfg.SocketDir)
	r.unmountNullNetns()
}

// unmountNullNetns lets go of runsc's shared empty network namespace, which
// it mounts in its state directory for sandboxes without a network.
func (r *Runtime) unmountNullNetns() {
	nullNetns := filepath.Join(r.cfg.Dir, "runsc", "null-netns")
	for i := 0; i < 16 && syscall.Unmount(nullNetns, syscall.MNT_DETACH) == nil; i++ {
	}
	os.Remove(nullNetns)
}

// OnExit tells f when a sandbox's processes end unexpectedly
// (runtime.ExitReporter): the sandbox process (runsc's sentry) is watched;
// it ends when the sandbox's init (the agent) dies, when it is killed from
// outside, and when the host's OOM killer takes it at the memory limit.
func (r *Runtime) OnExit(f func(runtime.Exit)) { r.exits.OnExit(f) }

// watch starts watching a running sandbox's process: the one runsc named
// in its pid file when it started it (no runsc call on the create and wake
// path), else the one `runsc state` names (a sandbox a previous server
// started, or one a failed --leave-running checkpoint restarted).
func (r *Runtime) watch(ctx context.Context, spec runtime.Spec, fromPidFile bool) {
	id := spec.SandboxID
	pid := 0
	if fromPidFile {
		pid = r.pidOf(id)
	}
	if pid <= 0 {
		st, err := r.state(ctx, spec)
		if err != nil || st == nil || st.PID <= 0 {
			r.log.Warn("gvisor: cannot watch the sandbox's process", "sandbox_id", id, "err", err)
			return
		}
		pid = st.PID
	}
	mem := spec.Resources.MemoryMiB
	err := r.exits.Watch(id, pid, func() (string, string) {
		if exitwatch.OOMKilled("space/" + id) {
			return runtime.ExitOutOfMemory, fmt.Sprintf("the sandbox reached its memory limit (%d MiB) and was killed", mem)
		}
		return "", ""
	})
	if err != nil {
		r.log.Warn("gvisor: cannot watch the sandbox's process", "sandbox_id", id, "err", err)
	}
}

// Probe checks that runsc can start a sandbox on this host, and says why not.
func Probe(ctx context.Context, runsc string) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	dir, err := os.MkdirTemp("", "space-runsc-probe")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	cmd := exec.CommandContext(ctx, runsc, "--root", filepath.Join(dir, "root"), "--network=none", "do", "true")
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("runsc do true: %v: %s", err, strings.TrimSpace(lastLine(string(out))))
	}
	return nil
}

func lastLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		return s[i+1:]
	}
	return s
}

func (r *Runtime) Name() string { return Name }

func (r *Runtime) Capabilities() runtime.Capabilities {
	return runtime.Capabilities{Net: runtime.NetNamespace, Detail: "gVisor (runsc, " + r.cfg.Platform + " platform): a user-space kernel per sandbox", Portable: true, HostClock: true}
}

func (r *Runtime) sandboxDir(id string) string { return filepath.Join(r.cfg.Dir, "sandboxes", id) }
func (r *Runtime) bundleDir(id string) string  { return filepath.Join(r.sandboxDir(id), "bundle") }
func (r *Runtime) upperDir(id string) string   { return filepath.Join(r.sandboxDir(id), "upper") }
func (r *Runtime) socketDir(id string) string  { return filepath.Join(r.cfg.SocketDir, id) }
func (r *Runtime) pidPath(id string) string    { return filepath.Join(r.sandboxDir(id), "sandbox.pid") }
func (r *Runtime) socketPath(id string) string { return filepath.Join(r.socketDir(id), "agent.sock") }

// globalFlags must be identical for every runsc command on a sandbox:
// restore needs the same configuration as create.
func (r *Runtime) globalFlags(spec runtime.Spec) []string {
	return []string{
		"--root", filepath.Join(r.cfg.Dir, "runsc"),
		"--platform", r.cfg.Platform,
		"--network", network(spec),
		"--host-uds", "open",
		"--overlay2", fmt.Sprintf("root:dir=%s,size=%dm", r.upperDir(spec.SandboxID), spec.Resources.DiskMiB),
		"--net-disconnect-ok",
		// Its network's packet processors, one per vCPU, fixed: left to
		// runsc they follow GOMAXPROCS when the link is made, and a
		// restore makes it while loading memory with GOMAXPROCS raised by
		// 128 loader threads — every woken sandbox had 130, which its next
		// save wrote out (an image 230 → 417 KB) and its next restore
		// decoded again (in one run here the restores of the larger
		// images took 296–355 ms, of the others 210–280).
		"--network-processors-per-channel", strconv.Itoa(max(1, spec.Resources.VCPUs)),
		"--log-format", "json",
		"--panic-log", filepath.Join(r.sandboxDir(spec.SandboxID), "panic.log"),
	}
}

// network is runsc's network mode: its own netstack over the sandbox's
// namespace when it has one, else none.
func network(spec runtime.Spec) string {
	if spec.Net != nil && spec.Net.Netns != "" {
		return "sandbox"
	}
	return "none"
}

// runsc runs one runsc command and returns its stdout.
func (r *Runtime) runsc(ctx context.Context, spec runtime.Spec, args ...string) ([]byte, error) {
	full := append(r.globalFlags(spec), args...)
	cmd := exec.CommandContext(ctx, r.cfg.Runsc, full...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.WaitDelay = 5 * time.Second
	if err := cmd.Run(); err != nil {
		return stdout.Bytes(), fmt.Errorf("runsc %s: %w: %s", args[0], err, strings.TrimSpace(lastLine(stderr.String())))
	}
	return stdout.Bytes(), nil
}

// start runs `runsc run|restore --detach`: the sandbox it leaves behind
// inherits stdio, so stdio goes to the sandbox's log file, never to pipes
// this process would wait on.
func (r *Runtime) start(ctx context.Context, spec runtime.Spec, args ...string) error {
	logPath := filepath.Join(r.sandboxDir(spec.SandboxID), "sandbox.log")
	logf, err := os.OpenFile(logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer logf.Close()
	off, _ := logf.Seek(0, io.SeekEnd)
	if _, err := os.Stat(filepath.Join(r.cfg.Dir, "runsc", "null-netns")); err != nil && network(spec) == "none" {
		r.firstStart.Lock()
		defer r.firstStart.Unlock()
	}
	cmd := exec.CommandContext(ctx, r.cfg.Runsc, append(r.globalFlags(spec), args...)...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = nil, logf, logf
	if err := cmd.Run(); err != nil {
		b, _ := os.ReadFile(logPath)
		if int64(len(b)) > off {
			b = b[off:]
		}
		return fmt.Errorf("runsc %s: %w: %s", args[0], err, lastLine(string(b)))
	}
	return nil
}

// containerState is what `runsc state` reports.
type containerState struct {
	Status string `json:"status"` // created, running, paused, stopped
	PID    int    `json:"pid"`
}

func (r *Runtime) state(ctx context.Context, spec runtime.Spec) (*containerState, error) {
	out, err := r.runsc(ctx, spec, "state", spec.SandboxID)
	if err != nil {
		if strings.Contains(err.Error(), "does not exist") || strings.Contains(err.Error(), "not exist") {
			return nil, nil
		}
		if strings.Contains(err.Error(), "reading container metadata file") {
			// A runsc killed as it wrote the container's record (it
			// writes it in place) left it torn: runsc can neither run,
			// save nor delete that container any more. What runs of it
			// is ended, its death reported, and the record removed: the
			// container is gone.
			r.log.Warn("gvisor: runsc's record of the container is torn; ending what runs of it", "sandbox_id", spec.SandboxID, "err", err)
			r.forgetContainer(spec.SandboxID)
			return nil, nil
		}
		return nil, err
	}
	var st containerState
	if err := json.Unmarshal(out, &st); err != nil {
		return nil, fmt.Errorf("decode runsc state: %w", err)
	}
	if (st.Status == "running" || st.Status == "paused") && r.ended(spec.SandboxID) {
		// runsc asks the process with a signal, which a zombie or a
		// process tearing down (killed as it was restored, say) still
		// takes: it is stopped.
		st.Status = "stopped"
	}
	return &st, nil
}

// endpoint returns the sandbox's agent endpoint, listening if needed.
func (r *Runtime) endpoint(id string) (*agentclient.Endpoint, error) { return r.endpoints.Get(id) }

func (r *Runtime) closeEndpoint(id string) { r.endpoints.Close(id) }

// waitAgent waits until the agent answers.
func (r *Runtime) waitAgent(ctx context.Context, id string) error { return r.endpoints.Wait(ctx, id) }

func (r *Runtime) Agent(ctx context.Context, spec runtime.Spec) (*agentclient.Client, error) {
	return r.endpoints.Client(ctx, spec.SandboxID)
}
