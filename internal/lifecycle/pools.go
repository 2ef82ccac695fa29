package lifecycle

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/spacesandbox/space/internal/errdefs"
	"github.com/spacesandbox/space/internal/ids"
	"github.com/spacesandbox/space/internal/sandbox"
	"github.com/spacesandbox/space/internal/store"
)

// Warm pools keep ready sandboxes of a template so a create is a claim, not a
// boot. A pool sandbox is an ordinary sandbox marked with its pool key
// (runtime, template digest, resources); it counts against capacity, is not
// listed to users, and a create that fits (same template digest, runtime and
// default resources) takes one atomically in the store — never the same one
// twice. The claimed sandbox gets its own clock and fresh entropy; its
// hostname is already its own id's. The pool refills in the background.

// MaxWarmPool bounds one pool.
const MaxWarmPool = 100

// poolKey names the pool a create of project claims from. Pools are per
// project (a claimed sandbox is the project's); the default project's keys
// are as they were before projects, so its pools survive an upgrade.
func poolKey(project, runtime, digest string, r sandbox.Resources) string {
	k := fmt.Sprintf("%s|%s|%d/%d/%d", runtime, digest, r.VCPUs, r.MemoryMiB, r.DiskMiB)
	if project != "" && project != store.DefaultProject {
		k = project + "|" + k
	}
	return k
}

// snapshotPoolKey is the pool of a snapshot tagged as a template: its
// sandboxes start from the snapshot, with its runtime and resources.
func snapshotPoolKey(project string, snap *sandbox.Snapshot) string {
	return poolKey(project, snap.Runtime, snap.ID, snap.Resources)
}

// pool is what a template reference's warm pool holds.
type pool struct {
	key     string
	project string
	tpl     sandbox.TemplateRef
	snap    *sandbox.Snapshot // a snapshot tagged as the template, else nil
}

// poolOf finds what template reference ref starts for project: a snapshot
// tagged as it, else the template store's template (default runtime and
// resources).
func (e *Engine) poolOf(ctx context.Context, project, ref string) (pool, error) {
	snap, err := e.taggedSnapshot(ctx, ref)
	if err != nil {
		return pool{}, err
	}
	if snap != nil {
		return pool{key: snapshotPoolKey(project, snap), project: project, tpl: snap.Template, snap: snap}, nil
	}
	if e.cfg.Templates == nil {
		return pool{}, errdefs.New(errdefs.Unavailable, "no template store is configured")
	}
	tpl, err := e.cfg.Templates.Resolve(ctx, ref)
	if err != nil {
		return pool{}, err
	}
	return pool{key: poolKey(project, e.cfg.DefaultRuntime, tpl.Digest, DefaultResources), project: project, tpl: tpl}, nil
}

// SetWarmPool sets how many ready sandboxes of template project keeps (0
// stops), within the project's warm_pool quota.
func (e *Engine) SetWarmPool(ctx context.Context, project, template string, minReady int) (WarmPool, error) {
	if minReady < 0 || minReady > MaxWarmPool {
		return WarmPool{}, errdefs.New(errdefs.InvalidArgument, "min_ready must be between 0 and %d", MaxWarmPool)
	}
	if _, err := e.poolOf(ctx, project, template); err != nil {
		// A pool whose template is gone can still be stopped.
		if !errors.Is(err, errdefs.NotFound) || minReady != 0 {
			return WarmPool{}, err
		}
		if _, set, perr := e.poolSetting(ctx, project, template); perr != nil || !set {
			return WarmPool{}, cmp.Or(perr, err)
		}
	}
	if err := e.store.SetWarmPool(ctx, store.PoolRef{Project: store.ProjectOr(project), Template: template}, minReady); err != nil {
		return WarmPool{}, err
	}
	e.kickPools()
	return e.WarmPool(ctx, project, template)
}

// warmPools is every pool's size: what was set through the API, and the
// server's defaults (the default project's) for templates nobody set one
// for.
func (e *Engine) warmPools(ctx context.Context) (map[store.PoolRef]int, error) {
	pools, err := e.store.WarmPools(ctx)
	if err != nil {
		return nil, err
	}
	for ref, n := range e.cfg.DefaultWarmPools {
		k := store.PoolRef{Project: store.DefaultProject, Template: ref}
		if _, set := pools[k]; !set {
			pools[k] = n
		}
	}
	return pools, nil
}

// WarmPool is a pool's setting and how many sandboxes are ready in it.
type WarmPool struct {
	Template string `json:"template"`
	MinReady int    `json:"min_ready"`
	Ready    int    `json:"ready"`
	Starting int    `json:"starting"`
}

