// Package ecw is SPACE's E2B-compatible layer: the E2B control-plane REST API
// and the envd in-sandbox API (HTTP /files and the Connect RPC process and
// filesystem services), mapped onto the same engine, command sessions and
// agents as the native API. E2B "pause" is SPACE suspend; "resume" and
// "connect" restore; the in-memory pause is never used.
//
// One listener serves both halves: a request carrying E2b-Sandbox-Id (as
// the SDKs send when E2B_SANDBOX_URL is set), or addressed to a host
// "<port>-<sandbox id>.<domain>", is an envd request for that sandbox;
// everything else is the control plane.
package ecw

import (
	"context"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/spacesandbox/space/internal/audit"
	"github.com/spacesandbox/space/internal/auth"
	"github.com/spacesandbox/space/internal/commands"
	"github.com/spacesandbox/space/internal/edge"
	"github.com/spacesandbox/space/internal/errdefs"
	"github.com/spacesandbox/space/internal/ids"
	"github.com/spacesandbox/space/internal/ingress"
	"github.com/spacesandbox/space/internal/jsonbody"
	"github.com/spacesandbox/space/internal/lifecycle"
	"github.com/spacesandbox/space/internal/metrics"
	"github.com/spacesandbox/space/internal/sandbox"
	"github.com/spacesandbox/space/internal/store"
	"github.com/spacesandbox/space/internal/usage"
)

// EnvdVersion is the envd version SPACE reports: the SDK features it gates
// (octet-stream uploads, closeStdin, stdin control) all work.
const EnvdVersion = "0.6.4"

// EnvdPort is the port E2B's SDKs address envd on.
const EnvdPort = "49983"

// DefaultTimeout is the sandbox timeout when a create names none (E2B's).
const DefaultTimeout = 15 * time.Second

// Engine is what the layer needs of the lifecycle engine.
type Engine interface {
	Create(ctx context.Context, req lifecycle.CreateRequest, render lifecycle.Render) (*sandbox.Sandbox, *sandbox.Operation, error)
	Get(ctx context.Context, id string) (*sandbox.Sandbox, error)
	List(ctx context.Context, q store.SandboxQuery) (store.Page[sandbox.Sandbox], error)
	Suspend(ctx context.Context, id string, render lifecycle.Render) (*sandbox.Operation, error)
	Wake(ctx context.Context, id string, render lifecycle.Render) (*sandbox.Operation, error)
	Delete(ctx context.Context, id string, render lifecycle.Render) (*sandbox.Operation, error)
	Fork(ctx context.Context, id string, count int, render lifecycle.ForkRender) (*sandbox.Operation, []*sandbox.Sandbox, error)
	CreateSnapshot(ctx context.Context, id, name string, render lifecycle.SnapshotRender) (*sandbox.Operation, *sandbox.Snapshot, error)
	GetSnapshot(ctx context.Context, id string) (*sandbox.Snapshot, error)
	ListSnapshots(ctx context.Context, q store.SnapshotQuery) (store.Page[sandbox.Snapshot], error)
	DeleteSnapshot(ctx context.Context, id string) error
	WaitOperation(ctx context.Context, id string) (*sandbox.Operation, error)
	SetTimeout(ctx context.Context, id string, d time.Duration) (*sandbox.Sandbox, error)
	ExtendTimeout(ctx context.Context, id string, d time.Duration) (*sandbox.Sandbox, error)
	Touch(id string)
	UpdateNetwork(ctx context.Context, id string, n sandbox.Network) (*sandbox.Sandbox, error)
}

