package api

import (
	"context"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/spacesandbox/space/internal/auth"
	"github.com/spacesandbox/space/internal/edge"
	"github.com/spacesandbox/space/internal/errdefs"
	"github.com/spacesandbox/space/internal/ids"
	"github.com/spacesandbox/space/internal/lifecycle"
	"github.com/spacesandbox/space/internal/sandbox"
	"github.com/spacesandbox/space/internal/store"
	"github.com/spacesandbox/space/internal/usage"
)

// createResponse is the body of 202 to POST /v1/sandboxes.
type createResponse struct {
	Sandbox   *sandbox.Sandbox   `json:"sandbox"`
	Operation *sandbox.Operation `json:"operation"`
}

// operationResponse is the body of 202 to the lifecycle endpoints.
type operationResponse struct {
	Operation *sandbox.Operation `json:"operation"`
}

// listResponse is the body of every list endpoint.
type listResponse[T any] struct {
	Items      []T     `json:"items"`
	NextCursor *string `json:"next_cursor"`
}

func toList[T any](p store.Page[T]) listResponse[T] {
	out := listResponse[T]{Items: p.Items}
	if out.Items == nil {
		out.Items = []T{}
	}
	if p.Next != "" {
		out.NextCursor = &p.Next
	}
	return out
}

func operationLocation(_ *sandbox.Sandbox, op *sandbox.Operation) string {
	return "/v1/operations/" + op.ID
}

// sandboxID checks a path's sandbox id: malformed is 400, never a lookup.
func sandboxID(p params) (string, error) {
	id := p["id"]
	if !ids.Valid(ids.Sandbox, id) {
		return "", errdefs.New(errdefs.InvalidArgument, "malformed sandbox id %q", truncate(id, 64)).WithDetails(map[string]any{"field": "id"})
	}
	return id, nil
}

// sandboxJSON checks a mutation on one sandbox: a well-formed id, no query
// parameters, and the body decoded strictly into v. It returns the id.
func sandboxJSON(r *http.Request, p params, body []byte, v any) (string, error) {
	id, err := sandboxID(p)
	if err != nil {
		return "", err
	}
	if _, err := query(r); err != nil {
		return "", err
	}
	if err := decodeJSON(r.Header.Get("Content-Type"), body, v); err != nil {
		return "", err
	}
	return id, nil
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}

// query checks a request's query parameters: only allowed names, each once.
func query(r *http.Request, allowed ...string) (url.Values, error) {
	q, err := url.ParseQuery(r.URL.RawQuery)
	if err != nil {
		return nil, errdefs.New(errdefs.InvalidArgument, "malformed query string")
	}
	for k, v := range q {
		ok := false
		for _, a := range allowed {
			ok = ok || k == a
		}
		if !ok {
			return nil, errdefs.New(errdefs.InvalidArgument, "unknown query parameter %q", truncate(k, 64))
		}
		if len(v) > 1 {
			return nil, errdefs.New(errdefs.InvalidArgument, "query parameter %q given more than once", k)
		}
	}
	return q, nil
}

func pageParams(q url.Values) (limit int, cursor string, err error) {
	if s := q.Get("limit"); s != "" {
		limit, err = strconv.Atoi(s)
		if err != nil || limit < 1 || limit > store.MaxLimit {
			return 0, "", errdefs.New(errdefs.InvalidArgument, "limit must be an integer between 1 and %d", store.MaxLimit)
		}
	}
	return limit, q.Get("cursor"), nil
}

func (s *Server) createSandbox(w http.ResponseWriter, r *http.Request, p params) error {
	return s.mutate(w, r, func(body []byte, i *idem) (response, error) {
		var req lifecycle.CreateRequest
		if err := decodeJSON(r.Header.Get("Content-Type"), body, &req); err != nil {
			return response{}, err
		}
		req.Project = auth.Project(r.Context())
		build := func(sb *sandbox.Sandbox, op *sandbox.Operation) any {
			return createResponse{Sandbox: s.present(sb), Operation: op}
		}
		sb, op, err := s.engine.Create(r.Context(), req, i.render(http.StatusAccepted, operationLocation, build))
		if err != nil {
			return response{}, err
		}
		b, err := edge.Marshal(build(sb, op))
		return response{status: http.StatusAccepted, body: b, location: operationLocation(sb, op)}, err
	})
}

