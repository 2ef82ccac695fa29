// Package lifecycle is the engine that changes sandboxes: it validates each
// requested transition against the state machine, records the intent and the
// operation before acting, runs the operation asynchronously on the sandbox's
// runtime under the engine's own lifetime (never a request's), records the
// outcome, and after a restart resumes or fails every operation left in flight.
package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/spacesandbox/space/internal/errdefs"
	"github.com/spacesandbox/space/internal/ids"
	"github.com/spacesandbox/space/internal/runtime"
	"github.com/spacesandbox/space/internal/sandbox"
	"github.com/spacesandbox/space/internal/store"
)

// Store is what the engine keeps in the database: sandboxes with their
// operations, and warm pools.
type Store interface {
	store.Sandboxes
	store.Snapshots
	store.Pools
	// TemplateOwners says which project built each template name: a
	// create names only its own project's or shared ones.
	TemplateOwners(ctx context.Context) (map[string]string, error)
}

// Templates resolves a template reference to the digest a sandbox records.
type Templates interface {
	// Resolve returns the reference and its digest; errdefs.NotFound when
	// the template does not exist.
	Resolve(ctx context.Context, ref string) (sandbox.TemplateRef, error)
}

// Network gives sandboxes their network (internal/network).
type Network interface {
	// Attach makes or repairs a sandbox's network of a runtime's kind with
	// a policy, and returns how to plug it in; starting: the runtime is
	// about to start the sandbox in it (create, restore), not re-adopt it.
	// Idempotent.
	Attach(ctx context.Context, id string, kind runtime.NetKind, policy sandbox.Network, starting bool) (*runtime.Net, error)
	// Apply changes a running sandbox's policy for new connections.
	Apply(ctx context.Context, id string, policy sandbox.Network) error
	// Detach removes a sandbox's network; absent is success.
	Detach(ctx context.Context, id string) error
	// Lookup returns a sandbox's attachment (nil for none).
	Lookup(id string) *runtime.Net
}

// Observer receives the outcome of every operation (for metrics).
type Observer interface {
	OperationFinished(kind sandbox.OpKind, state sandbox.OpState, d time.Duration)
}

// Config wires an Engine.
type Config struct {
	Store    Store
	Runtimes []runtime.Runtime
	// DefaultRuntime names the runtime used when a create names none; empty
	// means the first of Runtimes.
	DefaultRuntime string
	Templates      Templates
	// SnapshotRoot holds one directory per sandbox for suspend snapshots,
	// one per snapshot (snap_…) and one per fork in flight (op_…).
	SnapshotRoot string
	// Archive, when set, keeps every suspend snapshot in a blob store too:
	// a suspend succeeds once it is stored there, a wake fetches it when
	// the node has no copy.
	Archive  Archive
	Logger   *slog.Logger
	Observer Observer
	// Network gives sandboxes of runtimes that take one a network (nil:
	// no sandbox has a network).
	Network Network
	// DefaultEgress is the egress of sandboxes whose create names none
	// ("public" or "none"; default "none").
	DefaultEgress string
	Limits        Limits
	// MaxActiveSandboxes caps this node's sandboxes that are neither
	// deleted nor failed (0 = no cap); a create beyond it is
	// resource_exhausted.
	MaxActiveSandboxes int
	// Node is the node whose sandboxes this engine runs with Runtimes
	// ("" on a single machine; a node's id in a cluster). Cluster, when set,
	// places new sandboxes on nodes and hands operations to the node that
	// holds their sandbox; a control replica has a Cluster and no Runtimes.
	Node    string
	Cluster Cluster
	// InboxInterval is how often a cluster node looks for operations of
	// its sandboxes that were not handed to it (default 1 s).
	InboxInterval time.Duration
	// MaxParallelOps bounds the operations this engine runs at once (0: no
	// bound); the others wait, pending, for a turn. A node under a burst
	// of creates then boots a few sandboxes at a time instead of starving
	// every one (and its own heartbeat) of CPU.
	MaxParallelOps int
	// DefaultAutoLifecycle is the idle policy of sandboxes that name none.
	DefaultAutoLifecycle sandbox.AutoLifecycle
	// SuspendPausedAfter suspends sandboxes paused this long (0 = never).
	SuspendPausedAfter time.Duration
	// DefaultWarmPools are pool sizes for templates no one set one for
	// through the API (template reference → ready sandboxes).
	DefaultWarmPools map[string]int
	// IdleInterval is how often the idle policy is applied (default 1 s).
	IdleInterval time.Duration
	// OperationTimeout bounds one operation (default 10 minutes).
	OperationTimeout time.Duration
	Now              func() time.Time
}