// poolSetting is project's pool size for template and whether one is set
// (through the API, or the server's default).
func (e *Engine) poolSetting(ctx context.Context, project, template string) (int, bool, error) {
	pools, err := e.warmPools(ctx)
	if err != nil {
		return 0, false, err
	}
	n, set := pools[store.PoolRef{Project: store.ProjectOr(project), Template: template}]
	return n, set, nil
}

// WarmPool reports project's pool of a template: NotFound for a template
// that neither exists nor has a pool set (one whose template is gone is
// reported, so that it can be seen and stopped).
func (e *Engine) WarmPool(ctx context.Context, project, template string) (WarmPool, error) {
	n, set, err := e.poolSetting(ctx, project, template)
	if err != nil {
		return WarmPool{}, err
	}
	wp := WarmPool{Template: template, MinReady: n}
	if p, err := e.poolOf(ctx, project, template); err == nil {
		sbs, err := e.store.PoolSandboxes(ctx, p.key)
		if err != nil {
			return wp, err
		}
		for _, sb := range sbs {
			switch {
			case sb.State == sandbox.Running && sb.ActiveOperation == "":
				wp.Ready++
			case sb.State == sandbox.Starting:
				wp.Starting++
			}
		}
	} else if !errors.Is(err, errdefs.NotFound) || !set {
		return WarmPool{}, err
	}
	return wp, nil
}

func (e *Engine) kickPools() {
	select {
	case e.poolKick <- struct{}{}:
	default:
	}
}

// claim tries to hand a pool sandbox to a create. It returns nil when no
// pool sandbox fits or is ready.
func (e *Engine) claim(ctx context.Context, req CreateRequest, key string, tpl sandbox.TemplateRef, render Render) (*sandbox.Sandbox, *sandbox.Operation) {
	now := e.now()
	sb, op, err := e.store.ClaimPoolSandbox(ctx, key, func(sb *sandbox.Sandbox) (*sandbox.Operation, *store.Completion, error) {
		sb.Template, sb.Env, sb.Metadata, sb.AutoLifecycle, sb.Network = tpl, req.Env, req.Metadata, *req.AutoLifecycle, req.Network
		sb.CreatedAt, sb.LastActiveAt, sb.ExpiresAt = now, now, nil
		sb.SetState(sandbox.Running, now) // its timeout starts now
		op := &sandbox.Operation{ID: ids.New(ids.Operation), Project: sb.Project, Kind: sandbox.OpCreate, SandboxID: sb.ID, State: sandbox.OpSucceeded,
			CreatedAt: now, UpdatedAt: now, CompletedAt: &now}
		c := *sb
		c.Pool = ""
		return op, render.completion(&c, op), nil
	})
	if err != nil {
		// None ready, or the project is at a quota (the create that
		// follows is refused the same way, with the quota named).
		if !errors.Is(err, errdefs.NotFound) && !errors.Is(err, errdefs.ResourceExhausted) {
			e.log.Warn("claim from warm pool", "err", err)
		}
		return nil, nil
	}
	e.kickPools()
	if e.runsHere(sb.Node) || e.cfg.Cluster == nil {
		e.readyClaimed(ctx, sb)
	} else {
		e.cfg.Cluster.Claimed(sb.Node, sb.ID)
	}
	e.observe(*op, 0)
	e.log.Info("sandbox created from the warm pool", "sandbox_id", sb.ID, "operation_id", op.ID)
	return sb, op
}

// readyClaimed gives a claimed pool sandbox its user's network policy,
// before the user can run anything in it, and its own clock and entropy,
// now that it is someone's.
func (e *Engine) readyClaimed(ctx context.Context, sb *sandbox.Sandbox) {
	if e.cfg.Network != nil && sb.Network != nil {
		if err := e.cfg.Network.Apply(ctx, sb.ID, *sb.Network); err != nil {
			e.log.Error("apply the network policy of a claimed sandbox", "sandbox_id", sb.ID, "err", err)
		}
	}
	e.loops.Add(1)
	go func() {
		defer e.loops.Done()
		if r, ok := e.runtimes[sb.Runtime]; ok {
			e.identify(e.life, r, e.spec(sb), woken)
		}
	}()
}

// runPools keeps every pool at its size until the engine closes.
func (e *Engine) runPools() {
	defer e.loops.Done()
	t := time.NewTicker(time.Second)
	defer t.Stop()
	kicked := true
	for {
		e.refill(e.life, kicked)
		select {
		case <-e.life.Done():
			return
		case <-t.C:
			kicked = false
		case <-e.poolKick:
			kicked = true
		}
	}
}

