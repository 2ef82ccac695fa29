package api

import (
	"net/http"

	"github.com/spacesandbox/space/internal/auth"
	"github.com/spacesandbox/space/internal/edge"
	"github.com/spacesandbox/space/internal/templates"
)

type warmPoolRequest struct {
	MinReady *int `json:"min_ready"`
}

func poolTemplate(p params) (string, error) {
	ref := p["name"] + ":" + p["tag"]
	if _, _, err := templates.ParseRef(ref); err != nil {
		return "", err
	}
	return ref, nil
}

func (s *Server) getWarmPool(w http.ResponseWriter, r *http.Request, p params) error {
	ref, err := poolTemplate(p)
	if err == nil {
		_, err = query(r)
	}
	if err != nil {
		return err
	}
	wp, err := s.engine.WarmPool(r.Context(), auth.Project(r.Context()), ref)
	if err != nil {
		return err
	}
	return edge.JSON(w, http.StatusOK, wp)
}

func (s *Server) putWarmPool(w http.ResponseWriter, r *http.Request, p params) error {
	return s.mutate(w, r, func(body []byte, i *idem) (response, error) {
		ref, err := poolTemplate(p)
		if err != nil {
			return response{}, err
		}
		if _, err := query(r); err != nil {
			return response{}, err
		}
		var req warmPoolRequest
		if err := decodeJSON(r.Header.Get("Content-Type"), body, &req); err != nil {
			return response{}, err
		}
		if req.MinReady == nil {
			return response{}, errInvalid("min_ready", "required, like {\"min_ready\": 5}")
		}
		wp, err := s.engine.SetWarmPool(r.Context(), auth.Project(r.Context()), ref, *req.MinReady)
		if err != nil {
			return response{}, err
		}
		b, err := edge.Marshal(wp)
		return response{status: http.StatusOK, body: b}, err
	})
}
