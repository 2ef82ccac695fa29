//go:build linux

package gvisor

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/spacesandbox/space/internal/agent/proto"
	"github.com/spacesandbox/space/internal/agentclient"
	"github.com/spacesandbox/space/internal/ids"
	"github.com/spacesandbox/space/internal/procfs"
	"github.com/spacesandbox/space/internal/runtime"
	"github.com/spacesandbox/space/internal/runtime/runtimetest"
	"github.com/spacesandbox/space/internal/sandbox"
)

// testRuntime gives a function opening the runtime over one state
// directory (each call: a new server over the same host; a runsc named
// there is used instead of the real one, a wrapper injecting a fault) and
// one making the spec of a new sandbox of the test template (1 vCPU,
// 256 MiB), deleted at the end of the test.
func testRuntime(t *testing.T) (open func(wrapper ...string) *Runtime, newSpec func() runtime.Spec) {
	runsc, _ := runtimetest.RequireRunsc(t)
	agent := runtimetest.BuildAgent(t)
	store, tpl := runtimetest.TestTemplate(t)
	dir := t.TempDir()
	t.Cleanup(func() { syscall.Unmount(filepath.Join(dir, "runsc", "null-netns"), syscall.MNT_DETACH) })
	open = func(wrapper ...string) *Runtime {
		bin := runsc
		if len(wrapper) > 0 {
			bin = wrapper[0]
		}
		r, err := New(Config{Runsc: bin, Dir: dir, AgentBin: agent, Templates: store})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	newSpec = func() runtime.Spec {
		spec := runtime.Spec{SandboxID: ids.New(ids.Sandbox), Template: sandbox.TemplateRef{Ref: "test:latest", Digest: tpl.Digest},
			Resources: sandbox.Resources{VCPUs: 1, MemoryMiB: 256, DiskMiB: 256}, SnapshotDir: filepath.Join(t.TempDir(), "snapshot")}
		t.Cleanup(func() { open().Delete(context.Background(), spec) })
		return spec
	}
	return open, newSpec
}

// started creates a sandbox from newSpec on r and returns it with its
// agent.
func started(ctx context.Context, t *testing.T, r *Runtime, newSpec func() runtime.Spec) (runtime.Spec, *agentclient.Client) {
	t.Helper()
	spec := newSpec()
	if err := r.Create(ctx, spec); err != nil {
		t.Fatal(err)
	}
	c, err := r.Agent(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	return spec, c
}

// writeKept writes the file expectKept looks for.
func writeKept(ctx context.Context, t *testing.T, c *agentclient.Client) {
	t.Helper()
	if _, err := c.WriteFile(ctx, "/root/kept.txt", 0o600, strings.NewReader("kept"), 0); err != nil {
		t.Fatal(err)
	}
}

// expectKept fails the test unless the sandbox on r has the file
// writeKept wrote.
func expectKept(ctx context.Context, t *testing.T, r *Runtime, spec runtime.Spec) {
	t.Helper()
	c, err := r.Agent(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	if _, b, err := c.ReadFile(ctx, "/root/kept.txt", 0, 100); err != nil || string(b) != "kept" {
		t.Fatalf("the file written before: %q %v", b, err)
	}
}

// startShell starts `sh -c script` in the sandbox as process id.
func startShell(ctx context.Context, t *testing.T, c *agentclient.Client, id, script string) {
	t.Helper()
	if _, err := c.CreateProcess(ctx, proto.ProcessSpec{ID: id, Argv: []string{"sh", "-c", script}}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.StartProcess(ctx, id); err != nil {
		t.Fatal(err)
	}
}

// fillMemory fills 150 MB of the sandbox's memory: what its teardown
// gives back makes that teardown long enough to see (60–80 ms).
func fillMemory(ctx context.Context, t *testing.T, c *agentclient.Client) {
	t.Helper()
	fillFrom(ctx, t, c, "/dev/zero", 150000000)
}

// fillFrom writes n bytes of src to /tmp/fill in the sandbox (its memory)
// and waits for them.
func fillFrom(ctx context.Context, t *testing.T, c *agentclient.Client, src string, n int) {
	t.Helper()
	startShell(ctx, t, c, "fill", fmt.Sprintf("head -c %d %s > /tmp/fill && touch /tmp/filled", n, src))
	for {
		if _, _, err := c.ReadFile(ctx, "/tmp/filled", 0, 1); err == nil {
			return
		}
		if ctx.Err() != nil {
			t.Fatal("the sandbox's memory was not filled")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// checkpointThenKill does what a suspend does up to the kill of the
// sandbox, into generation gen-1 of its snapshot directory, and returns
// that: the checkpoint, its saved mark when saved (without it, the finish
// of the checkpoint was never seen), the kill.
func checkpointThenKill(ctx context.Context, t *testing.T, r *Runtime, spec runtime.Spec, saved bool) string {
	t.Helper()
	id := spec.SandboxID
	gdir := filepath.Join(spec.SnapshotDir, "gen-1")
	if err := os.MkdirAll(gdir, 0o700); err != nil {
		t.Fatal(err)
	}
	r.exits.Stop(id)
	r.closeEndpoint(id)
	if _, err := r.runsc(ctx, spec, r.checkpoint(false, "--leave-running", "--image-path", gdir, id)...); err != nil {
		t.Fatal(err)
	}
	if saved {
		if err := markSaved(gdir); err != nil {
			t.Fatal(err)
		}
	}
	if !r.kill(id) {
		t.Fatal("no sandbox process to kill")
	}
	return gdir
}

// A server killed in the middle of a suspend — after its checkpoint was
// written and the sandbox's process killed, before the save was marked
// current — leaves a sandbox whose process may still be going away when
// the next server resumes the suspend. That suspend adopts the save (it
// used to try a checkpoint of the dying process, fail, and lose the
// sandbox), and the sandbox wakes from it with its files.
func TestSuspendAdoptsTheSaveOfAKilledServer(t *testing.T) {
	open, newSpec := testRuntime(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	r := open()
	spec, c := started(ctx, t, r, newSpec)
	writeKept(ctx, t, c)

	// The killed server's suspend, up to the kill of the sandbox.
	id := spec.SandboxID
	gdir := checkpointThenKill(ctx, t, r, spec, true)
	if err := copyFile(filepath.Join(r.sandboxDir(id), "agent.key"), filepath.Join(gdir, "agent.key")); err != nil {
		t.Fatal(err)
	}
	if err := r.keepAgentRecord(id, gdir); err != nil {
		t.Fatal(err)
	}
	r.Close()

	// The next server resumes the suspend at once.
	r = open()
	if err := r.Suspend(ctx, spec); err != nil {
		t.Fatalf("the resumed suspend: %v", err)
	}
	if st, err := r.Recover(ctx, spec); err != nil || st != runtime.StatusSuspended {
		t.Fatalf("after the resumed suspend: %v %v", st, err)
	}
	if err := r.Restore(ctx, spec); err != nil {
		t.Fatal(err)
	}
	expectKept(ctx, t, r, spec)
}

// A server and its sandbox killed together during a suspend's checkpoint
// leave a generation whose files are there in part. The next server's
// resumed suspend must not adopt it (the sandbox would be shown suspended
// and never wake): the sandbox is gone. Fault injected: a checkpoint whose
// finish was never seen — runsc's files in place, no saved mark — and the
// sandbox's process killed.
func TestSuspendDoesNotAdoptACheckpointCutShortFaultInjection(t *testing.T) {
	open, newSpec := testRuntime(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	r := open()
	spec, _ := started(ctx, t, r, newSpec)
	checkpointThenKill(ctx, t, r, spec, false)
	r.Close()

	r = open()
	if err := r.Suspend(ctx, spec); !errors.Is(err, runtime.ErrNotFound) {
		t.Fatalf("the resumed suspend over a checkpoint cut short: %v, want not found", err)
	}
	if st, err := r.Recover(ctx, spec); err != nil || st != runtime.StatusAbsent {
		t.Fatalf("after the resumed suspend: %v %v, want absent", st, err)
	}
}

// A server killed during a suspend after the checkpoint finished, and the
// host restarted before the next server: the save may never have been
// flushed (the suspend flushes it after the checkpoint), so its files may
// have lost writes with the host's boot. The resumed suspend does not adopt
// it: the sandbox is gone. Fault injected: the saved mark holds a boot id
// the host does not have now (a restart no test can make); with this
// boot's id the same save is adopted.
func TestSuspendDoesNotAdoptASaveOfAnEarlierBootFaultInjection(t *testing.T) {
	open, newSpec := testRuntime(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	r := open()
	spec, _ := started(ctx, t, r, newSpec)
	gdir := checkpointThenKill(ctx, t, r, spec, true)
	boot, err := os.ReadFile(filepath.Join(gdir, savedMarker))
	if now, _ := procfs.BootID(); err != nil || string(boot) != now {
		t.Fatalf("saved mark %q (%v), want this boot's id %q", boot, err, now)
	}
	if err := os.WriteFile(filepath.Join(gdir, savedMarker), []byte("00000000-0000-4000-8000-000000000000"), 0o600); err != nil {
		t.Fatal(err)
	}
	r.Close()

	r = open()
	if err := r.Suspend(ctx, spec); !errors.Is(err, runtime.ErrNotFound) {
		t.Fatalf("the resumed suspend over a save of an earlier boot: %v, want not found", err)
	}
	if st, err := r.Recover(ctx, spec); err != nil || st != runtime.StatusAbsent {
		t.Fatalf("after the resumed suspend: %v %v, want absent", st, err)
	}
	if err := os.WriteFile(filepath.Join(gdir, savedMarker), boot, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := r.Suspend(ctx, spec); err != nil {
		t.Fatalf("the resumed suspend over a save of this boot: %v", err)
	}
	if st, err := r.Recover(ctx, spec); err != nil || st != runtime.StatusSuspended {
		t.Fatalf("after adopting the save of this boot: %v %v, want suspended", st, err)
	}
}

// A sandbox that runs from the runtime's directory but that runsc has no
// record of (its record removed under it, as when the data directory is
// wiped while sandboxes run) is ended when the next server starts, and its
// cgroups go; a sandbox with its record is re-adopted as before. Fault
// injected: the record removed by hand.
func TestStartEndsSandboxesRunscHasNoRecordOfFaultInjection(t *testing.T) {
	open, newSpec := testRuntime(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	r := open()
	orphan, _ := started(ctx, t, r, newSpec)
	kept, _ := started(ctx, t, r, newSpec)
	pid := r.pidOf(orphan.SandboxID)
	if pid == 0 || len(sandboxCgroups(orphan.SandboxID)) == 0 {
		t.Fatalf("the sandbox's process %d, cgroups %v", pid, sandboxCgroups(orphan.SandboxID))
	}
	r.Close()
	if err := r.removeRecord(orphan.SandboxID); err != nil {
		t.Fatal(err)
	}

	r = open()
	if !waitGone(ctx, pid, 10*time.Second) {
		t.Fatalf("the sandbox runsc has no record of still runs (pid %d)", pid)
	}
	if st, err := r.Recover(ctx, orphan); err != nil || st != runtime.StatusAbsent {
		t.Fatalf("the ended sandbox: %v %v, want absent", st, err)
	}
	for deadline := time.Now().Add(10 * time.Second); len(sandboxCgroups(orphan.SandboxID)) > 0; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("cgroups left: %v", sandboxCgroups(orphan.SandboxID))
		}
	}
	if st, err := r.Recover(ctx, kept); err != nil || st != runtime.StatusRunning {
		t.Fatalf("the sandbox with its record: %v %v, want running", st, err)
	}
	c, err := r.Agent(ctx, kept)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Info(ctx); err != nil {
		t.Fatalf("the kept sandbox's agent: %v", err)
	}
}

// A suspend leaves the snapshot directory holding its own generation
// only: the one the sandbox was woken from moves out at once (to the
// runtime's trash) and is removed a moment later, not while the suspend
// waits.
func TestSuspendDiscardsTheOlderGenerationLater(t *testing.T) {
	open, newSpec := testRuntime(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	r := open()
	spec, _ := started(ctx, t, r, newSpec)
	gens := func() (n int) {
		ents, _ := os.ReadDir(spec.SnapshotDir)
		for _, e := range ents {
			if e.IsDir() && strings.HasPrefix(e.Name(), "gen-") {
				n++
			}
		}
		return n
	}
	for _, step := range []func(context.Context, runtime.Spec) error{r.Suspend, r.Restore, r.Suspend} {
		if err := step(ctx, spec); err != nil {
			t.Fatal(err)
		}
	}
	if n := gens(); n != 1 {
		t.Fatalf("%d generations in the snapshot directory after the second suspend, want 1", n)
	}
	trash := r.trashDir()
	if ents, _ := os.ReadDir(trash); len(ents) != 1 {
		t.Fatalf("%d entries in the trash right after the suspend, want the older generation", len(ents))
	}
	deadline := time.Now().Add(discardDelay + 5*time.Second)
	for {
		if ents, _ := os.ReadDir(trash); len(ents) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the older generation is still in the trash")
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err := r.Restore(ctx, spec); err != nil {
		t.Fatalf("wake from the kept generation: %v", err)
	}
}

// A sandbox whose process ends while it is restored fails the wake at
// once, saying so, instead of being waited for until the operation's
// timeout (ten minutes by default; here the test's minute) — and stays
// suspended: its save is still the state to wake from, and the next wake
// does. The fault is injected by a runsc wrapper that kills the sandbox the
// moment `runsc restore` returns.
func TestRestoreOfASandboxThatDiesFailsAtOnceFaultInjected(t *testing.T) {
	open, newSpec := testRuntime(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	r := open()
	spec, c := started(ctx, t, r, newSpec)
	writeKept(ctx, t, c)
	if err := r.Suspend(ctx, spec); err != nil {
		t.Fatal(err)
	}
	r.Close()

	runsc, _ := runtimetest.RequireRunsc(t)
	wrapper := filepath.Join(t.TempDir(), "runsc")
	script := `#!/bin/sh
"` + runsc + `" "$@"
rc=$?
case " $* " in *" restore "*)
	prev=
	for a in "$@"; do
		[ "$prev" = --pid-file ] && kill -9 "$(cat "$a")"
		prev=$a
	done ;;
esac
exit $rc
`
	if err := os.WriteFile(wrapper, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	r = open(wrapper)
	wctx, wcancel := context.WithTimeout(ctx, time.Minute)
	defer wcancel()
	err := r.Restore(wctx, spec)
	if !errors.Is(err, agentclient.ErrHostEnded) {
		t.Fatalf("the wake of a sandbox killed as it was restored: %v, want %v", err, agentclient.ErrHostEnded)
	}
	// What the server observes next (at once: the killed process may
	// still be a zombie runsc calls running).
	if st, err := r.Recover(ctx, spec); err != nil || st != runtime.StatusSuspended {
		t.Fatalf("after the failed wake: %v %v, want suspended", st, err)
	}
	r.Close()
	r = open()
	if err := r.Restore(ctx, spec); err != nil {
		t.Fatalf("the next wake: %v", err)
	}
	expectKept(ctx, t, r, spec)
}

// A runsc killed as it wrote a container's record (FAULT INJECTED: the
// record is emptied by hand, as a kill in the middle of runsc's in-place
// write leaves it; found by the runtime-kill suite) leaves a container runsc
// can neither save nor delete: `runsc state` fails for good. The sandbox is
// then reported absent, and deleting it ends its processes and leaves
// nothing of it on the host. It used to fail every delete.
func TestTornRunscRecordFaultInjection(t *testing.T) {
	open, newSpec := testRuntime(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	r := open()
	spec, _ := started(ctx, t, r, newSpec)
	id := spec.SandboxID
	record := filepath.Join(r.cfg.Dir, "runsc", id+"_sandbox:"+id+".state")
	if err := os.Truncate(record, 0); err != nil {
		t.Fatal(err)
	}
	if st, err := r.Recover(ctx, spec); err != nil || st != runtime.StatusAbsent {
		t.Fatalf("a container with a torn record: %v %v, want absent", st, err)
	}
	if err := r.Delete(ctx, spec); err != nil {
		t.Fatalf("delete a container with a torn record: %v", err)
	}
	assertNothingLeft(t, r, id)
}

// A delete of a suspended sandbox asks runsc about its container; a runsc
// killed under it (by a wrapper that SIGKILLs its first `runsc state`:
// fault injection standing for the OOM killer or an operator) is run
// again, and the delete succeeds and leaves nothing.
func TestDeleteRunsAgainARunscKilledUnderItFaultInjection(t *testing.T) {
	open, newSpec := testRuntime(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	r := open()
	spec, _ := started(ctx, t, r, newSpec)
	if err := r.Suspend(ctx, spec); err != nil {
		t.Fatal(err)
	}
	mark := filepath.Join(t.TempDir(), "killed")
	wrapper := filepath.Join(t.TempDir(), "runsc")
	script := "#!/bin/sh\nfor a in \"$@\"; do\n  if [ \"$a\" = state ] && [ ! -e " + mark + " ]; then : > " + mark + "; kill -9 $$; fi\ndone\nexec \"" + r.cfg.Runsc + "\" \"$@\"\n"
	if err := os.WriteFile(wrapper, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := open(wrapper).Delete(ctx, spec); err != nil {
		t.Fatalf("delete with its runsc killed once: %v", err)
	}
	if _, err := os.Stat(mark); err != nil {
		t.Fatal("the wrapper never killed a runsc state: the delete did not ask")
	}
	assertNothingLeft(t, r, spec.SandboxID)
}

// TestForgetAKilledSandboxAtOnceFaultInjection: a sandbox killed from
// outside (kill(1) here; the OOM killer or an operator in production) is
// forgotten the moment its process is a zombie, as a failed wake or a
// delete that finds it so does. Its cgroup is still busy then, while its
// threads end: it must be removed all the same, not left behind.
func TestForgetAKilledSandboxAtOnceFaultInjection(t *testing.T) {
	open, newSpec := testRuntime(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	r := open()
	spec, c := started(ctx, t, r, newSpec)
	id := spec.SandboxID
	fillMemory(ctx, t, c)
	r.exits.Stop(id)
	r.closeEndpoint(id)
	if pid := r.pidOf(id); !r.kill(id) || !waitGone(ctx, pid, 10*time.Second) {
		t.Fatalf("kill the sandbox's process %d", pid)
	}
	if err := r.forgetContainer(id); err != nil {
		t.Fatalf("forget a killed sandbox: %v", err)
	}
	os.RemoveAll(r.sandboxDir(id))
	os.RemoveAll(r.socketDir(id))
	assertNothingLeft(t, r, id)
}

// The start's sweep removes a sandbox cgroup nothing runs in, and keeps
// one a process is in and one just made, unless a suspend moved it aside.
// Real cgroups (v1 pids, or v2).
func TestSweepCgroupsRemovesOnlyEmptyOldOnes(t *testing.T) {
	need := runtimetest.Need(t, "SPACE_REQUIRE_GVISOR") // where gVisor runs, so do its cgroups
	if os.Geteuid() != 0 {
		need("needs root: makes cgroups")
	}
	parent := "/sys/fs/cgroup/pids/space"
	if _, err := os.Stat("/sys/fs/cgroup/cgroup.controllers"); err == nil {
		parent = "/sys/fs/cgroup/space"
	}
	if err := os.MkdirAll(parent, 0o755); err != nil {
		need("no cgroup file system to make cgroups in: %v", err)
	}
	mk := func(age time.Duration) string {
		cg := filepath.Join(parent, ids.New(ids.Sandbox))
		if err := os.Mkdir(cg, 0o755); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.Remove(cg) })
		old := time.Now().Add(-age)
		if err := os.Chtimes(cg, old, old); err != nil {
			t.Fatal(err)
		}
		return cg
	}
	left, fresh, busy := mk(time.Hour), mk(0), mk(time.Hour)
	// Moved aside by a suspend a moment ago (clearAway): no start joins it.
	ended := mk(0) + ".ended-1"
	if err := os.Rename(strings.TrimSuffix(ended, ".ended-1"), ended); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(ended) })
	sleep := exec.Command("sleep", "60")
	if err := sleep.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { sleep.Process.Kill(); sleep.Wait() }()
	if err := os.WriteFile(filepath.Join(busy, "cgroup.procs"), []byte(strconv.Itoa(sleep.Process.Pid)), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(busy, time.Now().Add(-time.Hour), time.Now().Add(-time.Hour)); err != nil {
		t.Fatal(err)
	}
	if n := sweepCgroups(); n < 2 {
		t.Errorf("swept %d cgroups, want at least the empty old one and the one moved aside", n)
	}
	if _, err := os.Stat(left); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("an empty cgroup an hour old is kept: %v", err)
	}
	if _, err := os.Stat(ended); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("an empty cgroup a suspend moved aside is kept: %v", err)
	}
	for _, cg := range []string{fresh, busy} {
		if _, err := os.Stat(cg); err != nil {
			t.Errorf("%s was removed: %v", cg, err)
		}
	}
	// Out of the busy cgroup, so that it can go.
	os.WriteFile(filepath.Join(filepath.Dir(parent), "cgroup.procs"), []byte(strconv.Itoa(sleep.Process.Pid)), 0o644)
}

// A suspend clears its sandbox's container away without waiting for the
// sandbox's teardown: when it returns, runsc keeps no record of the
// container and its cgroups are moved aside, so a wake that follows at
// once starts at once (it used to wait for a background runsc delete). The
// wake brings the sandbox back, and a delete leaves nothing of it, the
// moved cgroups included.
func TestSuspendClearsTheContainerAwayAtOnce(t *testing.T) {
	open, newSpec := testRuntime(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	r := open()
	spec, c := started(ctx, t, r, newSpec)
	id := spec.SandboxID
	writeKept(ctx, t, c)
	fillMemory(ctx, t, c)
	gofer, _ := r.goferOf(id)
	if gofer == 0 {
		t.Fatal("runsc's record names no running gofer of the sandbox")
	}
	if err := r.Suspend(ctx, spec); err != nil {
		t.Fatal(err)
	}
	assertClearedAway(t, r, id, "the suspend", map[string]int{"gofer": gofer})
	if err := r.Restore(ctx, spec); err != nil {
		t.Fatalf("wake at once: %v", err)
	}
	expectKept(ctx, t, r, spec)
	if err := r.Delete(ctx, spec); err != nil {
		t.Fatal(err)
	}
	assertNothingLeft(t, r, id)
}

// runsOn reports whether process pid runs and was not killed: neither
// ending nor gone, nor holding a SIGKILL it has not been scheduled to take
// yet (on a loaded host the killed process may not have run since).
func runsOn(pid int) bool {
	s, err := procfs.Stat(pid)
	killed, kerr := procfs.KillPending(pid)
	return err == nil && kerr == nil && !s.Ending() && !s.Gone() && !killed
}

// assertClearedAway checks what a suspend or delete that cleared the
// sandbox's container away (clearAway) leaves the moment it returns: the
// processes named ending or gone, no runsc record, no cgroup under the
// sandbox's name.
func assertClearedAway(t *testing.T, r *Runtime, id, after string, procs map[string]int) {
	t.Helper()
	for what, p := range procs {
		if runsOn(p) {
			t.Errorf("the sandbox's %s (%d) runs on after %s", what, p, after)
		}
	}
	if left, _ := filepath.Glob(filepath.Join(r.cfg.Dir, "runsc", "*"+id+"*")); len(left) > 0 {
		t.Errorf("runsc's record of the container is there after %s: %v", after, left)
	}
	if cg := sandboxCgroups(id); len(cg) > 0 {
		t.Errorf("cgroups keep the sandbox's name after %s: %v", after, cg)
	}
}

// assertNothingLeft is runtimetest.AssertNothingLeft for a sandbox of r:
// runsc's record and the sandbox's directory included.
func assertNothingLeft(t *testing.T, r *Runtime, id string) {
	t.Helper()
	runtimetest.AssertNothingLeft(t, id, "space", filepath.Join(r.cfg.Dir, "runsc", "*"+id+"*"), r.sandboxDir(id))
}

// A delete ends a running or paused sandbox at once: when Delete returns,
// its processes are ending, runsc's record, its files and any cgroup under
// its name are gone — a create of the same id (a retried create) starts
// at once in a cgroup of its own — and what the dying processes still
// held goes within the teardown bound.
func TestDeleteEndsTheSandboxAtOnce(t *testing.T) {
	open, newSpec := testRuntime(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	r := open()
	for _, paused := range []bool{false, true} {
		spec, c := started(ctx, t, r, newSpec)
		id := spec.SandboxID
		fillMemory(ctx, t, c)
		pid := r.pidOf(id)
		gofer, _ := r.goferOf(id)
		if pid == 0 || gofer == 0 {
			t.Fatalf("no sandbox process (%d) or gofer (%d) named", pid, gofer)
		}
		if paused {
			if err := r.Pause(ctx, spec); err != nil {
				t.Fatal(err)
			}
		}
		if err := r.Delete(ctx, spec); err != nil {
			t.Fatal(err)
		}
		assertClearedAway(t, r, id, fmt.Sprintf("the delete (paused=%v)", paused), map[string]int{"process": pid, "gofer": gofer})
		if _, err := os.Stat(r.sandboxDir(id)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("paused=%v: the sandbox's directory is there after the delete: %v", paused, err)
		}
		if err := r.Create(ctx, spec); err != nil {
			t.Fatalf("paused=%v: create the same id again at once: %v", paused, err)
		}
		if err := r.Delete(ctx, spec); err != nil {
			t.Fatal(err)
		}
		assertNothingLeft(t, r, id)
	}
}

// On a cgroup v2 host a suspend cannot move the killed sandbox's cgroups
// aside and waits for `runsc delete` instead. A delete that fails then
// (FAULT INJECTED: the rename refused as v2 refuses it, and a runsc wrapper
// failing every delete) must not fail the suspend: the sandbox's process
// was killed and its image is complete, so the sandbox is suspended, and
// the next wake — runsc deleting again — brings it back with its files. It
// used to fail the suspend, and the engine then failed the sandbox.
func TestSuspendStandsWhenTheDeleteAfterItFailsFaultInjection(t *testing.T) {
	open, newSpec := testRuntime(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	runsc, _ := runtimetest.RequireRunsc(t)
	refuse := filepath.Join(t.TempDir(), "refuse-delete")
	wrapper := filepath.Join(t.TempDir(), "runsc")
	script := `#!/bin/sh
if [ -e "` + refuse + `" ]; then
	case " $* " in *" delete "*) echo "FAULT INJECTED: delete refused" >&2; exit 1 ;; esac
fi
exec "` + runsc + `" "$@"
`
	if err := os.WriteFile(wrapper, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	r := open(wrapper)
	r.moveCgroup = func(from, to string) error {
		return &os.LinkError{Op: "rename", Old: from, New: to, Err: syscall.EPERM}
	}
	spec, c := started(ctx, t, r, newSpec)
	writeKept(ctx, t, c)
	pid := r.pidOf(spec.SandboxID)
	if err := os.WriteFile(refuse, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := r.Suspend(ctx, spec); err != nil {
		t.Fatalf("a suspend whose runsc delete failed after the kill: %v", err)
	}
	if runsOn(pid) {
		t.Errorf("the sandbox's process (%d) runs on after the suspend", pid)
	}
	if st, err := r.Recover(ctx, spec); err != nil || st != runtime.StatusSuspended {
		t.Fatalf("after the suspend: %v %v, want suspended", st, err)
	}
	if err := os.Remove(refuse); err != nil {
		t.Fatal(err)
	}
	if err := r.Restore(ctx, spec); err != nil {
		t.Fatalf("wake: %v", err)
	}
	expectKept(ctx, t, r, spec)
	if err := r.Delete(ctx, spec); err != nil {
		t.Fatal(err)
	}
	assertNothingLeft(t, r, spec.SandboxID)
}

// A save's flusher flushes what is written into its directory while the
// save runs and stops when told, waiting for a flush under way; it keeps
// on through a directory that is not there yet.
func TestFlushWhileWritten(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "gen")
	stop := flushWhileWritten(dir)
	time.Sleep(3 * flushEvery)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "pages.img"), make([]byte, 1<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * flushEvery)
	done := make(chan struct{})
	go func() { stop(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("stop did not return")
	}
	if err := syncDir(dir); err != nil {
		t.Fatal(err)
	}
}
