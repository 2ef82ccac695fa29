package api

// Projects, their limits, quotas and usage; tokens; the audit log.

import (
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/spacesandbox/space/internal/auth"
	"github.com/spacesandbox/space/internal/edge"
	"github.com/spacesandbox/space/internal/errdefs"
	"github.com/spacesandbox/space/internal/store"
)

func (s *Server) needProjects() error {
	if s.projects == nil {
		return errdefs.New(errdefs.Unavailable, "projects are not configured on this server")
	}
	return nil
}

// projectView is a project as the API shows it: with what is enforced.
type projectView struct {
	*store.Project
	Effective store.Quotas `json:"effective_quotas"`
}

func view(p *store.Project) projectView { return projectView{Project: p, Effective: p.Effective()} }

func (s *Server) listProjects(w http.ResponseWriter, r *http.Request, p params) error {
	if err := s.needProjects(); err != nil {
		return err
	}
	if _, err := query(r); err != nil {
		return err
	}
	list, err := s.projects.ListProjects(r.Context())
	if err != nil {
		return err
	}
	out := make([]projectView, 0, len(list))
	for i := range list {
		out = append(out, view(&list[i]))
	}
	return edge.JSON(w, http.StatusOK, listResponse[projectView]{Items: out})
}

func (s *Server) createProject(w http.ResponseWriter, r *http.Request, p params) error {
	return s.mutate(w, r, func(body []byte, i *idem) (response, error) {
		if err := s.needProjects(); err != nil {
			return response{}, err
		}
		if _, err := query(r); err != nil {
			return response{}, err
		}
		var req struct {
			Name   string        `json:"name"`
			Limits *store.Quotas `json:"limits"`
			Quotas *store.Quotas `json:"quotas"`
		}
		if err := decodeJSON(r.Header.Get("Content-Type"), body, &req); err != nil {
			return response{}, err
		}
		if err := store.ValidProject(req.Name); err != nil {
			return response{}, errInvalid("name", err.Error())
		}
		proj := &store.Project{Name: req.Name, CreatedAt: time.Now().UTC()}
		for _, q := range []*store.Quotas{req.Limits, req.Quotas} {
			if q != nil {
				if err := q.Validate(); err != nil {
					return response{}, err
				}
			}
		}
		if req.Limits != nil {
			proj.Limits = *req.Limits
		}
		if req.Quotas != nil {
			proj.Quotas = *req.Quotas
		}
		if err := s.projects.CreateProject(r.Context(), proj); err != nil {
			return response{}, err
		}
		b, err := edge.Marshal(view(proj))
		return response{status: http.StatusCreated, body: b, location: "/v1/projects/" + proj.Name}, err
	})
}

// projectNamed reads the project a GET's path names (no query allowed).
func (s *Server) projectNamed(r *http.Request, p params) (*store.Project, error) {
	if err := s.needProjects(); err != nil {
		return nil, err
	}
	if _, err := query(r); err != nil {
		return nil, err
	}
	return s.projects.GetProject(r.Context(), p["id"])
}

func (s *Server) getProject(w http.ResponseWriter, r *http.Request, p params) error {
	proj, err := s.projectNamed(r, p)
	if err != nil {
		return err
	}
	return edge.JSON(w, http.StatusOK, view(proj))
}

func (s *Server) deleteProject(w http.ResponseWriter, r *http.Request, p params) error {
	return s.mutate(w, r, func(body []byte, i *idem) (response, error) {
		if err := s.needProjects(); err != nil {
			return response{}, err
		}
		if _, err := query(r); err != nil {
			return response{}, err
		}
		if err := s.projects.DeleteProject(r.Context(), p["id"]); err != nil {
			return response{}, err
		}
		return response{status: http.StatusNoContent}, nil
	})
}

// putLimits (the server's owner) and putQuotas (the project's admins)
// replace a project's limits or quotas; quotas must stay within limits.
func (s *Server) putLimits(w http.ResponseWriter, r *http.Request, p params) error {
	return s.putBounds(w, r, p, true)
}

func (s *Server) putQuotas(w http.ResponseWriter, r *http.Request, p params) error {
	return s.putBounds(w, r, p, false)
}

