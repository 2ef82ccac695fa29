package e2e

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
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

// Fork on gVisor: every copy has the source's files and a process counting
// on from the fork instant, its own hostname, entropy and address; a write
// in one is seen by no other; the source's command stream goes on without a
// gap. The vm runtime refuses (it cannot copy a live VM yet).
func TestFork(t *testing.T) {
	if testing.Short() {
		t.Skip("needs seed:latest")
	}
	requireGVisor(t)
	s := startSeedServer(t, "auto")
	src := s.createWithNetwork(t, "gvisor", map[string]any{"egress": "none"}).ID
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

	type view struct{ file, host, random, addr string }
	look := func(id string) view {
		out, code := s.sh(id, `a=$(cat /tmp/counter); sleep 0.5; b=$(cat /tmp/counter); [ "$b" -gt "$a" ] && [ "$a" -gt 1 ] || echo "counter stuck: $a $b"
cat /tmp/fork.txt; hostname; head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n'; echo; ip -4 -o addr show scope global | awk '{print $4}' | head -1`)
		f := strings.Split(strings.TrimRight(out, "\n"), "\n")
		if code != 0 || len(f) < 4 {
			t.Fatalf("look at %s: %d %q", id, code, out)
		}
		return view{f[0], f[1], f[2], strings.Join(f[3:], ",")}
	}
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
	// milliseconds) is written again; a repeated run of lines is tolerated.
	tr := &transcript{stdout: streamed}
	collect(t, st, tr, nil)
	next := 1
	for _, l := range strings.Split(strings.TrimSuffix(string(tr.stdout), "\n"), "\n") {
		n, err := strconv.Atoi(l)
		if err != nil || n > next || n < 1 {
			t.Errorf("source stream across the forks: a gap or garbage at %q (want ≤ %d): %q", l, next, tr.stdout)
			break
		}
		if n == next {
			next++
		}
	}
	if next != lines+1 || tr.exitCode == nil || *tr.exitCode != 0 {
		t.Errorf("source stream across the forks: exit %v, up to %d, %q", tr.exitCode, next-1, tr.stdout)
	}

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
	if v := look(forks[2]); v.file != "before" {
		t.Errorf("woken fork: %+v", v)
	}

	if ok, why := vmAvailable(); ok {
		vmID := s.createWithNetwork(t, "vm", nil).ID
		if r := s.do("POST", "/v1/sandboxes/"+vmID+":fork", s.token, nil); r.status != 409 || !strings.Contains(string(r.body), `"runtime":"vm"`) {
			t.Errorf("fork on vm = %d %s", r.status, r.body)
		}
	} else if os.Getenv("SPACE_REQUIRE_VM") == "1" {
		t.Fatalf("SPACE_REQUIRE_VM=1 but the vm runtime cannot run: %s", why)
	}
}

// Snapshots on gVisor: save a sandbox with a file and a counting process,
// delete the source, restart the server, start two sandboxes from the
// snapshot: both have the file and the process counting on; then the
// snapshot's refusals and delete.
func TestSnapshots(t *testing.T) {
	if testing.Short() {
		t.Skip("needs seed:latest")
	}
	requireGVisor(t)
	s := startSeedServer(t, "auto")
	src := s.createWithNetwork(t, "gvisor", map[string]any{"egress": "none"}).ID
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
	t.Logf("snapshot of a seed sandbox: %d bytes", got.SizeBytes)
	// The source goes; the server restarts; the snapshot stays.
	r = s.do("DELETE", "/v1/sandboxes/"+src, s.token, nil)
	var del struct{ Operation struct{ ID string } }
	r.json(t, &del)
	if op := s.waitOp(del.Operation.ID); op.State != "succeeded" {
		t.Fatalf("delete source: %+v", op.Error)
	}
	s.kill()
	s.start()
	for i := 0; i < 2; i++ {
		r := s.do("POST", "/v1/sandboxes", s.token, []byte(`{"snapshot":"`+snap+`","network":{"egress":"none"}}`))
		var c struct {
			Sandbox struct {
				ID, Snapshot string
			}
			Operation struct{ ID string }
		}
		r.json(t, &c)
		if r.status != 202 || c.Sandbox.Snapshot != snap {
			t.Fatalf("create from snapshot = %d %s", r.status, r.body)
		}
		if op := s.waitOp(c.Operation.ID); op.State != "succeeded" {
			t.Fatalf("create from snapshot failed: %+v\n%s", op.Error, s.log())
		}
		out, code := s.sh(c.Sandbox.ID, `a=$(cat /tmp/counter); sleep 0.5; b=$(cat /tmp/counter); [ "$b" -gt "$a" ] && [ "$a" -gt 1 ] || echo "counter stuck: $a $b"; cat /tmp/snap.txt; hostname`)
		if code != 0 || !strings.HasPrefix(out, "saved\nsbx-") {
			t.Fatalf("sandbox from the snapshot: %d %q", code, out)
		}
	}
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
	var list struct{ Items []struct{ ID string } }
	s.do("GET", "/v1/snapshots?sandbox_id="+src, s.token, nil).json(t, &list)
	if len(list.Items) != 1 || list.Items[0].ID != snap {
		t.Fatalf("list by source = %+v", list)
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
