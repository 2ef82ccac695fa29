package api

import (
	"bufio"
	"context"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/spacesandbox/space/internal/auth"
	"github.com/spacesandbox/space/internal/commands"
	"github.com/spacesandbox/space/internal/edge"
	"github.com/spacesandbox/space/internal/errdefs"
	"github.com/spacesandbox/space/internal/httpguard"
	"github.com/spacesandbox/space/internal/ids"
	"github.com/spacesandbox/space/internal/ingress"
	"github.com/spacesandbox/space/internal/metrics"
	"github.com/spacesandbox/space/internal/sandbox"
	"github.com/spacesandbox/space/internal/store"
)

// DataPlane serves command event streams and stdin, authorised only by
// session-scoped attachment tokens.
type DataPlane struct {
	cmds    *commands.Service
	metrics *metrics.Metrics
	log     *slog.Logger
	idem    *idempotency
	router  *router
	edge    *edge.Edge
	ingress *ingress.Proxy
	tokens  *auth.Tokens
	// forwarder and sandbox: see DataPlaneConfig.
	forwarder Forwarder
	sandbox   func(ctx context.Context, id string) (*sandbox.Sandbox, error)
	// Keepalive is the longest silence on a stream (api.md: ≤ 15 s).
	Keepalive time.Duration
}

// DataPlaneConfig wires a DataPlane.
type DataPlaneConfig struct {
	Commands *commands.Service
	Store    store.Idempotency
	Metrics  *metrics.Metrics
	Logger   *slog.Logger
	BootID   string
	// Keys is the control plane's Config.Keys, when it has them.
	Keys *Keys
	// Ingress, when set, proxies to sandbox ports (see ingress.go).
	Ingress *ingress.Proxy
	// Tokens, when set, ends attachment tokens whose API token is revoked.
	Tokens *auth.Tokens
	// Forwarder and Sandbox, on a cluster's control replica that proxies
	// the data plane, send a session's or a port's requests to the data
	// plane of the node that runs the sandbox.
	Forwarder Forwarder
	Sandbox   func(ctx context.Context, id string) (*sandbox.Sandbox, error)
}

// NewDataPlane builds the data-plane handler.
func NewDataPlane(cfg DataPlaneConfig) *DataPlane {
	d := &DataPlane{cmds: cfg.Commands, metrics: cfg.Metrics, log: cfg.Logger, idem: keysOr(cfg.Keys, cfg.Store, cfg.BootID), Keepalive: 15 * time.Second}
	d.router = newRouter(d.Routes())
	d.edge = &edge.Edge{Listener: "data", Metrics: cfg.Metrics, Log: cfg.Logger, Render: errorResponse}
	d.ingress, d.tokens, d.forwarder, d.sandbox = cfg.Ingress, cfg.Tokens, cfg.Forwarder, cfg.Sandbox
	return d
}

// forward serves an authenticated session request by the data plane of
// the node that runs its sandbox, when that is another process.
func (d *DataPlane) forward(w http.ResponseWriter, r *http.Request, _ *Route, p params) bool {
	return d.forwardSandbox(w, r, p["sandbox_id"])
}

func (d *DataPlane) forwardSandbox(w http.ResponseWriter, r *http.Request, id string) bool {
	if d.forwarder == nil || d.sandbox == nil || !ids.Valid(ids.Sandbox, id) {
		return false
	}
	sb, err := d.sandbox(r.Context(), id)
	if err != nil {
		return false
	}
	if d.forwarder.Forward(w, r, sb.Node) {
		httpguard.Exempt(r.Context()) // (a stream, once it flows)
		return true
	}
	return false
}

// Routes is the data plane's route table.
func (d *DataPlane) Routes() []Route {
	return []Route{
		{Method: "GET", Pattern: "/v1/sessions/{session_id}/events", Auth: true, Handler: d.events},
		{Method: "POST", Pattern: "/v1/sessions/{session_id}/stdin", Auth: true, Handler: d.stdin},
		{Method: "POST", Pattern: "/v1/sessions/{session_id}/stdin:close", Auth: true, Handler: d.closeStdin},
		{Method: "POST", Pattern: "/v1/sessions/{session_id}:resize", Auth: true, Handler: d.resize},
	}
}