// Validate checks the configuration.
func (c *Config) Validate() error {
	if c.Store == nil {
		return errors.New("lifecycle: no store")
	}
	if c.SnapshotRoot == "" {
		return errors.New("lifecycle: no snapshot root")
	}
	if c.DefaultRuntime != "" && (c.Cluster == nil || len(c.Runtimes) > 0) { // (a control replica's nodes run it)
		found := false
		for _, r := range c.Runtimes {
			found = found || r.Name() == c.DefaultRuntime
		}
		if !found {
			return fmt.Errorf("lifecycle: default runtime %q is not available", c.DefaultRuntime)
		}
	}
	return nil
}

// Engine runs lifecycle operations. Create it with New, then Start it.
type Engine struct {
	cfg      Config
	store    Store
	runtimes map[string]runtime.Runtime
	log      *slog.Logger
	now      func() time.Time

	// life is the engine's own lifetime: operations run under it, never
	// under a request's context. Close cancels it.
	life   context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup // operations in flight
	loops  sync.WaitGroup // background loops (idle policy)

	mu      sync.Mutex      // guards running and started
	running map[string]bool // operation ids being executed by this process
	// resumed are the operations this process resumed at Start (left in
	// flight by an earlier one): their sandboxes were not looked at then.
	resumed map[string]bool
	// doubted are sandboxes whose process may have ended while an
	// operation had them (its exit was reported, or its agent went away
	// as it was configured): the operation asks the runtime before it
	// records them running (lookAgain).
	doubted map[string]*runtime.Exit
	started bool
	// finished is closed (and replaced) whenever an operation finishes.
	finished chan struct{}
	// changes tells watchers (Watch) of every record the engine writes.
	changes Hub

	activity *activity
	poolKick chan struct{}
	turns    chan struct{} // MaxParallelOps (nil: no bound)
	refills  int           // runs of the pool refill (its loop's own)
	// fetching holds a lock per named snapshot this node fetches from the
	// blob store (snapshot id → *sync.Mutex).
	fetching sync.Map
}

// New returns an engine; it does nothing until Start.
func New(cfg Config) (*Engine, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Now == nil {
		cfg.Now = func() time.Time { return time.Now().UTC() }
	}
	if cfg.OperationTimeout == 0 {
		cfg.OperationTimeout = 10 * time.Minute
	}
	if cfg.Limits == (Limits{}) {
		cfg.Limits = DefaultLimits
	}
	if cfg.DefaultRuntime == "" && len(cfg.Runtimes) > 0 {
		cfg.DefaultRuntime = cfg.Runtimes[0].Name()
	}
	e := &Engine{
		cfg: cfg, store: cfg.Store, log: cfg.Logger, now: cfg.Now,
		runtimes: map[string]runtime.Runtime{}, running: map[string]bool{}, resumed: map[string]bool{}, doubted: map[string]*runtime.Exit{}, activity: newActivity(), poolKick: make(chan struct{}, 1), finished: make(chan struct{}),
	}
	e.store = watchedStore{Store: cfg.Store, hub: &e.changes}
	if cfg.DefaultAutoLifecycle == (sandbox.AutoLifecycle{}) {
		e.cfg.DefaultAutoLifecycle = DefaultAutoLifecycle
	}
	if cfg.IdleInterval == 0 {
		e.cfg.IdleInterval = time.Second
	}
	if cfg.InboxInterval == 0 {
		e.cfg.InboxInterval = time.Second
	}
	if cfg.MaxParallelOps > 0 {
		e.turns = make(chan struct{}, cfg.MaxParallelOps)
	}
	for _, r := range cfg.Runtimes {
		e.runtimes[r.Name()] = r
		if er, ok := r.(runtime.ExitReporter); ok {
			er.OnExit(e.sandboxExited)
		}
	}
	e.life, e.cancel = context.WithCancel(context.Background())
	return e, nil
}

// Ready returns nil when the engine can serve sandboxes, else the reason.
func (e *Engine) Ready() error {
	e.mu.Lock()
	started := e.started
	e.mu.Unlock()
	switch {
	case !started:
		return errors.New("lifecycle engine not started")
	case len(e.runtimes) == 0 && e.cfg.Cluster != nil:
		if err := e.cfg.Cluster.Ready(); err != nil {
			return err
		}
	case len(e.runtimes) == 0:
		return errors.New("no sandbox runtime is available on this host")
	case e.cfg.Templates == nil:
		return errors.New("no template store is configured")
	}
	if r, ok := e.cfg.Templates.(interface{ Ready() error }); ok {
		return r.Ready()
	}
	return nil
}

