// Package api is SPACE's control-plane HTTP API (api.md): routing,
// authentication, strict request decoding, idempotency, and the mapping of
// error kinds to statuses and codes — the one place that happens.
package api

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	apispec "github.com/spacesandbox/space/api"
	"github.com/spacesandbox/space/internal/audit"
	"github.com/spacesandbox/space/internal/auth"
	"github.com/spacesandbox/space/internal/commands"
	"github.com/spacesandbox/space/internal/edge"
	"github.com/spacesandbox/space/internal/errdefs"
	"github.com/spacesandbox/space/internal/ids"
	"github.com/spacesandbox/space/internal/lifecycle"
	"github.com/spacesandbox/space/internal/metrics"
	"github.com/spacesandbox/space/internal/sandbox"
	"github.com/spacesandbox/space/internal/store"
	"github.com/spacesandbox/space/internal/templates"
	"github.com/spacesandbox/space/internal/usage"
)

// Config wires a Server.
type Config struct {
	Engine   Engine
	Commands *commands.Service
	Store    Store
	Tokens   *auth.Tokens
	Metrics  *metrics.Metrics
	Logger   *slog.Logger
	// BootID identifies this server process (idempotency reservations).
	BootID string
	// Templates lists templates (nil: none).
	Templates TemplateLister
	// Builder builds and imports templates (nil: not offered).
	Builder TemplateBuilder
	// DataDir, when set, must take writes for /readyz to say ready.
	DataDir string
	// Usage holds the sandboxes' sampled CPU, memory and disk use (nil:
	// the metrics route answers an empty series).
	Usage Usage
	// Forwarder, in a cluster, serves the routes that need a sandbox's
	// agent by the node that runs it (nil: every sandbox runs here).
	Forwarder Forwarder
	// OwnerAlive, in a cluster, says whether the process holding an
	// idempotency reservation is alive (nil: only this one is).
	OwnerAlive func(ctx context.Context, owner string) bool
	// Keys, on a server no other process shares the store with, is the
	// idempotency its planes share (NewKeys); nil: keys are reserved in
	// the store.
	Keys *Keys
	// Nodes, in a cluster, lists and cordons or drains nodes.
	Nodes Nodes
	// AttachBase, in a cluster, says which data plane a forwarded request
	// wants its sessions' attach URLs to name ("": this server's own).
	AttachBase func(*http.Request) string
	// Projects are the projects, their quotas and the audit log (nil: only
	// the default project, no audit reads).
	Projects Projects
	// Audit records every authenticated mutation (nil: none recorded).
	Audit *audit.Log
	// Limiter bounds each token's request rate (nil: a limiter of its own).
	Limiter *auth.Limiter
}

// Projects is what the API keeps of projects: the projects and quotas,
// the audit log it reads, and which project owns each template name.
type Projects interface {
	store.Projects
	ListAudit(ctx context.Context, q store.AuditQuery) (store.Page[store.AuditEntry], error)
	TemplateOwners(ctx context.Context) (map[string]string, error)
	ClaimTemplate(ctx context.Context, project, name string, at time.Time) error
}

// Forwarder sends a request to the node that runs a sandbox
// (internal/cluster): it reports false when that is this process.
type Forwarder interface {
	Forward(w http.ResponseWriter, r *http.Request, node string) bool
}

// Usage is the sandboxes' sampled use of CPU, memory and disk.
type Usage interface {
	Series(sandboxID string, from, to time.Time) []usage.Sample
}

