package e2e

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

type forkReply struct {
	Operation struct {
		ID        string
		Kind      string
		SandboxID string `json:"sandbox_id"`
		Sandboxes []string
	}
	Sandboxes []struct {
		ID     string
		State  string
		ForkOf string `json:"fork_of"`
	}
}

// fork asks for count copies of sbx and waits for them to run.
func (s *server) fork(t *testing.T, sbx string, count int) []string {
	t.Helper()
	r := s.do("POST", "/v1/sandboxes/"+sbx+":fork", s.token, []byte(fmt.Sprintf(`{"count":%d}`, count)))
	var fr forkReply
	r.json(t, &fr)
	if r.status != 202 || fr.Operation.Kind != "fork" || fr.Operation.SandboxID != sbx || len(fr.Sandboxes) != count || len(fr.Operation.Sandboxes) != count {
		t.Fatalf("fork ×%d = %d %s", count, r.status, r.body)
	}
	var out []string
	for i, f := range fr.Sandboxes {
		if f.State != "starting" || f.ForkOf != sbx || f.ID != fr.Operation.Sandboxes[i] {
			t.Fatalf("fork record %+v", f)
		}
		out = append(out, f.ID)
	}
	if op := s.waitOp(fr.Operation.ID); op.State != "succeeded" {
		t.Fatalf("fork ×%d failed: %+v\n%s", count, op.Error, s.log())
	}
	return out
}

// Fork on gVisor and on the vm runtime: every copy has the source's files
// and a process counting on from the fork instant, its own hostname,
// entropy and address; a write in one is seen by no other; the source's
// command stream goes on without a gap.
func TestFork(t *testing.T) {
	if testing.Short() {
		t.Skip("needs seed:latest")
	}
	requireGVisor(t)
	s := startSeedServer(t, "auto")
	// Not subtests: the harness fails the test that started the server.
	t.Log("gvisor")
	ids := forkChecks(t, s, "gvisor")
	forkRefusals(t, s, ids)
	for _, id := range ids {
		s.do("DELETE", "/v1/sandboxes/"+id, s.token, nil) // the host's CPU for the VMs
	}
	if ok, why := vmAvailable(); !ok {
		if os.Getenv("SPACE_REQUIRE_VM") == "1" {
			t.Fatalf("SPACE_REQUIRE_VM=1 but the vm runtime cannot run: %s", why)
		}
		t.Skipf("vm: %s", why)
	}
	t.Log("vm")
	forkChecks(t, s, "vm")
}

