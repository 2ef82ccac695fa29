package api

// This file is who may do what: every authenticated route is checked here,
// once, before its handler runs — the token's rate, its role against the
// route's, and that the object the path names belongs to the token's
// project. An object of another project answers exactly as one that does
// not exist (404), so ids never leak across projects.

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/spacesandbox/space/internal/audit"
	"github.com/spacesandbox/space/internal/auth"
	"github.com/spacesandbox/space/internal/errdefs"
	"github.com/spacesandbox/space/internal/ids"
	"github.com/spacesandbox/space/internal/store"
)

// owns says what a route's {id} (or {name}:{tag}) names, whose project
// must be the token's.
type owns int

const (
	ownsNothing owns = iota
	ownsSandbox
	ownsSnapshot
	ownsOperation
	ownsTemplate // a template name: its own project's, or shared
	ownsProject  // the project itself (an owner reaches every project)
	ownsToken
)

// leastRole is the role a route needs: its own, else read-only to read and
// member to change.
func (r *Route) leastRole() store.Role {
	if r.Role != "" {
		return r.Role
	}
	if r.Method == http.MethodGet || r.Method == http.MethodHead {
		return store.RoleReadOnly
	}
	return store.RoleMember
}

// authenticate checks the bearer token, its rate and its role for route,
// and that the object route names is in its project; it returns the request
// carrying the token.
func (s *Server) authenticate(w http.ResponseWriter, r *http.Request, route *Route, p params) (*http.Request, error) {
	value, ok := auth.BearerToken(r.Header.Get("Authorization"))
	if !ok {
		return nil, errdefs.New(errdefs.Unauthenticated, "missing or invalid API token")
	}
	tok, err := s.tokens.Verify(r.Context(), value)
	if err != nil {
		return nil, err
	}
	if wait, err := s.limiter.Allow(tok); err != nil {
		w.Header().Set("Retry-After", strconv.Itoa(int(wait.Seconds())))
		return nil, err
	}
	ctx := auth.WithToken(r.Context(), tok)
	if rec := audit.From(ctx); rec != nil {
		rec.Token = tok
	}
	obj, err := s.authorize(ctx, tok, route, p)
	if err != nil {
		return nil, err
	}
	if obj != nil {
		// The handler reads it from here rather than again.
		ctx = context.WithValue(ctx, loadedKey{}, obj)
	}
	return r.WithContext(ctx), nil
}

type loadedKey struct{}

// loaded is the object the access check read for the path's id, when it is
// a T with that id's record (nil, false otherwise).
func loaded[T any](ctx context.Context) (T, bool) {
	v, ok := ctx.Value(loadedKey{}).(T)
	return v, ok
}

// authorize checks tok may use route on the object p names, and returns
// that object when it read one.
func (s *Server) authorize(ctx context.Context, tok store.Token, route *Route, p params) (any, error) {
	// The object first: a token of another project learns nothing, not
	// even that its role would not suffice.
	obj, err := s.inProject(ctx, tok, route.Owns, p)
	if err != nil {
		return nil, err
	}
	if need := route.leastRole(); tok.Role.Rank() < need.Rank() {
		return nil, errdefs.New(errdefs.PermissionDenied, "this needs a token with role %s or above; this one is %s", need, tok.Role).
			WithDetails(map[string]any{"required_role": string(need), "role": string(tok.Role)})
	}
	return obj, nil
}

// inProject answers NotFound when the object the path names belongs to
// another project, and returns the object it read (nil for none). A
// malformed id is left to the handler (its 400).
func (s *Server) inProject(ctx context.Context, tok store.Token, kind owns, p params) (any, error) {
	id := p["id"]
	switch kind {
	case ownsNothing:
		return nil, nil
	case ownsTemplate:
		return nil, s.templateVisible(ctx, tok.Project, p["name"])
	case ownsProject:
		if tok.Role == store.RoleOwner || id == tok.Project {
			return nil, nil
		}
		return nil, errdefs.New(errdefs.NotFound, "project %s not found", id)
	}
	obj, ok := s.ownedObjs[kind]
	if !ok {
		return nil, errors.New("unknown kind of owned object")
	}
	if !ids.Valid(obj.prefix, id) {
		return nil, nil
	}
	project, rec, err := obj.project(ctx, id)
	if err != nil {
		return nil, ignoreNotFound(err)
	}
	// An owner manages every project's tokens; everything else is seen
	// only by its own project.
	if project != tok.Project && !(kind == ownsToken && tok.Role == store.RoleOwner) {
		return nil, errdefs.New(errdefs.NotFound, "%s %s not found", obj.noun, id)
	}
	return rec, nil
}

