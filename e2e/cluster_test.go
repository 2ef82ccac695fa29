package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/spacesandbox/space/client"
	"github.com/spacesandbox/space/internal/blobstore/s3test"
	"github.com/spacesandbox/space/internal/store/postgres/pgtest"
)

// clusterKey is the test cluster's shared secret.
const clusterKey = "e2e-cluster-key-0123456789"

// testCluster is control replicas and nodes on one PostgreSQL database
// and one bucket, each process with its own data directory.
type testCluster struct {
	t         *testing.T
	env       []string
	tplDir    string // a data directory holding the test and seed templates, linked into each member's
	controls  []*server
	nodes     []*server
	token     string
	lostAfter string // --node-lost-after
	runtime   string // the nodes' runtime: gvisor, or fake (the FAKE runtime)
}

// startCluster starts controls control replicas and nodes nodes of rt
// (gvisor, or fake: the test build's FAKE runtime); a member silent for
// lostAfter is lost.
func startCluster(t *testing.T, rt string, controls, nodes int, lostAfter time.Duration) *testCluster {
	t.Helper()
	if rt == "gvisor" {
		requireGVisor(t)
	}
	_, bucket := s3test.Bucket(t)
	c := &testCluster{t: t, runtime: rt, lostAfter: lostAfter.String(), env: append(s3test.Env(), "SPACE_STORE="+pgtest.URL(t), "SPACE_BLOB_STORE="+bucket, "SPACE_CLUSTER_KEY="+clusterKey)}
	c.tplDir = t.TempDir()
	if rt == "gvisor" {
		c.tplDir = seedDataDir(t) // (for the E2B SDK, which runs commands with bash)
		if out, err := exec.Command(spaceBin, "template", "build", "test", "--data-dir", c.tplDir).CombinedOutput(); err != nil {
			t.Fatalf("build test template: %v\n%s", err, out)
		}
	}
	for i := range controls {
		var extra []string
		if i == 1 {
			extra = []string{"--proxy-data-plane"} // the second replica's clients reach no node
		}
		c.controls = append(c.controls, c.start("control", extra...))
	}
	for range nodes {
		c.nodes = append(c.nodes, c.start("node"))
	}
	c.waitReady(nodes)
	return c
}

// start starts one member of role; the first one makes the API token.
func (c *testCluster) start(role string, extra ...string) *server {
	c.t.Helper()
	dir := c.t.TempDir()
	bin := spaceFakeBin
	if c.runtime == "gvisor" {
		bin = spaceBin
		// Hard links: template contents are immutable, and seed is large.
		if out, err := exec.Command("cp", "-al", filepath.Join(c.tplDir, "templates"), dir).CombinedOutput(); err != nil {
			c.t.Fatalf("copy templates: %v %s", err, out)
		}
	}
	args := []string{"--role", role, "--runtime", c.runtime, "--build-seed=false", "--heartbeat", "200ms", "--node-lost-after", c.lostAfter, "--memory-overcommit", "4", // (three nodes on one host)
		"--agent-bin", filepath.Join(filepath.Dir(spaceBin), "space-agent"), "--node-name", fmt.Sprintf("%s-%d", role, len(c.controls)+len(c.nodes))}
	args = append(args, extra...)
	if role == "node" && c.runtime == "gvisor" {
		c.t.Cleanup(func() { killGVisorLeftovers(dir) }) // after the node stopped
	}
	s := startServer(c.t, serverOpts{bin: bin, dataDir: dir, template: "test:latest", env: c.env, args: args, token: c.token})
	if c.token == "" {
		c.token = s.token
	}
	if role == "node" && c.runtime == "gvisor" {
		c.t.Cleanup(func() { cleanupGVisor(s) }) // before it stops
	}
	return s
}

// waitReady waits until every control replica sees n live nodes.
func (c *testCluster) waitReady(n int) {
	c.t.Helper()
	for _, ctl := range c.controls {
		waitFor(c.t, fmt.Sprintf("%d nodes ready", n), func() bool { return len(c.liveNodes(ctl)) == n })
	}
}