// forkChecks forks a sandbox of runtime rt once and three times and checks
// every copy and the source; it returns the forks.
func forkChecks(t *testing.T, s *server, rt string) []string {
	src := s.createWithNetwork(t, rt, map[string]any{"egress": "none"}).ID
	if out, code := s.sh(src, `echo before > /tmp/fork.txt; (i=0; while true; do i=$((i+1)); echo $i > /tmp/counter.new; mv /tmp/counter.new /tmp/counter; sleep 0.1; done) >/dev/null 2>&1 & sleep 0.5`); code != 0 {
		t.Fatalf("prepare source: %d %s", code, out)
	}
	// A command streaming on the source across both forks.
	const lines = 100
	sess := s.command(src, map[string]any{"command": []string{"sh", "-c", fmt.Sprintf("for i in $(seq 1 %d); do echo $i; sleep 0.05; done", lines)}})
	st, resp := s.attach(sess.Attach.URL, sess.Attach.Token, "")
	if st == nil {
		t.Fatalf("attach: %d", resp.StatusCode)
	}
	var streamed []byte
	readSome := func(n int) {
		for i := 0; i < n; {
			ev, err := st.next()
			if err != nil {
				t.Fatalf("source stream: %v", err)
			}
			if ev.name == "output" {
				var o struct{ Data string }
				json.Unmarshal(ev.data, &o)
				b, _ := base64.StdEncoding.DecodeString(o.Data)
				streamed = append(streamed, b...)
				i++
			}
		}
	}
	readSome(3)

	forks := append(s.fork(t, src, 1), s.fork(t, src, 3)...)

	look := func(id string) forkView { return lookAtFork(t, s, id) }
	seen := map[string]string{}
	srcView := look(src)
	for _, id := range append([]string{src}, forks...) {
		v := look(id)
		if v.file != "before" {
			t.Errorf("%s: file %q, want the source's (or a stuck counter)", id, v.file)
		}
		for _, k := range []string{"host:" + v.host, "random:" + v.random} {
			if other, dup := seen[k]; dup {
				t.Errorf("%s and %s share %s", id, other, k)
			}
			seen[k] = id
		}
		if id != src && v.addr != "" && v.addr == srcView.addr {
			t.Errorf("fork %s has the source's address %s", id, v.addr)
		}
		var sb struct {
			State  string
			ForkOf string `json:"fork_of"`
		}
		s.do("GET", "/v1/sandboxes/"+id, s.token, nil).json(t, &sb)
		if sb.State != "running" || (id != src && sb.ForkOf != src) {
			t.Errorf("%s: %+v", id, sb)
		}
	}
	if out, code := s.sh(forks[0], "echo changed > /tmp/fork.txt"); code != 0 {
		t.Fatalf("write in a fork: %s", out)
	}
	for _, id := range []string{src, forks[1], forks[3]} {
		if v := look(id); v.file != "before" {
			t.Errorf("%s sees a fork's write: %q", id, v.file)
		}
	}

	// The source's stream: every line, in order, to the end, with no gap.
	// Known limit (README): gVisor saves the source and restarts it from
	// the save, so output it wrote between the save and the restart (a few
	// milliseconds) is written again; a repeated run of lines is tolerated
	// there. The vm runtime only holds the source still: nothing repeats.
	tr := &transcript{stdout: streamed}
	collect(t, st, tr, nil)
	next := 1
	for _, l := range strings.Split(strings.TrimSuffix(string(tr.stdout), "\n"), "\n") {
		n, err := strconv.Atoi(l)
		if err != nil || n > next || n < 1 || (n < next && rt == "vm") {
			t.Errorf("source stream across the forks: a gap, a repeat or garbage at %q (want %d): %q", l, next, tr.stdout)
			break
		}
		if n == next {
			next++
		}
	}
	if next != lines+1 || tr.exitCode == nil || *tr.exitCode != 0 {
		t.Errorf("source stream across the forks: exit %v, up to %d, %q", tr.exitCode, next-1, tr.stdout)
	}

	return append([]string{src}, forks...)
}

// forkView is what a fork test sees in a sandbox.
type forkView struct{ file, host, random, addr string }

// lookAtFork checks that the sandbox's counter runs and reads its file,
// hostname, 16 random bytes and address. The counter has 10 s to move:
// five TCG guests (a source and four forks) on two cores take well over
// half a second for one turn of its loop (a process start each).
func lookAtFork(t *testing.T, s *server, id string) forkView {
	t.Helper()
	out, code := s.sh(id, `a=$(cat /tmp/counter); b=$a; i=0; while [ "$b" -le "$a" ] && [ $i -lt 40 ]; do sleep 0.25; b=$(cat /tmp/counter); i=$((i+1)); done; [ "$b" -gt "$a" ] && [ "$a" -gt 1 ] || echo "counter stuck: $a $b"
cat /tmp/fork.txt; hostname; head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n'; echo; ip -4 -o addr show scope global | awk '{print $4}' | head -1`)
	f := strings.Split(strings.TrimRight(out, "\n"), "\n")
	if code != 0 || len(f) < 4 {
		t.Fatalf("look at %s: %d %q", id, code, out)
	}
	return forkView{f[0], f[1], f[2], strings.Join(f[3:], ",")}
}

