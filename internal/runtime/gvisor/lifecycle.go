//go:build linux

package gvisor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spacesandbox/space/internal/errdefs"
	"github.com/spacesandbox/space/internal/ids"
	"github.com/spacesandbox/space/internal/procfs"
	"github.com/spacesandbox/space/internal/runtime"
)

// A snapshot directory holds checkpoint generations, one subdirectory each,
// and a marker naming the generation to restore. The marker is written only
// after a checkpoint finished, and removed once the sandbox was restored from
// it. A generation's files stay until the next checkpoint succeeded: a
// restored sandbox may still be paging memory in from them (restore
// --background), and a new checkpoint no longer needs them.
const currentMarker = "current"

// snapshotGen returns the generation directory to restore, or "".
func snapshotGen(dir string) string {
	b, err := os.ReadFile(filepath.Join(dir, currentMarker))
	if err != nil {
		return ""
	}
	gen := filepath.Join(dir, strings.TrimSpace(string(b)))
	if filepath.Dir(gen) != filepath.Clean(dir) {
		return ""
	}
	if _, err := os.Stat(gen); err != nil {
		return ""
	}
	return gen
}

func snapshotComplete(dir string) bool { return snapshotGen(dir) != "" }

// markCurrent makes generation gen of dir the state to restore.
func markCurrent(dir, gen string) error {
	if err := replaceFile(filepath.Join(dir, currentMarker), []byte(gen)); err != nil {
		return err
	}
	return syncDir(dir)
}

// replaceFile writes b to path whole or not at all: to path.tmp, then
// renamed over path, so a reader (or a crash) never sees half of it.
func replaceFile(path string, b []byte) error {
	if err := os.WriteFile(path+".tmp", b, 0o600); err != nil {
		return err
	}
	return os.Rename(path+".tmp", path)
}

// savedMarker, in a generation, says that runsc's checkpoint into it
// finished. A suspend writes it as soon as runsc returns, before it ends the
// sandbox. A generation without it may be a checkpoint cut short (the
// sandbox died during the save, with the server): its files are there, in
// part, and no restore can use them. It holds the host's boot id: the
// suspend flushes the save after writing it, so one a killed server left
// unmarked is adopted only in the boot that wrote it (see savedAlready).
const savedMarker = "saved"

// markSaved records that the checkpoint into generation gdir finished, in
// this boot of the host.
func markSaved(gdir string) error {
	boot, err := procfs.BootID()
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(gdir, savedMarker), []byte(boot), 0o600)
}

// savedInEarlierBoot reports whether generation gdir's checkpoint finished
// in an earlier boot of the host (a marker from before the boot id was
// recorded is empty, and says nothing).
func savedInEarlierBoot(gdir string) bool {
	b, err := os.ReadFile(filepath.Join(gdir, savedMarker))
	boot, berr := procfs.BootID()
	return err == nil && berr == nil && len(b) > 0 && string(b) != boot
}

// newestCheckpoint is the newest generation in dir whose checkpoint
// finished ("" when none did).
func newestCheckpoint(dir string) string {
	ents, _ := os.ReadDir(dir)
	best := ""
	for _, e := range ents {
		if !e.IsDir() || !strings.HasPrefix(e.Name(), "gen-") {
			continue
		}
		if _, err := os.Stat(filepath.Join(dir, e.Name(), savedMarker)); err != nil {
			continue
		}
		if best == "" || len(e.Name()) > len(best) || (len(e.Name()) == len(best) && e.Name() > best) {
			best = e.Name()
		}
	}
	return best
}

// awaitEarlierRunsc waits until no `runsc checkpoint|restore … <id>` a
// killed server started on the sandbox still runs, then lets the caller look
// at what it left. Only a previous server's runsc can be in flight (the
// engine runs one operation per sandbox at a time), so the process table is
// scanned once per sandbox per server, not on every suspend and wake.
func (r *Runtime) awaitEarlierRunsc(ctx context.Context, id string) error {
	if _, done := r.earlierChecked.Load(id); done {
		return nil
	}
	for runscRunning(id, "checkpoint", "restore") {
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for an earlier server's runsc on %s: %w", id, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
	r.earlierChecked.Store(id, true)
	return nil
}

// runscRunning reports whether a `runsc <verb> … <id>` process runs for one
// of verbs.
func runscRunning(id string, verbs ...string) bool {
	found := false
	eachRunsc(func(_ int, name string, args []string) bool {
		found = args[len(args)-1] == id && slices.ContainsFunc(verbs, func(v string) bool { return slices.Contains(args, v) })
		return !found
	})
	return found
}

// eachRunsc calls fn with the pid, program name and arguments of each host
// process whose program name has "runsc" in it (runsc, runsc-sandbox,
// runsc-gofer) and which has arguments, until fn returns false.
func eachRunsc(fn func(pid int, name string, args []string) bool) {
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		args := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
		name := filepath.Base(args[0])
		if len(args) < 2 || !strings.Contains(name, "runsc") {
			continue
		}
		pid, err := strconv.Atoi(filepath.Base(filepath.Dir(p)))
		if err == nil && !fn(pid, name, args) {
			return
		}
	}
}

