package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/spacesandbox/space/client"
)

// faultRig is what the fault suites share: a server on a real runtime,
// sandboxes that carry a file and a process which must outlive everything,
// a seeded random source, and how long each step takes here (the kills
// land within it).
type faultRig struct {
	t    *testing.T
	s    *server
	rt   string
	rng  *rand.Rand
	mark map[string]string        // sandbox → what its /root/mark says
	all  map[string]bool          // every sandbox and snapshot made, for the leak check
	span map[string]time.Duration // step → how long it took, with a margin
	// killsRuntimes is set where the sandboxes' own processes are killed:
	// a sandbox may then die after the step that cut it settled.
	killsRuntimes bool
}

// newFaultRig seeds the rig from the time, or from SPACE_FAULT_SEED, and
// prints the seed so that a failing run can be repeated.
func newFaultRig(t *testing.T, s *server, rt string, iterations int) *faultRig {
	seed := time.Now().UnixNano()
	if v, err := strconv.ParseInt(os.Getenv("SPACE_FAULT_SEED"), 10, 64); err == nil {
		seed = v
	}
	t.Logf("seed %d, %d iterations (SPACE_FAULT_SEED, SPACE_FAULT_ITERATIONS)", seed, iterations)
	return &faultRig{t: t, s: s, rt: rt, rng: rand.New(rand.NewPCG(uint64(seed), 0)),
		mark: map[string]string{}, all: map[string]bool{}, span: map[string]time.Duration{}}
}

// prepare gives a new sandbox its file and its process.
func (f *faultRig) prepare(id string) {
	f.s.runCommand(id, map[string]any{"command": []string{"sh", "-c", "echo " + id + " > /root/mark"}})
	sess := f.s.command(id, map[string]any{"command": []string{"sleep", "100000"}})
	if st, _ := f.s.attach(sess.Attach.URL, sess.Attach.Token, ""); st != nil {
		st.close()
	}
	f.mark[id] = id
}

func (f *faultRig) snapshotOf(id string) (snap, opID string) {
	snap, opID, err := f.startSnapshot(id)
	if err != nil {
		f.t.Fatalf("snapshot %s: %v", id, err)
	}
	return snap, opID
}

// startSnapshot asks for a snapshot of id and records it for the leak
// check.
func (f *faultRig) startSnapshot(id string) (snap, opID string, err error) {
	sn, op, err := f.s.client().CreateSnapshot(context.Background(), id, "", "")
	if err != nil {
		return "", "", err
	}
	f.all[sn.ID] = true
	return sn.ID, op.ID, nil
}

func (f *faultRig) fromSnapshot(snap string) (id, opID string) {
	out, _, err := f.s.client().CreateSandbox(context.Background(), client.CreateSandboxRequest{Snapshot: snap}, "")
	if err != nil {
		f.t.Fatalf("create from %s: %v", snap, err)
	}
	f.all[out.Sandbox.ID] = true
	return out.Sandbox.ID, out.Operation.ID
}

// measure times each step once on a probe sandbox.
func (f *faultRig) measure() {
	s := f.s
	timed := func(name string, fn func()) {
		start := time.Now()
		fn()
		f.span[name] = max(time.Since(start)*5/4, 50*time.Millisecond)
	}
	var probe, probeFork, probeSnap, probeCopy string
	timed("create", func() { probe = s.createRunning() })
	timed("pause", func() { s.lifecycle(probe, "pause", "paused") })
	timed("wake", func() { s.lifecycle(probe, "wake", "running") })
	timed("fork", func() { probeFork = s.fork(f.t, probe, 1)[0] })
	timed("snapshot", func() {
		var op string
		probeSnap, op = f.snapshotOf(probe)
		s.waitOp(op)
	})
	timed("from-snapshot", func() {
		var op string
		probeCopy, op = f.fromSnapshot(probeSnap)
		s.waitOp(op)
	})
	timed("suspend", func() { s.lifecycle(probe, "suspend", "suspended") })
	timed("restore", func() { s.lifecycle(probe, "wake", "running") })
	timed("delete", func() { s.lifecycle(probe, "delete", "deleted") })
	for _, id := range []string{probeFork, probeCopy} {
		s.lifecycle(id, "delete", "deleted")
	}
	if err := s.client().DeleteSnapshot(context.Background(), probeSnap); err != nil {
		f.t.Fatal(err)
	}
	f.t.Logf("kill windows: %v", f.span)
}

// faultStep is one step a suite started and cuts short.
type faultStep struct {
	action, opID string
	id           string   // the sandbox it is on (a new one for a create)
	from         string   // the snapshot a create from one starts from
	snap         string   // the snapshot a snapshot makes
	forks        []string // the copies a fork makes
	window       time.Duration
}

