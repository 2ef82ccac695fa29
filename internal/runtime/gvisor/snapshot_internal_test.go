//go:build linux

package gvisor

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/spacesandbox/space/internal/agent/proto"
	"github.com/spacesandbox/space/internal/procfs"
	"github.com/spacesandbox/space/internal/runtime"
)

// A snapshot (what a fork takes) leaves its source running: the same
// sandbox process, a counting process inside going on without a restart,
// and the agent answering again (the save closed its connection; SIGCONT
// made it dial again). The image makes a copy that has the count too.
func TestSnapshotLeavesTheSourceRunning(t *testing.T) {
	open, newSpec := testRuntime(t)
	r := open()
	snapshotAndCheck(t, r, newSpec, true)
}

// An agent that is not told to dial again (FAULT INJECTED: the host sends
// a signal the agent ignores, as an agent from before it dialled again
// would) does not come back: its sandbox is restored from the save in
// place — a new sandbox process, the count going on from the save — and
// the snapshot succeeds.
func TestSnapshotRestartsASourceWhoseAgentDoesNotComeBackFaultInjected(t *testing.T) {
	open, newSpec := testRuntime(t)
	r := open()
	r.redialSignal, r.redialWait = syscall.SIGWINCH, 2*time.Second
	snapshotAndCheck(t, r, newSpec, false)
}