// refill keeps each pool at its size; thorough (after a change, and every
// half minute) also drops the sandboxes of pools nothing leads to, which
// reads every pool's sandboxes.
func (e *Engine) refill(ctx context.Context, thorough bool) {
	if e.Ready() != nil {
		return
	}
	e.refills++
	pools, err := e.warmPools(ctx)
	if err != nil {
		return
	}
	live := map[string]bool{}
	for ref, want := range pools {
		p, err := e.poolOf(ctx, ref.Project, ref.Template)
		if err != nil {
			continue
		}
		live[p.key] = true
		sbs, err := e.poolSandboxes(ctx, p.key)
		if err != nil {
			continue
		}
		have := 0
		var ready []string
		for _, sb := range sbs {
			switch sb.State {
			case sandbox.Running:
				have++
				if sb.ActiveOperation == "" {
					ready = append(ready, sb.ID)
				}
			case sandbox.Starting:
				have++
			case sandbox.Failed, sandbox.Paused, sandbox.Suspended:
				e.Delete(ctx, sb.ID, nil) // a pool sandbox that is not ready is useless
			}
		}
		if have < want && p.snap != nil && !e.canStartFrom(ctx, p.snap) {
			continue // (the node that has its image keeps the pool)
		}
		for i := have; i < want; i++ {
			if err := e.createPooled(ctx, p); err != nil {
				e.log.Warn("refill warm pool", "project", ref.Project, "template", ref.Template, "err", err)
				break
			}
		}
		for i := 0; i < len(ready)-want; i++ { // the pool shrank
			e.Delete(ctx, ready[i], nil)
		}
	}
	if thorough || e.refills%30 == 0 {
		e.dropStalePools(ctx, live)
	}
}

// dropStalePools deletes the idle sandboxes of pools no template reference
// leads to any more (its tag moved to other content, a snapshot's tag was
// removed): nothing would claim them.
func (e *Engine) dropStalePools(ctx context.Context, live map[string]bool) {
	keys, err := e.store.PoolKeys(ctx)
	if err != nil {
		return
	}
	for _, k := range keys {
		if live[k] {
			continue
		}
		sbs, err := e.poolSandboxes(ctx, k)
		if err != nil {
			continue
		}
		for _, sb := range sbs {
			if sb.ActiveOperation == "" {
				e.log.Info("drop a sandbox of a stale warm pool", "sandbox_id", sb.ID, "pool", k)
				e.Delete(ctx, sb.ID, nil)
			}
		}
	}
}

// poolSandboxes lists a pool's sandboxes on this node: each node keeps
// its own pools full (in a cluster, a create claims from any node's).
func (e *Engine) poolSandboxes(ctx context.Context, key string) ([]sandbox.Sandbox, error) {
	sbs, err := e.store.PoolSandboxes(ctx, key)
	return slices.DeleteFunc(sbs, func(sb sandbox.Sandbox) bool { return sb.Node != e.cfg.Node }), err
}

func (e *Engine) createPooled(ctx context.Context, p pool) error {
	now := e.now()
	sb := &sandbox.Sandbox{
		ID: ids.New(ids.Sandbox), State: sandbox.Starting, Template: p.tpl, Runtime: e.cfg.DefaultRuntime, Resources: DefaultResources,
		Env: map[string]string{}, Metadata: map[string]string{}, AutoLifecycle: sandbox.AutoLifecycle{IdleTimeout: "720h", IdleAction: "none"},
		Network:   &sandbox.Network{Egress: "none", Allow: []string{}, Deny: []string{}}, // its user's policy comes with the claim
		CreatedAt: now, UpdatedAt: now, LastActiveAt: now, Pool: p.key, Node: e.cfg.Node, Project: store.ProjectOr(p.project),
	}
	if s := p.snap; s != nil {
		sb.Snapshot, sb.Runtime, sb.Resources, sb.Env = s.ID, s.Runtime, s.Resources, maps.Clone(s.Env)
	}
	op := &sandbox.Operation{ID: ids.New(ids.Operation), Project: sb.Project, Kind: sandbox.OpCreate, SandboxID: sb.ID, State: sandbox.OpPending, CreatedAt: now, UpdatedAt: now}
	sb.ActiveOperation = op.ID
	if err := e.store.CreateSandbox(ctx, sb, op, nil, e.cfg.MaxActiveSandboxes); err != nil {
		return err
	}
	e.submit(*op)
	return nil
}