// choose picks the next step at random among those live's states allow
// (a create when there are few sandboxes; copies only while there are few).
func (f *faultRig) choose(live map[string]string, snaps []savedSnapshot) (action, id string) {
	ids := slices.Sorted(func(yield func(string) bool) {
		for id := range live {
			if !yield(id) {
				return
			}
		}
	})
	if len(ids) >= 2 || (len(ids) > 0 && f.rng.IntN(3) > 0) {
		id = ids[f.rng.IntN(len(ids))]
		var choices []string
		switch live[id] {
		case "running":
			choices = []string{"pause", "suspend", "delete", "snapshot"}
		case "paused":
			choices = []string{"wake", "suspend", "delete", "snapshot"}
		case "suspended":
			choices = []string{"wake", "wake", "delete"}
		}
		if len(ids) < 4 {
			if live[id] != "suspended" {
				choices = append(choices, "fork")
			}
			if len(snaps) > 0 {
				choices = append(choices, "from-snapshot")
			}
		}
		return choices[f.rng.IntN(len(choices))], id
	}
	if len(snaps) > 0 && f.rng.IntN(2) == 0 {
		return "from-snapshot", ""
	}
	return "create", ""
}

// savedSnapshot is a ready snapshot and the mark its sandboxes carry.
type savedSnapshot struct{ id, mark string }

// begin starts action on id (state is id's state) and says how long it
// takes.
func (f *faultRig) begin(i int, action, id, state string, snaps []savedSnapshot) faultStep {
	ctx, c := context.Background(), f.s.client()
	st := faultStep{action: action, id: id, window: f.span[action]}
	switch action {
	case "create":
		out, _, err := c.CreateSandbox(ctx, client.CreateSandboxRequest{Template: f.s.template}, "")
		if err != nil {
			f.t.Fatalf("iteration %d: create: %v", i, err)
		}
		st.id, st.opID = out.Sandbox.ID, out.Operation.ID
		f.all[st.id] = true
	case "from-snapshot":
		sn := snaps[f.rng.IntN(len(snaps))]
		st.id, st.opID = f.fromSnapshot(sn.id)
		f.mark[st.id], st.from = sn.mark, sn.id
	case "snapshot":
		var err error
		st.snap, st.opID, err = f.startSnapshot(id)
		if f.diedSince(i, id, state, err) {
			return faultStep{action: action, id: id}
		} else if err != nil {
			f.t.Fatalf("iteration %d: snapshot %s: %v", i, id, err)
		}
	case "fork":
		count := 1
		if f.rt != "vm" { // (two TCG guests more would crowd the host)
			count += f.rng.IntN(2)
		}
		op, sbs, _, err := c.Fork(ctx, id, count, "")
		if f.diedSince(i, id, state, err) {
			return faultStep{action: action, id: id}
		} else if err != nil {
			f.t.Fatalf("iteration %d: fork %s: %v", i, id, err)
		}
		st.opID = op.ID
		for _, sb := range sbs {
			st.forks = append(st.forks, sb.ID)
			f.all[sb.ID] = true
		}
	default:
		if action == "wake" && state == "suspended" {
			st.window = f.span["restore"]
		}
		op, _, err := c.Lifecycle(ctx, action, id, "")
		if f.diedSince(i, id, state, err) {
			return faultStep{action: action, id: id}
		} else if err != nil {
			f.t.Fatalf("iteration %d: %s %s (%s): %v", i, action, id, state, err)
		}
		st.opID = op.ID
	}
	return st
}

// diedSince reports whether err refuses a step on sandbox id because the
// sandbox was failed since the last step settled it (state). A sandbox
// can die after its step: what a kill cut short may end it later. That is
// the truth only if it has a reason and nothing of it runs. (Where only
// the server is killed, no sandbox may die: the step fails the test.)
func (f *faultRig) diedSince(i int, id, state string, err error) bool {
	var ce *client.Error
	return f.killsRuntimes && errors.As(err, &ce) && ce.Status == 409 && f.died(i, id, state)
}

// died reports whether sandbox id, shown state when its last step
// settled, is failed now, and checks that this is the truth (i < 0: in the
// end check).
func (f *faultRig) died(i int, id, state string) bool {
	sb, gerr := f.s.client().GetSandbox(context.Background(), id)
	if gerr != nil || sb.State != "failed" {
		return false
	}
	at := fmt.Sprintf("iteration %d", i)
	if i < 0 {
		at = "at the end"
	}
	if sb.Error == nil || sb.Error.Code == "" {
		f.t.Errorf("%s: %s was %s and is failed without a reason", at, id, state)
		return true
	}
	if p := sandboxProcesses(id); len(p) > 0 {
		f.t.Errorf("%s: %s was %s and is failed with processes %s", at, id, state, describeProcesses(p))
	}
	f.t.Logf("%s: %s was %s after its last step and died since: %s", at, id, state, sb.Error.Message)
	return true
}

