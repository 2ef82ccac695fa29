// Package fakeruntime is an in-process FAKE runtime for tests. It isolates
// nothing: when given an agent binary it runs space-agent as a plain host
// process (file operations confined to a directory, commands run on the
// host), otherwise it runs nothing at all. It keeps each sandbox's status in
// a small file so that a server restart sees it again, and it can slow or
// fail lifecycle steps on demand — fault injection a real runtime cannot
// produce. Production builds of `space` never include it; only binaries
// built with the `spacefake` tag offer it.
package fakeruntime

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/spacesandbox/space/internal/agentclient"
	"github.com/spacesandbox/space/internal/runtime"
)

// Name is the API name of the fake runtime.
const Name = "fake"

// Config tunes the fake.
type Config struct {
	// Dir holds one state file (and root directory) per sandbox.
	Dir string
	// Delay is how long every lifecycle step takes.
	Delay time.Duration
	// Fail names lifecycle steps ("create", "pause", …) that fail after the
	// delay without changing anything.
	Fail map[string]bool
	// AgentBin, when set, is a space-agent binary run as a host process for
	// each sandbox.
	AgentBin string
	Logger   *slog.Logger
}

// Runtime is the fake. Safe for concurrent use.
type Runtime struct {
	cfg Config

	mu        sync.Mutex // guards state files and endpoints
	endpoints map[string]*agentclient.Endpoint
}

var _ runtime.Runtime = (*Runtime)(nil)

// state is what the fake remembers of a sandbox on disk.
type state struct {
	Status   runtime.Status `json:"status"`
	AgentPID int            `json:"agent_pid,omitempty"`
}

// New returns a fake runtime keeping state in cfg.Dir.
func New(cfg Config) (*Runtime, error) {
	if err := os.MkdirAll(cfg.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("fake runtime dir: %w", err)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Runtime{cfg: cfg, endpoints: map[string]*agentclient.Endpoint{}}, nil
}

// ParseFail parses a comma-separated list of step names.
func ParseFail(s string) map[string]bool {
	m := map[string]bool{}
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			m[f] = true
		}
	}
	return m
}

func (r *Runtime) Name() string { return Name }

func (r *Runtime) Capabilities() runtime.Capabilities {
	return runtime.Capabilities{Detail: "fake runtime for tests: no isolation; the agent runs as a host process"}
}

// ErrInjected is returned by steps configured to fail.
var ErrInjected = errors.New("injected failure")