type clusterNode struct {
	ID    string `json:"id"`
	Name  string `json:"name"`
	State string `json:"state"`
}

// liveNodes lists the nodes a control replica reports ready.
func (c *testCluster) liveNodes(s *server) []clusterNode {
	r := s.do("GET", "/v1/nodes", c.token, nil)
	if r.status != 200 {
		c.t.Fatalf("list nodes = %d %s", r.status, r.body)
	}
	var page struct {
		Nodes []clusterNode `json:"nodes"`
	}
	r.json(c.t, &page)
	var out []clusterNode
	for _, n := range page.Nodes {
		if n.State == "ready" {
			out = append(out, n)
		}
	}
	return out
}

// nodeOf says which node a sandbox is on.
func nodeOf(t *testing.T, s *server, sbx string) string {
	t.Helper()
	sb, err := s.client().GetSandbox(context.Background(), sbx)
	if err != nil {
		t.Fatal(err)
	}
	return sb.Node
}

// TestCluster drives 2 control replicas and 3 gvisor nodes on one
// PostgreSQL database and one bucket: creates spread over the nodes;
// commands, files and E2B calls work through either replica; a control
// replica SIGKILLed with an operation in flight loses nothing; a node
// SIGKILLed fails its running sandboxes (node_lost) while its suspended one
// wakes on another node with its processes and files.
func TestCluster(t *testing.T) {
	c := startCluster(t, "gvisor", 2, 3, 4*time.Second)
	c1, c2 := c.controls[0], c.controls[1]
	ctx := context.Background()

	// Creates spread: six sandboxes through both replicas, two per node.
	perNode := map[string][]string{}
	var sbxs []string
	for i := range 6 {
		s := c.controls[i%2]
		sbx := s.createRunning()
		sbxs = append(sbxs, sbx)
		perNode[nodeOf(t, c1, sbx)] = append(perNode[nodeOf(t, c1, sbx)], sbx)
	}
	if len(perNode) != 3 {
		t.Fatalf("six creates landed on %d nodes: %v", len(perNode), perNode)
	}
	for n, l := range perNode {
		if len(l) != 2 {
			t.Fatalf("node %s got %d of six sandboxes (want an even spread): %v", n, len(l), perNode)
		}
	}

	// Commands and files through either replica, whichever node runs it.
	for i, sbx := range sbxs[:3] {
		w, r := c.controls[i%2], c.controls[(i+1)%2]
		if rep := w.do("PUT", "/v1/sandboxes/"+sbx+"/files?path=/root/hello.txt", c.token, []byte("hello "+sbx)); rep.status/100 != 2 {
			t.Fatalf("write through a replica = %d %s", rep.status, rep.body)
		}
		if rep := r.do("GET", "/v1/sandboxes/"+sbx+"/files?path=/root/hello.txt", c.token, nil); rep.status != 200 || string(rep.body) != "hello "+sbx {
			t.Fatalf("read through the other replica = %d %q", rep.status, rep.body)
		}
		tr, sess := r.runCommand(sbx, map[string]any{"command": []string{"cat", "/root/hello.txt"}})
		if string(tr.stdout) != "hello "+sbx {
			t.Fatalf("command through a replica = %q %v", tr.stdout, tr.events)
		}
		// The proxying replica's sessions attach through its own data
		// plane; the other's through the node's.
		if through := strings.Contains(sess.Attach.URL, c2.dpAddr); through != (r == c2) {
			t.Fatalf("attach URL %s through replica %s (proxying replica's data plane %s)", sess.Attach.URL, r.apiAddr, c2.dpAddr)
		}
	}

	// E2B: the SDK's calls reach the node through the replica's E2B
	// listener (REST, and envd by E2b-Sandbox-Id).
	e2bKey := "X-API-KEY: " + c.token
	rep := c2.ecwDo("POST", "/sandboxes", []byte(`{"templateID":"test:latest","timeout":300}`), e2bKey, "Content-Type: application/json")
	if rep.status != 201 {
		t.Fatalf("E2B create through a replica = %d %s", rep.status, rep.body)
	}
	var e2bSbx struct {
		SandboxID       string `json:"sandboxID"`
		EnvdAccessToken string `json:"envdAccessToken"`
	}
	rep.json(t, &e2bSbx)
	route := []string{"E2b-Sandbox-Id: " + e2bSbx.SandboxID, "E2b-Sandbox-Port: 49983", "X-Access-Token: " + e2bSbx.EnvdAccessToken}
	for _, s := range c.controls {
		if rep := s.ecwDo("GET", "/files?path=/etc/hostname", nil, route...); rep.status != 200 || len(rep.body) == 0 {
			t.Fatalf("E2B envd file read through a replica = %d %s", rep.status, rep.body)
		}
	}
	if rep := c1.ecwDo("GET", "/sandboxes/"+e2bSbx.SandboxID, nil, e2bKey); rep.status != 200 {
		t.Fatalf("E2B get through the other replica = %d %s", rep.status, rep.body)
	}
	// The E2B SDK itself, through one replica (commands stream over
	// Connect, forwarded to the node).
	sdk := requireE2BSDK(t)
	sctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	cmd := exec.CommandContext(sctx, "node", "cluster.mjs")
	cmd.Dir = sdk
	cmd.Env = append(os.Environ(), "E2B_API_URL=http://"+c2.ecwAddr, "E2B_SANDBOX_URL=http://"+c2.ecwAddr, "E2B_API_KEY="+c.token)
	sdkOut, err := cmd.CombinedOutput()
	cancel()
	if err != nil || !strings.HasSuffix(strings.TrimSpace(string(sdkOut)), "ALL OK") {
		t.Fatalf("the E2B SDK through a control replica: %v\n%s", err, sdkOut)
	}

	// A control replica dies with an operation in flight: the other one
	// reports it done (the node runs it; no replica owns it).
	out, _, err := c1.client().CreateSandbox(ctx, client.CreateSandboxRequest{Template: "test:latest"}, "")
	if err != nil {
		t.Fatal(err)
	}
	c1.kill()
	if op := c2.waitOp(out.Operation.ID); op.State != "succeeded" {
		t.Fatalf("create accepted by a replica killed at once: %+v", op)
	}
	c1.start()

	// A suspended sandbox outlives its node: it wakes on another node with
	// its files and the process that was counting.
	moving := perNode[nodeOf(t, c1, sbxs[0])][0]
	home := nodeOf(t, c1, moving)
	sess := c1.command(moving, map[string]any{"command": []string{"sh", "-c", "i=0; while true; do echo $i > /tmp/counter; echo tick-$i; i=$((i+1)); sleep 0.2; done"}})
	st, _ := c1.attach(sess.Attach.URL, sess.Attach.Token, "") // (a command starts when first attached)
	collect(t, st, &transcript{}, func(tr *transcript) bool { return len(tr.ids) >= 3 })
	c1.lifecycle(moving, "suspend", "suspended")
	var homeSrv *server
	for _, n := range c.nodes {
		if nodeIDOf(t, n) == home {
			homeSrv = n
		}
	}
	if homeSrv == nil {
		t.Fatalf("no node process has id %s", home)
	}
	var stayed []string // its other sandboxes, still running
	for _, sbx := range perNode[home] {
		if sbx != moving {
			stayed = append(stayed, sbx)
		}
	}
	// One of them was suspended once and woken since: its snapshot stays
	// in the bucket, and a wake after the loss restores it.
	restore := stayed[0]
	c1.do("PUT", "/v1/sandboxes/"+restore+"/files?path=/root/saved.txt", c.token, []byte("saved before the loss"))
	c1.lifecycle(restore, "suspend", "suspended")
	c1.lifecycle(restore, "wake", "running")
	if n := nodeOf(t, c1, restore); n != home {
		t.Fatalf("a sandbox woke on %s while its node %s was fine", n, home)
	}
	// A named snapshot taken on that node is stored in the bucket as well.
	snap, sop, err := c1.client().CreateSnapshot(ctx, restore, "before-the-loss", "")
	if err != nil {
		t.Fatalf("snapshot on the node to be lost: %v", err)
	}
	if op := c1.waitOp(sop.ID); op.State != "succeeded" {
		t.Fatalf("snapshot on the node to be lost: %+v", op.Error)
	}
	homeSrv.kill()
	waitFor(t, "the killed node's running sandboxes to fail", func() bool {
		for _, sbx := range stayed {
			sb, err := c2.client().GetSandbox(ctx, sbx)
			if err != nil || sb.State != "failed" {
				return false
			}
		}
		return true
	})
	for _, sbx := range stayed {
		sb, _ := c2.client().GetSandbox(ctx, sbx)
		if sb.Error == nil || sb.Error.Code != "node_lost" {
			t.Fatalf("sandbox of a lost node: %+v", sb)
		}
	}
	if sb, _ := c2.client().GetSandbox(ctx, moving); sb.State != "suspended" {
		t.Fatalf("the suspended sandbox of a lost node is %s", sb.State)
	}
	if sb, _ := c2.client().GetSandbox(ctx, restore); !strings.Contains(sb.Error.Message, "wake it to restore") {
		t.Fatalf("a lost sandbox with a stored snapshot does not say it can be restored: %+v", sb.Error)
	}
	c2.lifecycle(restore, "wake", "running")
	if rep := c2.do("GET", "/v1/sandboxes/"+restore+"/files?path=/root/saved.txt", c.token, nil); rep.status != 200 || string(rep.body) != "saved before the loss" || nodeOf(t, c2, restore) == home {
		t.Fatalf("restored from the bucket after the loss: %d %q on %s", rep.status, rep.body, nodeOf(t, c2, restore))
	}
	// The snapshot outlived its node: a sandbox starts from it on another.
	fromSnap, _, err := c2.client().CreateSandbox(ctx, client.CreateSandboxRequest{Snapshot: snap.ID}, "")
	if err != nil {
		t.Fatalf("create from a snapshot whose node is lost: %v", err)
	}
	if op := c2.waitOp(fromSnap.Operation.ID); op.State != "succeeded" {
		t.Fatalf("create from a snapshot whose node is lost: %+v", op.Error)
	}
	if rep := c2.do("GET", "/v1/sandboxes/"+fromSnap.Sandbox.ID+"/files?path=/root/saved.txt", c.token, nil); rep.status != 200 || string(rep.body) != "saved before the loss" || nodeOf(t, c2, fromSnap.Sandbox.ID) == home {
		t.Fatalf("sandbox from the stored snapshot: %d %q on %s", rep.status, rep.body, nodeOf(t, c2, fromSnap.Sandbox.ID))
	}
	c2.lifecycle(moving, "wake", "running")
	if now := nodeOf(t, c2, moving); now == home || now == "" {
		t.Fatalf("woke on node %q, the lost one was %s", now, home)
	}
	if rep := c2.do("GET", "/v1/sandboxes/"+moving+"/files?path=/root/hello.txt", c.token, nil); rep.status != 200 || string(rep.body) != "hello "+moving {
		t.Fatalf("file after waking on another node = %d %q", rep.status, rep.body)
	}
	counter := func() int {
		tr, _ := c2.runCommand(moving, map[string]any{"command": []string{"cat", "/tmp/counter"}})
		var n int
		fmt.Sscan(strings.TrimSpace(string(tr.stdout)), &n)
		return n
	}
	first := counter()
	time.Sleep(time.Second)
	if second := counter(); first == 0 || second <= first {
		t.Fatalf("the counting process did not carry on after the move: %d then %d", first, second)
	}

	// Drain: a live node's running sandboxes are suspended and wake on
	// another node; the CLI shows the node draining.
	var drained string
	for n := range perNode {
		if n != home {
			drained = n
			break
		}
	}
	var onDrained []string
	cursor := ""
	for {
		page, err := c1.client().ListSandboxes(ctx, "running", client.ListOptions{Limit: 500, Cursor: cursor})
		if err != nil {
			t.Fatal(err)
		}
		for _, sb := range page.Items {
			if sb.Node == drained {
				onDrained = append(onDrained, sb.ID)
			}
		}
		if page.NextCursor == nil {
			break
		}
		cursor = *page.NextCursor
	}
	if len(onDrained) == 0 {
		t.Fatalf("node %s runs nothing to drain", drained)
	}
	if out, errOut, code := c1.runCLI("node", "drain", drained); code != 0 || !strings.Contains(out, "draining") {
		t.Fatalf("space node drain = %d %q %q", code, out, errOut)
	}
	waitFor(t, "the drained node's sandboxes to be suspended", func() bool {
		for _, sbx := range onDrained {
			if sb, err := c2.client().GetSandbox(ctx, sbx); err != nil || sb.State != "suspended" {
				return false
			}
		}
		return true
	})
	if out, _, code := c2.runCLI("node", "list"); code != 0 || !strings.Contains(out, drained) || !strings.Contains(out, "draining") || !strings.Contains(out, "lost") {
		t.Fatalf("space node list after a drain and a loss:\n%s", out)
	}
	c2.lifecycle(onDrained[0], "wake", "running")
	if now := nodeOf(t, c2, onDrained[0]); now == drained || now == home {
		t.Fatalf("a drained sandbox woke on %s (drained %s, lost %s)", now, drained, home)
	}
	if out, _, code := c1.runCLI("node", "uncordon", drained); code != 0 || !strings.Contains(out, "ready") {
		t.Fatalf("space node uncordon: %q", out)
	}
	if n, err := c2.client().GetNode(ctx, drained); err != nil || n.ID != drained || n.State != "ready" {
		t.Fatalf("GetNode after uncordon: %+v %v", n, err)
	}
	if n, err := c2.client().GetNode(ctx, home); err != nil || n.State != "lost" {
		t.Fatalf("GetNode of the lost node: %+v %v", n, err)
	}

	// The lost node comes back: it takes nothing of what was failed or
	// moved, and is ready again.
	homeSrv.start()
	c.waitReady(3)
}