// ServeHTTP routes a data-plane request and authenticates it with the
// session's attachment token.
func (d *DataPlane) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if d.ingress != nil {
		if id, port, path, ok := d.ingress.Match(r); ok {
			if !d.forwardSandbox(w, r, id) {
				d.ingress.Serve(w, r, id, port, path)
			}
			return
		}
	}
	if r.URL.Path == "/healthz" && r.Method == http.MethodGet {
		edge.JSON(w, http.StatusOK, map[string]string{"status": "ok"})
		return
	}
	serve(d.edge, d.router, w, r, d.forward, func(w http.ResponseWriter, r *http.Request, _ *Route, p params) (*http.Request, error) {
		sid := p["session_id"]
		if !ids.Valid(ids.Process, sid) {
			return nil, errdefs.New(errdefs.NotFound, "no such session")
		}
		tok, ok := auth.BearerToken(r.Header.Get("Authorization"))
		if !ok {
			return nil, errdefs.New(errdefs.Unauthenticated, "missing or invalid attachment token")
		}
		claims, err := d.cmds.Signer().Verify(tok, sid)
		if err != nil {
			return nil, err
		}
		// An attachment token lives only as long as the API token that
		// created its session (tokens from before this check name none).
		if claims.Token != "" && d.tokens != nil {
			tok, err := d.tokens.Active(r.Context(), claims.Token)
			if err != nil {
				return nil, err
			}
			// The token's project is the session's: a token never moves,
			// so a mismatch is a forged or stale claim.
			if claims.Project != "" && claims.Project != tok.Project {
				return nil, errdefs.New(errdefs.NotFound, "no such session")
			}
		}
		p["sandbox_id"] = claims.Sandbox
		return r, nil
	})
}

// events streams a session's output as Server-Sent Events. The first attach
// starts the process. Terminal events: process_exited (success) or error.
// A stream that ends without one is incomplete; the client reconnects with
// Last-Event-ID.
func (d *DataPlane) events(w http.ResponseWriter, r *http.Request, p params) error {
	sid, sbx := p["session_id"], p["sandbox_id"]
	ctx := r.Context()
	httpguard.Exempt(ctx) // an authenticated stream: not held to the connection cap
	last := parseLastEventID(r.Header.Get("Last-Event-ID"))
	after := last.after
	if last.resync {
		after = commands.FollowAll
	}
	rc := http.NewResponseController(w)
	bw := bufio.NewWriterSize(w, 256<<10)
	var sse eventWriter = &sseWriter{w: bw}
	contentType := "text/event-stream"
	if wantsFrames(r.Header.Get("Accept")) {
		sse, contentType = &frameWriter{w: bw}, FramedType
	}
	flush := func() error {
		if err := bw.Flush(); err != nil {
			return err
		}
		return rc.Flush()
	}
	// The answer starts once the process has started (the first event is
	// Started), so a client holding the response knows its process runs;
	// a failure before that is an ordinary error response.
	started := false
	err := d.cmds.Follow(ctx, sbx, sid, after, d.Keepalive, true, func(ev commands.Event) error {
		switch {
		case ev.Started != nil:
			h := w.Header()
			h.Set("Content-Type", contentType)
			h.Set("Cache-Control", "no-store")
			h.Set("X-Accel-Buffering", "no")
			w.WriteHeader(http.StatusOK)
			started = true
			return flush()
		case ev.Resync:
			sse.jsonEvent(eventID(ev.ResumeAt), "resync_required", map[string]any{
				"message": "output after the requested event is no longer retained; what follows is the retained output",
			})
		case ev.Exited != nil:
			ex := ev.Exited
			if ex.ErrorCode != "" {
				sse.jsonEvent("", "error", map[string]any{"code": ex.ErrorCode, "message": ex.ErrorMessage, "exit_code": ex.ExitCode})
			} else {
				e := map[string]any{"exit_code": ex.ExitCode}
				if ex.Signal != "" {
					e["signal"] = ex.Signal
				}
				sse.jsonEvent("", "process_exited", e)
			}
			return flush()
		case ev.Quiet:
			sse.ping()
			return flush()
		default:
			sse.output(ev.Seq, ev.Stream, ev.Data)
		}
		if ev.Flush {
			return flush()
		}
		return nil
	})
	switch {
	case err == nil || ctx.Err() != nil:
	case !started:
		return err
	default:
		// The sandbox stopped running: the stream ends without a terminal
		// event, and the client reconnects with Last-Event-ID after wake.
		d.log.Info("event stream ends: agent unavailable", "session_id", sid, "sandbox_id", sbx, "err", err)
	}
	return nil
}