// Runtimes lists the available runtimes and the default.
func (e *Engine) Runtimes() (names []string, def string) {
	for _, r := range e.cfg.Runtimes {
		names = append(names, r.Name())
	}
	def = e.cfg.DefaultRuntime
	if len(names) == 0 && e.cfg.Cluster != nil {
		// A control replica offers what its nodes run.
		names = e.cfg.Cluster.Runtimes()
		if def == "" && len(names) > 0 {
			def = names[0]
		}
	}
	return names, def
}

// offers says whether a runtime runs here or on some node of the cluster.
func (e *Engine) offers(name string) bool {
	if _, ok := e.runtimes[name]; ok {
		return true
	}
	names, _ := e.Runtimes()
	return slices.Contains(names, name)
}

// RuntimeDetails says how each runtime runs on this host (for example the
// vm runtime's acceleration and why it was chosen).
func (e *Engine) RuntimeDetails() map[string]string {
	out := map[string]string{}
	for _, r := range e.cfg.Runtimes {
		out[r.Name()] = r.Capabilities().Detail
	}
	return out
}

// Close stops accepting work, cancels operations in flight and waits for
// them. Interrupted operations stay recorded as running and are resumed by
// the next Start.
func (e *Engine) Close() {
	e.cancel()
	e.wg.Wait()
	e.loops.Wait()
	// Runtimes release what they hold on the host for no sandbox (their
	// sandboxes keep running without the server).
	for _, rt := range e.runtimes {
		if c, ok := rt.(interface{ Close() }); ok {
			c.Close()
		}
	}
}

// Drain waits up to d for operations in flight to finish on their own.
func (e *Engine) Drain(d time.Duration) {
	done := make(chan struct{})
	go func() { e.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(d):
	}
}

// Render makes the idempotent response for a change, given the records as
// they will be committed. Nil means the request carries no idempotency key.
type Render func(sb *sandbox.Sandbox, op *sandbox.Operation) *store.Completion

// Completion is r's completion for sb and op (nil without a key).
func (r Render) Completion(sb *sandbox.Sandbox, op *sandbox.Operation) *store.Completion {
	return r.completion(sb, op)
}

func (r Render) completion(sb *sandbox.Sandbox, op *sandbox.Operation) *store.Completion {
	if r == nil {
		return nil
	}
	return r(sb, op)
}