// forkRefusals: counts out of range, an unknown sandbox, a suspended one;
// a fork suspends and wakes with its own state. ids: the source, then its
// forks.
func forkRefusals(t *testing.T, s *server, ids []string) {
	src, forks := ids[0], ids[1:]
	// Refusals: counts out of range, an unknown sandbox, a suspended one.
	for _, body := range []string{`{"count":0}`, `{"count":17}`, `{"count":"2"}`, `{"counts":2}`} {
		if r := s.do("POST", "/v1/sandboxes/"+src+":fork", s.token, []byte(body)); r.status != 400 {
			t.Errorf("fork %s = %d %s", body, r.status, r.body)
		}
	}
	if r := s.do("POST", "/v1/sandboxes/sbx_aaaaaaaaaaaaaaaaaaaaaaaaaa:fork", s.token, nil); r.status != 404 {
		t.Errorf("fork of an unknown sandbox = %d %s", r.status, r.body)
	}
	r := s.do("POST", "/v1/sandboxes/"+forks[2]+":suspend", s.token, nil)
	var sus struct{ Operation struct{ ID string } }
	r.json(t, &sus)
	if op := s.waitOp(sus.Operation.ID); op.State != "succeeded" {
		t.Fatalf("suspend a fork: %+v", op.Error)
	}
	if r := s.do("POST", "/v1/sandboxes/"+forks[2]+":fork", s.token, nil); r.status != 409 || !strings.Contains(string(r.body), "wake it first") {
		t.Errorf("fork of a suspended sandbox = %d %s", r.status, r.body)
	}
	// A fork wakes from its own suspend with its own state.
	r = s.do("POST", "/v1/sandboxes/"+forks[2]+":wake", s.token, nil)
	r.json(t, &sus)
	if op := s.waitOp(sus.Operation.ID); op.State != "succeeded" {
		t.Fatalf("wake a fork: %+v", op.Error)
	}
	if v := lookAtFork(t, s, forks[2]); v.file != "before" {
		t.Errorf("woken fork: %+v", v)
	}

}

// Snapshots on gVisor and on the vm runtime: save a sandbox with a file and
// a counting process, delete the source, restart the server, start two
// sandboxes from each snapshot: both have the file and the process
// counting on; then the snapshot's refusals, its use as a template, and
// its delete.
func TestSnapshots(t *testing.T) {
	if testing.Short() {
		t.Skip("needs seed:latest")
	}
	requireGVisor(t)
	s := startSeedServer(t, "auto")
	rts := copyRuntimes(t)
	var snaps []string
	for _, rt := range rts {
		snaps = append(snaps, saveForSnapshotTest(t, s, rt))
	}
	// The sources are gone; the server restarts; the snapshots stay.
	s.kill()
	s.start()
	for i, snap := range snaps {
		for j := 0; j < 2; j++ {
			var c struct {
				Sandbox struct {
					ID, Snapshot, Runtime string
				}
				Operation struct{ ID string }
			}
			if j == 1 {
				// The second through the CLI.
				out, stderr, code := s.runCLI("sandbox", "create", "--snapshot", snap, "--json")
				if err := json.Unmarshal([]byte(out), &c); code != 0 || err != nil || c.Sandbox.Snapshot != snap || c.Sandbox.Runtime != rts[i] {
					t.Fatalf("space sandbox create --snapshot = %d %v %s %s", code, err, out, stderr)
				}
			} else {
				r := s.do("POST", "/v1/sandboxes", s.token, []byte(`{"snapshot":"`+snap+`","network":{"egress":"none"}}`))
				r.json(t, &c)
				if r.status != 202 || c.Sandbox.Snapshot != snap || c.Sandbox.Runtime != rts[i] {
					t.Fatalf("create from snapshot = %d %s", r.status, r.body)
				}
			}
			if op := s.waitOp(c.Operation.ID); op.State != "succeeded" {
				t.Fatalf("create from snapshot failed: %+v\n%s", op.Error, s.log())
			}
			out, code := s.sh(c.Sandbox.ID, `a=$(cat /tmp/counter); sleep 0.5; b=$(cat /tmp/counter); [ "$b" -gt "$a" ] && [ "$a" -gt 1 ] || echo "counter stuck: $a $b"; cat /tmp/snap.txt; hostname`)
			if code != 0 || !strings.HasPrefix(out, "saved\nsbx-") {
				t.Fatalf("%s sandbox from the snapshot: %d %q", rts[i], code, out)
			}
			if rts[i] == "vm" {
				s.do("DELETE", "/v1/sandboxes/"+c.Sandbox.ID, s.token, nil) // the host's CPU
			}
		}
	}
	snap := snaps[0]
	for body, want := range map[string]int{
		`{"snapshot":"` + snap + `","resources":{"memory_mib":1024}}`: 400,
		`{"snapshot":"` + snap + `","env":{"A":"b"}}`:                 400,
		`{"snapshot":"snap_aaaaaaaaaaaaaaaaaaaaaaaaaa"}`:              404,
		`{"snapshot":"snap_nope"}`:                                    400,
	} {
		if r := s.do("POST", "/v1/sandboxes", s.token, []byte(body)); r.status != want {
			t.Errorf("create %s = %d %s, want %d", body, r.status, r.body, want)
		}
	}
	snapshotAsTemplate(t, s, snap)
	var list struct {
		Items []struct {
			ID        string
			SandboxID string `json:"sandbox_id"`
		}
	}
	s.do("GET", "/v1/snapshots", s.token, nil).json(t, &list)
	if len(list.Items) != len(snaps) || list.Items[0].ID != snap {
		t.Fatalf("list = %+v", list)
	}
	var bySource struct{ Items []struct{ ID string } }
	s.do("GET", "/v1/snapshots?sandbox_id="+list.Items[0].SandboxID, s.token, nil).json(t, &bySource)
	if len(bySource.Items) != 1 || bySource.Items[0].ID != snap {
		t.Fatalf("list by source = %+v", bySource)
	}
	if r := s.do("DELETE", "/v1/snapshots/"+snap, s.token, nil); r.status != 204 {
		t.Fatalf("delete snapshot = %d %s", r.status, r.body)
	}
	if r := s.do("GET", "/v1/snapshots/"+snap, s.token, nil); r.status != 404 {
		t.Fatalf("get a deleted snapshot = %d %s", r.status, r.body)
	}
	if _, err := os.Stat(s.dataDir + "/snapshots/" + snap); !os.IsNotExist(err) {
		t.Fatalf("snapshot image left on disk: %v", err)
	}
}