func snapshotAndCheck(t *testing.T, r *Runtime, newSpec func() runtime.Spec, sameProcess bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	spec, c := started(ctx, t, r, newSpec)
	if !c.Hello().Redials {
		t.Fatal("the agent does not say it dials again on SIGCONT")
	}
	const counter = "counter"
	startShell(ctx, t, c, counter, "i=0; while :; do i=$((i+1)); echo $i > /root/n.tmp; mv /root/n.tmp /root/n; sleep 0.02; done")
	count := func(s runtime.Spec) int {
		t.Helper()
		c, err := r.Agent(ctx, s)
		if err != nil {
			t.Fatal(err)
		}
		actx, acancel := context.WithTimeout(ctx, 5*time.Second)
		defer acancel()
		_, b, err := c.ReadFile(actx, "/root/n", 0, 64)
		if err != nil {
			t.Fatalf("sandbox %s: read the count: %v", s.SandboxID, err)
		}
		n, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil {
			t.Fatalf("sandbox %s: count %q", s.SandboxID, b)
		}
		return n
	}
	time.Sleep(300 * time.Millisecond)
	before := count(spec)
	pid := r.pidOf(spec.SandboxID)

	img := filepath.Join(t.TempDir(), "image")
	if err := r.Snapshot(ctx, spec, img); err != nil {
		t.Fatal(err)
	}
	if got := r.pidOf(spec.SandboxID); (got == pid) != sameProcess {
		t.Fatalf("sandbox process %d before the snapshot, %d after; want the same: %v", pid, got, sameProcess)
	}
	after := count(spec)
	time.Sleep(300 * time.Millisecond)
	if later := count(spec); after < before || later <= after {
		t.Fatalf("the source's count: %d before the snapshot, %d after, %d later: want it going on", before, after, later)
	}
	nc, err := r.Agent(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	if p, err := nc.GetProcess(ctx, counter); err != nil || p.State != proto.ProcRunning {
		t.Fatalf("the source's counting process after the snapshot: %+v %v", p, err)
	}

	cp := newSpec()
	if err := r.CreateFrom(ctx, cp, img); err != nil {
		t.Fatal(err)
	}
	if n := count(cp); n < before {
		t.Fatalf("the copy's count %d, below %d counted before the snapshot", n, before)
	}
}

// A server killed between a snapshot's save and its agent's redial leaves a
// sandbox whose agent waits on the connection the save closed. The snapshot
// retried by the next server finds its save complete and gets the agent
// back.
func TestSnapshotRetriedAfterACrashGetsTheAgentBack(t *testing.T) {
	open, newSpec := testRuntime(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	r := open()
	spec, _ := started(ctx, t, r, newSpec)
	// The killed server's snapshot, up to the save published.
	img := filepath.Join(t.TempDir(), "image")
	if err := os.MkdirAll(img, 0o700); err != nil {
		t.Fatal(err)
	}
	if _, err := r.runsc(ctx, spec, r.checkpoint(false, "--leave-running", "--image-path", img, spec.SandboxID)...); err != nil {
		t.Fatal(err)
	}
	r.Close()

	r = open()
	if st, err := r.Recover(ctx, spec); err != nil || st != runtime.StatusRunning {
		t.Fatalf("recovered: %v %v", st, err)
	}
	if err := r.Snapshot(ctx, spec, img); err != nil {
		t.Fatalf("the retried snapshot: %v", err)
	}
	actx, acancel := context.WithTimeout(ctx, 10*time.Second)
	defer acancel()
	if err := r.waitAgent(actx, spec.SandboxID); err != nil {
		t.Fatalf("after the retried snapshot: %v", err)
	}
}

// A fork's save is ephemeral: sealed without an fsync and marked with the
// host's boot. One found after the host restarted (FAULT INJECTED: the mark
// names another boot) may be incomplete on disk, so a retried snapshot
// saves again instead of adopting it; one from this boot is adopted.
func TestSnapshotEphemeralSaveFromAnEarlierBootIsNotTrustedFaultInjected(t *testing.T) {
	open, newSpec := testRuntime(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	r := open()
	spec, _ := started(ctx, t, r, newSpec)
	spec.Ephemeral = true
	img := filepath.Join(t.TempDir(), "image")
	if err := r.Snapshot(ctx, spec, img); err != nil {
		t.Fatal(err)
	}
	boot, err := procfs.BootID()
	if err != nil {
		t.Fatal(err)
	}
	mark := filepath.Join(img, ephemeralMark)
	if b, err := os.ReadFile(mark); err != nil || string(b) != boot {
		t.Fatalf("the ephemeral save's mark: %q %v, want this boot %q", b, err, boot)
	}
	stale := filepath.Join(img, "stale")
	if err := os.WriteFile(stale, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	// From this boot: adopted as it is.
	if err := r.Snapshot(ctx, spec, img); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(stale); err != nil {
		t.Fatalf("a save from this boot was not adopted: %v", err)
	}
	// From another boot: saved again.
	if err := os.WriteFile(mark, []byte("00000000-0000-0000-0000-000000000000"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := r.Snapshot(ctx, spec, img); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(stale); !os.IsNotExist(err) {
		t.Fatalf("a save from another boot was adopted (%v)", err)
	}
	if b, err := os.ReadFile(mark); err != nil || string(b) != boot {
		t.Fatalf("the new save's mark: %q %v, want this boot %q", b, err, boot)
	}
	cp := newSpec()
	if err := r.CreateFrom(ctx, cp, img); err != nil {
		t.Fatalf("a copy from the new save: %v", err)
	}
	if err := r.waitAgent(ctx, cp.SandboxID); err != nil {
		t.Fatalf("the copy's agent: %v", err)
	}
}

// A copy prepared while its source has not been saved yet (what a fork
// does: runsc create beside the save) restores the save into the sandbox
// process PrepareCopy created, and has the source's files. A server
// restarted between the two keeps that process (a resumed fork prepares
// again); Delete removes a prepared copy that never got its image.
func TestPreparedCopyRestoresTheSaveIntoItsProcess(t *testing.T) {
	open, newSpec := testRuntime(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	r := open()
	spec, c := started(ctx, t, r, newSpec)
	writeKept(ctx, t, c)
	status := func(r *Runtime, s runtime.Spec) string {
		t.Helper()
		st, err := r.state(ctx, s)
		if err != nil {
			t.Fatal(err)
		}
		if st == nil {
			return "absent"
		}
		return st.Status
	}

	cp := newSpec()
	if err := r.PrepareCopy(ctx, cp, spec); err != nil {
		t.Fatal(err)
	}
	pid := r.pidOf(cp.SandboxID)
	if st := status(r, cp); st != "created" || pid == 0 {
		t.Fatalf("a prepared copy: runsc says %q, pid %d; want created with a process", st, pid)
	}
	// The server restarts: the next one prepares the copy again (a
	// resumed fork) and keeps what the first created.
	r.Close()
	r = open()
	if err := r.PrepareCopy(ctx, cp, spec); err != nil {
		t.Fatal(err)
	}
	if got := r.pidOf(cp.SandboxID); got != pid {
		t.Fatalf("prepared again after a restart: sandbox process %d, want %d kept", got, pid)
	}

	img := filepath.Join(t.TempDir(), "image")
	if err := r.Snapshot(ctx, spec, img); err != nil {
		t.Fatal(err)
	}
	if err := r.CreateFrom(ctx, cp, img); err != nil {
		t.Fatal(err)
	}
	if got := r.pidOf(cp.SandboxID); got != pid {
		t.Fatalf("the copy runs as process %d, want %d, the one PrepareCopy created", got, pid)
	}
	expectKept(ctx, t, r, cp)

	gone := newSpec()
	if err := r.PrepareCopy(ctx, gone, spec); err != nil {
		t.Fatal(err)
	}
	gpid := r.pidOf(gone.SandboxID)
	if err := r.Delete(ctx, gone); err != nil {
		t.Fatal(err)
	}
	if st := status(r, gone); st != "absent" {
		t.Fatalf("a deleted prepared copy: runsc says %q", st)
	}
	if !waitGone(ctx, gpid, 5*time.Second) {
		t.Fatalf("a deleted prepared copy's process %d is still there", gpid)
	}
}

// A paused source runs for its save and is paused again after. A server
// killed in between (FAULT INJECTED: the cut's traces — the hold mark and
// the sandbox running — are made by hand, before and after the save) left
// it running, while its record said paused. The retried snapshot leaves
// it paused in both cases, and a resume then gets its agent back.
func TestSnapshotOfPausedCutShortFaultInjection(t *testing.T) {
	for _, saved := range []bool{false, true} {
		name := "before the save"
		if saved {
			name = "after the save"
		}
		t.Run(name, func(t *testing.T) {
			open, newSpec := testRuntime(t)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			r := open()
			spec, _ := started(ctx, t, r, newSpec)
			id := spec.SandboxID
			if err := r.Pause(ctx, spec); err != nil {
				t.Fatal(err)
			}
			// The killed server's snapshot: the hold mark, the sandbox
			// running, and maybe its save complete.
			if err := os.WriteFile(r.holdPausedMark(id), nil, 0o600); err != nil {
				t.Fatal(err)
			}
			if err := r.resumeSandbox(ctx, spec); err != nil {
				t.Fatal(err)
			}
			img := filepath.Join(t.TempDir(), "image")
			if saved {
				if err := os.MkdirAll(img, 0o700); err != nil {
					t.Fatal(err)
				}
				if _, err := r.runsc(ctx, spec, r.checkpoint(false, "--leave-running", "--image-path", img, id)...); err != nil {
					t.Fatal(err)
				}
			}
			r.Close()

			r = open()
			if err := r.Snapshot(ctx, spec, img); err != nil {
				t.Fatalf("the retried snapshot: %v", err)
			}
			if _, err := os.Stat(filepath.Join(img, "checkpoint.img")); err != nil {
				t.Fatalf("the retried snapshot's image: %v", err)
			}
			if m := r.mark(id); m != markPaused {
				t.Fatalf("pause mark %q after the retried snapshot, want %q", m, markPaused)
			}
			if r.agentAnswers(ctx, id) {
				t.Fatal("the source's agent answers: it runs, and was paused")
			}
			if _, err := os.Stat(r.holdPausedMark(id)); !os.IsNotExist(err) {
				t.Fatalf("the hold mark is left: %v", err)
			}
			if err := r.Resume(ctx, spec); err != nil {
				t.Fatal(err)
			}
			actx, acancel := context.WithTimeout(ctx, 10*time.Second)
			defer acancel()
			if err := r.waitAgent(actx, id); err != nil {
				t.Fatalf("resumed after the retried snapshot: %v", err)
			}
		})
	}
}

// A fork's save (ephemeral) is written through the page cache, where its
// copies read it from, while a durable save is written around the cache
// (O_DIRECT, where the file system takes it). A copy keeps no link to an
// ephemeral image once restored: when the fork removes the image, only the
// copies' loading holds it, and nothing does soon after, so its pages are
// dropped from the cache without being written to the disk. A sandbox whose
// memory cgroup is too full for its save beside what it holds (180 MB of
// its 256 MiB filled) is saved around the cache even for a fork.
func TestEphemeralSaveIsCachedAndLeftByItsCopies(t *testing.T) {
	open, newSpec := testRuntime(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	r := open()
	spec, c := started(ctx, t, r, newSpec)
	writeKept(ctx, t, c)

	durable := filepath.Join(t.TempDir(), "durable")
	if err := r.Snapshot(ctx, spec, durable); err != nil {
		t.Fatal(err)
	}
	eph := spec
	eph.Ephemeral = true
	img := filepath.Join(t.TempDir(), "image")
	if err := r.Snapshot(ctx, eph, img); err != nil {
		t.Fatal(err)
	}
	if r.direct {
		if f := cachedFraction(t, filepath.Join(durable, "pages.img")); f > 0.5 {
			t.Errorf("%.0f%% of a durable save's pages are in the page cache; want it written with O_DIRECT", f*100)
		}
	} else {
		t.Logf("the test's directory does not take O_DIRECT: the durable save is not checked")
	}
	if f := cachedFraction(t, filepath.Join(img, "pages.img")); f < 0.9 {
		t.Errorf("%.0f%% of an ephemeral save's pages are in the page cache; want it written through the cache", f*100)
	}

	var pids []int
	for range 2 {
		cp := newSpec()
		if err := r.CreateFrom(ctx, cp, img); err != nil {
			t.Fatal(err)
		}
		expectKept(ctx, t, r, cp)
		ents, _ := os.ReadDir(cp.SnapshotDir)
		for _, e := range ents {
			if strings.HasPrefix(e.Name(), restoreImagePrefix) {
				t.Errorf("copy %s keeps %s, a link to the ephemeral image it restored from", cp.SandboxID, e.Name())
			}
		}
		pids = append(pids, r.pidOf(cp.SandboxID))
	}
	if err := os.RemoveAll(img); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		var held []string
		for _, pid := range pids {
			fds, _ := filepath.Glob(fmt.Sprintf("/proc/%d/fd/*", pid))
			for _, fd := range fds {
				if to, err := os.Readlink(fd); err == nil && strings.HasPrefix(to, img) {
					held = append(held, fmt.Sprintf("process %d: %s", pid, to))
				}
			}
		}
		if len(held) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the removed ephemeral image is still open 10s after its copies started: %v", held)
		}
		time.Sleep(20 * time.Millisecond)
	}

	c, err := r.Agent(ctx, spec) // the saves closed the connection it had
	if err != nil {
		t.Fatal(err)
	}
	startShell(ctx, t, c, "fill", "head -c 180000000 /dev/urandom > /tmp/fill && md5sum /tmp/fill > /tmp/filled")
	var sum []byte
	for sum == nil {
		if _, b, err := c.ReadFile(ctx, "/tmp/filled", 0, 100); err == nil && len(b) > 0 {
			sum = b
		} else if ctx.Err() != nil {
			t.Fatal("the sandbox's memory was not filled")
		}
		time.Sleep(20 * time.Millisecond)
	}
	full := filepath.Join(t.TempDir(), "full")
	if err := r.Snapshot(ctx, eph, full); err != nil {
		t.Fatal(err)
	}
	if cachedSave(full) {
		t.Errorf("a fork's save of a sandbox whose cgroup is too full for it was written through the page cache")
	}
	if f := cachedFraction(t, filepath.Join(full, "pages.img")); r.direct && f > 0.5 {
		t.Errorf("%.0f%% of the save of a sandbox whose cgroup is too full for it is in the page cache", f*100)
	}
	cp := newSpec()
	if err := r.CreateFrom(ctx, cp, full); err != nil {
		t.Fatal(err)
	}
	cc, err := r.Agent(ctx, cp)
	if err != nil {
		t.Fatal(err)
	}
	startShell(ctx, t, cc, "check", "md5sum /tmp/fill > /tmp/checked")
	for {
		if _, b, err := cc.ReadFile(ctx, "/tmp/checked", 0, 100); err == nil && len(b) > 0 {
			if string(b) != string(sum) {
				t.Fatalf("the copy's filled file: %q, want %q", b, sum)
			}
			break
		}
		if ctx.Err() != nil {
			t.Fatal("the copy did not check its filled file")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// cachedFraction is the share of the file at path's pages that are in the
// page cache (mincore of a mapping of it).
func cachedFraction(t *testing.T, path string) float64 {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil || st.Size() == 0 {
		t.Fatalf("%s: %v (size %d)", path, err, st.Size())
	}
	m, err := unix.Mmap(int(f.Fd()), 0, int(st.Size()), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(m)
	pages := (len(m) + os.Getpagesize() - 1) / os.Getpagesize()
	vec := make([]byte, pages)
	if _, _, errno := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&m[0])), uintptr(len(m)), uintptr(unsafe.Pointer(&vec[0]))); errno != 0 {
		t.Fatal(errno)
	}
	in := 0
	for _, v := range vec {
		in += int(v & 1)
	}
	return float64(in) / float64(pages)
}