// Engine is what the control plane asks of the lifecycle engine.
type Engine interface {
	Create(ctx context.Context, req lifecycle.CreateRequest, render lifecycle.Render) (*sandbox.Sandbox, *sandbox.Operation, error)
	Get(ctx context.Context, id string) (*sandbox.Sandbox, error)
	List(ctx context.Context, q store.SandboxQuery) (store.Page[sandbox.Sandbox], error)
	Pause(ctx context.Context, id string, render lifecycle.Render) (*sandbox.Operation, error)
	Suspend(ctx context.Context, id string, render lifecycle.Render) (*sandbox.Operation, error)
	Wake(ctx context.Context, id string, render lifecycle.Render) (*sandbox.Operation, error)
	Delete(ctx context.Context, id string, render lifecycle.Render) (*sandbox.Operation, error)
	Fork(ctx context.Context, id string, count int, render lifecycle.ForkRender) (*sandbox.Operation, []*sandbox.Sandbox, error)
	CreateSnapshot(ctx context.Context, id, name string, render lifecycle.SnapshotRender) (*sandbox.Operation, *sandbox.Snapshot, error)
	GetSnapshot(ctx context.Context, id string) (*sandbox.Snapshot, error)
	ListSnapshots(ctx context.Context, q store.SnapshotQuery) (store.Page[sandbox.Snapshot], error)
	DeleteSnapshot(ctx context.Context, id string) error
	TagSnapshot(ctx context.Context, id, ref string) (*sandbox.Snapshot, error)
	UpdateNetwork(ctx context.Context, id string, n sandbox.Network) (*sandbox.Sandbox, error)
	Operation(ctx context.Context, id string) (*sandbox.Operation, error)
	// WaitOperation blocks until the operation is terminal or ctx ends.
	WaitOperation(ctx context.Context, id string) (*sandbox.Operation, error)
	Operations(ctx context.Context, q store.OperationQuery) (store.Page[sandbox.Operation], error)
	StartBuild(ctx context.Context, project, ref string, render lifecycle.Render, build func(ctx context.Context) error) (*sandbox.Operation, error)
	WarmPool(ctx context.Context, project, template string) (lifecycle.WarmPool, error)
	SetWarmPool(ctx context.Context, project, template string, minReady int) (lifecycle.WarmPool, error)
	// Ready says why the engine cannot serve sandboxes (nil: it can);
	// Runtimes and RuntimeDetails describe what it runs them on.
	Ready() error
	// Watch tells of the sandboxes and operations written from now until
	// ctx ends (GET /v1/events).
	Watch(ctx context.Context) *lifecycle.Changes
	Runtimes() (names []string, def string)
	RuntimeDetails() map[string]string
}

// Store is what the control plane keeps in the database itself: idempotency
// records, and a read that says the database answers (readiness).
type Store interface {
	store.Idempotency
	Ping(ctx context.Context) error
}

// TemplateLister is what the API needs of the template store.
type TemplateLister interface {
	List(ctx context.Context) ([]templates.Template, error)
	Get(ref string) (templates.Template, error)
}

// Server is the control-plane HTTP handler.
type Server struct {
	engine     Engine
	commands   *commands.Service
	store      Store
	tokens     *auth.Tokens
	metrics    *metrics.Metrics
	log        *slog.Logger
	idem       *idempotency
	router     *router
	edge       *edge.Edge
	templates  TemplateLister
	builder    TemplateBuilder
	dataDir    string
	usage      Usage
	forwarder  Forwarder
	nodes      Nodes
	attachBase func(*http.Request) string
	projects   Projects
	owners     interface {
		TemplateOwners(ctx context.Context) (map[string]string, error)
	}
	audit     *audit.Log
	limiter   *auth.Limiter
	ownedObjs map[owns]ownedObject
	// EventsKeepalive is the longest silence on GET /v1/events, and how
	// often it checks that its token is still valid.
	EventsKeepalive time.Duration
}