// ownedObject is how to find the project of an object an id names.
type ownedObject struct {
	prefix  ids.Prefix
	noun    string
	project func(ctx context.Context, id string) (string, any, error)
}

// owned is built once, with the server.
func (s *Server) owned() map[owns]ownedObject {
	return map[owns]ownedObject{
		ownsSandbox: {ids.Sandbox, "sandbox", func(ctx context.Context, id string) (string, any, error) {
			sb, err := s.engine.Get(ctx, id)
			if err != nil {
				return "", nil, err
			}
			return sb.Project, sb, nil
		}},
		ownsSnapshot: {ids.Snapshot, "snapshot", func(ctx context.Context, id string) (string, any, error) {
			snap, err := s.engine.GetSnapshot(ctx, id)
			if err != nil {
				return "", nil, err
			}
			return snap.Project, snap, nil
		}},
		ownsOperation: {ids.Operation, "operation", func(ctx context.Context, id string) (string, any, error) {
			op, err := s.engine.Operation(ctx, id)
			if err != nil {
				return "", nil, err
			}
			return op.Project, op, nil
		}},
		ownsToken: {ids.Token, "token", func(ctx context.Context, id string) (string, any, error) {
			t, err := s.tokens.Get(ctx, id)
			return t.Project, nil, err
		}},
	}
}

// ignoreNotFound leaves a missing object to the handler, which answers it
// the same way.
func ignoreNotFound(err error) error {
	if errors.Is(err, errdefs.NotFound) {
		return nil
	}
	return err
}

// templateVisible answers NotFound for a template name another project
// built; shared names (builtin, or built before projects) are everyone's.
func (s *Server) templateVisible(ctx context.Context, project, name string) error {
	if s.owners == nil {
		return nil
	}
	owners, err := s.owners.TemplateOwners(ctx)
	if err != nil {
		return err
	}
	if o, ok := owners[name]; ok && o != project {
		return errdefs.New(errdefs.NotFound, "template %s not found", name)
	}
	return nil
}

// claimName makes template name the caller's project's to build into (or
// tag a snapshot as). A name another project built is not found; a name
// the server has that no project built (builtin, or from before projects)
// is shared, and only the server's owner builds into it.
func (s *Server) claimName(ctx context.Context, name string) error {
	if s.projects == nil {
		return nil
	}
	tok, _ := auth.TokenOf(ctx)
	project := auth.Project(ctx)
	owners, err := s.projects.TemplateOwners(ctx)
	if err != nil {
		return err
	}
	if o, ok := owners[name]; ok {
		if o != project {
			return errdefs.New(errdefs.NotFound, "template %s not found", name)
		}
		return nil
	}
	if s.templates != nil {
		list, err := s.templates.List(ctx)
		if err != nil {
			return err
		}
		for _, t := range list {
			if t.Name == name {
				if tok.Role == store.RoleOwner {
					return nil
				}
				return errdefs.New(errdefs.PermissionDenied, "template name %s is shared by every project; only the server's owner builds into it", name)
			}
		}
	}
	return s.projects.ClaimTemplate(ctx, project, name, time.Now().UTC())
}

// templateName is the name part of a template reference (name:tag).
func templateName(ref string) string {
	name, _, _ := strings.Cut(ref, ":")
	return name
}

// listProject is the project a list shows: the token's own, or — for the
// server's owner only — the one it names, or every project's ("*").
func listProject(r *http.Request, named string) (string, error) {
	own := auth.Project(r.Context())
	if named == "" || named == own {
		return own, nil
	}
	if tok, _ := auth.TokenOf(r.Context()); tok.Role != store.RoleOwner {
		return "", errdefs.New(errdefs.NotFound, "project %s not found", truncate(named, 64))
	}
	if named == "*" {
		return "", nil
	}
	return named, store.ValidProject(named)
}