// keepSnapshot adds a ready snapshot to snaps, deleting the oldest beyond
// two (their disk).
func (f *faultRig) keepSnapshot(snaps []savedSnapshot, sn savedSnapshot) []savedSnapshot {
	snaps = append(snaps, sn)
	if len(snaps) > 2 {
		if err := f.s.client().DeleteSnapshot(context.Background(), snaps[0].id); err != nil {
			f.t.Fatalf("delete snapshot %s: %v", snaps[0].id, err)
		}
		snaps = snaps[1:]
	}
	return snaps
}

// finish checks that every sandbox left still has its file and its
// process, deletes them and the snapshots, and then that nothing of any
// is left on the host: after a restart the snapshot directory is empty
// (what a kill left of finished forks and deleted images goes at start),
// and no process, mount, cgroup or file names any of them.
func (f *faultRig) finish(live map[string]string, snaps []savedSnapshot) {
	s, t, ctx := f.s, f.t, context.Background()
	for id, st := range live {
		if f.killsRuntimes && st != "failed" && st != "deleted" && f.died(-1, id, st) {
			st = "failed"
		}
		switch st {
		case "deleted": // the last iteration's delete
			continue
		case "failed":
			s.lifecycle(id, "delete", "deleted")
			continue
		case "paused", "suspended":
			s.lifecycle(id, "wake", "running")
		}
		tr, _ := s.runCommand(id, map[string]any{"command": []string{"sh", "-c", "cat /root/mark; ps | grep -c '[s]leep 100000'"}})
		if string(tr.stdout) != f.mark[id]+"\n1\n" {
			t.Errorf("%s lost its file or process: %q %q (want mark %s)", id, tr.stdout, tr.stderr, f.mark[id])
		}
		s.lifecycle(id, "delete", "deleted")
	}
	for _, sn := range snaps {
		if err := s.client().DeleteSnapshot(ctx, sn.id); err != nil {
			t.Errorf("delete snapshot %s: %v", sn.id, err)
		}
	}
	s.kill()
	s.start()
	if left, _ := os.ReadDir(filepath.Join(s.dataDir, "snapshots")); len(left) > 0 {
		var names []string
		for _, e := range left {
			names = append(names, e.Name())
		}
		t.Errorf("left in the snapshot directory after a restart: %v", names)
	}
	mounts, _ := os.ReadFile("/proc/self/mountinfo")
	for id := range f.all {
		if p := sandboxProcesses(id); len(p) > 0 {
			t.Errorf("%s: processes left: %v", id, p)
		}
		if bytes.Contains(mounts, []byte(id)) {
			t.Errorf("%s: a mount is left", id)
		}
		if cg, _ := filepath.Glob("/sys/fs/cgroup/*/*/" + id + "*"); len(cg) > 0 {
			t.Errorf("%s: cgroups are left: %v", id, cg)
		}
		if cg, _ := filepath.Glob("/sys/fs/cgroup/*/" + id + "*"); len(cg) > 0 {
			t.Errorf("%s: cgroups are left: %v", id, cg)
		}
		filepath.Walk(s.dataDir, func(p string, fi os.FileInfo, err error) error {
			if strings.Contains(p, id) {
				t.Errorf("%s: %s is left", id, p)
				return filepath.SkipDir
			}
			return nil
		})
	}
}

// faultIterations is how many steps a fault suite cuts short on rt:
// SPACE_FAULT_ITERATIONS, else onVM on the vm runtime (it runs under TCG
// here, where every step takes seconds) and others elsewhere.
func faultIterations(rt string, onVM, others int) int {
	if v, err := strconv.Atoi(os.Getenv("SPACE_FAULT_ITERATIONS")); err == nil && v > 0 {
		return v
	}
	if rt == "vm" {
		return onVM
	}
	return others
}