// copyRuntimes is the runtimes fork and snapshot tests run on: gvisor, and
// vm where it can run (SPACE_REQUIRE_VM=1: it must).
func copyRuntimes(t *testing.T) []string {
	t.Helper()
	rts := []string{"gvisor"}
	if ok, why := vmAvailable(); ok {
		rts = append(rts, "vm")
	} else if os.Getenv("SPACE_REQUIRE_VM") == "1" {
		t.Fatalf("SPACE_REQUIRE_VM=1 but the vm runtime cannot run: %s", why)
	}
	return rts
}

// saveForSnapshotTest makes a sandbox of runtime rt with /tmp/snap.txt and
// a counting process, snapshots it, deletes it and returns the snapshot.
func saveForSnapshotTest(t *testing.T, s *server, rt string) string {
	t.Helper()
	src := s.createWithNetwork(t, rt, map[string]any{"egress": "none"}).ID
	if out, code := s.sh(src, `echo saved > /tmp/snap.txt; (i=0; while true; do i=$((i+1)); echo $i > /tmp/counter.new; mv /tmp/counter.new /tmp/counter; sleep 0.1; done) >/dev/null 2>&1 & sleep 0.5`); code != 0 {
		t.Fatalf("prepare source: %d %s", code, out)
	}
	r := s.do("POST", "/v1/sandboxes/"+src+"/snapshots", s.token, []byte(`{"name":"warm"}`))
	var created struct {
		Snapshot struct {
			ID, Name, State string
			SandboxID       string `json:"sandbox_id"`
		}
		Operation struct{ ID, Kind, Snapshot string }
	}
	r.json(t, &created)
	snap := created.Snapshot.ID
	if r.status != 202 || !strings.HasPrefix(snap, "snap_") || created.Snapshot.State != "creating" || created.Snapshot.SandboxID != src ||
		created.Operation.Kind != "snapshot" || created.Operation.Snapshot != snap {
		t.Fatalf("create snapshot = %d %s", r.status, r.body)
	}
	if op := s.waitOp(created.Operation.ID); op.State != "succeeded" {
		t.Fatalf("snapshot failed: %+v\n%s", op.Error, s.log())
	}
	var got struct {
		State     string
		SizeBytes int64 `json:"size_bytes"`
	}
	s.do("GET", "/v1/snapshots/"+snap, s.token, nil).json(t, &got)
	if got.State != "ready" || got.SizeBytes <= 0 {
		t.Fatalf("snapshot = %+v", got)
	}
	t.Logf("snapshot of a %s seed sandbox: %d bytes", rt, got.SizeBytes)
	r = s.do("DELETE", "/v1/sandboxes/"+src, s.token, nil)
	var del struct{ Operation struct{ ID string } }
	r.json(t, &del)
	if op := s.waitOp(del.Operation.ID); op.State != "succeeded" {
		t.Fatalf("delete source: %+v", op.Error)
	}
	return snap
}