// New builds the control-plane handler.
func New(cfg Config) *Server {
	s := &Server{engine: cfg.Engine, commands: cfg.Commands, store: cfg.Store, tokens: cfg.Tokens, metrics: cfg.Metrics, log: cfg.Logger,
		idem: keysOr(cfg.Keys, cfg.Store, cfg.BootID), templates: cfg.Templates, builder: cfg.Builder, dataDir: cfg.DataDir, usage: cfg.Usage, forwarder: cfg.Forwarder, nodes: cfg.Nodes, attachBase: cfg.AttachBase}
	s.idem.alive = cfg.OwnerAlive
	s.projects, s.audit, s.limiter = cfg.Projects, cfg.Audit, cfg.Limiter
	if cfg.Projects != nil {
		s.owners = cfg.Projects
	}
	if s.limiter == nil {
		s.limiter = auth.NewLimiter()
	}
	s.ownedObjs = s.owned()
	s.EventsKeepalive = 15 * time.Second
	s.router = newRouter(s.Routes())
	s.edge = &edge.Edge{Listener: "api", Metrics: cfg.Metrics, Log: cfg.Logger, Render: errorResponse, Finished: cfg.Audit.Finished("api", nil)}
	return s
}

// Routes is the route table: the single source the router and the OpenAPI
// conformance test both read.
func (s *Server) Routes() []Route {
	return []Route{
		{Method: "GET", Pattern: "/healthz", Handler: s.healthz},
		{Method: "GET", Pattern: "/readyz", Handler: s.readyz},
		{Method: "GET", Pattern: "/metrics", Handler: s.serveMetrics},
		{Method: "GET", Pattern: "/openapi-m1.json", Handler: s.openapi},
		{Method: "POST", Pattern: "/v1/sandboxes", Auth: true, Handler: s.createSandbox},
		{Method: "GET", Pattern: "/v1/sandboxes", Auth: true, Handler: s.listSandboxes},
		{Method: "GET", Pattern: "/v1/events", Auth: true, Handler: s.events},
		{Method: "GET", Pattern: "/v1/token", Auth: true, Handler: s.whoami},
		{Method: "GET", Pattern: "/v1/sandboxes/{id}", Auth: true, Owns: ownsSandbox, Handler: s.getSandbox},
		{Method: "DELETE", Pattern: "/v1/sandboxes/{id}", Auth: true, Owns: ownsSandbox, Handler: s.lifecycleHandler(sandbox.OpDelete)},
		{Method: "POST", Pattern: "/v1/sandboxes/{id}:pause", Auth: true, Owns: ownsSandbox, Handler: s.lifecycleHandler(sandbox.OpPause)},
		{Method: "POST", Pattern: "/v1/sandboxes/{id}:suspend", Auth: true, Owns: ownsSandbox, Handler: s.lifecycleHandler(sandbox.OpSuspend)},
		{Method: "POST", Pattern: "/v1/sandboxes/{id}:wake", Auth: true, Owns: ownsSandbox, Handler: s.lifecycleHandler(sandbox.OpWake)},
		{Method: "POST", Pattern: "/v1/sandboxes/{id}:fork", Auth: true, Owns: ownsSandbox, Handler: s.forkSandbox},
		{Method: "PUT", Pattern: "/v1/sandboxes/{id}/network", Auth: true, Owns: ownsSandbox, Node: true, Handler: s.putNetwork},
		{Method: "POST", Pattern: "/v1/sandboxes/{id}/snapshots", Auth: true, Owns: ownsSandbox, Handler: s.createSnapshot},
		{Method: "GET", Pattern: "/v1/snapshots", Auth: true, Handler: s.listSnapshots},
		{Method: "GET", Pattern: "/v1/snapshots/{id}", Auth: true, Owns: ownsSnapshot, Handler: s.getSnapshot},
		{Method: "DELETE", Pattern: "/v1/snapshots/{id}", Auth: true, Owns: ownsSnapshot, Handler: s.deleteSnapshot},
		{Method: "POST", Pattern: "/v1/snapshots/{id}:tag", Auth: true, Role: store.RoleAdmin, Owns: ownsSnapshot, Handler: s.tagSnapshot(true)},
		{Method: "POST", Pattern: "/v1/snapshots/{id}:untag", Auth: true, Role: store.RoleAdmin, Owns: ownsSnapshot, Handler: s.tagSnapshot(false)},
		{Method: "GET", Pattern: "/v1/sandboxes/{id}/metrics", Auth: true, Owns: ownsSandbox, Node: true, Handler: s.getMetrics},
		{Method: "POST", Pattern: "/v1/sandboxes/{id}/commands", Auth: true, Owns: ownsSandbox, Node: true, Handler: s.createCommand},
		{Method: "GET", Pattern: "/v1/sandboxes/{id}/processes", Auth: true, Owns: ownsSandbox, Node: true, Handler: s.listProcesses},
		{Method: "GET", Pattern: "/v1/sandboxes/{id}/processes/{process_id}", Auth: true, Owns: ownsSandbox, Node: true, Handler: s.getProcess},
		{Method: "POST", Pattern: "/v1/sandboxes/{id}/processes/{process_id}:signal", Auth: true, Owns: ownsSandbox, Node: true, Handler: s.signalProcess},
		{Method: "GET", Pattern: "/v1/sandboxes/{id}/files", Auth: true, Owns: ownsSandbox, Node: true, Handler: s.readFile},
		{Method: "PUT", Pattern: "/v1/sandboxes/{id}/files", Auth: true, Owns: ownsSandbox, Node: true, Handler: s.writeFile},
		{Method: "DELETE", Pattern: "/v1/sandboxes/{id}/files", Auth: true, Owns: ownsSandbox, Node: true, Handler: s.deleteFile},
		{Method: "GET", Pattern: "/v1/sandboxes/{id}/files:list", Auth: true, Owns: ownsSandbox, Node: true, Handler: s.listFiles},
		{Method: "GET", Pattern: "/v1/sandboxes/{id}/files:stat", Auth: true, Owns: ownsSandbox, Node: true, Handler: s.statFile},
		{Method: "POST", Pattern: "/v1/sandboxes/{id}/files:mkdir", Auth: true, Owns: ownsSandbox, Node: true, Handler: s.mkdirFile},
		{Method: "POST", Pattern: "/v1/sandboxes/{id}/files:move", Auth: true, Owns: ownsSandbox, Node: true, Handler: s.moveFile},
		{Method: "GET", Pattern: "/v1/templates", Auth: true, Handler: s.listTemplates},
		{Method: "POST", Pattern: "/v1/templates", Auth: true, Role: store.RoleAdmin, Handler: s.createTemplate},
		{Method: "GET", Pattern: "/v1/templates/{name}:{tag}", Auth: true, Owns: ownsTemplate, Handler: s.getTemplate},
		{Method: "GET", Pattern: "/v1/warm-pools/{name}:{tag}", Auth: true, Owns: ownsTemplate, Handler: s.getWarmPool},
		{Method: "PUT", Pattern: "/v1/warm-pools/{name}:{tag}", Auth: true, Role: store.RoleAdmin, Owns: ownsTemplate, Handler: s.putWarmPool},
		{Method: "GET", Pattern: "/v1/nodes", Auth: true, Role: store.RoleOwner, Handler: s.listNodes},
		{Method: "GET", Pattern: "/v1/nodes/{id}", Auth: true, Role: store.RoleOwner, Handler: s.getNode},
		{Method: "POST", Pattern: "/v1/nodes/{id}:cordon", Auth: true, Role: store.RoleOwner, Handler: s.setNodeState(store.MemberCordoned)},
		{Method: "POST", Pattern: "/v1/nodes/{id}:uncordon", Auth: true, Role: store.RoleOwner, Handler: s.setNodeState(store.MemberReady)},
		{Method: "POST", Pattern: "/v1/nodes/{id}:drain", Auth: true, Role: store.RoleOwner, Handler: s.setNodeState(store.MemberDraining)},
		{Method: "GET", Pattern: "/v1/operations", Auth: true, Handler: s.listOperations},
		{Method: "GET", Pattern: "/v1/operations/{id}", Auth: true, Owns: ownsOperation, Handler: s.getOperation},
		{Method: "GET", Pattern: "/v1/projects", Auth: true, Role: store.RoleOwner, Handler: s.listProjects},
		{Method: "POST", Pattern: "/v1/projects", Auth: true, Role: store.RoleOwner, Handler: s.createProject},
		{Method: "GET", Pattern: "/v1/projects/{id}", Auth: true, Owns: ownsProject, Handler: s.getProject},
		{Method: "DELETE", Pattern: "/v1/projects/{id}", Auth: true, Role: store.RoleOwner, Handler: s.deleteProject},
		{Method: "PUT", Pattern: "/v1/projects/{id}/limits", Auth: true, Role: store.RoleOwner, Handler: s.putLimits},
		{Method: "PUT", Pattern: "/v1/projects/{id}/quotas", Auth: true, Role: store.RoleAdmin, Owns: ownsProject, Handler: s.putQuotas},
		{Method: "GET", Pattern: "/v1/projects/{id}/usage", Auth: true, Owns: ownsProject, Handler: s.getUsage},
		{Method: "GET", Pattern: "/v1/tokens", Auth: true, Role: store.RoleAdmin, Handler: s.listTokens},
		{Method: "POST", Pattern: "/v1/tokens", Auth: true, Role: store.RoleAdmin, Handler: s.createToken},
		{Method: "GET", Pattern: "/v1/tokens/{id}", Auth: true, Role: store.RoleAdmin, Owns: ownsToken, Handler: s.getToken},
		{Method: "DELETE", Pattern: "/v1/tokens/{id}", Auth: true, Role: store.RoleAdmin, Owns: ownsToken, Handler: s.revokeToken},
		{Method: "GET", Pattern: "/v1/audit", Auth: true, Role: store.RoleAdmin, Handler: s.listAudit},
	}
}