// The runtime-kill suite: the sandbox's own host processes (runsc's sandbox
// and gofer, or QEMU) are SIGKILLed at a random instant (seeded, printed)
// of a random create, pause, suspend, wake, delete, fork, snapshot or
// create from a snapshot, while the server runs on — or, one cut in four,
// with the server killed at the same instant and restarted. The step must end —
// succeeded, or failed with an error code — and every sandbox it touched
// must settle where the API tells the truth:
//   - one shown running or paused has its processes (a dead one is failed
//     within seconds), and a running one still answers with its file and
//     its process;
//   - one shown suspended has none, and wakes later with its file;
//   - on gVisor a wake from suspend that failed leaves it suspended: the
//     restore only reads the image, so nothing is lost (a VM runs in place
//     on its saved RAM file and disk: once QEMU let it run, a death loses
//     it, and it is failed);
//   - a delete succeeds whatever it meets;
//   - a snapshot that succeeded is ready, and starts sandboxes.
//
// At the end nothing of any of them is left on the host.
func testRuntimeKills(t *testing.T, rt string) {
	s := startRuntimeServer(t, rt)
	iterations := faultIterations(rt, 30, 100)
	f := newFaultRig(t, s, rt, iterations)
	f.killsRuntimes = true
	ctx := context.Background()
	f.measure()

	live := map[string]string{}
	var snaps []savedSnapshot
	kills, serverKills, failedOps, failedSandboxes := 0, 0, 0, 0
	actions := map[string]int{}
	for i := 0; i < iterations; i++ {
		// Most steps fail a sandbox: two are kept to act on.
		for len(live) < 2 {
			id := s.createRunning()
			f.all[id] = true
			f.prepare(id)
			live[id] = "running"
		}
		action, id := f.choose(live, snaps)
		if f.rng.IntN(8) == 0 {
			action, id = "create", ""
		}
		actions[action]++
		was := live[id]
		step := f.begin(i, action, id, was, snaps)
		if step.opID == "" { // the sandbox died after its last step
			s.lifecycle(id, "delete", "deleted")
			delete(live, id)
			continue
		}
		d := time.Duration(f.rng.Int64N(int64(step.window)))
		time.Sleep(d)
		// One step in four runs uncut, so that sandboxes get paused and
		// suspended to be cut in their turn. One cut in four takes the
		// server with the sandbox, as a crash of both would (the disk
		// intact): the restart finds the step in flight and its processes
		// gone.
		withServer := false
		if pids := sandboxProcesses(step.id); len(pids) > 0 && f.rng.IntN(4) > 0 {
			kills++
			if withServer = f.rng.IntN(4) == 0; withServer {
				serverKills++
				killProcesses(append(pids, s.pid()))
				s.kill() // reaps it
				s.start()
			} else {
				killProcesses(pids)
			}
		}
		what := fmt.Sprintf("iteration %d: %s of %s (%s) cut after %v", i, action, step.id, was, d)
		if withServer {
			what += " with the server"
		}
		wctx, wcancel := context.WithTimeout(ctx, 2*time.Minute)
		op, err := s.client().WaitOperation(wctx, step.opID)
		wcancel()
		if err != nil {
			s.signal(syscall.SIGQUIT) // its goroutines, into its log
			time.Sleep(time.Second)
			t.Fatalf("%s: operation %s: %v; the server's log of it:\n%s\n%s", what, step.opID, err, f.logOf(step.id), s.log())
		}
		if op.State != "succeeded" {
			failedOps++
			if op.Error == nil || op.Error.Code == "" {
				t.Errorf("%s: operation %s without an error code", what, op.State)
			}
		}
		for _, id := range append([]string{step.id}, step.forks...) {
			if id != step.id {
				f.mark[id] = f.mark[step.id]
			}
			st := f.settle(what, id)
			switch {
			case action == "wake" && was == "suspended" && op.State != "succeeded" && st != "suspended" && rt == "gvisor":
				t.Errorf("%s: the wake failed (%+v) and left the sandbox %s: its image was intact", what, op.Error, st)
			case action == "delete" && (op.State != "succeeded" || st != "deleted"):
				t.Errorf("%s: the delete %s (%+v), the sandbox %s", what, op.State, op.Error, st)
			}
			switch st {
			case "failed":
				failedSandboxes++
				s.lifecycle(id, "delete", "deleted")
				delete(live, id)
			case "deleted":
				delete(live, id)
			default:
				live[id] = st
				if _, ok := f.mark[id]; !ok && st == "running" { // a create that ran
					f.prepare(id)
				}
			}
		}
		if action == "snapshot" && op.State == "succeeded" {
			if got, err := s.client().GetSnapshot(ctx, step.snap); err != nil || got.State != "ready" {
				t.Errorf("%s: snapshot %s after its operation succeeded: %v %+v", what, step.snap, err, got)
			} else {
				snaps = f.keepSnapshot(snaps, savedSnapshot{step.snap, f.mark[step.id]})
			}
		}
	}
	t.Logf("runtime kills on %s: %d iterations %v, %d kills (%d with the server), %d operations failed, %d sandboxes failed", rt, iterations, actions, kills, serverKills, failedOps, failedSandboxes)
	if strings.Contains(s.log(), "panic") {
		t.Error("the server's log has a panic")
	}
	f.finish(live, snaps)
}