// Create boots a sandbox and waits for its agent. A half-made sandbox of the
// same id (a crash during create) is removed and made again.
func (r *Runtime) Create(ctx context.Context, spec runtime.Spec) error {
	id := spec.SandboxID
	t0 := time.Now()
	if done, err := r.prepare(ctx, spec, ""); done || err != nil {
		return err
	}
	t1 := time.Now()
	if err := r.start(ctx, spec, "run", "--detach", "--pid-file", r.pidPath(id), "--bundle", r.bundleDir(id), id); err != nil {
		return err
	}
	t2 := time.Now()
	err := r.ready(ctx, spec, true)
	r.log.Debug("gvisor: started", "sandbox_id", id, "prepare", t1.Sub(t0), "runsc_run", t2.Sub(t1), "agent", time.Since(t2))
	return err
}

// prepare readies a new container's bundle and agent endpoint (with the
// agent key from keyDir when given). A sandbox directory means an earlier
// attempt got somewhere: a container already running is finished (done),
// anything else is removed and made again. Without one (the common case)
// runsc need not be asked.
func (r *Runtime) prepare(ctx context.Context, spec runtime.Spec, keyDir string) (done bool, _ error) {
	id := spec.SandboxID
	if _, err := os.Stat(r.sandboxDir(id)); err == nil {
		st, err := r.state(ctx, spec)
		if err != nil {
			return false, err
		}
		if st != nil && st.Status == "running" {
			return true, r.ready(ctx, spec, false)
		}
		if err := r.destroy(ctx, spec); err != nil {
			return false, err
		}
	}
	rootfs, err := r.cfg.Templates.RootfsPath(spec.Template.Digest)
	if err != nil {
		return false, fmt.Errorf("template of %s: %w", id, err)
	}
	agent := r.agentOf(keyDir)
	if err := r.writeBundle(spec, rootfs, r.agentFile(agent)); err != nil {
		return false, fmt.Errorf("write bundle: %w", err)
	}
	if err := os.WriteFile(filepath.Join(r.sandboxDir(id), agentDigestFile), []byte(agent+"\n"), 0o600); err != nil {
		return false, fmt.Errorf("record the agent: %w", err)
	}
	if keyDir != "" {
		if err := copyFile(filepath.Join(keyDir, "agent.key"), filepath.Join(r.sandboxDir(id), "agent.key")); err != nil && !errors.Is(err, os.ErrNotExist) {
			return false, fmt.Errorf("agent key: %w", err)
		}
	}
	_, err = r.endpoint(id)
	return false, err
}

// ready waits for a sandbox's agent and starts watching its process;
// started says runsc just started it (so its pid file is fresh).
func (r *Runtime) ready(ctx context.Context, spec runtime.Spec, started bool) error {
	// Found running by a retry, its restore may be an earlier server's that
	// ended before the CPU limit (cpu.go). One runsc just started has it:
	// from its bundle (run) or from restore.
	if !started {
		if err := limitCPU(spec.SandboxID, spec.Resources.VCPUs); err != nil {
			return fmt.Errorf("limit the CPU of %s: %w", spec.SandboxID, err)
		}
	}
	if err := r.waitAgentAlive(ctx, spec.SandboxID); err != nil {
		return err
	}
	r.watch(ctx, spec, started)
	return nil
}

// waitAgentAlive waits for the sandbox's agent to answer, and gives up as
// soon as the sandbox's process, as the pid file names it, ends.
func (r *Runtime) waitAgentAlive(ctx context.Context, id string) error {
	if r.pidOf(id) == 0 {
		return r.waitAgent(ctx, id) // no process named to watch
	}
	return r.endpoints.WaitAlive(ctx, id, func() bool { return !r.ended(id) })
}

// Pause freezes every task of the sandbox (already paused is success):
// one call to its control server (control.go).
// A pause asked for now settles what a cut-short Snapshot was to leave.
func (r *Runtime) Pause(ctx context.Context, spec runtime.Spec) error {
	os.Remove(r.holdPausedMark(spec.SandboxID))
	return r.pauseSandbox(ctx, spec)
}

// Resume unfreezes a paused sandbox (running already is success). A resume
// asked for now settles what a cut-short Snapshot was to leave.
func (r *Runtime) Resume(ctx context.Context, spec runtime.Spec) error {
	os.Remove(r.holdPausedMark(spec.SandboxID))
	return r.resumeSandbox(ctx, spec)
}

func (r *Runtime) pausedMark(id string) string { return filepath.Join(r.sandboxDir(id), "paused") }

// holdPausedMark is there while Snapshot has a paused sandbox running for
// its save (snapshot.go).
func (r *Runtime) holdPausedMark(id string) string {
	return filepath.Join(r.sandboxDir(id), "hold-paused")
}

// surelyRunning reports, without asking runsc (a process start, tens of
// milliseconds), that a sandbox runs unpaused: its process, as runsc named
// it in the pid file, is alive, and no pause is marked. Anything less
// certain is false: the caller asks runsc.
func (r *Runtime) surelyRunning(id string) bool {
	if _, err := os.Stat(r.pausedMark(id)); !errors.Is(err, os.ErrNotExist) {
		return false
	}
	pid := r.pidOf(id)
	return r.isSandboxProcess(pid, id) && syscall.Kill(pid, 0) == nil
}