// nodeIDOf reads a node process's id from its data directory.
func nodeIDOf(t *testing.T, s *server) string {
	t.Helper()
	b, err := readFileTrim(filepath.Join(s.dataDir, "node.id"))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func readFileTrim(path string) (string, error) {
	out, err := exec.Command("cat", path).Output()
	return strings.TrimSpace(string(out)), err
}

// TestClusterRollingRestartFakeRuntime restarts both control replicas, one
// after the other, while 200 clients each create a sandbox with an
// idempotency key and retry it (on either replica) until they get an
// answer: exactly 200 sandboxes exist afterwards, every retry of a key
// answered with the same sandbox, and every one runs.
//
// The nodes run the FAKE runtime: what is under test is the control
// replicas and the store (a real PostgreSQL, real processes killed and
// restarted), and 200 gVisor boots cost this 2-core CI machine over five
// minutes. SPACE_CLUSTER_RUNTIME=gvisor runs the same test on gVisor (it
// passes there too; the closing note of the cluster issue has its numbers).
func TestClusterRollingRestartFakeRuntime(t *testing.T) {
	rt := "fake"
	if os.Getenv("SPACE_CLUSTER_RUNTIME") == "gvisor" {
		rt = "gvisor"
	}
	c := startCluster(t, rt, 2, 3, 15*time.Second)
	const n = 200
	type answer struct {
		sandbox, op string
		tries       int
	}
	answers := make([]answer, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			time.Sleep(time.Duration(i) * 25 * time.Millisecond) // 5 s of arrivals, across both restarts
			key := fmt.Sprintf("roll-%d", i)
			body := []byte(`{"template":"test:latest","metadata":{"batch":"roll"}}`)
			last := ""
			for try := 0; ; try++ {
				s := c.controls[(i+try)%2]
				req, _ := http.NewRequest("POST", s.url("/v1/sandboxes"), bytes.NewReader(body))
				req.Header.Set("Authorization", "Bearer "+c.token)
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("Idempotency-Key", key)
				resp, err := http.DefaultClient.Do(req)
				if err == nil {
					b, _ := io.ReadAll(resp.Body)
					resp.Body.Close()
					if resp.StatusCode == 202 {
						var out struct {
							Sandbox   struct{ ID string } `json:"sandbox"`
							Operation struct{ ID string } `json:"operation"`
						}
						json.Unmarshal(b, &out)
						answers[i] = answer{out.Sandbox.ID, out.Operation.ID, try + 1}
						return
					}
					last = fmt.Sprintf("%d %s", resp.StatusCode, b)
					if resp.StatusCode/100 == 4 && resp.StatusCode != 409 && resp.StatusCode != 429 {
						t.Errorf("create %s = %d %s", key, resp.StatusCode, b)
						return
					}
				}
				if try > 600 {
					t.Errorf("create %s: no answer after %d tries (last: %v %s)", key, try, err, last)
					return
				}
				time.Sleep(100 * time.Millisecond)
			}
		}()
	}
	close(start)
	// The rolling restart, while the creates come in.
	for _, s := range c.controls {
		time.Sleep(500 * time.Millisecond)
		s.signal(syscall.SIGTERM)
		s.start()
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	retried := 0
	seen := map[string]bool{}
	for i, a := range answers {
		if a.sandbox == "" || seen[a.sandbox] {
			t.Fatalf("create %d answered %+v (duplicate or empty)", i, a)
		}
		seen[a.sandbox] = true
		if a.tries > 1 {
			retried++
		}
	}
	// A retry of a key that was answered replays the same sandbox.
	rep := c.controls[1].do("POST", "/v1/sandboxes", c.token, []byte(`{"template":"test:latest","metadata":{"batch":"roll"}}`), "Idempotency-Key: roll-7", "Content-Type: application/json")
	var again struct {
		Sandbox struct{ ID string } `json:"sandbox"`
	}
	rep.json(t, &again)
	if again.Sandbox.ID != answers[7].sandbox || rep.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("retry of an answered key = %d %s (first answer %s)", rep.status, rep.body, answers[7].sandbox)
	}
	ctx := context.Background()
	for _, a := range answers {
		wctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
		op, err := c.controls[0].client().WaitOperation(wctx, a.op)
		cancel()
		if err != nil || op.State != "succeeded" {
			t.Fatalf("create %s: %+v %v", a.sandbox, op, err)
		}
	}
	// Exactly n sandboxes of the batch, spread over the nodes.
	count, perNode := 0, map[string]int{}
	cursor := ""
	for {
		page, err := c.controls[0].client().ListSandboxes(ctx, "", client.ListOptions{Limit: 500, Cursor: cursor})
		if err != nil {
			t.Fatal(err)
		}
		for _, sb := range page.Items {
			if sb.Metadata["batch"] == "roll" {
				count++
				perNode[sb.Node]++
			}
		}
		if page.NextCursor == nil {
			break
		}
		cursor = *page.NextCursor
	}
	if count != n {
		t.Fatalf("%d sandboxes of the batch exist, want exactly %d", count, n)
	}
	t.Logf("%d creates across a rolling restart of both control replicas: %d retried at least once; per node %v", n, retried, perNode)
}