// ServeHTTP routes, authenticates with the API token, recovers panics and
// records metrics.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	r = audit.With(r)
	serve(s.edge, s.router, w, r, s.forward, s.authenticate)
}

// forward serves an authenticated request of a Node route by the cluster
// node that runs its sandbox, when that is another process; anything it
// cannot resolve (a malformed or unknown id) is left to the handler.
func (s *Server) forward(w http.ResponseWriter, r *http.Request, route *Route, p params) bool {
	if !route.Node || s.forwarder == nil || !ids.Valid(ids.Sandbox, p["id"]) {
		return false
	}
	sb, err := s.engine.Get(r.Context(), p["id"])
	if err != nil {
		return false
	}
	if s.forwarder.Forward(w, r, sb.Node) {
		if rec := audit.From(r.Context()); rec != nil {
			rec.Forwarded = true // the node that served it records it
		}
		return true
	}
	return false
}

// serve is what both listeners do with a request on their edge: route it,
// authenticate it with authn when the route needs it (success gives the
// request as the handler sees it), hand it to fwd (nil, or false: it is
// served here), and run its handler.
func serve(e *edge.Edge, rt *router, w http.ResponseWriter, r *http.Request, fwd func(http.ResponseWriter, *http.Request, *Route, params) bool, authn func(http.ResponseWriter, *http.Request, *Route, params) (*http.Request, error)) {
	e.Serve(w, r, func(w http.ResponseWriter, r *http.Request, name *string) error {
		route, p, allowed := rt.match(r.Method, r.URL.Path)
		if route == nil {
			return edge.NoRoute(w, r, allowed)
		}
		*name = route.Pattern
		if rec := audit.From(r.Context()); rec != nil {
			rec.Action, rec.Target = route.Method+" "+route.Pattern, p["id"]
			if p["name"] != "" {
				rec.Target = p["name"] + ":" + p["tag"]
			}
		}
		if route.Auth {
			ar, err := authn(w, r, route, p)
			if err != nil {
				return err
			}
			r = ar
		}
		if fwd != nil && fwd(w, r, route, p) {
			return nil
		}
		return route.Handler(w, r, p)
	})
}