// pidOf is the sandbox process runsc wrote in the pid file (0: none).
func (r *Runtime) pidOf(id string) int {
	b, err := os.ReadFile(r.pidPath(id))
	if err != nil {
		return 0
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	return pid
}

// isSandboxProcess reports whether pid is the runsc sandbox process of id.
func (r *Runtime) isSandboxProcess(pid int, id string) bool {
	if pid <= 0 {
		return false
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	return err == nil && strings.Contains(string(b), "runsc-sandbox") && strings.Contains(string(b), id)
}

// ended reports that the sandbox's process, as the pid file names it, has
// ended or is ending; false when there is no pid file to say.
func (r *Runtime) ended(id string) bool {
	pid := r.pidOf(id)
	return pid > 0 && (!r.isSandboxProcess(pid, id) || processExiting(pid))
}

// processExiting reports whether process pid is ending: killed and
// tearing down, or a zombie.
func processExiting(pid int) bool {
	p, err := procfs.Stat(pid)
	return pid > 0 && err == nil && p.Ending()
}

// waitGone waits up to d for process pid to be gone (reaped, or a
// zombie: it holds nothing any more); false if it is still there.
func waitGone(ctx context.Context, pid int, d time.Duration) bool {
	deadline := time.Now().Add(d)
	for {
		if p, err := procfs.Stat(pid); err != nil || p.Gone() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// kill ends the sandbox's process at once (SIGKILL), if the pid file names
// it; false when there is none to kill.
func (r *Runtime) kill(id string) bool {
	pid := r.pidOf(id)
	return r.isSandboxProcess(pid, id) && syscall.Kill(pid, syscall.SIGKILL) == nil
}

// endAtOnce kills the sandbox's process, if the pid file names it, and
// clears its container away (clearAway): killed is false when there was
// none to kill, and err says why the clearing failed.
func (r *Runtime) endAtOnce(id string) (killed bool, err error) {
	pid := r.pidOf(id)
	if !r.kill(id) {
		return false, nil
	}
	return true, r.clearAway(id, pid)
}

// goferOf is the gofer process runsc's record of the container names
// (named), if it is still running as that container's gofer (pid; 0: it
// has ended, as a gofer does soon after its sandbox).
func (r *Runtime) goferOf(id string) (pid int, named bool) {
	states, _ := filepath.Glob(filepath.Join(r.cfg.Dir, "runsc", "*"+id+"*.state"))
	if len(states) != 1 {
		return 0, false
	}
	b, err := os.ReadFile(states[0])
	if err != nil {
		return 0, false
	}
	var st struct {
		GoferPid int `json:"goferPid"`
	}
	if json.Unmarshal(b, &st) != nil || st.GoferPid <= 0 {
		return 0, false
	}
	cmd, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", st.GoferPid))
	if err != nil || !strings.Contains(string(cmd), "runsc-gofer") || !strings.Contains(string(cmd), id) {
		return 0, true
	}
	return st.GoferPid, true
}

// sweepOrphans ends, at start, the sandboxes whose processes run from this
// runtime's runsc root but which runsc has no record of there: a data
// directory removed under running sandboxes (or a record lost) leaves them
// running with nothing that could reach or end them. One a runsc command
// still works on (a `runsc restore` a killed server started, which
// records it when done) is left to it; one made by a runsc killed before
// it recorded it is ended here, as the operation resumed for it would end
// it before doing its step again (clearAway). Their cgroups go once their
// processes have (in the background). It returns the sandboxes ended.
func (r *Runtime) sweepOrphans() (ended []string) {
	runscRoot := filepath.Join(r.cfg.Dir, "runsc")
	root := "--root=" + runscRoot
	// One look at the host's processes: each sandbox's own (its sandbox
	// process and gofer, both named with this root), and the sandboxes a
	// runsc command works on.
	procs := map[string][]int{}
	busy := map[string]bool{}
	eachRunsc(func(pid int, name string, args []string) bool {
		id := args[len(args)-1]
		switch {
		case name == "runsc-sandbox" || name == "runsc-gofer":
			if slices.Contains(args, root) && ids.Valid(ids.Sandbox, id) {
				procs[id] = append(procs[id], pid)
			}
		case slices.ContainsFunc([]string{"run", "create", "start", "restore", "checkpoint", "delete", "kill"}, func(v string) bool { return slices.Contains(args, v) }):
			busy[id] = true
		}
		return true
	})
	if len(procs) == 0 {
		return nil
	}
	// runsc's records (as removeRecord finds them): unreadable, nothing can
	// be told an orphan.
	recs, err := os.ReadDir(runscRoot)
	if err != nil {
		r.log.Warn("gvisor: read runsc's records; not looking for sandboxes it has none of", "err", err)
		return nil
	}
	recorded := func(id string) bool {
		return slices.ContainsFunc(recs, func(e os.DirEntry) bool { return strings.Contains(e.Name(), id) })
	}
	for id, pids := range procs {
		if recorded(id) || busy[id] {
			continue
		}
		var killed []int
		for _, pid := range pids {
			if syscall.Kill(pid, syscall.SIGKILL) == nil {
				killed = append(killed, pid)
			}
		}
		if len(killed) == 0 {
			continue
		}
		ended = append(ended, id)
		r.ending.Add(1)
		go func() {
			defer r.ending.Done()
			for _, pid := range killed {
				waitGone(context.Background(), pid, 10*time.Second)
			}
			for _, cg := range sandboxCgroups(id) {
				if err := removeCgroup(cg); err != nil {
					r.log.Warn("gvisor: remove the cgroup of a sandbox runsc had no record of", "sandbox_id", id, "err", err)
				}
			}
		}()
	}
	slices.Sort(ended)
	return ended
}

// killStrays ends what is left of a sandbox's host processes that runsc no
// longer knows of: a gofer or sandbox process whose `runsc restore` or
// `runsc run` was killed before runsc recorded them (their command names
// the sandbox as its last argument). It returns the processes it killed.
func killStrays(id string) (killed []int) {
	eachRunsc(func(pid int, name string, args []string) bool {
		if (name == "runsc-gofer" || name == "runsc-sandbox") && args[len(args)-1] == id && syscall.Kill(pid, syscall.SIGKILL) == nil {
			killed = append(killed, pid)
		}
		return true
	})
	return killed
}

// clearAway ends a sandbox whose process (pid) was just killed — by a
// suspend, which makes way for its next start, or by a delete: its gofer
// (as runsc's record names it) is killed too, what names its container —
// runsc's record and control socket, its cgroups — is removed or moved
// aside at once, and what its dying processes still hold goes in the
// background. runsc's own delete waits for the sandbox's teardown (its
// memory given back and its threads ended: 20–60 ms for 200 MiB), and a
// wake that followed a suspend at once waited for that. A cgroup is moved
// aside under a name of its own (`<id>.ended-<time>`), which no start ever
// joins; the start's sweep removes one a killed server left.
func (r *Runtime) clearAway(id string, pid int) error {
	pids := []int{pid}
	switch g, named := r.goferOf(id); {
	case g > 0 && syscall.Kill(g, syscall.SIGKILL) == nil:
		pids = append(pids, g)
	case !named:
		// No record to name it: look for it among every process (6 ms
		// here; 87 ms with a thousand more processes on the host).
		pids = append(pids, killStrays(id)...)
	}
	stamp := fmt.Sprintf(".ended-%d", time.Now().UnixNano())
	var moved []string
	defer func() {
		r.ending.Add(1)
		go func() {
			defer r.ending.Done()
			for _, p := range pids {
				waitGone(context.Background(), p, 10*time.Second)
			}
			for _, cg := range moved {
				if err := removeCgroup(cg); err != nil {
					r.log.Warn("gvisor: remove an ended sandbox's cgroup", "sandbox_id", id, "err", err)
				}
			}
		}()
	}()
	for _, cg := range sandboxCgroups(id) {
		switch err := r.moveCgroup(cg, cg+stamp); {
		case err == nil:
			moved = append(moved, cg+stamp)
		case errors.Is(err, os.ErrNotExist): // a v1 controller mounted with another, moved already
		default:
			return fmt.Errorf("move the cgroup of %s aside: %w", id, err)
		}
	}
	if err := r.removeRecord(id); err != nil {
		return fmt.Errorf("remove runsc's record of %s: %w", id, err)
	}
	return nil
}

// removeRecord removes what runsc's root holds of a container: its record,
// lock and control socket.
func (r *Runtime) removeRecord(id string) error {
	left, _ := filepath.Glob(filepath.Join(r.cfg.Dir, "runsc", "*"+id+"*"))
	var errs []error
	for _, p := range left {
		if err := os.RemoveAll(p); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func (r *Runtime) freeze(ctx context.Context, spec runtime.Spec, verb, want string) error {
	_, err := r.runsc(ctx, spec, verb, spec.SandboxID)
	if err == nil {
		return nil
	}
	st, serr := r.state(ctx, spec)
	switch {
	case serr != nil:
		return errors.Join(err, serr)
	case st == nil:
		return fmt.Errorf("%s %s: %w", verb, spec.SandboxID, runtime.ErrNotFound)
	case st.Status == want:
		return nil
	}
	return err
}

// Suspend checkpoints the sandbox (memory, kernel state and the overlay's
// writable layer) into spec.SnapshotDir and removes the running sandbox.
func (r *Runtime) Suspend(ctx context.Context, spec runtime.Spec) error {
	// A checkpoint a killed server started runs on: let it finish, then
	// look at what it left.
	if err := r.awaitEarlierRunsc(ctx, spec.SandboxID); err != nil {
		return err
	}
	return r.suspend(ctx, spec, r.surelyRunning(spec.SandboxID))
}

// suspend saves the sandbox; quick skips asking runsc for its state (the
// common case: surelyRunning), and looks properly if the checkpoint fails.
func (r *Runtime) suspend(ctx context.Context, spec runtime.Spec, quick bool) error {
	id, dir := spec.SandboxID, spec.SnapshotDir
	st := &containerState{Status: "running"}
	if !quick {
		var err error
		if st, err = r.state(ctx, spec); err != nil {
			return err
		}
	}
	if st == nil || st.Status == "stopped" {
		return r.savedAlready(ctx, spec, st != nil)
	}
	how, err := r.frozen(ctx, spec, st)
	if err != nil {
		return err
	}
	wasPaused := how != ""
	if wasPaused {
		// runsc checkpoints running sandboxes.
		if err := r.resumeSandbox(ctx, spec); err != nil {
			return err
		}
	}
	gen := fmt.Sprintf("gen-%d", time.Now().UnixNano())
	gdir := filepath.Join(dir, gen)
	if err := os.MkdirAll(gdir, 0o700); err != nil {
		return err
	}
	if err := r.roomToSave(spec, gdir, "save"); err != nil {
		os.RemoveAll(gdir)
		if wasPaused {
			r.pauseSandbox(ctx, spec)
		}
		return err
	}
	// The sandbox's process is replaced or ended from here: not a death to
	// report. Nothing it does after its image is taken may reach a client:
	// its agent's channel closes first.
	r.exits.Stop(id)
	r.closeEndpoint(id)
	// --leave-running: a checkpoint that fails (a full disk) leaves the
	// sandbox running as it was, instead of ending it with its state lost.
	t0 := time.Now()
	stopFlush := flushWhileWritten(gdir)
	_, err = r.runsc(ctx, spec, r.checkpoint(false, "--leave-running", "--image-path", gdir, id)...)
	stopFlush()
	if err != nil {
		os.RemoveAll(gdir)
		r.endpoint(id)
		if wasPaused {
			r.pauseSandbox(ctx, spec)
		}
		r.watch(ctx, spec, false)
		if strings.Contains(err.Error(), "no space left") {
			return errdefs.Wrap(errdefs.InsufficientStorage, err, "not enough disk space to save the sandbox; it runs on as before")
		}
		if pid := r.pidOf(id); processExiting(pid) {
			// Its process is going away: a killed server's suspend saved
			// it and killed it before marking the save current. Once the
			// process is gone, look again: that save is adopted.
			if waitGone(ctx, pid, 10*time.Second) {
				return r.savedAlready(ctx, spec, true)
			}
			return err
		}
		if quick {
			// It was taken for running without asking: ask, and try again.
			return r.suspend(ctx, spec, false)
		}
		return err
	}
	t1 := time.Now()
	if err := markSaved(gdir); err != nil {
		return fmt.Errorf("mark the checkpoint of %s finished: %w", id, err)
	}
	// The image is the sandbox now: what runs on is killed at once, and
	// its container cleared away without waiting for its teardown
	// (clearAway); without a pid to kill, or where that fails, runsc's
	// delete is waited for beside making the image durable.
	deleted := make(chan error, 1)
	if killed, err := r.endAtOnce(id); killed && err == nil {
		deleted <- nil
	} else {
		go func() {
			_, err := r.runsc(ctx, spec, "delete", "--force", id)
			if notExist(err) {
				err = nil
			}
			if err != nil && killed {
				// Its process was killed: the image is the sandbox, and
				// the suspend stands. What runsc left of the container
				// is cleared by the next wake (a container in the way is
				// deleted first) or delete (forgetContainer).
				r.log.Warn("gvisor: runsc delete after a suspend failed; the sandbox was killed and its save stands", "sandbox_id", id, "err", err)
				err = nil
			}
			deleted <- err
		}()
	}
	// The agent's key goes with the image: a node that restores it
	// elsewhere (a cluster's wake) lets the same agent in.
	err = copyFile(filepath.Join(r.sandboxDir(id), "agent.key"), filepath.Join(gdir, "agent.key"))
	if errors.Is(err, os.ErrNotExist) {
		err = nil
	}
	if err != nil {
		err = fmt.Errorf("keep agent key: %w", err)
	} else if err = r.keepAgentRecord(id, gdir); err == nil {
		if err = syncDir(gdir); err != nil {
			err = fmt.Errorf("sync snapshot: %w", err)
		}
	}
	if err := errors.Join(err, <-deleted); err != nil {
		return err
	}
	t2 := time.Now()
	if err := markCurrent(dir, gen); err != nil {
		return err
	}
	r.setMark(id, "")
	defer func() {
		r.log.Debug("gvisor: suspended", "sandbox_id", id, "checkpoint", t1.Sub(t0), "kill_and_sync", t2.Sub(t1), "after", time.Since(t2))
	}()
	// Older generations are not needed once this checkpoint holds all the
	// sandbox's memory. They leave the directory before Suspend returns,
	// so it is the snapshot and nothing else (a blob store uploads all of
	// it), and are removed later (discard).
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if e.IsDir() && e.Name() != gen {
			r.discard(filepath.Join(dir, e.Name()))
		}
	}
	return nil
}

// trashDir holds what discard moved out of the way.
func (r *Runtime) trashDir() string { return filepath.Join(r.cfg.Dir, "trash") }

// discardDelay is how long discarded files wait before their removal.
const discardDelay = 2 * time.Second

// discard moves path out of the way at once and removes it a little
// later. Removing a generation of a few hundred megabytes costs tens of
// milliseconds (its pages are dropped from the page cache), which no
// suspend should wait for, nor the wake that often follows it at once. It
// goes into the runtime's trash directory (a rename: where the data
// directory is one file system), which the next server empties at start
// if this one stopped first; elsewhere it is removed at once.
func (r *Runtime) discard(path string) {
	trash := r.trashDir()
	to := filepath.Join(trash, fmt.Sprintf("%d-%s", time.Now().UnixNano(), filepath.Base(path)))
	if os.MkdirAll(trash, 0o700) != nil || os.Rename(path, to) != nil {
		os.RemoveAll(path)
		return
	}
	time.AfterFunc(discardDelay, func() { os.RemoveAll(to) })
}

// savedAlready finishes a suspend whose sandbox no longer runs: a save is
// its state (one a killed server wrote but did not mark current is
// adopted), and what is left of its container (exists) goes; without a
// save the sandbox is not found.
func (r *Runtime) savedAlready(ctx context.Context, spec runtime.Spec, exists bool) error {
	id, dir := spec.SandboxID, spec.SnapshotDir
	if !snapshotComplete(dir) {
		// The server died after the checkpoint was written but before it
		// was marked current: it is the sandbox's state now, unless it was
		// written in an earlier boot of the host (that server may have
		// died before flushing it, and its files lost writes with the
		// boot).
		gen := newestCheckpoint(dir)
		if gen != "" && savedInEarlierBoot(filepath.Join(dir, gen)) {
			r.log.Warn("gvisor: not adopting a checkpoint a killed server left unmarked and unflushed before the host restarted", "sandbox_id", id, "generation", gen)
			gen = ""
		}
		if gen != "" {
			r.log.Warn("gvisor: adopting a checkpoint a killed server left unmarked", "sandbox_id", id, "generation", gen)
			if err := syncDir(filepath.Join(dir, gen)); err != nil {
				return fmt.Errorf("sync the adopted checkpoint: %w", err)
			}
			if err := markCurrent(dir, gen); err != nil {
				return err
			}
		}
	}
	if snapshotComplete(dir) {
		if exists {
			r.runsc(ctx, spec, "delete", "--force", id)
		}
		r.closeEndpoint(id)
		return nil // already suspended
	}
	return fmt.Errorf("suspend %s: %w", id, runtime.ErrNotFound)
}

// checkpoint is runsc checkpoint with SPACE's flags: where the data
// directory's file system takes O_DIRECT, the pages file is written with
// it, and restore reads it with it too. A save then neither fills the
// page cache nor, when durable, is written twice over (to the page cache,
// then by the fsync); and on a virtual machine's host, where every page the
// cache takes costs a fault, the cache was the slow part: a fork of a
// sandbox with 200 MiB dirty whose save stayed in the page cache took
// 1.13–1.28 s here, with O_DIRECT both ways 0.67–0.94 s, and a wake from
// suspend 0.74–0.94 s against 0.44–0.53 s (alternated).
//
// A fork's save, which its copies load at once and the fork then removes,
// goes through the page cache instead (cached) unless the sandbox's memory
// cgroup is too full for it (pagecache.go): it is gone, unwritten, once
// they have loaded it (restoreFrom), so the pages it takes are given back
// at once.
func (r *Runtime) checkpoint(cached bool, args ...string) []string {
	if r.direct && !cached {
		return append([]string{"checkpoint", "--direct"}, args...)
	}
	return append([]string{"checkpoint"}, args...)
}

// directIO reports whether files in dir can be opened with O_DIRECT.
func directIO(dir string) bool {
	f, err := os.CreateTemp(dir, ".direct-")
	if err != nil {
		return false
	}
	name := f.Name()
	f.Close()
	defer os.Remove(name)
	fd, err := syscall.Open(name, syscall.O_WRONLY|syscall.O_DIRECT, 0)
	if err != nil {
		return false
	}
	syscall.Close(fd)
	return true
}

// Restore brings a suspended sandbox back from spec.SnapshotDir.
// One that fails leaves nothing of its attempt running: the sandbox is
// still suspended, and its image intact.
func (r *Runtime) Restore(ctx context.Context, spec runtime.Spec) (err error) {
	id := spec.SandboxID
	t0 := time.Now()
	if err := r.awaitEarlierRunsc(ctx, id); err != nil {
		return err
	}
	t1 := time.Now()
	gdir := snapshotGen(spec.SnapshotDir)
	if gdir == "" {
		if st, err := r.state(ctx, spec); err == nil && st != nil && st.Status == "running" {
			return r.ready(ctx, spec, false) // restored already
		}
		return fmt.Errorf("restore %s: no complete snapshot: %w", id, runtime.ErrNotFound)
	}
	if _, err := os.Stat(r.sandboxDir(id)); errors.Is(err, os.ErrNotExist) {
		// Suspended on another host (its snapshot came from a blob
		// store): its bundle and agent endpoint are made here, as for a
		// copy (CreateFrom), with the key saved beside the image.
		if _, err := r.prepare(ctx, spec, gdir); err != nil {
			return err
		}
	}
	if _, err := r.endpoint(id); err != nil {
		return err
	}
	err = r.restore(ctx, spec, gdir, r.pidPath(id))
	defer func() {
		if err != nil && ctx.Err() == nil {
			// Suspended still: nothing of this attempt runs on.
			r.deleteContainer(context.WithoutCancel(ctx), spec)
			r.forgetContainer(id)
		}
	}()
	if err != nil {
		// Only now look closer: restored already (a retry), or a stale
		// container of the same id in the way.
		st, serr := r.state(ctx, spec)
		switch {
		case serr != nil:
			return errors.Join(err, serr)
		case st != nil && st.Status == "running":
			return r.ready(ctx, spec, false)
		case st != nil:
			r.runsc(ctx, spec, "delete", "--force", id)
			err = r.restore(ctx, spec, gdir, r.pidPath(id))
		}
		if err != nil {
			return err
		}
	}
	t2 := time.Now()
	if err := r.ready(ctx, spec, true); err != nil {
		return err
	}
	r.log.Debug("gvisor: woken", "sandbox_id", id, "before", t1.Sub(t0), "runsc_restore", t2.Sub(t1), "agent", time.Since(t2))
	// The sandbox runs again: this generation is no longer the state to
	// restore. Its files stay (memory may still be paging in from them)
	// until the next checkpoint or delete.
	return os.Remove(filepath.Join(spec.SnapshotDir, currentMarker))
}

// Delete removes the sandbox's processes, runsc state, cgroup, bundle,
// overlay and socket directory. Absent is success.
func (r *Runtime) Delete(ctx context.Context, spec runtime.Spec) error {
	return r.destroy(ctx, spec)
}

func (r *Runtime) destroy(ctx context.Context, spec runtime.Spec) error {
	id := spec.SandboxID
	r.exits.Stop(id)
	r.earlierChecked.Delete(id)
	r.prepared.Delete(id)
	r.closeEndpoint(id)
	t0 := time.Now()
	// A running sandbox is ended at once and its container cleared away,
	// as a suspend does, its teardown left to the background (clearAway):
	// runsc's kill and delete, and the look at the host's processes for
	// strays, cost 40–70 ms here, most of it waiting for that teardown.
	// Without a process of its own to kill (ended already, or never
	// started), or where clearing fails, runsc deletes what it knows of.
	var errs []error
	killed, err := r.endAtOnce(id)
	quick := killed && err == nil
	if !quick {
		if err := r.deleteContainer(ctx, spec); err != nil {
			return err
		}
		errs = append(errs, r.forgetContainer(id))
	}
	defer func() { r.log.Debug("gvisor: deleted", "sandbox_id", id, "quick", quick, "took", time.Since(t0)) }()
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

// deleteContainer ends and deletes the sandbox's container as far as runsc
// knows of it; forgetContainer removes the rest. A runsc killed under it by
// a signal (the OOM killer, an operator's kill) is run again, up to three
// times: a delete does not fail on a helper process that died.
func (r *Runtime) deleteContainer(ctx context.Context, spec runtime.Spec) error {
	var err error
	for range 3 {
		if err = r.deleteContainerOnce(ctx, spec); err == nil || !killedBySignal(err) || ctx.Err() != nil {
			return err
		}
		r.log.Warn("gvisor: runsc was killed during a delete; running it again", "sandbox_id", spec.SandboxID, "err", err)
	}
	return err
}

// killedBySignal reports whether err is that of a process a signal ended.
func killedBySignal(err error) bool {
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		return false
	}
	ws, ok := ee.Sys().(syscall.WaitStatus)
	return ok && ws.Signaled()
}

func (r *Runtime) deleteContainerOnce(ctx context.Context, spec runtime.Spec) error {
	id := spec.SandboxID
	st, err := r.state(ctx, spec)
	if err != nil || st == nil {
		return err
	}
	if st.Status != "stopped" {
		r.runsc(ctx, spec, "kill", "--all", id, "KILL")
	}
	if _, err := r.runsc(ctx, spec, "delete", "--force", id); err != nil && !notExist(err) {
		return err
	}
	return nil
}

// forgetContainer ends what still runs of a container runsc no longer
// manages (killStrays) and removes what runsc's root holds of it: what a
// sandbox process killed from outside leaves there, which runsc's delete
// does not remove (its control socket and lock files), or a record a
// killed runsc left torn.
func (r *Runtime) forgetContainer(id string) error {
	for _, pid := range killStrays(id) {
		waitGone(context.Background(), pid, 5*time.Second)
	}
	errs := []error{r.removeRecord(id)}
	// Its cgroup, which runsc's delete would have removed, once its
	// processes are gone, and any a suspend moved aside (clearAway).
	for _, cg := range sandboxCgroups(id + "*") {
		if err := removeCgroup(cg); err != nil {
			errs = append(errs, fmt.Errorf("remove cgroup: %w", err))
		}
	}
	return errors.Join(errs...)
}

// sandboxCgroups are the gVisor sandbox cgroups whose name matches pattern
// (a sandbox id, or a glob): v1, one per controller, or v2, one.
func sandboxCgroups(pattern string) []string {
	v1, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup/*/space", pattern))
	v2, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup/space", pattern))
	return append(v1, v2...)
}

// removeCgroup removes an empty cgroup directory; absent is success. A
// killed sandbox's cgroup stays busy after its process is a zombie, until
// its hundred-odd threads and its stub processes have ended (tens of ms):
// that is waited for, up to two seconds, as runsc's delete does.
func removeCgroup(dir string) error {
	for end := time.Now().Add(2 * time.Second); ; time.Sleep(2 * time.Millisecond) {
		err := os.Remove(dir)
		if err == nil || errors.Is(err, os.ErrNotExist) {
			return nil
		}
		if !errors.Is(err, syscall.EBUSY) || time.Now().After(end) {
			return err
		}
	}
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
	if st != nil && (st.Status == "running" || st.Status == "paused") {
		// A server that ended between a restore and its CPU limit (cpu.go)
		// left the sandbox without one.
		if err := limitCPU(spec.SandboxID, spec.Resources.VCPUs); err != nil {
			r.log.Warn("gvisor: limit the CPU of a sandbox found running", "sandbox_id", spec.SandboxID, "err", err)
		}
	}
	switch {
	case st != nil && (st.Status == "running" || st.Status == "paused"):
		if _, err := r.endpoint(spec.SandboxID); err != nil {
			return "", err
		}
		r.watch(ctx, spec, false)
		how, err := r.frozen(ctx, spec, st)
		if err != nil {
			return "", err
		}
		if how != "" {
			return runtime.StatusPaused, nil
		}
		return runtime.StatusRunning, nil
	case snapshotComplete(spec.SnapshotDir):
		return runtime.StatusSuspended, nil
	}
	return runtime.StatusAbsent, nil
}

// syncDir makes dir's files and subdirectories (not what they hold) and
// its entries durable, and says when the disk could not: a save whose
// flush failed must not be taken for kept.
func syncDir(dir string) error {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range ents {
		if !e.Type().IsRegular() && !e.IsDir() {
			continue
		}
		f, err := os.Open(filepath.Join(dir, e.Name()))
		if errors.Is(err, os.ErrNotExist) {
			continue // gone since the listing: nothing of it to keep
		}
		if err == nil {
			err = errors.Join(f.Sync(), f.Close())
		}
		if err != nil {
			return err
		}
	}
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// flushEvery is how often flushWhileWritten flushes a save being written.
const flushEvery = 20 * time.Millisecond

// flushWhileWritten flushes the files of dir to the disk every flushEvery
// until the returned stop is called (which waits for a flush under way),
// so the flush that makes a save durable once it is written (syncDir) has
// only its tail left. A disk's flush of what was written takes about as
// long as the write itself (200 MiB: 120–160 ms on a virtual machine's
// disk here, where runsc's checkpoint writes it in ~150 ms); it runs
// beside runsc's save, waiting on the disk while runsc works, instead of
// after it. Errors are left to syncDir, which looks again.
func flushWhileWritten(dir string) (stop func()) {
	done, finished := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(finished)
		t := time.NewTicker(flushEvery)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
			}
			ents, _ := os.ReadDir(dir)
			for _, e := range ents {
				if !e.Type().IsRegular() {
					continue
				}
				if f, err := os.Open(filepath.Join(dir, e.Name())); err == nil {
					syscall.Fdatasync(int(f.Fd()))
					f.Close()
				}
			}
		}
	}()
	return func() { close(done); <-finished }
}

// roomToSave refuses a checkpoint into dir that the disk may not hold,
// before it starts: a gVisor checkpoint that fails half-way leaves the
// sandbox running but unable to reach host sockets, so its agent never
// answers again. The image holds at most the memory the sandbox's cgroup
// uses (uncompressed), so that much must be free. verb names the
// save in the error.
func (r *Runtime) roomToSave(spec runtime.Spec, dir, verb string) error {
	b, err := os.ReadFile(filepath.Join("/sys/fs/cgroup/space", spec.SandboxID, "memory.current")) // cgroup v2
	if err != nil {
		b, err = os.ReadFile(filepath.Join("/sys/fs/cgroup/memory/space", spec.SandboxID, "memory.usage_in_bytes")) // v1
	}
	if err != nil {
		return nil // no cgroup to ask: try
	}
	used, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		return nil
	}
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return nil
	}
	free := int64(st.Bavail) * int64(st.Bsize)
	if need := used + 16<<20; free < need {
		return errdefs.New(errdefs.InsufficientStorage, "not enough disk space to %s the sandbox (it uses %d MiB of memory; %d MiB are free); it runs on as before",
			verb, used>>20, free>>20)
	}
	return nil
}

// sweepCgroups removes, at start, the cgroups of gVisor sandboxes that
// nothing runs in: what a delete before removeCgroup left, a server killed
// before it removed what a suspend moved aside, or a host crash (suspended
// sandboxes hold none). Every server on the host shares the "space"
// parent, and only an empty cgroup can be removed, so a sandbox that runs,
// here or under another server, keeps its own; one made in the last minute
// is kept too (a runsc may be about to join it). It returns how many it
// removed.
func sweepCgroups() int {
	removed := 0
	for _, cg := range sandboxCgroups("sbx_*") {
		fi, err := os.Stat(cg)
		if err != nil || !fi.IsDir() {
			continue
		}
		if strings.Contains(filepath.Base(cg), ".ended-") {
			// Moved aside by a suspend or a delete (clearAway): never
			// joined again, and empty once its processes have gone.
			if removeCgroup(cg) == nil {
				removed++
			}
			continue
		}
		if time.Since(fi.ModTime()) >= time.Minute && os.Remove(cg) == nil {
			removed++
		}
	}
	return removed
}