func (r *Runtime) step(ctx context.Context, name string) error {
	if r.cfg.Delay > 0 {
		t := time.NewTimer(r.cfg.Delay)
		defer t.Stop()
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
	if r.cfg.Fail[name] {
		return fmt.Errorf("%s: %w", name, ErrInjected)
	}
	return nil
}

func (r *Runtime) path(id string) string { return filepath.Join(r.cfg.Dir, id+".json") }

// RootDir is the directory a sandbox's agent confines file operations to.
func (r *Runtime) RootDir(id string) string { return filepath.Join(r.cfg.Dir, id+".root") }

// socket is an abstract unix socket name (no path length limit to worry
// about), unique per data directory and sandbox.
func (r *Runtime) socket(id string) string {
	sum := sha256.Sum256([]byte(r.cfg.Dir))
	return "@space-fake-" + hex.EncodeToString(sum[:6]) + "-" + id
}

// get reads a sandbox's state. Precondition: r.mu held.
func (r *Runtime) get(id string) state {
	b, err := os.ReadFile(r.path(id))
	if err != nil {
		return state{Status: runtime.StatusAbsent}
	}
	var s state
	if json.Unmarshal(b, &s) != nil {
		return state{Status: runtime.StatusAbsent}
	}
	return s
}

// set writes a sandbox's state. Precondition: r.mu held.
func (r *Runtime) set(id string, s state) error {
	if s.Status == runtime.StatusAbsent {
		if err := os.Remove(r.path(id)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
		return nil
	}
	b, _ := json.Marshal(s)
	tmp := r.path(id) + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, r.path(id))
}

// transition moves id from one of the accepted statuses to `to`, running
// effect first. Being in `to` already is success (idempotent).
func (r *Runtime) transition(ctx context.Context, name, id string, to runtime.Status, effect func(*state) error, accept ...runtime.Status) error {
	if err := r.step(ctx, name); err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	cur := r.get(id)
	if cur.Status == to {
		return nil
	}
	for _, a := range accept {
		if cur.Status == a {
			if effect != nil {
				if err := effect(&cur); err != nil {
					return err
				}
			}
			cur.Status = to
			return r.set(id, cur)
		}
	}
	if cur.Status == runtime.StatusAbsent {
		return fmt.Errorf("%s %s: %w", name, id, runtime.ErrNotFound)
	}
	return fmt.Errorf("%s %s: sandbox is %s", name, id, cur.Status)
}

// startAgent runs the agent as a host process in its own session, so it
// outlives a server that is killed. Precondition: r.mu held.
func (r *Runtime) startAgent(id string, s *state) error {
	if r.cfg.AgentBin == "" {
		return nil
	}
	root := r.RootDir(id)
	if err := os.MkdirAll(root, 0o755); err != nil {
		return err
	}
	ep, err := r.endpointLocked(id)
	if err != nil {
		return err
	}
	_ = ep
	logf, err := os.OpenFile(filepath.Join(r.cfg.Dir, id+".agent.log"), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd := exec.Command(r.cfg.AgentBin, "--connect", "unix:"+r.socket(id), "--root", root)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start agent: %w", err)
	}
	s.AgentPID = cmd.Process.Pid
	go cmd.Wait() // reap it if it dies while we run
	return nil
}

// endpointLocked returns the sandbox's agent endpoint, listening if needed.
// Precondition: r.mu held.
func (r *Runtime) endpointLocked(id string) (*agentclient.Endpoint, error) {
	if ep, ok := r.endpoints[id]; ok {
		return ep, nil
	}
	ep, err := agentclient.Listen(r.socket(id), r.cfg.Logger.With("sandbox_id", id))
	if err != nil {
		return nil, err
	}
	r.endpoints[id] = ep
	return ep, nil
}

func (r *Runtime) signalAgent(s *state, sig syscall.Signal) error {
	if s.AgentPID == 0 {
		return nil
	}
	if err := syscall.Kill(s.AgentPID, sig); err != nil && !errors.Is(err, syscall.ESRCH) {
		return err
	}
	return nil
}

func (r *Runtime) Create(ctx context.Context, spec runtime.Spec) error {
	id := spec.SandboxID
	if err := r.transition(ctx, "create", id, runtime.StatusRunning, func(s *state) error { return r.startAgent(id, s) }, runtime.StatusAbsent); err != nil {
		return err
	}
	if r.cfg.AgentBin != "" {
		c, err := r.Agent(ctx, spec)
		if err != nil {
			return err
		}
		if _, err := c.Info(ctx); err != nil {
			return fmt.Errorf("agent not answering: %w", err)
		}
	}
	return nil
}

// Pause stops the agent (its commands keep running: it is a fake).
func (r *Runtime) Pause(ctx context.Context, spec runtime.Spec) error {
	return r.transition(ctx, "pause", spec.SandboxID, runtime.StatusPaused, func(s *state) error { return r.signalAgent(s, syscall.SIGSTOP) }, runtime.StatusRunning)
}

func (r *Runtime) Resume(ctx context.Context, spec runtime.Spec) error {
	return r.transition(ctx, "resume", spec.SandboxID, runtime.StatusRunning, func(s *state) error { return r.signalAgent(s, syscall.SIGCONT) }, runtime.StatusPaused)
}

// Suspend only records the status: the fake cannot save a process.
func (r *Runtime) Suspend(ctx context.Context, spec runtime.Spec) error {
	return r.transition(ctx, "suspend", spec.SandboxID, runtime.StatusSuspended, func(s *state) error { return r.signalAgent(s, syscall.SIGSTOP) }, runtime.StatusRunning, runtime.StatusPaused)
}

func (r *Runtime) Restore(ctx context.Context, spec runtime.Spec) error {
	return r.transition(ctx, "restore", spec.SandboxID, runtime.StatusRunning, func(s *state) error { return r.signalAgent(s, syscall.SIGCONT) }, runtime.StatusSuspended)
}

func (r *Runtime) Delete(ctx context.Context, spec runtime.Spec) error {
	id := spec.SandboxID
	return r.transition(ctx, "delete", id, runtime.StatusAbsent, func(s *state) error {
		if s.AgentPID != 0 {
			KillSession(s.AgentPID)
		}
		if ep, ok := r.endpoints[id]; ok {
			ep.Close()
			delete(r.endpoints, id)
		}
		os.Remove(filepath.Join(r.cfg.Dir, id+".agent.log"))
		return os.RemoveAll(r.RootDir(id))
	}, runtime.StatusRunning, runtime.StatusPaused, runtime.StatusSuspended)
}

// Recover reports the recorded status and listens for the agent again.
func (r *Runtime) Recover(ctx context.Context, spec runtime.Spec) (runtime.Status, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.get(spec.SandboxID)
	if s.Status != runtime.StatusAbsent && r.cfg.AgentBin != "" {
		if _, err := r.endpointLocked(spec.SandboxID); err != nil {
			return "", err
		}
	}
	return s.Status, nil
}

// ErrNoAgent is returned by Agent when the fake runs without an agent.
var ErrNoAgent = errors.New("fake runtime runs no agent")

func (r *Runtime) Agent(ctx context.Context, spec runtime.Spec) (*agentclient.Client, error) {
	if r.cfg.AgentBin == "" {
		return nil, ErrNoAgent
	}
	r.mu.Lock()
	s := r.get(spec.SandboxID)
	if s.Status != runtime.StatusRunning {
		r.mu.Unlock()
		return nil, fmt.Errorf("agent of %s: sandbox is %s", spec.SandboxID, s.Status)
	}
	ep, err := r.endpointLocked(spec.SandboxID)
	r.mu.Unlock()
	if err != nil {
		return nil, err
	}
	return ep.Client(ctx)
}

// KillSession kills every process of the session led by sid: the agent and
// the commands it started (each in its own process group, same session).
func KillSession(sid int) {
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid := 0
		if _, err := fmt.Sscan(e.Name(), &pid); err != nil || pid <= 1 {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		// Fields after the parenthesised command: state ppid pgrp session.
		rest := string(b)
		if i := strings.LastIndexByte(rest, ')'); i >= 0 {
			rest = rest[i+1:]
		}
		var st string
		var ppid, pgrp, session int
		if _, err := fmt.Sscan(rest, &st, &ppid, &pgrp, &session); err == nil && session == sid {
			syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	syscall.Kill(sid, syscall.SIGKILL)
}

var _ runtime.Snapshotter = (*Runtime)(nil)

// Snapshot copies the sandbox's root directory into dir (the fake saves
// files only: its agent's processes are host processes, not copied).
func (r *Runtime) Snapshot(ctx context.Context, spec runtime.Spec, dir string) error {
	if err := r.step(ctx, "snapshot"); err != nil {
		return err
	}
	if _, err := os.Stat(dir); err == nil {
		return nil
	}
	r.mu.Lock()
	st := r.get(spec.SandboxID).Status
	r.mu.Unlock()
	if st != runtime.StatusRunning && st != runtime.StatusPaused {
		return fmt.Errorf("snapshot %s: %w", spec.SandboxID, runtime.ErrNotFound)
	}
	tmp := dir + ".tmp"
	os.RemoveAll(tmp)
	if err := os.MkdirAll(tmp, 0o700); err != nil {
		return err
	}
	if src := r.RootDir(spec.SandboxID); dirExists(src) {
		if out, err := exec.CommandContext(ctx, "cp", "-a", src, filepath.Join(tmp, "root")).CombinedOutput(); err != nil {
			os.RemoveAll(tmp)
			return fmt.Errorf("copy root: %v: %s", err, out)
		}
	}
	if err := os.Rename(tmp, dir); err != nil {
		return err
	}
	if spec.Saved != nil {
		spec.Saved()
	}
	return nil
}

// CreateFrom creates a sandbox whose root starts as the snapshot's.
func (r *Runtime) CreateFrom(ctx context.Context, spec runtime.Spec, dir string) error {
	if err := r.step(ctx, "create_from"); err != nil {
		return err
	}
	if _, err := os.Stat(dir); err != nil {
		return fmt.Errorf("create %s from %s: %w", spec.SandboxID, dir, err)
	}
	if saved := filepath.Join(dir, "root"); dirExists(saved) && !dirExists(r.RootDir(spec.SandboxID)) {
		tmp := r.RootDir(spec.SandboxID) + ".tmp"
		os.RemoveAll(tmp)
		if out, err := exec.CommandContext(ctx, "cp", "-a", saved, tmp).CombinedOutput(); err != nil {
			return fmt.Errorf("copy root: %v: %s", err, out)
		}
		if err := os.Rename(tmp, r.RootDir(spec.SandboxID)); err != nil {
			return err
		}
	}
	return r.Create(ctx, spec)
}

func dirExists(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.IsDir()
}