// Config wires a Server.
type Config struct {
	Engine   Engine
	Commands *commands.Service
	Tokens   *auth.Tokens
	Metrics  *metrics.Metrics
	Logger   *slog.Logger
	// Keepalive is the longest silence on a process stream (E2B: ≤ 50 s).
	Keepalive time.Duration
	// Ingress reaches sandbox ports other than envd's (getHost); nil
	// refuses them. Domain is the sandbox domain create answers with.
	Ingress *ingress.Proxy
	Domain  string
	// Usage holds the sandboxes' sampled resource use (nil: getMetrics
	// answers an empty list).
	Usage Usage
	// Forwarder, in a cluster, serves a sandbox's envd, port and metrics
	// requests by the node that runs it (nil: every sandbox runs here).
	Forwarder Forwarder
	// Audit records every authenticated change (nil: none); Limiter
	// bounds each key's request rate (nil: one of the layer's own).
	Audit   *audit.Log
	Limiter *auth.Limiter
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

// Server serves the E2B-compatible API.
type Server struct {
	cfg     Config
	log     *slog.Logger
	control *http.ServeMux
	envd    *http.ServeMux
	edge    *edge.Edge
}

// New returns the layer's handler.
func New(cfg Config) *Server {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Keepalive == 0 {
		cfg.Keepalive = 30 * time.Second
	}
	s := &Server{cfg: cfg, log: cfg.Logger, control: http.NewServeMux(), envd: http.NewServeMux(),
		edge: &edge.Edge{Listener: "ecw", Metrics: cfg.Metrics, Log: cfg.Logger, Render: render, Finished: cfg.Audit.Finished("ecw", readsOnly)}}
	if s.cfg.Limiter == nil {
		s.cfg.Limiter = auth.NewLimiter()
	}
	s.routeControl()
	s.routeEnvd()
	return s
}

// ServeHTTP sends a request to the control plane or to a sandbox's envd, on
// the layer's edge (errors as E2B's {"code","message"}).
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	r = audit.With(r)
	s.edge.Serve(w, r, func(w http.ResponseWriter, r *http.Request, route *string) error {
		if id, _, ok := envdTarget(r); ok && s.forward(w, r, id) {
			*route = "forwarded"
			return nil
		}
		if id, ok := metricsTarget(r); ok && s.forward(w, r, id) {
			*route = "forwarded"
			return nil
		}
		if id, port, ok := envdTarget(r); ok && port != EnvdPort && s.cfg.Ingress != nil {
			*route = "ingress"
			s.cfg.Ingress.Serve(w, r, id, port, r.URL.Path)
			return nil
		}
		mux := s.control
		id, port, ok := envdTarget(r)
		if !ok && r.URL.Path == "/files" {
			// A signed file URL on a plain E2B_SANDBOX_URL: the
			// signature says which sandbox it is for.
			f, signed, err := signedRequest(r)
			if err != nil {
				return err
			}
			if signed {
				if id, err = s.signedSandbox(r.Context(), f); err != nil {
					return err
				}
				if s.forward(w, r, id) {
					*route = "forwarded"
					return nil
				}
				port, ok = EnvdPort, true
			}
		}
		if ok {
			mux = s.envd
			r = r.WithContext(context.WithValue(r.Context(), targetKey{}, target{sandboxID: id, port: port}))
		}
		_, pattern := mux.Handler(r)
		if pattern == "" {
			allowed := allowedMethods(mux, r)
			if len(allowed) == 0 {
				// As E2B's API answers a route it does not have: a plain
				// 404 with no error body, which the SDKs do not read as
				// "sandbox not found" (they decide on the body's code).
				http.Error(w, "404 page not found", http.StatusNotFound)
				return nil
			}
			return edge.NoRoute(w, r, allowed)
		}
		*route = pattern
		if rec := audit.From(r.Context()); rec != nil {
			rec.Action = pattern
			if !strings.Contains(pattern, " ") {
				rec.Action = r.Method + " " + pattern
			}
			rec.Target = id
		}
		var err error
		mux.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), errSlotKey{}, &err))) // (sets the path values)
		return err
	})
}

// forward serves a request about sandbox id by the cluster node that runs
// it, when that is another process (anything unresolved is served here).
func (s *Server) forward(w http.ResponseWriter, r *http.Request, id string) bool {
	if s.cfg.Forwarder == nil || !ids.Valid(ids.Sandbox, id) {
		return false
	}
	sb, err := s.cfg.Engine.Get(r.Context(), id)
	if err != nil {
		return false
	}
	if s.cfg.Forwarder.Forward(w, r, sb.Node) {
		if rec := audit.From(r.Context()); rec != nil {
			rec.Forwarded = true // the node that served it records it
		}
		return true
	}
	return false
}