// snapshotAsTemplate tags snapshot snap (a saved seed sandbox with
// /tmp/snap.txt and a counter) as template warm:v1: creates of the template
// start from it, so does its warm pool; a tagged snapshot cannot be
// deleted; untagged, the template is gone.
func snapshotAsTemplate(t *testing.T, s *server, snap string) {
	t.Helper()
	expectError(t, s.do("POST", "/v1/snapshots/"+snap+":tag", s.token, []byte(`{"template":"seed:latest"}`)), 409, "conflict")
	expectError(t, s.do("POST", "/v1/snapshots/"+snap+":tag", s.token, []byte(`{"template":"Bad Ref"}`)), 400, "invalid_argument")
	expectError(t, s.do("POST", "/v1/snapshots/"+snap+":tag", s.token, []byte(`{}`)), 400, "invalid_argument")
	expectError(t, s.do("POST", "/v1/snapshots/snap_aaaaaaaaaaaaaaaaaaaaaaaaaa:tag", s.token, []byte(`{"template":"warm:v1"}`)), 404, "not_found")
	// The CLI tags through the API.
	if out, stderr, code := s.runCLI("template", "tag", "--from-snapshot", snap, "warm:v1"); code != 0 || !strings.Contains(out, "warm:v1") {
		t.Fatalf("space template tag --from-snapshot = %d %s %s", code, out, stderr)
	}
	expectError(t, s.do("DELETE", "/v1/snapshots/"+snap, s.token, nil), 409, "conflict")
	check := func(id string) {
		t.Helper()
		out, code := s.sh(id, `a=$(cat /tmp/counter); sleep 0.5; b=$(cat /tmp/counter); [ "$b" -gt "$a" ] && [ "$a" -gt 1 ] || echo "counter stuck: $a $b"; cat /tmp/snap.txt; hostname`)
		if want := "saved\nsbx-" + strings.TrimPrefix(id, "sbx_")[:12] + "\n"; code != 0 || out != want {
			t.Fatalf("sandbox of template warm:v1: %d %q, want %q", code, out, want)
		}
	}
	type created struct {
		Sandbox struct {
			ID, State, Snapshot string
			Template            struct{ Ref string }
		}
		Operation struct{ ID, State string }
	}
	var c created
	r := s.do("POST", "/v1/sandboxes", s.token, []byte(`{"template":"warm:v1","network":{"egress":"none"}}`))
	r.json(t, &c)
	if r.status != 202 || c.Sandbox.Snapshot != snap || c.Sandbox.Template.Ref != "seed:latest" {
		t.Fatalf("create of template warm:v1 = %d %s", r.status, r.body)
	}
	if op := s.waitOp(c.Operation.ID); op.State != "succeeded" {
		t.Fatalf("create of template warm:v1 failed: %+v\n%s", op.Error, s.log())
	}
	check(c.Sandbox.ID)
	// A warm pool of the template: a create claims a ready copy.
	if r := s.do("PUT", "/v1/warm-pools/warm:v1", s.token, []byte(`{"min_ready":1}`)); r.status != 200 {
		t.Fatalf("PUT warm pool of warm:v1 = %d %s", r.status, r.body)
	}
	s.waitPool(t, "warm:v1", `"ready":1`, 90*time.Second)
	r = s.do("POST", "/v1/sandboxes", s.token, []byte(`{"template":"warm:v1","network":{"egress":"none"}}`))
	r.json(t, &c)
	if r.status != 202 || c.Operation.State != "succeeded" || c.Sandbox.State != "running" || c.Sandbox.Snapshot != snap {
		t.Fatalf("create of warm:v1 from its pool = %d %s", r.status, r.body)
	}
	check(c.Sandbox.ID)
	s.do("PUT", "/v1/warm-pools/warm:v1", s.token, []byte(`{"min_ready":0}`))
	s.waitPool(t, "warm:v1", `"ready":0,"starting":0`, 60*time.Second)
	// Untagged: the template is gone, the snapshot can go.
	if out, stderr, code := s.runCLI("snapshot", "untag", snap); code != 0 {
		t.Fatalf("space snapshot untag = %d %s %s", code, out, stderr)
	}
	expectError(t, s.do("POST", "/v1/sandboxes", s.token, []byte(`{"template":"warm:v1"}`)), 404, "not_found")
}

