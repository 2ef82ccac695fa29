package e2e

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spacesandbox/space/internal/runtime/runtimetest"
)

// realRuntimes are the runtimes that run real sandboxes; in CI both must.
func realRuntimes(t *testing.T) []string {
	t.Helper()
	var rts []string
	for _, rt := range e2eRuntimes(t) {
		if rt != "fake" {
			rts = append(rts, rt)
		}
	}
	if len(rts) == 0 {
		t.Skip("no real runtime here")
	}
	return rts
}

// TestRealRuntimes runs the suites that need real sandboxes on every real
// runtime: gVisor, and QEMU microVMs (TCG here, KVM in production).
func TestRealRuntimes(t *testing.T) {
	runOnRuntimes(t, realRuntimes(t), []suiteCase{
		{"ProcessSurvivesSuspendWake", testProcessSurvivesSuspendWake},
		{"ServerKilledSandboxesSurvive", testServerKilledSandboxesSurvive},
		{"DeleteLeavesNothing", testDeleteLeavesNothing},
		{"PathsStayInsideAndSandboxesIndependent", testPathsStayInside},
		{"BenchQuick", testBenchQuick},
		{"DeadSandboxIsFailed", testDeadSandboxIsFailed},
		{"FaultInjection", testFaultInjection},
		{"RuntimeKills", testRuntimeKills},
		{"FailedSuspendKeepsRunning", testFailedSuspendKeepsRunning},
		{"CommandsSeeTheSandboxVCPUs", testCommandsSeeTheSandboxVCPUs},
	})
}

// A command sees as many CPUs as its sandbox has vCPUs — gVisor itself
// shows at least two — and still after a suspend and wake.
func testCommandsSeeTheSandboxVCPUs(t *testing.T, rt string) {
	s := startRuntimeServer(t, rt)
	for _, vcpus := range []int{1, 2} {
		sbx := s.createWith(t, map[string]any{"template": s.template, "runtime": rt, "resources": map[string]any{"vcpus": vcpus}}).ID
		want := fmt.Sprint(vcpus)
		if got, code := s.sh(sbx, "nproc"); strings.TrimSpace(got) != want || code != 0 {
			t.Fatalf("%d vCPUs: nproc says %q (exit %d)", vcpus, got, code)
		}
		if vcpus == 1 {
			s.lifecycle(sbx, "suspend", "suspended")
			s.lifecycle(sbx, "wake", "running")
			if got, _ := s.sh(sbx, "nproc"); strings.TrimSpace(got) != want {
				t.Fatalf("after a wake, 1 vCPU: nproc says %q", got)
			}
		}
	}
}

// lifecycle drives one lifecycle step through the API and waits for it.
func (s *server) lifecycle(sbx, action, want string) {
	s.t.Helper()
	op, _, err := s.client().Lifecycle(context.Background(), action, sbx, "")
	if err != nil {
		s.t.Fatalf("%s: %v", action, err)
	}
	if done := s.waitOp(op.ID); done.State != "succeeded" {
		s.t.Fatalf("%s failed: %+v", action, done.Error)
	}
	sb, err := s.client().GetSandbox(context.Background(), sbx)
	if err != nil || sb.State != want {
		s.t.Fatalf("after %s: %+v %v", action, sb, err)
	}
}