// settle waits for sandbox id to leave its transitional state and checks
// that what the API says of it is true (testRuntimeKills); it returns the
// state.
func (f *faultRig) settle(what, id string) string {
	t, ctx := f.t, context.Background()
	deadline := time.Now().Add(time.Minute)
	var sb *client.Sandbox
	var deadSince time.Time
	for {
		var err error
		if sb, err = f.s.client().GetSandbox(ctx, id); err != nil {
			t.Fatalf("%s: %s: %v", what, id, err)
		}
		if (sb.State == "running" || sb.State == "paused") && len(sandboxProcesses(id)) == 0 {
			// Dead: it must be failed within seconds.
			if deadSince.IsZero() {
				deadSince = time.Now()
			} else if time.Since(deadSince) > 10*time.Second {
				t.Errorf("%s: %s is shown %s with no process of it left; the server's log of it:\n%s", what, id, sb.State, f.logOf(id))
				return sb.State
			}
		} else if !slices.Contains([]string{"starting", "pausing", "resuming", "suspending", "restoring", "deleting"}, sb.State) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %s is still %s a minute later", what, id, sb.State)
		}
		time.Sleep(50 * time.Millisecond)
	}
	switch sb.State {
	case "failed":
		if sb.Error == nil || sb.Error.Code == "" {
			t.Errorf("%s: %s failed without a reason; the server's log of it:\n%s", what, id, f.logOf(id))
		}
	case "suspended":
		// (runsc removes what is left of the saved container in the
		// background: seconds at most.)
		p := sandboxProcesses(id)
		for end := time.Now().Add(5 * time.Second); len(p) > 0 && time.Now().Before(end); p = sandboxProcesses(id) {
			time.Sleep(50 * time.Millisecond)
		}
		if len(p) > 0 {
			t.Errorf("%s: %s is suspended with processes %s; the server's log of it:\n%s", what, id, describeProcesses(p), f.logOf(id))
		}
	case "running":
		want, ok := f.mark[id]
		if !ok {
			break // a create: prepared by the caller
		}
		r := f.s.do("POST", "/v1/sandboxes/"+id+"/commands", f.s.token, []byte(`{"command":["sh","-c","cat /root/mark; ps | grep -c '[s]leep 100000'"]}`))
		if r.status != 201 {
			// Refused: it may have died just now (killed after its step
			// ended, its processes still ending when it was read, or its
			// agent's connection cut during the call); then it must be
			// failed within seconds.
			if f.failsSoon(id) {
				return f.settle(what, id)
			}
			t.Errorf("%s: %s is running, and a command on it is answered %d %s; the server's log of it:\n%s", what, id, r.status, r.body, f.logOf(id))
			break
		}
		var sess session
		r.json(t, &sess)
		st, resp := f.s.attach(sess.Attach.URL, sess.Attach.Token, "")
		if st == nil {
			t.Errorf("%s: %s: attach = %d", what, id, resp.StatusCode)
			break
		}
		tr := &transcript{}
		collect(t, st, tr, nil)
		if string(tr.stdout) != want+"\n1\n" {
			if f.failsSoon(id) {
				return f.settle(what, id)
			}
			t.Errorf("%s: %s runs without its file or process: %q %q %v (want mark %s)", what, id, tr.stdout, tr.stderr, tr.events, want)
		}
	}
	return sb.State
}

// failsSoon reports whether sandbox id is failed within ten seconds.
func (f *faultRig) failsSoon(id string) bool {
	for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		if sb, err := f.s.client().GetSandbox(context.Background(), id); err == nil && sb.State == "failed" {
			return true
		}
	}
	return false
}

// logOf is the last lines of the server's log that name id.
func (f *faultRig) logOf(id string) string {
	lines := strings.Split(grepLines(f.s.log(), id), "\n")
	return strings.Join(lines[max(0, len(lines)-12):], "\n")
}

// describeProcesses says what each process is: its state and command line.
func describeProcesses(pids []int) string {
	var out []string
	for _, pid := range pids {
		st, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		cmd, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		out = append(out, fmt.Sprintf("%d %q [%s]", pid, bytes.ReplaceAll(cmd, []byte{0}, []byte{' '}), st))
	}
	return strings.Join(out, "; ")
}