// Create records a new sandbox and its create operation and starts it.
func (e *Engine) Create(ctx context.Context, req CreateRequest, render Render) (*sandbox.Sandbox, *sandbox.Operation, error) {
	if req.Template != "" {
		// Another project's template is one that does not exist.
		owners, err := e.store.TemplateOwners(ctx)
		if err != nil {
			return nil, nil, err
		}
		name, _, _ := strings.Cut(req.Template, ":")
		if o, ok := owners[name]; ok && o != store.ProjectOr(req.Project) {
			return nil, nil, errdefs.New(errdefs.NotFound, "template %s not found", name).WithDetails(map[string]any{"field": "template"})
		}
	}
	var snap *sandbox.Snapshot
	if req.Snapshot == "" && req.Template != "" {
		// A snapshot tagged as this template starts it.
		tagged, err := e.taggedSnapshot(ctx, req.Template)
		if err != nil {
			return nil, nil, err
		}
		if tagged != nil {
			req.Snapshot, req.Template = tagged.ID, ""
		}
	}
	if req.Snapshot != "" {
		var err error
		if snap, err = e.fromSnapshot(ctx, &req); err != nil {
			return nil, nil, err
		}
	}
	if err := req.normalize(e.cfg.Limits, e.cfg.DefaultAutoLifecycle, e.cfg.DefaultEgress); err != nil {
		return nil, nil, err
	}
	if err := e.Ready(); err != nil {
		return nil, nil, errdefs.Wrap(errdefs.Unavailable, err, "the server cannot create sandboxes now: %v", err)
	}
	rtName := req.Runtime
	if rtName == "" {
		_, rtName = e.Runtimes()
	}
	if !e.offers(rtName) {
		names, _ := e.Runtimes()
		return nil, nil, errdefs.New(errdefs.InvalidArgument, "runtime: %q is not available on this server (available: %v)", rtName, names).
			WithDetails(map[string]any{"field": "runtime"})
	}
	var tpl sandbox.TemplateRef
	if snap != nil {
		// The snapshot's template by digest: its tag may have moved since.
		tpl = snap.Template
		req.Env = maps.Clone(snap.Env)
		if sb, op := e.claim(ctx, req, snapshotPoolKey(req.Project, snap), tpl, render); sb != nil {
			return sb, op, nil
		}
	} else {
		var err error
		tpl, err = e.cfg.Templates.Resolve(ctx, req.Template)
		if err != nil {
			return nil, nil, fmt.Errorf("resolve template %s: %w", req.Template, err)
		}
		if *req.Resources == DefaultResources {
			if sb, op := e.claim(ctx, req, poolKey(req.Project, rtName, tpl.Digest, *req.Resources), tpl, render); sb != nil {
				return sb, op, nil
			}
		}
	}
	var node string
	var maxActive int
	if snap != nil {
		// Its image is on the disk of the node that made it, and in the
		// blob store when it has one and the runtime restores anywhere.
		node, maxActive = snap.Node, e.cfg.MaxActiveSandboxes
		if c := e.cfg.Cluster; c != nil {
			got, max, err := c.Place(ctx, Need{Runtime: rtName, Resources: *req.Resources, Template: tpl.Digest, Prefer: node})
			if err == nil && got != node && !e.portableSnapshot(ctx, snap) {
				err = errdefs.New(errdefs.Unavailable, "snapshot %s is on node %s, which takes no new sandboxes now", snap.ID, node)
			}
			node = got
			if err != nil {
				return nil, nil, err
			}
			maxActive = max
		}
	} else {
		var err error
		if node, maxActive, err = e.place(ctx, Need{Runtime: rtName, Resources: *req.Resources, Template: tpl.Digest}); err != nil {
			return nil, nil, err
		}
	}
	now := e.now()
	sb := &sandbox.Sandbox{
		ID: ids.New(ids.Sandbox), State: sandbox.Starting, Template: tpl, Runtime: rtName,
		Resources: *req.Resources, Env: req.Env, Metadata: req.Metadata, AutoLifecycle: *req.AutoLifecycle, Network: req.Network,
		CreatedAt: now, UpdatedAt: now, LastActiveAt: now, Node: node, Project: req.Project,
	}
	if snap != nil {
		sb.Snapshot = snap.ID // its environment came with req.Env
	}
	op := &sandbox.Operation{ID: ids.New(ids.Operation), Project: req.Project, Kind: sandbox.OpCreate, SandboxID: sb.ID, State: sandbox.OpPending, CreatedAt: now, UpdatedAt: now}
	sb.ActiveOperation = op.ID
	if err := e.store.CreateSandbox(ctx, sb, op, render.completion(sb, op), maxActive); err != nil {
		return nil, nil, fmt.Errorf("record sandbox: %w", err)
	}
	e.log.Info("sandbox create accepted", "sandbox_id", sb.ID, "operation_id", op.ID, "runtime", rtName, "template", tpl.Ref, "node", node)
	e.dispatch(*op, node)
	return sb, op, nil
}

// Pause freezes a running sandbox.
func (e *Engine) Pause(ctx context.Context, id string, render Render) (*sandbox.Operation, error) {
	return e.begin(ctx, sandbox.OpPause, id, render)
}

// Suspend saves a running or paused sandbox to disk and releases it.
func (e *Engine) Suspend(ctx context.Context, id string, render Render) (*sandbox.Operation, error) {
	return e.begin(ctx, sandbox.OpSuspend, id, render)
}

// Wake resumes a paused or restores a suspended sandbox; on a running one
// the operation succeeds at once.
func (e *Engine) Wake(ctx context.Context, id string, render Render) (*sandbox.Operation, error) {
	return e.begin(ctx, sandbox.OpWake, id, render)
}

// Delete removes a sandbox; an already deleted one is NotFound.
func (e *Engine) Delete(ctx context.Context, id string, render Render) (*sandbox.Operation, error) {
	return e.begin(ctx, sandbox.OpDelete, id, render)
}