func (s *Server) listSandboxes(w http.ResponseWriter, r *http.Request, p params) error {
	q, err := query(r, "limit", "cursor", "state", "project")
	if err != nil {
		return err
	}
	limit, cursor, err := pageParams(q)
	if err != nil {
		return err
	}
	st := sandbox.State(q.Get("state"))
	if st != "" && !st.Valid() {
		return errdefs.New(errdefs.InvalidArgument, "unknown state %q", truncate(string(st), 32))
	}
	project, err := listProject(r, q.Get("project"))
	if err != nil {
		return err
	}
	page, err := s.engine.List(r.Context(), store.SandboxQuery{Project: project, State: st, Cursor: cursor, Limit: limit})
	if err != nil {
		return err
	}
	for i := range page.Items {
		page.Items[i] = *s.present(&page.Items[i])
	}
	return edge.JSON(w, http.StatusOK, toList(page))
}

func (s *Server) getSandbox(w http.ResponseWriter, r *http.Request, p params) error {
	id, err := sandboxID(p)
	if err == nil {
		_, err = query(r)
	}
	if err != nil {
		return err
	}
	// Read a moment ago by the access check, for this same id.
	sb, ok := loaded[*sandbox.Sandbox](r.Context())
	if !ok || sb.ID != id {
		if sb, err = s.engine.Get(r.Context(), id); err != nil {
			return err
		}
	}
	return edge.JSON(w, http.StatusOK, s.present(sb))
}

// present is a sandbox as clients see it: with its ingress token.
func (s *Server) present(sb *sandbox.Sandbox) *sandbox.Sandbox {
	if sb == nil || sb.Network == nil || s.commands == nil {
		return sb
	}
	c, n := *sb, *sb.Network
	n.IngressToken = s.commands.Signer().IngressToken(sb.ID)
	c.Network = &n
	return &c
}

// putNetwork replaces a sandbox's network policy.
func (s *Server) putNetwork(w http.ResponseWriter, r *http.Request, p params) error {
	return s.mutate(w, r, func(body []byte, i *idem) (response, error) {
		var n sandbox.Network
		id, err := sandboxJSON(r, p, body, &n)
		if err != nil {
			return response{}, err
		}
		if n.IngressToken != "" {
			return response{}, errdefs.New(errdefs.InvalidArgument, "network.ingress_token is read-only").WithDetails(map[string]any{"field": "network.ingress_token"})
		}
		sb, err := s.engine.UpdateNetwork(r.Context(), id, n)
		if err != nil {
			return response{}, err
		}
		b, err := edge.Marshal(s.present(sb))
		return response{status: http.StatusOK, body: b}, err
	})
}

// lifecycleHandler serves DELETE and the :pause, :suspend and :wake methods.
func (s *Server) lifecycleHandler(kind sandbox.OpKind) handlerFunc {
	step := func(ctx context.Context, id string, render lifecycle.Render) (*sandbox.Operation, error) {
		switch kind {
		case sandbox.OpPause:
			return s.engine.Pause(ctx, id, render)
		case sandbox.OpSuspend:
			return s.engine.Suspend(ctx, id, render)
		case sandbox.OpWake:
			return s.engine.Wake(ctx, id, render)
		}
		return s.engine.Delete(ctx, id, render)
	}
	return func(w http.ResponseWriter, r *http.Request, p params) error {
		return s.mutate(w, r, func(body []byte, i *idem) (response, error) {
			var empty struct{}
			id, err := sandboxJSON(r, p, body, &empty)
			if err != nil {
				return response{}, err
			}
			build := func(_ *sandbox.Sandbox, op *sandbox.Operation) any { return operationResponse{Operation: op} }
			op, err := step(r.Context(), id, i.render(http.StatusAccepted, operationLocation, build))
			if err != nil {
				return response{}, err
			}
			b, err := edge.Marshal(build(nil, op))
			return response{status: http.StatusAccepted, body: b, location: operationLocation(nil, op)}, err
		})
	}
}

// forkResponse is the body of 202 to :fork.
type forkResponse struct {
	Operation *sandbox.Operation `json:"operation"`
	Sandboxes []*sandbox.Sandbox `json:"sandboxes"`
}

// forkSandbox serves POST /v1/sandboxes/{id}:fork {"count": N}.
func (s *Server) forkSandbox(w http.ResponseWriter, r *http.Request, p params) error {
	return s.mutate(w, r, func(body []byte, i *idem) (response, error) {
		var req struct {
			Count *int `json:"count"`
		}
		id, err := sandboxJSON(r, p, body, &req)
		if err != nil {
			return response{}, err
		}
		count := 1
		if req.Count != nil {
			count = *req.Count
		}
		var forks []*sandbox.Sandbox
		build := func(_ *sandbox.Sandbox, op *sandbox.Operation) any {
			out := forkResponse{Operation: op}
			for _, f := range forks {
				out.Sandboxes = append(out.Sandboxes, s.present(f))
			}
			return out
		}
		render := i.render(http.StatusAccepted, operationLocation, build)
		op, made, err := s.engine.Fork(r.Context(), id, count, func(op *sandbox.Operation, f []*sandbox.Sandbox) *store.Completion {
			forks = f
			return render.Completion(nil, op)
		})
		if err != nil {
			return response{}, err
		}
		forks = made
		b, err := edge.Marshal(build(nil, op))
		return response{status: http.StatusAccepted, body: b, location: operationLocation(nil, op)}, err
	})
}