// A process started before pause and three suspend/wake cycles keeps
// running; its stream continues from Last-Event-ID with no gap or repeat;
// files written before are still there.
func testProcessSurvivesSuspendWake(t *testing.T, rt string) {
	s := startRuntimeServer(t, rt)
	sbx := s.createRunning()
	s.do("PUT", "/v1/sandboxes/"+sbx+"/files?path=/root/before.txt", s.token, []byte("written before suspend"))
	sess := s.command(sbx, map[string]any{"command": []string{"sh", "-c", "i=0; while [ $i -lt 60 ]; do echo tick-$i; i=$((i+1)); sleep 0.1; done"}})
	tr := &transcript{}
	st, _ := s.attach(sess.Attach.URL, sess.Attach.Token, "")
	collect(t, st, tr, func(tr *transcript) bool { return len(tr.ids) >= 5 })
	s.lifecycle(sbx, "pause", "paused")
	s.lifecycle(sbx, "wake", "running")
	for cycle := 0; cycle < 3; cycle++ {
		s.lifecycle(sbx, "suspend", "suspended")
		expectError(t, s.do("POST", "/v1/sandboxes/"+sbx+"/commands", s.token, []byte(`{"command":["true"]}`)), 409, "failed_precondition")
		s.lifecycle(sbx, "wake", "running")
		r := s.do("GET", "/v1/sandboxes/"+sbx+"/files?path=/root/before.txt", s.token, nil)
		if r.status != 200 || string(r.body) != "written before suspend" {
			t.Fatalf("cycle %d: file = %d %q", cycle, r.status, r.body)
		}
		// Resume the stream where it stopped.
		st, resp := s.attach(sess.Attach.URL, sess.Attach.Token, tr.lastID)
		if st == nil {
			t.Fatalf("cycle %d: reattach = %d", cycle, resp.StatusCode)
		}
		n := len(tr.ids)
		collect(t, st, tr, func(tr *transcript) bool { return len(tr.ids) >= n+3 })
	}
	for reconnects := 0; !tr.complete; reconnects++ {
		if reconnects > 20 {
			t.Fatal("stream never completed")
		}
		st, _ := s.attach(sess.Attach.URL, sess.Attach.Token, tr.lastID)
		collect(t, st, tr, nil)
	}
	var want strings.Builder
	for i := 0; i < 60; i++ {
		fmt.Fprintf(&want, "tick-%d\n", i)
	}
	if string(tr.stdout) != want.String() || tr.exitCode == nil || *tr.exitCode != 0 {
		t.Fatalf("output across suspend/wake:\n%s", tr.stdout)
	}
	for _, e := range tr.events {
		if e == "resync_required" {
			t.Fatal("output was lost across suspend/wake")
		}
	}
	// The sandbox's usage samples (every 5 s) say what its agent holds,
	// after all this still a small part of the sandbox's memory.
	deadline := time.Now().Add(15 * time.Second)
	for {
		var got struct {
			Items []struct {
				MemTotal uint64 `json:"mem_total"`
				AgentRSS uint64 `json:"agent_rss"`
			} `json:"items"`
		}
		r := s.do("GET", "/v1/sandboxes/"+sbx+"/metrics", s.token, nil)
		if r.status != 200 || json.Unmarshal(r.body, &got) != nil {
			t.Fatalf("metrics = %d %s", r.status, r.body)
		}
		if n := len(got.Items); n > 0 {
			if x := got.Items[n-1]; x.AgentRSS < 1<<20 || x.AgentRSS > 128<<20 || x.AgentRSS > x.MemTotal {
				t.Fatalf("agent memory %d bytes of %d (want 1–128 MiB)", x.AgentRSS, x.MemTotal)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no usage sample in 15 s")
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// SIGKILL of the server while sandboxes run, paused and suspended: after a
// restart every one is usable.
func testServerKilledSandboxesSurvive(t *testing.T, rt string) {
	s := startRuntimeServer(t, rt)
	// How the runtime runs here is visible (the vm runtime: its acceleration and why).
	if r := s.do("GET", "/readyz", "", nil); !bytes.Contains(r.body, []byte(`"runtime_details":{"`+rt+`":`)) ||
		(rt == "vm" && !bytes.Contains(r.body, []byte("accel="))) {
		t.Fatalf("readyz = %s", r.body)
	}
	running, paused, suspended := s.createRunning(), s.createRunning(), s.createRunning()
	s.lifecycle(paused, "pause", "paused")
	s.lifecycle(suspended, "suspend", "suspended")
	s.kill()
	s.start()
	for _, id := range []string{running, paused, suspended} {
		sb, _ := s.client().GetSandbox(context.Background(), id)
		if sb.State == "paused" || sb.State == "suspended" {
			s.lifecycle(id, "wake", "running")
		}
		tr, _ := s.runCommand(id, map[string]any{"command": []string{"sh", "-c", "echo alive; hostname"}})
		if !strings.HasPrefix(string(tr.stdout), "alive\nsbx-") || *tr.exitCode != 0 {
			t.Fatalf("%s after restart: %q %v", id, tr.stdout, tr.events)
		}
	}
}

// After delete nothing of the sandbox is left on the host.
func testDeleteLeavesNothing(t *testing.T, rt string) {
	s := startRuntimeServer(t, rt)
	// This server's socket directory under /run (other servers of the
	// run, on other runtimes, have theirs at the same time).
	runDir := runtimeSocketDir(rt, filepath.Join(s.dataDir, "runtime", rt))
	if _, err := os.Stat(runDir); err != nil {
		t.Fatalf("the %s runtime's socket directory: %v", rt, err)
	}
	for _, final := range []string{"running", "paused", "suspended"} {
		sbx := s.createRunning()
		s.runCommand(sbx, map[string]any{"command": []string{"sh", "-c", "echo x > /root/f"}})
		if final == "paused" {
			s.lifecycle(sbx, "pause", "paused")
		}
		if final == "suspended" {
			s.lifecycle(sbx, "suspend", "suspended")
		}
		s.lifecycle(sbx, "delete", "deleted")
		// Its processes are ended by the delete; their teardown, the
		// removal of their cgroups and of its network, may finish just
		// after it.
		for deadline := time.Now().Add(runtimetest.TeardownBound); ; time.Sleep(10 * time.Millisecond) {
			left := runtimetest.ProcessesAndCgroups(sbx, "space*")
			if b, _ := os.ReadFile("/proc/self/mountinfo"); bytes.Contains(b, []byte(sbx)) {
				left = append(left, "a mount")
			}
			for _, root := range []string{s.dataDir, "/run"} {
				filepath.Walk(root, func(p string, fi os.FileInfo, err error) error {
					if strings.Contains(p, sbx) {
						left = append(left, p)
					}
					return nil
				})
			}
			if len(left) == 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: still on the host %v after the delete: %v", final, runtimetest.TeardownBound, left)
			}
		}
	}
	// With no sandbox left, a graceful stop leaves no mount under the data
	// directory and no directory under /run (#14 item 12).
	s.stop()
	if b, _ := os.ReadFile("/proc/self/mountinfo"); bytes.Contains(b, []byte(s.dataDir)) {
		t.Fatalf("a mount under the data directory remains after a graceful stop:\n%s", b)
	}
	if _, err := os.Stat(runDir); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("%s remains after a graceful stop (%v)", runDir, err)
	}
}

// runtimeSocketDir is where a runtime whose directory is dir keeps its
// sockets (gvisor.Config and vm.Config name it so).
func runtimeSocketDir(rt, dir string) string {
	if rt == "vm" {
		h := uint32(2166136261) // FNV-1a, as vm's shortDir
		for i := 0; i < len(dir); i++ {
			h = (h ^ uint32(dir[i])) * 16777619
		}
		return fmt.Sprintf("/run/space-vm-%08x", h)
	}
	sum := sha256.Sum256([]byte(dir))
	return "/run/space-" + hex.EncodeToString(sum[:4])
}

// Paths and symlinks inside a gVisor sandbox resolve inside it: a symlink
// to / reads the sandbox's files, never the host's.
func testPathsStayInside(t *testing.T, rt string) {
	s := startRuntimeServer(t, rt)
	if r := s.do("GET", "/v1/templates", s.token, nil); r.status != 200 || !bytes.Contains(r.body, []byte(`"name":"test"`)) {
		t.Fatalf("templates = %d %s", r.status, r.body)
	}
	if r := s.do("GET", "/v1/templates/test:latest", s.token, nil); r.status != 200 || !bytes.Contains(r.body, []byte(`"digest":"sha256:`)) {
		t.Fatalf("template test:latest = %d %s", r.status, r.body)
	}
	expectError(t, s.do("GET", "/v1/templates/nope:latest", s.token, nil), 404, "not_found")
	expectError(t, s.do("GET", "/v1/templates/nope", s.token, nil), 404, "not_found")
	sbx := s.createRunning()
	s.runCommand(sbx, map[string]any{"command": []string{"sh", "-c", "ln -s / /tmp/root-link; echo inside > /etc/marker"}})
	base := "/v1/sandboxes/" + sbx + "/files"
	r := s.do("GET", base+"?path=/tmp/root-link/etc/marker", s.token, nil)
	if r.status != 200 || string(r.body) != "inside\n" {
		t.Fatalf("read through in-sandbox symlink = %d %q", r.status, r.body)
	}
	r = s.do("GET", base+"?path=/../../../etc/hostname", s.token, nil)
	host, _ := os.ReadFile("/etc/hostname")
	if r.status == 200 && bytes.Equal(r.body, host) && len(host) > 0 {
		t.Fatal("a .. path read the host's /etc/hostname")
	}
	if r := s.do("PUT", base+"?path=/tmp/root-link/../../space-e2e-escape", s.token, []byte("x")); r.status != 200 {
		t.Fatalf("put = %d", r.status)
	}
	if _, err := os.Stat("/space-e2e-escape"); err == nil {
		os.Remove("/space-e2e-escape")
		t.Fatal("a write escaped to the host's root")
	}
	// Files whose size is not known up front are read whole (#14 item 9);
	// a device is refused, not read forever.
	if r := s.do("GET", base+"?path=/proc/self/mounts", s.token, nil); r.status != 200 || !bytes.Contains(r.body, []byte(" / ")) {
		t.Fatalf("read /proc/self/mounts = %d %q", r.status, r.body)
	}
	expectError(t, s.do("GET", base+"?path=/dev/zero", s.token, nil), 409, "failed_precondition")
	// Nothing the sandbox writes lands on the host outside its disk: the
	// agent's channel directory is not writable, from inside or through
	// the files API (#14 item 1).
	if rt == "gvisor" {
		res, _ := s.runCommand(sbx, map[string]any{"command": []string{"sh", "-c", "echo x > /.space/run/planted || exit 3; dd if=/dev/zero of=/.space/run/big bs=1M count=8"}})
		if res.exitCode == nil || *res.exitCode != 3 {
			t.Fatalf("writing into /.space/run from inside: exit %v %s %s, want refused", res.exitCode, res.stdout, res.stderr)
		}
		expectError(t, s.do("PUT", base+"?path=/.space/run/planted", s.token, []byte("x")), 409, "failed_precondition")
		// A process in the sandbox dialling the agent's socket with its own
		// agent cannot take the agent's place (#14 item 15).
		s.runCommand(sbx, map[string]any{"command": []string{"sh", "-c", "timeout 3 /.space/agent --connect unix:/.space/run/agent.sock >/dev/null 2>&1; true"}})
		if tr, _ := s.runCommand(sbx, map[string]any{"command": []string{"echo", "still mine"}}); string(tr.stdout) != "still mine\n" {
			t.Fatalf("after an impostor dialled the agent socket: %q", tr.stdout)
		}
		if !strings.Contains(s.log(), "cannot prove the agent's key") {
			t.Fatal("the impostor's connection was not refused")
		}
		left, _ := filepath.Glob(filepath.Join("/run/space-*", sbx, "*"))
		for _, f := range left {
			if filepath.Base(f) != "agent.sock" {
				t.Fatalf("the sandbox wrote %s on the host", f)
			}
		}
	}
	// Two sandboxes are independent and have their own hostnames.
	other := s.createRunning()
	a, _ := s.runCommand(sbx, map[string]any{"command": []string{"sh", "-c", "hostname; head -c 16 /dev/urandom | od -An -tx1"}})
	b, _ := s.runCommand(other, map[string]any{"command": []string{"sh", "-c", "hostname; head -c 16 /dev/urandom | od -An -tx1; cat /etc/marker"}})
	al, bl := strings.SplitN(string(a.stdout), "\n", 3), strings.SplitN(string(b.stdout), "\n", 3)
	if len(al) < 2 || len(bl) < 3 || al[0] == bl[0] || al[1] == bl[1] || strings.Contains(bl[2], "inside") ||
		!strings.HasPrefix(al[0], "sbx-") || !strings.HasPrefix(bl[0], "sbx-") {
		t.Fatalf("sandboxes not independent (hostname, random bytes, a file):\n%s\n%s", a.stdout, b.stdout)
	}
	_ = time.Second
}

// `space bench --quick --baseline` measures every row through the public
// API and the bare runtime doing each row's work (runsc alone; QEMU alone
// through QMP, commands through the guest's agent).
func testBenchQuick(t *testing.T, rt string) {
	s := startRuntimeServer(t, rt)
	out := filepath.Join(t.TempDir(), "bench.json")
	// Three samples a row: the quick form's five cost the vm runtime's
	// cold bare boots (6 s each under TCG) for no check made here.
	args := []string{"bench", "--quick", "--runs", "3", "--template", "test:latest", "--json-out", out, "--baseline", "--data-dir", s.dataDir}
	stdout, stderr, code := s.runCLIWith(spaceBin, args...)
	if code != 0 {
		t.Fatalf("bench exit %d: %s", code, stderr)
	}
	t.Logf("\n%s", stdout)
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	var rep struct {
		Runtime  string
		Baseline bool
		Rows     []struct {
			Key, Name   string
			Samples     int
			P50         float64
			Bare, Ratio float64
			BareNote    string `json:"bare_note"`
		}
	}
	// Fourteen rows on every runtime, delete, fork and create-from-snapshot
	// included, and output on SSE and on the binary stream.
	const want = 14
	if err := json.Unmarshal(b, &rep); err != nil || rep.Runtime != rt || len(rep.Rows) != want || !rep.Baseline {
		t.Fatalf("report = %s (%v)", b, err)
	}
	for _, r := range rep.Rows {
		if r.P50 <= 0 {
			t.Fatalf("row %q measured nothing", r.Name)
		}
		if r.Key == "create" && r.Samples != 3 {
			t.Fatalf("create row has %d samples: --runs 3 beside --quick was not kept", r.Samples)
		}
		if r.Key == "delete" && r.Samples != 2 {
			t.Fatalf("delete row has %d samples, want 2 (every create's sandbox but the last)", r.Samples)
		}
		// Every row but the control plane's reads has a bare equivalent.
		if r.Key != "reads" && (r.Bare <= 0 || r.Ratio <= 0) {
			t.Fatalf("row %q has no bare measurement: %s", r.Name, b)
		}
		if rt == "vm" && r.Key == "exec" && !strings.Contains(r.BareNote, "agent") {
			t.Fatalf("the vm's bare exec row does not say it ran through the guest's agent: %q", r.BareNote)
		}
	}
}

// A warm pool on gVisor: a create claims a ready sandbox (its operation has
// succeeded in the answer), which runs commands with its own identity; pool
// sandboxes are not listed; the pool refills.
func TestGVisorWarmPool(t *testing.T) {
	requireGVisor(t)
	s := startRuntimeServer(t, "gvisor")
	r := s.do("PUT", "/v1/warm-pools/test:latest", s.token, []byte(`{"min_ready":3}`))
	if r.status != 200 {
		t.Fatalf("PUT warm pool = %d %s", r.status, r.body)
	}
	expectError(t, s.do("PUT", "/v1/warm-pools/test:latest", s.token, []byte(`{"min_ready":1000}`)), 400, "invalid_argument")
	expectError(t, s.do("PUT", "/v1/warm-pools/test:latest", s.token, []byte(`{}`)), 400, "invalid_argument")
	expectError(t, s.do("PUT", "/v1/warm-pools/nope:latest", s.token, []byte(`{"min_ready":1}`)), 404, "not_found")
	expectError(t, s.do("GET", "/v1/warm-pools/nope:latest", s.token, nil), 404, "not_found")
	s.waitPool(t, "test:latest", `"ready":3`, 60*time.Second)
	if r := s.do("GET", "/v1/sandboxes", s.token, nil); !bytes.Contains(r.body, []byte(`"items":[]`)) {
		t.Fatalf("pool sandboxes are listed: %s", r.body)
	}
	if r := s.do("GET", "/metrics", "", nil); !bytes.Contains(r.body, []byte(`space_sandboxes{pool="true",state="running"} 3`)) {
		t.Fatalf("pool sandboxes not in metrics:\n%s", grepLines(string(r.body), "space_sandboxes"))
	}
	r = s.do("POST", "/v1/sandboxes", s.token, []byte(`{"template":"test:latest","env":{"MINE":"yes"},"network":{"egress":"none"}}`))
	var created struct {
		Sandbox   struct{ ID, State string }
		Operation struct{ State string }
	}
	r.json(t, &created)
	if r.status != 202 || created.Operation.State != "succeeded" || created.Sandbox.State != "running" {
		t.Fatalf("create from pool = %d %s", r.status, r.body)
	}
	tr, _ := s.runCommand(created.Sandbox.ID, map[string]any{"command": []string{"sh", "-c", "echo $MINE; hostname"}})
	want := "yes\nsbx-" + strings.TrimPrefix(created.Sandbox.ID, "sbx_")[:12] + "\n"
	if string(tr.stdout) != want {
		t.Fatalf("claimed sandbox: %q, want %q", tr.stdout, want)
	}
	// Claimed sandboxes get their user's network policy.
	// (busybox's wget crashes in a static build; nc speaks HTTP well enough)
	httpGet := []string{"sh", "-c", "printf 'GET / HTTP/1.0\\r\\n\\r\\n' | nc -w 3 " + s.up.Public[0].String() + " 80 2>&1"}
	if tr, _ := s.runCommand(created.Sandbox.ID, map[string]any{"command": httpGet}); strings.Contains(string(tr.stdout), "hello from upstream") {
		t.Errorf("a sandbox claimed with egress none reached upstream")
	}
	r = s.do("POST", "/v1/sandboxes", s.token, []byte(`{"template":"test:latest","network":{"egress":"public"}}`))
	r.json(t, &created)
	if r.status != 202 || created.Operation.State != "succeeded" {
		t.Fatalf("second create from pool = %d %s", r.status, r.body)
	}
	if tr, _ := s.runCommand(created.Sandbox.ID, map[string]any{"command": httpGet}); !strings.Contains(string(tr.stdout), "hello from upstream") {
		t.Errorf("a sandbox claimed with egress public cannot reach upstream: %q %q ", tr.stdout, tr.stderr)
	}
	s.waitPool(t, "test:latest", `"ready":3`, 60*time.Second) // refilled
	// Shrinking the pool deletes its sandboxes.
	s.do("PUT", "/v1/warm-pools/test:latest", s.token, []byte(`{"min_ready":0}`))
	s.waitPool(t, "test:latest", `"ready":0,"starting":0`, 60*time.Second)
}

// waitPool waits up to d for GET /v1/warm-pools/{ref} to answer a body
// containing want.
func (s *server) waitPool(t *testing.T, ref, want string, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		r := s.do("GET", "/v1/warm-pools/"+ref, s.token, nil)
		if bytes.Contains(r.body, []byte(want)) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("pool %s never answered %s in %s: %s\n%s", ref, want, d, r.body, s.log())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func grepLines(text, substr string) string {
	var out []string
	for _, l := range strings.Split(text, "\n") {
		if strings.Contains(l, substr) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