func (s *Server) putBounds(w http.ResponseWriter, r *http.Request, p params, limits bool) error {
	return s.mutate(w, r, func(body []byte, i *idem) (response, error) {
		if err := s.needProjects(); err != nil {
			return response{}, err
		}
		if _, err := query(r); err != nil {
			return response{}, err
		}
		var q store.Quotas
		if err := decodeJSON(r.Header.Get("Content-Type"), body, &q); err != nil {
			return response{}, err
		}
		if err := q.Validate(); err != nil {
			return response{}, err
		}
		proj, err := s.projects.UpdateProject(r.Context(), p["id"], func(proj *store.Project) error {
			if limits {
				proj.Limits = q
				return nil
			}
			if err := q.Within(proj.Limits); err != nil {
				return err
			}
			proj.Quotas = q
			return nil
		})
		if err != nil {
			return response{}, err
		}
		b, err := edge.Marshal(view(proj))
		return response{status: http.StatusOK, body: b}, err
	})
}

func (s *Server) getUsage(w http.ResponseWriter, r *http.Request, p params) error {
	proj, err := s.projectNamed(r, p)
	if err != nil {
		return err
	}
	u, err := s.projects.ProjectUsage(r.Context(), p["id"])
	if err != nil {
		return err
	}
	return edge.JSON(w, http.StatusOK, map[string]any{"project": proj.Name, "usage": u, "quotas": proj.Effective()})
}

// TokenView is a token as the API (and the CLI) shows it: never its hash
// or value.
type TokenView struct {
	ID         string     `json:"id"`
	Name       string     `json:"name"`
	Project    string     `json:"project"`
	Role       store.Role `json:"role"`
	CreatedAt  time.Time  `json:"created_at"`
	ExpiresAt  *time.Time `json:"expires_at"`
	RevokedAt  *time.Time `json:"revoked_at"`
	RatePerSec float64    `json:"rate_per_sec,omitempty"`
	Burst      int        `json:"burst,omitempty"`
}

// TokenOut is t as the API shows it.
func TokenOut(t store.Token) TokenView {
	return TokenView{ID: t.ID, Name: t.Name, Project: t.Project, Role: t.Role, CreatedAt: t.CreatedAt, ExpiresAt: t.ExpiresAt,
		RevokedAt: t.RevokedAt, RatePerSec: t.RatePerSec, Burst: t.Burst}
}

// tokenProject is the project a token request names: an admin's own; an
// owner's, or any it names.
func tokenProject(r *http.Request, named string) (string, error) {
	tok, _ := auth.TokenOf(r.Context())
	if named == "" || named == tok.Project {
		return tok.Project, nil
	}
	if tok.Role != store.RoleOwner {
		return "", errdefs.New(errdefs.NotFound, "project %s not found", named)
	}
	return named, nil
}

func (s *Server) listTokens(w http.ResponseWriter, r *http.Request, p params) error {
	q, err := query(r, "project")
	if err != nil {
		return err
	}
	project, err := tokenProject(r, q.Get("project"))
	if err != nil {
		return err
	}
	list, err := s.tokens.List(r.Context(), project)
	if err != nil {
		return err
	}
	out := make([]TokenView, 0, len(list))
	for _, t := range list {
		out = append(out, TokenOut(t))
	}
	return edge.JSON(w, http.StatusOK, listResponse[TokenView]{Items: out})
}

func (s *Server) getToken(w http.ResponseWriter, r *http.Request, p params) error {
	if _, err := query(r); err != nil {
		return err
	}
	t, err := s.tokens.Get(r.Context(), p["id"])
	if err != nil {
		return err
	}
	return edge.JSON(w, http.StatusOK, TokenOut(t))
}

// ParseTTL reads a token lifetime: a Go duration ("12h") or a number of
// days ("30d").
func ParseTTL(v string) (time.Duration, error) {
	if v == "" {
		return 0, nil
	}
	if d, ok := strings.CutSuffix(v, "d"); ok {
		n, err := strconv.Atoi(d)
		if err != nil || n <= 0 || n > int(auth.MaxTTL/(24*time.Hour)) {
			return 0, errInvalid("expires_in", "a positive number of days (30d) or a duration (12h)")
		}
		return time.Duration(n) * 24 * time.Hour, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		return 0, errInvalid("expires_in", "a positive number of days (30d) or a duration (12h)")
	}
	return d, nil
}

