// Package enginetest is a FAKE lifecycle engine for the HTTP layers' handler
// tests: sandboxes and operations in maps, transitions checked by
// sandbox.Plan and finished at once, and errors on demand. Agents gives its
// running sandboxes a real agent serving in the test process
// (sandboxiotest). It satisfies the engine interfaces api and ecw own.
package enginetest

import (
	"bytes"
	"context"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/spacesandbox/space/internal/auth"
	"github.com/spacesandbox/space/internal/commands"
	"github.com/spacesandbox/space/internal/errdefs"
	"github.com/spacesandbox/space/internal/ids"
	"github.com/spacesandbox/space/internal/lifecycle"
	"github.com/spacesandbox/space/internal/sandbox"
	"github.com/spacesandbox/space/internal/sandboxio"
	"github.com/spacesandbox/space/internal/sandboxio/sandboxiotest"
	"github.com/spacesandbox/space/internal/store"
	"github.com/spacesandbox/space/internal/store/sqlite"
)

// Engine is the FAKE engine. Set Fail to make every mutation refuse with it,
// NotReady to make Ready report it.
type Engine struct {
	Fail     error
	NotReady error

	mu    sync.Mutex
	sbs   map[string]*sandbox.Sandbox
	ops   map[string]*sandbox.Operation
	snaps map[string]*sandbox.Snapshot
	hub   lifecycle.Hub
}

// New returns an engine with no sandboxes.
func New() *Engine {
	return &Engine{sbs: map[string]*sandbox.Sandbox{}, ops: map[string]*sandbox.Operation{}, snaps: map[string]*sandbox.Snapshot{}}
}

// Add records a sandbox in state.
func (f *Engine) Add(state sandbox.State) *sandbox.Sandbox {
	f.mu.Lock()
	defer f.mu.Unlock()
	sb := &sandbox.Sandbox{ID: ids.New(ids.Sandbox), Project: store.DefaultProject, State: state, Runtime: "fake", CreatedAt: time.Now().UTC(),
		Template: sandbox.TemplateRef{Ref: "seed:latest", Digest: "sha256:0"}}
	f.sbs[sb.ID] = sb
	return sb
}

// find returns a sandbox's record. Precondition: f.mu held.
func (f *Engine) find(id string) (*sandbox.Sandbox, error) {
	sb, ok := f.sbs[id]
	if !ok {
		return nil, errdefs.New(errdefs.NotFound, "sandbox %s not found", id)
	}
	return sb, nil
}

// op records an operation that already succeeded.
func (f *Engine) op(kind sandbox.OpKind, sbID string) *sandbox.Operation {
	op := &sandbox.Operation{ID: ids.New(ids.Operation), Project: store.DefaultProject, Kind: kind, SandboxID: sbID, State: sandbox.OpSucceeded, CreatedAt: time.Now().UTC()}
	f.ops[op.ID] = op
	f.hub.Publish(lifecycle.Change{Sandbox: sbID, Operation: op.ID})
	return op
}

// Running records an operation of sbID still running, and tells watchers.
func (f *Engine) Running(kind sandbox.OpKind, sbID string) *sandbox.Operation {
	f.mu.Lock()
	defer f.mu.Unlock()
	op := f.op(kind, sbID)
	op.State = sandbox.OpRunning
	return op
}

// FinishElsewhere ends a running operation without telling watchers, as a
// cluster node records an outcome in the shared store.
func (f *Engine) FinishElsewhere(opID string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.ops[opID].State = sandbox.OpSucceeded
}

// Watch tells of every operation from now on, and of its sandbox.
func (f *Engine) Watch(ctx context.Context) *lifecycle.Changes { return f.hub.Watch(ctx) }

func (f *Engine) Create(ctx context.Context, req lifecycle.CreateRequest, render lifecycle.Render) (*sandbox.Sandbox, *sandbox.Operation, error) {
	if err := req.Normalize(lifecycle.DefaultLimits); err != nil {
		return nil, nil, err
	}
	if f.Fail != nil {
		return nil, nil, f.Fail
	}
	sb := f.Add(sandbox.Running)
	f.mu.Lock()
	defer f.mu.Unlock()
	return sb, f.op(sandbox.OpCreate, sb.ID), nil
}

func (f *Engine) Get(ctx context.Context, id string) (*sandbox.Sandbox, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	sb, err := f.find(id)
	if err != nil {
		return nil, err
	}
	c := *sb
	return &c, nil
}

func (f *Engine) List(ctx context.Context, q store.SandboxQuery) (store.Page[sandbox.Sandbox], error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var p store.Page[sandbox.Sandbox]
	for _, sb := range f.sbs {
		if (q.State == "" || sb.State == q.State) && (q.Project == "" || sb.Project == q.Project) {
			p.Items = append(p.Items, *sb)
		}
	}
	return p, nil
}

