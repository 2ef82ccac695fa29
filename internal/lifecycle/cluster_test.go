package lifecycle_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/spacesandbox/space/internal/errdefs"
	"github.com/spacesandbox/space/internal/ids"
	"github.com/spacesandbox/space/internal/lifecycle"
	"github.com/spacesandbox/space/internal/runtime"
	"github.com/spacesandbox/space/internal/runtime/fakeruntime"
	"github.com/spacesandbox/space/internal/sandbox"
	"github.com/spacesandbox/space/internal/store"
	"github.com/spacesandbox/space/internal/store/sqlite"
)

// fakeCluster is a FAKE cluster (internal/cluster is tested over its real
// store, and the whole end to end): it places on the first live node —
// or the preferred one — and hands operations straight to the node's
// engine, unless told to lose them.
type fakeCluster struct {
	mu    sync.Mutex
	nodes map[string]*lifecycle.Engine
	order []string
	dead  map[string]bool
	drop  bool // lose dispatches (a control replica dying before the call)
}

func (c *fakeCluster) Place(_ context.Context, need lifecycle.Need) (string, int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if need.Prefer != "" && !c.dead[need.Prefer] {
		return need.Prefer, 0, nil
	}
	for _, n := range c.order {
		if !c.dead[n] {
			return n, 0, nil
		}
	}
	return "", 0, errdefs.New(errdefs.Unavailable, "no node")
}

func (c *fakeCluster) Usable(ctx context.Context, node string) bool { return c.Alive(ctx, node) }
func (c *fakeCluster) Alive(_ context.Context, node string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return !c.dead[node] && slices.Contains(c.order, node)
}

func (c *fakeCluster) Dispatch(node, opID string) {
	c.mu.Lock()
	e, drop := c.nodes[node], c.drop || c.dead[node]
	c.mu.Unlock()
	if !drop {
		go e.Run(context.Background(), opID)
	}
}
func (c *fakeCluster) Claimed(node, id string) {}
func (c *fakeCluster) Runtimes() []string      { return []string{"fake"} }
func (c *fakeCluster) Portable(string) bool    { return false } // (the fake restores only its own)
func (c *fakeCluster) Ready() error            { return nil }