// MaxStdin bounds one stdin request.
const MaxStdin = 16 << 20

func (d *DataPlane) mutate(w http.ResponseWriter, r *http.Request, limit int64, handler func(body []byte) (response, error)) error {
	return mutate(w, r, d.idem, limit, func(body []byte, _ *idem) (response, error) { return handler(body) })
}

func (d *DataPlane) stdin(w http.ResponseWriter, r *http.Request, p params) error {
	return d.mutate(w, r, MaxStdin, func(body []byte) (response, error) {
		if _, err := query(r); err != nil {
			return response{}, err
		}
		ag, _, err := d.cmds.Agents().Agent(r.Context(), p["sandbox_id"])
		if err != nil {
			return response{}, err
		}
		if err := ag.Stdin(r.Context(), p["session_id"], body); err != nil {
			return response{}, err
		}
		b, err := edge.Marshal(map[string]int{"bytes": len(body)})
		return response{status: http.StatusOK, body: b}, err
	})
}

func (d *DataPlane) closeStdin(w http.ResponseWriter, r *http.Request, p params) error {
	return d.mutate(w, r, edge.MaxJSONBody, func(body []byte) (response, error) {
		if _, err := query(r); err != nil {
			return response{}, err
		}
		if len(strings.TrimSpace(string(body))) > 0 && strings.TrimSpace(string(body)) != "{}" {
			return response{}, errdefs.New(errdefs.InvalidArgument, "stdin:close takes no body")
		}
		ag, _, err := d.cmds.Agents().Agent(r.Context(), p["sandbox_id"])
		if err != nil {
			return response{}, err
		}
		if err := ag.CloseStdin(r.Context(), p["session_id"]); err != nil {
			return response{}, err
		}
		b, err := edge.Marshal(map[string]bool{"closed": true})
		return response{status: http.StatusOK, body: b}, err
	})
}

type resizeRequest struct {
	Cols int `json:"cols"`
	Rows int `json:"rows"`
}

func (d *DataPlane) resize(w http.ResponseWriter, r *http.Request, p params) error {
	return d.mutate(w, r, edge.MaxJSONBody, func(body []byte) (response, error) {
		if _, err := query(r); err != nil {
			return response{}, err
		}
		var req resizeRequest
		if err := decodeJSON(r.Header.Get("Content-Type"), body, &req); err != nil {
			return response{}, err
		}
		if req.Cols < 1 || req.Cols > 10000 || req.Rows < 1 || req.Rows > 10000 {
			return response{}, errdefs.New(errdefs.InvalidArgument, "cols and rows must be between 1 and 10000")
		}
		ag, _, err := d.cmds.Agents().Agent(r.Context(), p["sandbox_id"])
		if err != nil {
			return response{}, err
		}
		if err := ag.Resize(r.Context(), p["session_id"], uint16(req.Cols), uint16(req.Rows)); err != nil {
			return response{}, err
		}
		b, err := edge.Marshal(req)
		return response{status: http.StatusOK, body: b}, err
	})
}