func (f *Engine) step(kind sandbox.OpKind, id string) (*sandbox.Operation, error) {
	if f.Fail != nil {
		return nil, f.Fail
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	sb, err := f.find(id)
	if err != nil {
		return nil, err
	}
	tr, err := sandbox.Plan(kind, sb.State)
	if err != nil {
		return nil, errdefs.Wrap(errdefs.FailedPrecondition, err, "%v", err)
	}
	sb.State = tr.To
	return f.op(kind, id), nil
}

func (f *Engine) Pause(ctx context.Context, id string, _ lifecycle.Render) (*sandbox.Operation, error) {
	return f.step(sandbox.OpPause, id)
}

func (f *Engine) Suspend(ctx context.Context, id string, _ lifecycle.Render) (*sandbox.Operation, error) {
	return f.step(sandbox.OpSuspend, id)
}

func (f *Engine) Wake(ctx context.Context, id string, _ lifecycle.Render) (*sandbox.Operation, error) {
	return f.step(sandbox.OpWake, id)
}

func (f *Engine) Delete(ctx context.Context, id string, _ lifecycle.Render) (*sandbox.Operation, error) {
	return f.step(sandbox.OpDelete, id)
}

// Fork makes count running copies of a running or paused sandbox at once.
func (f *Engine) Fork(ctx context.Context, id string, count int, _ lifecycle.ForkRender) (*sandbox.Operation, []*sandbox.Sandbox, error) {
	if count < 1 || count > sandbox.MaxForks {
		return nil, nil, errdefs.New(errdefs.InvalidArgument, "count must be between 1 and %d", sandbox.MaxForks)
	}
	if f.Fail != nil {
		return nil, nil, f.Fail
	}
	f.mu.Lock()
	src, err := f.find(id)
	if err == nil {
		_, err = sandbox.Plan(sandbox.OpFork, src.State)
		if err != nil {
			err = errdefs.Wrap(errdefs.FailedPrecondition, err, "%v", err)
		}
	}
	f.mu.Unlock()
	if err != nil {
		return nil, nil, err
	}
	var forks []*sandbox.Sandbox
	for range count {
		forks = append(forks, f.Add(sandbox.Running))
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	op := f.op(sandbox.OpFork, id)
	for _, sb := range forks {
		sb.ForkOf = id
		op.Sandboxes = append(op.Sandboxes, sb.ID)
	}
	return op, forks, nil
}

// CreateSnapshot makes a ready snapshot of a running or paused sandbox at once.
func (f *Engine) CreateSnapshot(ctx context.Context, id, name string, _ lifecycle.SnapshotRender) (*sandbox.Operation, *sandbox.Snapshot, error) {
	if f.Fail != nil {
		return nil, nil, f.Fail
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	src, err := f.find(id)
	if err != nil {
		return nil, nil, err
	}
	if _, err := sandbox.Plan(sandbox.OpSnapshot, src.State); err != nil {
		return nil, nil, errdefs.Wrap(errdefs.FailedPrecondition, err, "%v", err)
	}
	now := time.Now().UTC()
	snap := &sandbox.Snapshot{ID: ids.New(ids.Snapshot), Project: src.Project, Name: name, SandboxID: id, State: sandbox.SnapshotReady, Template: src.Template,
		Runtime: src.Runtime, Resources: src.Resources, SizeBytes: 4096, CreatedAt: now, UpdatedAt: now}
	op := f.op(sandbox.OpSnapshot, id)
	op.Snapshot, snap.OperationID = snap.ID, op.ID
	f.snaps[snap.ID] = snap
	c := *snap
	return op, &c, nil
}

func (f *Engine) GetSnapshot(ctx context.Context, id string) (*sandbox.Snapshot, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	snap, ok := f.snaps[id]
	if !ok {
		return nil, errdefs.New(errdefs.NotFound, "snapshot %s not found", id)
	}
	c := *snap
	return &c, nil
}

func (f *Engine) ListSnapshots(ctx context.Context, q store.SnapshotQuery) (store.Page[sandbox.Snapshot], error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var p store.Page[sandbox.Snapshot]
	for _, s := range f.snaps {
		if (q.SandboxID == "" || s.SandboxID == q.SandboxID) && (q.Name == "" || s.Name == q.Name || s.ID == q.Name) {
			p.Items = append(p.Items, *s)
		}
	}
	return p, nil
}

func (f *Engine) DeleteSnapshot(ctx context.Context, id string) error {
	if f.Fail != nil {
		return f.Fail
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.snaps[id]; !ok {
		return errdefs.New(errdefs.NotFound, "snapshot %s not found", id)
	}
	delete(f.snaps, id)
	return nil
}

func (f *Engine) TagSnapshot(ctx context.Context, id, ref string) (*sandbox.Snapshot, error) {
	if f.Fail != nil {
		return nil, f.Fail
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	snap, ok := f.snaps[id]
	if !ok {
		return nil, errdefs.New(errdefs.NotFound, "snapshot %s not found", id)
	}
	snap.Tag = ref
	c := *snap
	return &c, nil
}

func (f *Engine) UpdateNetwork(ctx context.Context, id string, n sandbox.Network) (*sandbox.Sandbox, error) {
	if f.Fail != nil {
		return nil, f.Fail
	}
	sb, err := f.Get(ctx, id)
	if err != nil {
		return nil, err
	}
	sb.Network = &n
	return sb, nil
}

func (f *Engine) Operation(ctx context.Context, id string) (*sandbox.Operation, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	op, ok := f.ops[id]
	if !ok {
		return nil, errdefs.New(errdefs.NotFound, "operation %s not found", id)
	}
	return op, nil
}

func (f *Engine) Operations(ctx context.Context, q store.OperationQuery) (store.Page[sandbox.Operation], error) {
	return store.Page[sandbox.Operation]{}, nil
}

func (f *Engine) StartBuild(ctx context.Context, project, ref string, _ lifecycle.Render, build func(ctx context.Context) error) (*sandbox.Operation, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.op(sandbox.OpBuild, ""), nil
}

func (f *Engine) WarmPool(ctx context.Context, project, template string) (lifecycle.WarmPool, error) {
	if template != "seed:latest" {
		return lifecycle.WarmPool{}, errdefs.New(errdefs.NotFound, "template %s not found", template)
	}
	return lifecycle.WarmPool{Template: template}, nil
}

func (f *Engine) SetWarmPool(ctx context.Context, project, template string, minReady int) (lifecycle.WarmPool, error) {
	if _, err := f.WarmPool(ctx, project, template); err != nil {
		return lifecycle.WarmPool{}, err
	}
	return lifecycle.WarmPool{Template: template, MinReady: minReady}, nil
}

func (f *Engine) Ready() error                      { return f.NotReady }
func (f *Engine) Runtimes() ([]string, string)      { return []string{"fake"}, "fake" }
func (f *Engine) RuntimeDetails() map[string]string { return map[string]string{"fake": "FAKE engine"} }

// WaitOperation returns an operation (they all finish at once).
func (f *Engine) WaitOperation(ctx context.Context, id string) (*sandbox.Operation, error) {
	return f.Operation(ctx, id)
}

func (f *Engine) timeout(id string, d time.Duration) (*sandbox.Sandbox, error) {
	if f.Fail != nil {
		return nil, f.Fail
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	sb, err := f.find(id)
	if err != nil {
		return nil, err
	}
	if sb.State != sandbox.Running {
		return nil, errdefs.New(errdefs.FailedPrecondition, "sandbox %s is %s", id, sb.State)
	}
	end := time.Now().Add(d)
	sb.ExpiresAt = &end
	c := *sb
	return &c, nil
}

// SetTimeout and ExtendTimeout set a running sandbox's expiry.
func (f *Engine) SetTimeout(ctx context.Context, id string, d time.Duration) (*sandbox.Sandbox, error) {
	return f.timeout(id, d)
}

func (f *Engine) ExtendTimeout(ctx context.Context, id string, d time.Duration) (*sandbox.Sandbox, error) {
	return f.timeout(id, d)
}

// Touch does nothing: the fake has no idle policy.
func (f *Engine) Touch(string) {}

// Agents is commands.Agents over the fake engine's records and one real
// agent serving in this process (sandboxiotest): a running sandbox gets it,
// others get the engine's refusal.
type Agents struct {
	Engine *Engine
	IO     *sandboxiotest.Agent
}

func (a *Agents) Agent(ctx context.Context, id string) (*sandboxio.Agent, *sandbox.Sandbox, error) {
	sb, err := a.Engine.Get(ctx, id)
	if err != nil {
		return nil, nil, err
	}
	if sb.State != sandbox.Running {
		return nil, nil, errdefs.New(errdefs.FailedPrecondition, "sandbox %s is %s", id, sb.State)
	}
	return a.IO.Agent, sb, nil
}

// PeekAgent is Agent (the fake keeps no idle clock).
func (a *Agents) PeekAgent(ctx context.Context, id string) (*sandboxio.Agent, *sandbox.Sandbox, error) {
	return a.Agent(ctx, id)
}

// Attached does nothing.
func (a *Agents) Attached(string) func() { return func() {} }

// World is what a handler test needs around the FAKE engine: a real agent
// serving in the test process for its running sandboxes, command sessions
// over both (data plane at DataPlaneURL), API tokens in real SQLite, and one
// token (Key, its id KeyID).
type World struct {
	Engine   *Engine
	IO       *sandboxiotest.Agent
	Commands *commands.Service
	Signer   *auth.Signer
	Store    *sqlite.Store
	Tokens   *auth.Tokens
	Key      string
	KeyID    string
}

// DataPlaneURL is where a World's sessions say to attach.
const DataPlaneURL = "http://data.test"

// NewWorld makes a World that ends with the test.
func NewWorld(t testing.TB) *World {
	t.Helper()
	st, err := sqlite.Open(context.Background(), filepath.Join(t.TempDir(), "space.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	tokens := auth.New(st, st)
	tok, key, err := tokens.Create(context.Background(), "test")
	if err != nil {
		t.Fatal(err)
	}
	w := &World{Engine: New(), IO: sandboxiotest.Start(t), Signer: auth.NewSigner(bytes.Repeat([]byte{7}, 32)), Store: st, Tokens: tokens, Key: key, KeyID: tok.ID}
	w.Commands = commands.New(commands.Config{Agents: &Agents{Engine: w.Engine, IO: w.IO}, Signer: w.Signer, DataPlaneURL: DataPlaneURL})
	return w
}