// A fork or snapshot that finds the disk too full for the copy fails with
// the reason (resource_exhausted) and leaves the source running as it was;
// once there is room, the same source forks. The snapshot directory is a
// 4 MiB tmpfs the test mounts over the data directory's (needs root); on
// gVisor and on the vm runtime.
func TestForkOnFullDisk(t *testing.T) {
	if testing.Short() {
		t.Skip("needs seed:latest")
	}
	requireRoot(t)
	requireGVisor(t)
	s := startSeedServer(t, "auto")
	rts := copyRuntimes(t)
	for _, rt := range rts {
		src := s.createWithNetwork(t, rt, map[string]any{"egress": "none"}).ID
		// 16 MB of incompressible data: more than the copy has room for.
		if out, code := s.sh(src, `echo kept > /tmp/kept.txt; head -c 16000000 /dev/urandom > /tmp/big`); code != 0 {
			t.Fatalf("prepare %s source: %d %s", rt, code, out)
		}
		dir := filepath.Join(s.dataDir, "snapshots")
		os.MkdirAll(dir, 0o700)
		if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=4m", "space-e2e-full", dir).CombinedOutput(); err != nil {
			t.Fatalf("mount tmpfs: %v %s", err, out)
		}
		unmount := func() { syscall.Unmount(dir, syscall.MNT_DETACH) }
		t.Cleanup(unmount)
		r := s.do("POST", "/v1/sandboxes/"+src+":fork", s.token, []byte(`{"count":2}`))
		var fr forkReply
		r.json(t, &fr)
		if r.status != 202 {
			t.Fatalf("%s: fork = %d %s", rt, r.status, r.body)
		}
		op := s.waitOp(fr.Operation.ID)
		if op.State != "failed" || op.Error == nil || op.Error.Code != "resource_exhausted" {
			t.Fatalf("%s: fork on a full disk = %s %+v, want failed resource_exhausted", rt, op.State, op.Error)
		}
		for _, f := range fr.Sandboxes {
			var sb struct{ State string }
			s.do("GET", "/v1/sandboxes/"+f.ID, s.token, nil).json(t, &sb)
			if sb.State != "failed" {
				t.Errorf("%s: fork %s = %s after a failed fork, want failed", rt, f.ID, sb.State)
			}
			// gVisor made the copies' sandbox processes beside the save
			// (PrepareCopy): a failed fork ends them.
			if pids := sandboxProcesses(f.ID); len(pids) > 0 {
				t.Errorf("%s: fork %s failed, but its host processes %v still run", rt, f.ID, pids)
			}
		}
		r = s.do("POST", "/v1/sandboxes/"+src+"/snapshots", s.token, nil)
		var sn struct {
			Snapshot  struct{ ID string }
			Operation struct{ ID string }
		}
		r.json(t, &sn)
		if op := s.waitOp(sn.Operation.ID); op.State != "failed" || op.Error == nil || op.Error.Code != "resource_exhausted" {
			t.Fatalf("%s: snapshot on a full disk = %s %+v", rt, op.State, op.Error)
		}
		var snap struct{ State string }
		s.do("GET", "/v1/snapshots/"+sn.Snapshot.ID, s.token, nil).json(t, &snap)
		if snap.State != "failed" {
			t.Errorf("%s: snapshot after a full disk = %s, want failed", rt, snap.State)
		}
		var sb struct{ State string }
		s.do("GET", "/v1/sandboxes/"+src, s.token, nil).json(t, &sb)
		if out, code := s.sh(src, `cat /tmp/kept.txt`); sb.State != "running" || code != 0 || out != "kept\n" {
			t.Fatalf("%s: source after the failed copies: %s, %d %q", rt, sb.State, code, out)
		}
		unmount()
		forks := s.fork(t, src, 1)
		if out, code := s.sh(forks[0], `cat /tmp/kept.txt`); code != 0 || out != "kept\n" {
			t.Fatalf("%s: fork once there is room: %d %q", rt, code, out)
		}
		for _, id := range append(forks, src) {
			s.do("DELETE", "/v1/sandboxes/"+id, s.token, nil)
		}
	}
}