func (e *Engine) begin(ctx context.Context, kind sandbox.OpKind, id string, render Render) (*sandbox.Operation, error) {
	home := e.rehome(ctx, kind, id)
	// A sandbox its node's loss failed wakes from its last stored suspend.
	var fromStore bool
	if kind == sandbox.OpWake && e.cfg.Cluster != nil {
		sb, err := e.store.GetSandbox(ctx, id)
		if err == nil && e.restorable(ctx, sb) {
			fromStore = true
		}
		if err == nil && home == "" && sb.State == sandbox.Suspended && !e.cfg.Cluster.Alive(ctx, sb.Node) {
			why := fmt.Sprintf("%s sandboxes do not move between nodes yet; it wakes when that node is back", sb.Runtime)
			if e.cfg.Cluster.Portable(sb.Runtime) {
				why = "no other node can take it now"
			}
			return nil, errdefs.New(errdefs.Unavailable, "sandbox %s is suspended on node %s, which is gone, and %s", id, sb.Node, why).
				WithDetails(map[string]any{"node": sb.Node})
		}
	}
	now := e.now()
	op := &sandbox.Operation{ID: ids.New(ids.Operation), Kind: kind, SandboxID: id, State: sandbox.OpPending, CreatedAt: now, UpdatedAt: now}
	var immediate bool
	var node string
	decide := func(sb *sandbox.Sandbox, op *sandbox.Operation) error {
		if sb.State == sandbox.Deleted {
			if kind == sandbox.OpDelete {
				return errdefs.New(errdefs.NotFound, "sandbox %s is already deleted", id)
			}
			return errdefs.New(errdefs.FailedPrecondition, "cannot %s a sandbox that is deleted", kind).
				WithDetails(map[string]any{"state": string(sb.State)})
		}
		if sb.ActiveOperation != "" {
			return errdefs.New(errdefs.Conflict, "sandbox %s has operation %s in flight", id, sb.ActiveOperation).
				WithDetails(map[string]any{"operation_id": sb.ActiveOperation, "state": string(sb.State)})
		}
		if fromStore && sb.State == sandbox.Failed && sb.Error != nil && sb.Error.Code == NodeLost {
			sb.State, sb.Error = sandbox.Suspended, nil // (its snapshot is in the blob store)
		}
		tr, err := sandbox.Plan(kind, sb.State)
		if err != nil {
			return errdefs.New(errdefs.FailedPrecondition, "%v", err).WithDetails(map[string]any{"state": string(sb.State)})
		}
		if !e.offers(sb.Runtime) && !tr.Immediate {
			return errdefs.New(errdefs.Unavailable, "runtime %q of sandbox %s is not available on this server", sb.Runtime, id)
		}
		op.From = sb.State
		immediate = tr.Immediate // (a store may decide more than once)
		if tr.Immediate {
			op.State, op.CompletedAt = sandbox.OpSucceeded, &now
			return nil
		}
		sb.SetState(tr.Through, now)
		sb.ActiveOperation = op.ID
		if home != "" {
			sb.Node = home
		}
		node = sb.Node
		return nil
	}
	_, err := e.store.BeginOperation(ctx, op, func(sb *sandbox.Sandbox, o *sandbox.Operation) (*store.Completion, error) {
		if err := decide(sb, o); err != nil {
			return nil, err
		}
		return render.completion(sb, o), nil
	})
	if err != nil {
		return nil, err
	}
	if immediate {
		e.observe(*op, 0)
		return op, nil
	}
	e.log.Info("operation accepted", "sandbox_id", id, "operation_id", op.ID, "kind", kind, "node", node)
	e.dispatch(*op, node)
	return op, nil
}

// Get returns a sandbox.
func (e *Engine) Get(ctx context.Context, id string) (*sandbox.Sandbox, error) {
	return e.store.GetSandbox(ctx, id)
}

// List returns a page of sandboxes.
func (e *Engine) List(ctx context.Context, q store.SandboxQuery) (store.Page[sandbox.Sandbox], error) {
	return e.store.ListSandboxes(ctx, q)
}

// Operation returns an operation.
func (e *Engine) Operation(ctx context.Context, id string) (*sandbox.Operation, error) {
	return e.store.GetOperation(ctx, id)
}

// Operations returns a page of operations.
func (e *Engine) Operations(ctx context.Context, q store.OperationQuery) (store.Page[sandbox.Operation], error) {
	return e.store.ListOperations(ctx, q)
}

func (e *Engine) snapshotDir(id string) string { return filepath.Join(e.cfg.SnapshotRoot, id) }

func (e *Engine) spec(sb *sandbox.Sandbox) runtime.Spec {
	spec := runtime.Spec{SandboxID: sb.ID, Template: sb.Template, Resources: sb.Resources, Env: sb.Env, SnapshotDir: e.snapshotDir(sb.ID)}
	if e.cfg.Network != nil {
		spec.Net = e.cfg.Network.Lookup(sb.ID)
	}
	return spec
}

func (e *Engine) observe(op sandbox.Operation, d time.Duration) {
	if e.cfg.Observer != nil {
		e.cfg.Observer.OperationFinished(op.Kind, op.State, d)
	}
}