func (s *Server) createToken(w http.ResponseWriter, r *http.Request, p params) error {
	return s.mutate(w, r, func(body []byte, i *idem) (response, error) {
		if _, err := query(r); err != nil {
			return response{}, err
		}
		var req struct {
			Name       string     `json:"name"`
			Project    string     `json:"project"`
			Role       store.Role `json:"role"`
			ExpiresIn  string     `json:"expires_in"`
			RatePerSec float64    `json:"rate_per_sec"`
			Burst      int        `json:"burst"`
			Format     string     `json:"format"`
		}
		if err := decodeJSON(r.Header.Get("Content-Type"), body, &req); err != nil {
			return response{}, err
		}
		project, err := tokenProject(r, req.Project)
		if err != nil {
			return response{}, err
		}
		me, _ := auth.TokenOf(r.Context())
		if req.Role == "" {
			req.Role = store.RoleMember
		}
		if req.Role.Rank() == 0 {
			return response{}, errInvalid("role", "owner, admin, member or read-only")
		}
		// Nobody hands out more than they hold; only an owner makes owners.
		if req.Role.Rank() > me.Role.Rank() {
			return response{}, errdefs.New(errdefs.PermissionDenied, "a %s token cannot make a %s token", me.Role, req.Role)
		}
		if req.Format != "" && req.Format != "space" && req.Format != "e2b" {
			return response{}, errInvalid("format", `"space" (default) or "e2b"`)
		}
		ttl, err := ParseTTL(req.ExpiresIn)
		if err != nil {
			return response{}, err
		}
		tok, value, err := s.tokens.CreateSpec(r.Context(), auth.Spec{Name: req.Name, Project: project, Role: req.Role, TTL: ttl,
			RatePerSec: req.RatePerSec, Burst: req.Burst, E2BFormat: req.Format == "e2b"})
		if err != nil {
			return response{}, err
		}
		// The value is in this one response only: a retry with the same
		// Idempotency-Key replays the token without it (tokens are never
		// stored but hashed), so revoke it and make another.
		b, err := edge.Marshal(map[string]any{"token": TokenOut(tok), "value": value})
		if err != nil {
			return response{}, err
		}
		kept, err := edge.Marshal(map[string]any{"token": TokenOut(tok), "value": nil})
		return response{status: http.StatusCreated, body: b, stored: kept, location: "/v1/tokens/" + tok.ID}, err
	})
}

func (s *Server) revokeToken(w http.ResponseWriter, r *http.Request, p params) error {
	return s.mutate(w, r, func(body []byte, i *idem) (response, error) {
		if _, err := query(r); err != nil {
			return response{}, err
		}
		me, _ := auth.TokenOf(r.Context())
		if t, err := s.tokens.Get(r.Context(), p["id"]); err == nil && t.Role.Rank() > me.Role.Rank() {
			return response{}, errdefs.New(errdefs.PermissionDenied, "a %s token cannot revoke a %s token", me.Role, t.Role)
		}
		if err := s.tokens.Revoke(r.Context(), p["id"]); err != nil {
			return response{}, err
		}
		return response{status: http.StatusNoContent}, nil
	})
}

func (s *Server) listAudit(w http.ResponseWriter, r *http.Request, p params) error {
	if err := s.needProjects(); err != nil {
		return err
	}
	q, err := query(r, "limit", "cursor", "project", "token_id", "action", "since")
	if err != nil {
		return err
	}
	limit, cursor, err := pageParams(q)
	if err != nil {
		return err
	}
	me, _ := auth.TokenOf(r.Context())
	aq := store.AuditQuery{Project: me.Project, TokenID: q.Get("token_id"), Action: q.Get("action"), Cursor: cursor, Limit: limit}
	if named := q.Get("project"); me.Role == store.RoleOwner {
		aq.Project = named // an owner reads every project's, or one's
	} else if named != "" && named != me.Project {
		return errdefs.New(errdefs.NotFound, "project %s not found", named)
	}
	if v := q.Get("since"); v != "" {
		if aq.Since, err = time.Parse(time.RFC3339Nano, v); err != nil {
			return errInvalid("since", "an RFC 3339 time")
		}
	}
	if len(aq.Action) > 200 {
		return errInvalid("action", "at most 200 characters")
	}
	page, err := s.projects.ListAudit(r.Context(), aq)
	if err != nil {
		return err
	}
	return edge.JSON(w, http.StatusOK, toList(page))
}
