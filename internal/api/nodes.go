package api

import (
	"context"
	"net/http"

	"github.com/spacesandbox/space/internal/cluster"
	"github.com/spacesandbox/space/internal/edge"
	"github.com/spacesandbox/space/internal/errdefs"
	"github.com/spacesandbox/space/internal/ids"
	"github.com/spacesandbox/space/internal/store"
)

// Nodes is the cluster's nodes as an operator manages them
// (internal/cluster); nil on a single machine, which has none.
type Nodes interface {
	ListNodes(ctx context.Context) ([]cluster.Node, error)
	GetNode(ctx context.Context, id string) (*cluster.Node, error)
	SetNodeState(ctx context.Context, id string, state store.MemberState) (*cluster.Node, error)
}

func (s *Server) listNodes(w http.ResponseWriter, r *http.Request, p params) error {
	if _, err := query(r); err != nil {
		return err
	}
	nodes := []cluster.Node{}
	if s.nodes != nil {
		var err error
		if nodes, err = s.nodes.ListNodes(r.Context()); err != nil {
			return err
		}
	}
	return edge.JSON(w, http.StatusOK, map[string]any{"nodes": nodes})
}

func (s *Server) node(r *http.Request, p params) (*cluster.Node, error) {
	id := p["id"]
	if !ids.Valid(ids.Node, id) {
		return nil, errInvalid("id", "malformed node id")
	}
	if s.nodes == nil {
		return nil, errdefs.New(errdefs.NotFound, "node %s not found (this server runs its sandboxes itself: --role all)", id)
	}
	return s.nodes.GetNode(r.Context(), id)
}

func (s *Server) getNode(w http.ResponseWriter, r *http.Request, p params) error {
	if _, err := query(r); err != nil {
		return err
	}
	n, err := s.node(r, p)
	if err != nil {
		return err
	}
	return edge.JSON(w, http.StatusOK, n)
}

// setNodeState is cordon, uncordon and drain.
func (s *Server) setNodeState(state store.MemberState) handlerFunc {
	return func(w http.ResponseWriter, r *http.Request, p params) error {
		return s.mutate(w, r, func(body []byte, i *idem) (response, error) {
			if _, err := query(r); err != nil {
				return response{}, err
			}
			if err := decodeJSON(r.Header.Get("Content-Type"), body, &struct{}{}); err != nil {
				return response{}, err
			}
			if _, err := s.node(r, p); err != nil {
				return response{}, err
			}
			n, err := s.nodes.SetNodeState(r.Context(), p["id"], state)
			if err != nil {
				return response{}, err
			}
			b, err := edge.Marshal(n)
			return response{status: http.StatusOK, body: b}, err
		})
	}
}
