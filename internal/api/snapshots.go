package api

import (
	"bytes"
	"net/http"

	"github.com/spacesandbox/space/internal/auth"
	"github.com/spacesandbox/space/internal/edge"
	"github.com/spacesandbox/space/internal/errdefs"
	"github.com/spacesandbox/space/internal/ids"
	"github.com/spacesandbox/space/internal/sandbox"
	"github.com/spacesandbox/space/internal/store"
)

// snapshotResponse is the body of 202 to POST …/snapshots.
type snapshotResponse struct {
	Snapshot  *sandbox.Snapshot  `json:"snapshot"`
	Operation *sandbox.Operation `json:"operation"`
}

// createSnapshot serves POST /v1/sandboxes/{id}/snapshots {"name": …}.
func (s *Server) createSnapshot(w http.ResponseWriter, r *http.Request, p params) error {
	return s.mutate(w, r, func(body []byte, i *idem) (response, error) {
		var req struct {
			Name string `json:"name"`
		}
		id, err := sandboxJSON(r, p, body, &req)
		if err != nil {
			return response{}, err
		}
		var snap *sandbox.Snapshot
		build := func(_ *sandbox.Sandbox, op *sandbox.Operation) any {
			return snapshotResponse{Snapshot: snap, Operation: op}
		}
		render := i.render(http.StatusAccepted, operationLocation, build)
		op, made, err := s.engine.CreateSnapshot(r.Context(), id, req.Name, func(op *sandbox.Operation, sn *sandbox.Snapshot) *store.Completion {
			snap = sn
			return render.Completion(nil, op)
		})
		if err != nil {
			return response{}, err
		}
		snap = made
		b, err := edge.Marshal(build(nil, op))
		return response{status: http.StatusAccepted, body: b, location: operationLocation(nil, op)}, err
	})
}

func snapshotID(p params) (string, error) {
	id := p["id"]
	if !ids.Valid(ids.Snapshot, id) {
		return "", errdefs.New(errdefs.InvalidArgument, "malformed snapshot id %q", truncate(id, 64)).WithDetails(map[string]any{"field": "id"})
	}
	return id, nil
}

func (s *Server) getSnapshot(w http.ResponseWriter, r *http.Request, p params) error {
	id, err := snapshotID(p)
	if err == nil {
		_, err = query(r)
	}
	if err != nil {
		return err
	}
	snap, err := s.engine.GetSnapshot(r.Context(), id)
	if err != nil {
		return err
	}
	return edge.JSON(w, http.StatusOK, snap)
}

func (s *Server) listSnapshots(w http.ResponseWriter, r *http.Request, p params) error {
	q, err := query(r, "limit", "cursor", "sandbox_id")
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
	page, err := s.engine.ListSnapshots(r.Context(), store.SnapshotQuery{Project: auth.Project(r.Context()), SandboxID: sbID, Cursor: cursor, Limit: limit})
	if err != nil {
		return err
	}
	return edge.JSON(w, http.StatusOK, toList(page))
}

// deleteSnapshot serves DELETE /v1/snapshots/{id}: 204, the image gone.
func (s *Server) deleteSnapshot(w http.ResponseWriter, r *http.Request, p params) error {
	return s.mutate(w, r, func(body []byte, i *idem) (response, error) {
		id, err := snapshotID(p)
		if err == nil {
			_, err = query(r)
		}
		if err == nil && len(body) > 0 {
			err = errdefs.New(errdefs.InvalidArgument, "DELETE takes no body")
		}
		if err != nil {
			return response{}, err
		}
		if err := s.engine.DeleteSnapshot(r.Context(), id); err != nil {
			return response{}, err
		}
		return response{status: http.StatusNoContent}, nil
	})
}

// tagSnapshot serves POST /v1/snapshots/{id}:tag {"template": "name:tag"}
// (tag) and POST /v1/snapshots/{id}:untag (no body): 200 with the
// snapshot.
func (s *Server) tagSnapshot(tag bool) handlerFunc {
	return func(w http.ResponseWriter, r *http.Request, p params) error {
		return s.mutate(w, r, func(body []byte, i *idem) (response, error) {
			id, err := snapshotID(p)
			if err == nil {
				_, err = query(r)
			}
			var req struct {
				Template string `json:"template"`
			}
			if err == nil && tag {
				err = decodeJSON(r.Header.Get("Content-Type"), body, &req)
				if err == nil && req.Template == "" {
					err = errInvalid("template", "required: the template reference (name:tag) to start from the snapshot")
				}
			} else if err == nil && len(bytes.TrimSpace(body)) > 0 && string(bytes.TrimSpace(body)) != "{}" {
				err = errdefs.New(errdefs.InvalidArgument, ":untag takes no body")
			}
			if err != nil {
				return response{}, err
			}
			if tag {
				if err := s.claimName(r.Context(), templateName(req.Template)); err != nil {
					return response{}, err
				}
			}
			snap, err := s.engine.TagSnapshot(r.Context(), id, req.Template)
			if err != nil {
				return response{}, err
			}
			b, err := edge.Marshal(snap)
			return response{status: http.StatusOK, body: b}, err
		})
	}
}