func (s *Server) getOperation(w http.ResponseWriter, r *http.Request, p params) error {
	id := p["id"]
	if !ids.Valid(ids.Operation, id) {
		return errdefs.New(errdefs.InvalidArgument, "malformed operation id %q", truncate(id, 64)).WithDetails(map[string]any{"field": "id"})
	}
	q, err := query(r, "wait")
	if err != nil {
		return err
	}
	wait, err := waitParam(q.Get("wait"))
	if err != nil {
		return err
	}
	op, ok := loaded[*sandbox.Operation](r.Context())
	if !ok || op.ID != id {
		if op, err = s.engine.Operation(r.Context(), id); err != nil {
			return err
		}
	}
	if wait > 0 && !op.State.Terminal() {
		// A long poll: answer when the operation ends, or at the wait
		// with the operation as it is then.
		ctx, cancel := context.WithTimeout(r.Context(), wait)
		done, err := s.engine.WaitOperation(ctx, id)
		cancel()
		switch {
		case err == nil:
			op = done
		case r.Context().Err() != nil:
			return r.Context().Err()
		default:
			if op, err = s.engine.Operation(r.Context(), id); err != nil {
				return err
			}
		}
	}
	return edge.JSON(w, http.StatusOK, op)
}

func (s *Server) listOperations(w http.ResponseWriter, r *http.Request, p params) error {
	q, err := query(r, "limit", "cursor", "sandbox_id", "project")
	if err != nil {
		return err
	}
	limit, cursor, err := pageParams(q)
	if err != nil {
		return err
	}
	sbID := q.Get("sandbox_id")
	if q.Has("sandbox_id") && !ids.Valid(ids.Sandbox, sbID) {
		return errdefs.New(errdefs.InvalidArgument, "malformed sandbox_id %q", truncate(sbID, 64))
	}
	project, err := listProject(r, q.Get("project"))
	if err != nil {
		return err
	}
	page, err := s.engine.Operations(r.Context(), store.OperationQuery{Project: project, SandboxID: sbID, Cursor: cursor, Limit: limit})
	if err != nil {
		return err
	}
	return edge.JSON(w, http.StatusOK, toList(page))
}

// getMetrics is a sandbox's sampled use of CPU, memory and disk, oldest
// first, optionally between start and end (RFC 3339).
func (s *Server) getMetrics(w http.ResponseWriter, r *http.Request, p params) error {
	id, err := sandboxID(p)
	if err != nil {
		return err
	}
	q, err := query(r, "start", "end")
	if err != nil {
		return err
	}
	var bounds [2]time.Time
	for i, k := range []string{"start", "end"} {
		if v := q.Get(k); v != "" {
			if bounds[i], err = time.Parse(time.RFC3339, v); err != nil {
				return errdefs.New(errdefs.InvalidArgument, "%s must be an RFC 3339 time", k).WithDetails(map[string]any{"field": k})
			}
		}
	}
	if _, err := s.engine.Get(r.Context(), id); err != nil {
		return err
	}
	items := []usage.Sample{}
	if s.usage != nil {
		items = s.usage.Series(id, bounds[0], bounds[1])
	}
	return edge.JSON(w, http.StatusOK, map[string]any{"items": items})
}

// MaxOperationWait bounds a long poll of an operation (?wait=).
const MaxOperationWait = 60 * time.Second

// waitParam reads ?wait= of GET /v1/operations/{id}: a Go duration
// ("500ms", "30s") or whole seconds, at most MaxOperationWait.
func waitParam(v string) (time.Duration, error) {
	if v == "" {
		return 0, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		n, nerr := strconv.Atoi(v)
		if nerr != nil || len(v) > 3 {
			return 0, errdefs.New(errdefs.InvalidArgument, "wait must be a duration like 30s").WithDetails(map[string]any{"field": "wait"})
		}
		d = time.Duration(n) * time.Second
	}
	if d < 0 || d > MaxOperationWait {
		return 0, errdefs.New(errdefs.InvalidArgument, "wait must be between 0 and %s", MaxOperationWait).WithDetails(map[string]any{"field": "wait"})
	}
	return d, nil
}