// mutate reads the body of a mutating request (at most limit bytes) and
// runs handler under the request's Idempotency-Key.
func mutate(w http.ResponseWriter, r *http.Request, ids *idempotency, limit int64, handler func(body []byte, i *idem) (response, error)) error {
	body, err := edge.ReadBody(w, r, limit)
	if err != nil {
		return err
	}
	resp, replayed, err := ids.do(w, r, body, func(i *idem) (response, error) { return handler(body, i) })
	if err != nil {
		return err
	}
	if rec := audit.From(r.Context()); rec != nil {
		if strings.HasPrefix(resp.location, "/v1/operations/") {
			rec.Operation = strings.TrimPrefix(resp.location, "/v1/operations/")
		}
		if resp.status >= 400 {
			rec.Code = codeOf(resp.body)
		}
	}
	writeResponse(w, resp, replayed)
	return nil
}

func (s *Server) mutate(w http.ResponseWriter, r *http.Request, handler func(body []byte, i *idem) (response, error)) error {
	return mutate(w, r, s.idem, edge.MaxJSONBody, handler)
}

func (s *Server) healthz(w http.ResponseWriter, r *http.Request, p params) error {
	return edge.JSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

func (s *Server) readyz(w http.ResponseWriter, r *http.Request, p params) error {
	err := s.engine.Ready()
	if err == nil {
		ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		defer cancel()
		err = s.store.Ping(ctx)
	}
	if err == nil && s.dataDir != "" {
		err = probeWritable(s.dataDir)
	}
	if err != nil {
		return edge.JSON(w, http.StatusServiceUnavailable, map[string]string{"status": "not_ready", "reason": err.Error()})
	}
	names, def := s.engine.Runtimes()
	return edge.JSON(w, http.StatusOK, map[string]any{"status": "ready", "runtimes": names, "default_runtime": def,
		"runtime_details": s.engine.RuntimeDetails()})
}

// probeWritable writes and removes a small file in dir: a data directory
// that is full or read-only makes the server not ready.
func probeWritable(dir string) error {
	p := filepath.Join(dir, ".ready-probe")
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err == nil {
		_, err = f.Write(make([]byte, 4096))
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		os.Remove(p)
	}
	if err != nil {
		return fmt.Errorf("data directory %s cannot take writes: %w", dir, err)
	}
	return nil
}

func (s *Server) serveMetrics(w http.ResponseWriter, r *http.Request, p params) error {
	s.metrics.Handler().ServeHTTP(w, r)
	return nil
}

func (s *Server) openapi(w http.ResponseWriter, r *http.Request, p params) error {
	w.Header().Set("Content-Type", "application/json")
	w.Write(apispec.OpenAPI)
	return nil
}

func (s *Server) listTemplates(w http.ResponseWriter, r *http.Request, p params) error {
	if _, err := query(r); err != nil {
		return err
	}
	var list []templates.Template
	if s.templates != nil {
		var err error
		if list, err = s.templates.List(r.Context()); err != nil {
			return err
		}
	}
	visible := []templates.Template{}
	for _, t := range list {
		if s.templateVisible(r.Context(), auth.Project(r.Context()), t.Name) == nil {
			visible = append(visible, t)
		}
	}
	return edge.JSON(w, http.StatusOK, listResponse[templates.Template]{Items: visible})
}

func (s *Server) getTemplate(w http.ResponseWriter, r *http.Request, p params) error {
	if _, err := query(r); err != nil {
		return err
	}
	if s.templates == nil {
		return errdefs.New(errdefs.NotFound, "template %s:%s not found", p["name"], p["tag"])
	}
	t, err := s.templates.Get(p["name"] + ":" + p["tag"])
	if err != nil {
		return err
	}
	return edge.JSON(w, http.StatusOK, t)
}
