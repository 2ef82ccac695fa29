package ecw

import (
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/spacesandbox/space/internal/auth"
	"github.com/spacesandbox/space/internal/edge"
	"github.com/spacesandbox/space/internal/errdefs"
	"github.com/spacesandbox/space/internal/ids"
	"github.com/spacesandbox/space/internal/sandbox"
	"github.com/spacesandbox/space/internal/store"
)

// snapshotInfo is E2B's SnapshotInfo. A SPACE snapshot id is what
// Sandbox.create takes as the template to start from it.
type snapshotInfo struct {
	SnapshotID string   `json:"snapshotID"`
	Names      []string `json:"names"`
}

func infoOf(s *sandbox.Snapshot) snapshotInfo {
	names := []string{s.ID}
	if s.Name != "" {
		names = []string{s.Name}
	}
	return snapshotInfo{SnapshotID: s.ID, Names: names}
}

// createSnapshot is E2B's POST /sandboxes/{id}/snapshots: answered once the
// snapshot is ready.
func (s *Server) createSnapshot(w http.ResponseWriter, r *http.Request) error {
	var body struct {
		Name string `json:"name"`
	}
	if err := decodeBody(w, r, &body); err != nil {
		return err
	}
	sb, err := s.sandbox(r)
	if err != nil {
		return err
	}
	if e2bState(sb.State) != "running" {
		return errdefs.New(errdefs.Conflict, "Sandbox %q is in %s state", sb.ID, e2bState(sb.State))
	}
	op, snap, err := s.cfg.Engine.CreateSnapshot(r.Context(), sb.ID, body.Name, nil)
	if err != nil {
		return conflict(err)
	}
	if err := s.await(r.Context(), op); err != nil {
		return err
	}
	s.log.Info("E2B snapshot created", "sandbox_id", sb.ID, "snapshot_id", snap.ID, "operation_id", op.ID)
	return edge.JSON(w, http.StatusCreated, infoOf(snap))
}

// listSnapshots is E2B's GET /snapshots: sandboxID and name filters, limit
// and nextToken paging (X-Next-Token).
func (s *Server) listSnapshots(w http.ResponseWriter, r *http.Request) error {
	vals, err := url.ParseQuery(r.URL.RawQuery)
	if err != nil {
		return errdefs.New(errdefs.InvalidArgument, "malformed query string")
	}
	q := store.SnapshotQuery{Project: auth.Project(r.Context()), Limit: 100}
	for k, v := range vals {
		if len(v) != 1 {
			return errdefs.New(errdefs.InvalidArgument, "%s: give it once", k)
		}
		switch k {
		case "sandboxID":
			q.SandboxID, _ = shortID(v[0])
			if !ids.Valid(ids.Sandbox, q.SandboxID) {
				return edge.JSON(w, http.StatusOK, []snapshotInfo{}) // no such sandbox: none of its snapshots
			}
		case "name":
			// "name", "team/name" or "name:tag": SPACE snapshots have one name, no tags.
			n := v[0]
			if i := strings.LastIndexByte(n, '/'); i >= 0 {
				n = n[i+1:]
			}
			n, _, _ = strings.Cut(n, ":")
			if ids.Valid(ids.Snapshot, n) {
				snap, err := s.cfg.Engine.GetSnapshot(r.Context(), n)
				if err != nil || snap.State != sandbox.SnapshotReady || snap.Project != q.Project {
					return edge.JSON(w, http.StatusOK, []snapshotInfo{})
				}
				return edge.JSON(w, http.StatusOK, []snapshotInfo{infoOf(snap)})
			}
			q.Name = n
		case "limit":
			n, err := strconv.Atoi(v[0])
			if err != nil || n < 1 || n > 100 {
				return errdefs.New(errdefs.InvalidArgument, "limit must be between 1 and 100")
			}
			q.Limit = n
		case "nextToken":
			q.Cursor = v[0]
		default:
			return errdefs.New(errdefs.InvalidArgument, "unknown query parameter %q", k)
		}
	}
	page, err := s.cfg.Engine.ListSnapshots(r.Context(), q)
	if err != nil {
		return err
	}
	out := []snapshotInfo{}
	for i := range page.Items {
		if page.Items[i].State == sandbox.SnapshotReady {
			out = append(out, infoOf(&page.Items[i]))
		}
	}
	if page.Next != "" {
		w.Header().Set("X-Next-Token", page.Next)
	}
	return edge.JSON(w, http.StatusOK, out)
}

// deleteTemplate is E2B's DELETE /templates/{id}, which the SDKs use to
// delete a snapshot. SPACE templates are not deleted through this layer.
func (s *Server) deleteTemplate(w http.ResponseWriter, r *http.Request) error {
	id := r.PathValue("templateID")
	if !strings.HasPrefix(id, string(ids.Snapshot)) {
		return errdefs.New(errdefs.InvalidArgument, "only snapshots can be deleted through the E2B API; use `space template rm` for templates")
	}
	if !ids.Valid(ids.Snapshot, id) {
		return errdefs.New(errdefs.NotFound, "snapshot %q not found", id)
	}
	if snap, err := s.cfg.Engine.GetSnapshot(r.Context(), id); err == nil && snap.Project != auth.Project(r.Context()) {
		return errdefs.New(errdefs.NotFound, "snapshot %q not found", id)
	}
	if err := s.cfg.Engine.DeleteSnapshot(r.Context(), id); err != nil {
		return conflict(err)
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}