// readsOnly says an E2B request changes nothing though its method is not
// GET: envd's Connect calls that list, stat, read or watch.
func readsOnly(rec *audit.Request) bool {
	method, path, _ := strings.Cut(rec.Action, " ")
	return readCall(method, path)
}

// readCall says a request with method and path only reads: a GET, or one
// of envd's Connect calls that list, stat, read or watch.
func readCall(method, path string) bool {
	if method == http.MethodGet || method == http.MethodHead {
		return true
	}
	call := path[strings.LastIndexByte(path, '/')+1:]
	for _, p := range []string{"List", "Stat", "Get", "Watch", "Connect", "CreateWatcher", "RemoveWatcher"} {
		if strings.HasPrefix(call, p) {
			return true
		}
	}
	return false
}

// metricsTarget is the sandbox of a getMetrics request (its samples are
// kept by the node that runs it).
func metricsTarget(r *http.Request) (string, bool) {
	rest, ok := strings.CutPrefix(r.URL.Path, "/sandboxes/")
	if !ok {
		return "", false
	}
	composite, tail, ok := strings.Cut(rest, "/")
	if !ok || tail != "metrics" {
		return "", false
	}
	return shortID(composite)
}

// handler is an E2B endpoint: it returns its failure, which the edge writes.
type handler func(w http.ResponseWriter, r *http.Request) error

// errSlotKey carries a handler's failure out of the ServeMux to the edge.
type errSlotKey struct{}

// handle mounts h on a ServeMux.
func (s *Server) handle(h handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := h(w, r); err != nil {
			if slot, ok := r.Context().Value(errSlotKey{}).(*error); ok {
				*slot = err
				return
			}
			s.edge.Fail(w, r, err)
		}
	})
}

// allowedMethods lists the methods a path does answer to.
func allowedMethods(mux *http.ServeMux, r *http.Request) []string {
	var out []string
	for _, m := range []string{"GET", "POST", "PUT", "DELETE"} {
		c := r.Clone(r.Context())
		c.Method = m
		if _, p := mux.Handler(c); p != "" {
			out = append(out, m)
		}
	}
	return out
}

type targetKey struct{}

type target struct {
	sandboxID string
	port      string
}

// envdTarget finds the sandbox and port an envd request is for: the
// E2b-Sandbox-Id/-Port headers, or a "<port>-<id>.<domain>" host.
func envdTarget(r *http.Request) (id, port string, ok bool) {
	if id := r.Header.Get("E2b-Sandbox-Id"); id != "" {
		port := r.Header.Get("E2b-Sandbox-Port")
		if port == "" {
			port = EnvdPort
		}
		return id, port, true
	}
	host := r.Host
	if i := strings.IndexByte(host, '.'); i > 0 {
		if port, id, found := strings.Cut(host[:i], "-"); found && port != "" && id != "" && strings.Trim(port, "0123456789") == "" {
			return id, port, true
		}
	}
	return "", "", false
}

// apiError is E2B's error body: the SDKs decide on its code.
type apiError struct {
	// SandboxID is set on E2B's edge's "sandbox not found" (502).
	SandboxID string `json:"sandboxId,omitempty"`
	Code      int    `json:"code"`
	Message   string `json:"message"`
}

// render is E2B's error body, {"code", "message"}, with the status of the
// error's kind: the SDKs decide on its code. Errors without a kind never show
// their text.
func render(err error) (int, []byte) {
	kind, msg, details := errdefs.Public(err)
	e := apiError{Code: kind.Status, Message: msg}
	if kind == kindGone {
		e.SandboxID, _ = details["sandboxId"].(string)
	}
	b, _ := edge.Marshal(e)
	return kind.Status, b
}

// fail logs server-side failures and writes the error.

// decodeBody decodes a JSON body strictly (unknown fields are refused); an
// empty body leaves v as it is.
func decodeBody(w http.ResponseWriter, r *http.Request, v any) error {
	return jsonbody.Decode(http.MaxBytesReader(w, r.Body, edge.MaxJSONBody), v)
}