// A control engine with no runtime places creates on nodes, whose engines
// run them (handed over, or found by a node's inbox when the hand-over was
// lost); a node that is lost has its running sandboxes failed and its
// in-flight work settled, and a delete of its suspended sandbox runs on
// another node.
func TestClusterEngines(t *testing.T) {
	ctl, clu, _, _ := startClusterEngines(t)
	ctx := context.Background()
	done := func(opID string) *sandbox.Operation { t.Helper(); return waitOn(t, ctl, opID) }
	create := func() *sandbox.Sandbox {
		t.Helper()
		sb, op, err := ctl.Create(ctx, lifecycle.CreateRequest{Template: "base"}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if op := done(op.ID); op.State != sandbox.OpSucceeded {
			t.Fatalf("create: %+v", op.Error)
		}
		return sb
	}
	if names, def := ctl.Runtimes(); len(names) != 1 || def != "fake" {
		t.Fatalf("a control replica offers %v (default %q)", names, def)
	}
	running := create()
	if running.Node != "node_a" {
		t.Fatalf("placed on %q", running.Node)
	}
	// A node's engine never runs another node's sandbox.
	if _, _, err := clu.nodes["node_b"].Agent(ctx, running.ID); !errors.Is(err, errdefs.Unavailable) {
		t.Fatalf("node_b reached node_a's sandbox: %v", err)
	}
	// The hand-over is lost: node_a's inbox finds the work.
	clu.mu.Lock()
	clu.drop = true
	clu.mu.Unlock()
	suspended := create()
	op, err := ctl.Suspend(ctx, suspended.ID, nil)
	if err != nil {
		t.Fatal(err)
	}
	if op := done(op.ID); op.State != sandbox.OpSucceeded {
		t.Fatalf("suspend: %+v", op.Error)
	}
	clu.mu.Lock()
	clu.drop = false
	clu.dead["node_a"] = true
	clu.mu.Unlock()

	if n, err := ctl.FailLostNode(ctx, "node_a"); err != nil || n != 1 {
		t.Fatalf("fail lost node = %d, %v", n, err)
	}
	sb, _ := ctl.Get(ctx, running.ID)
	if sb.State != sandbox.Failed || sb.Error == nil || sb.Error.Code != lifecycle.NodeLost {
		t.Fatalf("running sandbox of a lost node: %+v", sb)
	}
	if sb, _ := ctl.Get(ctx, suspended.ID); sb.State != sandbox.Suspended {
		t.Fatalf("suspended sandbox of a lost node is %s", sb.State)
	}
	if n, _ := ctl.FailLostNode(ctx, "node_a"); n != 0 {
		t.Fatalf("a second sweep changed %d sandboxes", n)
	}
	// Its suspended sandbox is deleted by another node (its stored
	// snapshot goes from the blob store).
	op, err = ctl.Delete(ctx, suspended.ID, nil)
	if err != nil {
		t.Fatal(err)
	}
	if op := done(op.ID); op.State != sandbox.OpSucceeded {
		t.Fatalf("delete: %+v", op.Error)
	}
	if sb, _ := ctl.Get(ctx, suspended.ID); sb.State != sandbox.Deleted || sb.Node != "node_b" {
		t.Fatalf("deleted sandbox of a lost node: %+v", sb)
	}
}

// startClusterEngines starts the engines of nodes node_a and node_b (FAKE
// runtime, FAKE archive) and of a control replica over one SQLite store.
// Node n's snapshots are in dir/n/snapshots.
func startClusterEngines(t *testing.T) (ctl *lifecycle.Engine, clu *fakeCluster, st *sqlite.Store, dir string) {
	t.Helper()
	dir = t.TempDir()
	st, err := sqlite.Open(context.Background(), filepath.Join(dir, "space.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	arch := &fakeArchive{stored: map[string]bool{}}
	clu = &fakeCluster{nodes: map[string]*lifecycle.Engine{}, dead: map[string]bool{}, order: []string{"node_a", "node_b"}}
	start := func(cfg lifecycle.Config) *lifecycle.Engine {
		cfg.Store, cfg.Templates, cfg.Cluster, cfg.Archive = st, fakeruntime.Templates{}, clu, arch
		cfg.OperationTimeout, cfg.InboxInterval = 5*time.Second, 20*time.Millisecond
		return startEngine(t, cfg)
	}
	for _, n := range clu.order {
		rt, err := fakeruntime.New(fakeruntime.Config{Dir: filepath.Join(dir, n)})
		if err != nil {
			t.Fatal(err)
		}
		clu.nodes[n] = start(lifecycle.Config{Node: n, Runtimes: []runtime.Runtime{rt}, SnapshotRoot: filepath.Join(dir, n, "snapshots")})
	}
	return start(lifecycle.Config{SnapshotRoot: filepath.Join(dir, "control")}), clu, st, dir
}

// startEngine starts an engine that closes when the test ends.
func startEngine(t *testing.T, cfg lifecycle.Config) *lifecycle.Engine {
	t.Helper()
	e, err := lifecycle.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	return e
}

// waitOn waits for operation opID through engine e.
func waitOn(t *testing.T, e *lifecycle.Engine, opID string) *sandbox.Operation {
	t.Helper()
	wctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	op, err := e.WaitOperation(wctx, opID)
	if err != nil {
		t.Fatalf("wait %s: %v", opID, err)
	}
	return op
}

// The warm pool of a snapshot tagged as a template fills on the node that
// holds its image; a node that can neither find it nor fetch it (a runtime
// that restores only its own images) starts none, rather than sandboxes
// that fail and are replaced every second.
func TestClusterSnapshotPoolStaysWithItsImage(t *testing.T) {
	ctl, _, st, _ := startClusterEngines(t)
	ctx := context.Background()
	src, op, err := ctl.Create(ctx, lifecycle.CreateRequest{Template: "base"}, nil)
	if err != nil || waitOn(t, ctl, op.ID).State != sandbox.OpSucceeded {
		t.Fatalf("create: %v", err)
	}
	sop, snap, err := ctl.CreateSnapshot(ctx, src.ID, "", nil)
	if err != nil || waitOn(t, ctl, sop.ID).State != sandbox.OpSucceeded {
		t.Fatalf("snapshot: %v", err)
	}
	if _, err := ctl.TagSnapshot(ctx, snap.ID, "missingwarm:v1"); err != nil {
		t.Fatal(err)
	}
	if _, err := ctl.SetWarmPool(ctx, "", "missingwarm:v1", 1); err != nil {
		t.Fatal(err)
	}
	waitPool(t, ctl, "missingwarm:v1", 1) // (filled on the snapshot's node)
	time.Sleep(2500 * time.Millisecond)   // two more refills on each node
	other := "node_b"
	if src.Node == other {
		other = "node_a"
	}
	for _, state := range []sandbox.State{"", sandbox.Deleted} {
		page, err := st.ListSandboxes(ctx, store.SandboxQuery{State: state, IncludePool: true, Node: &other, Limit: 100})
		if err != nil {
			t.Fatal(err)
		}
		for _, sb := range page.Items {
			t.Errorf("%s started %s (%s, pool %q) without the snapshot's image", other, sb.ID, sb.State, sb.Pool)
		}
	}
}

// What a fetch of a snapshot's image from the blob store leaves when a
// crash cuts it short is removed by the node's periodic sweep.
func TestClusterNodeRemovesCutShortFetches(t *testing.T) {
	_, _, _, dir := startClusterEngines(t)
	scratch := filepath.Join(dir, "node_a", "snapshots", ids.New(ids.Snapshot)+".fetch")
	if err := os.MkdirAll(scratch, 0o700); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(scratch, "checkpoint.img"), []byte("half"), 0o600)
	if !eventually(10*time.Second, func() bool { _, err := os.Stat(scratch); return errors.Is(err, os.ErrNotExist) }) {
		t.Fatal("the scratch directory of a fetch cut short is still there")
	}
}

// A build whose control replica died is failed by another replica once its
// record stops changing; a live one is left alone.
func TestOrphanBuildsFailInACluster(t *testing.T) {
	dir := t.TempDir()
	st, err := sqlite.Open(context.Background(), filepath.Join(dir, "space.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	var mu sync.Mutex
	now := time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	clu := &fakeCluster{nodes: map[string]*lifecycle.Engine{}, dead: map[string]bool{}}
	newEngine := func() *lifecycle.Engine {
		return startEngine(t, lifecycle.Config{Store: st, Templates: fakeruntime.Templates{}, SnapshotRoot: dir, Cluster: clu, Now: clock})
	}
	builder, other := newEngine(), newEngine()
	release := make(chan struct{})
	defer close(release)
	op, err := builder.StartBuild(context.Background(), "", "mine:v1", nil, func(ctx context.Context) error {
		select {
		case <-release:
		case <-ctx.Done():
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond) // (it is marked running)
	if n, _ := other.FailOrphanBuilds(context.Background()); n != 0 {
		t.Fatalf("a running build was failed (%d)", n)
	}
	mu.Lock()
	now = now.Add(lifecycle.OrphanBuildAfter + time.Second)
	mu.Unlock()
	if n, err := other.FailOrphanBuilds(context.Background()); err != nil || n != 1 {
		t.Fatalf("orphan builds failed = %d, %v", n, err)
	}
	if got, _ := other.Operation(context.Background(), op.ID); got.State != sandbox.OpFailed || got.Error == nil {
		t.Fatalf("orphan build: %+v", got)
	}
}
