package api

import (
	"net/http"

	"github.com/spacesandbox/space/internal/commands"
	"github.com/spacesandbox/space/internal/edge"
	"github.com/spacesandbox/space/internal/errdefs"
	"github.com/spacesandbox/space/internal/ids"
)

func processID(p params) (string, error) {
	id := p["process_id"]
	if !ids.Valid(ids.Process, id) {
		return "", errdefs.New(errdefs.InvalidArgument, "malformed process id %q", truncate(id, 64)).WithDetails(map[string]any{"field": "process_id"})
	}
	return id, nil
}

func (s *Server) createCommand(w http.ResponseWriter, r *http.Request, p params) error {
	return s.mutate(w, r, func(body []byte, i *idem) (response, error) {
		var req commands.CreateRequest
		id, err := sandboxJSON(r, p, body, &req)
		if err != nil {
			return response{}, err
		}
		ctx := r.Context()
		if s.attachBase != nil {
			if u := s.attachBase(r); u != "" {
				ctx = commands.WithDataPlaneURL(ctx, u)
			}
		}
		sess, err := s.commands.Create(ctx, id, req)
		if err != nil {
			return response{}, err
		}
		b, err := edge.Marshal(sess)
		return response{status: http.StatusCreated, body: b, location: "/v1/sandboxes/" + id + "/processes/" + sess.ProcessID}, err
	})
}

func (s *Server) listProcesses(w http.ResponseWriter, r *http.Request, p params) error {
	id, err := sandboxID(p)
	if err == nil {
		_, err = query(r)
	}
	if err != nil {
		return err
	}
	ps, err := s.commands.List(r.Context(), id)
	if err != nil {
		return err
	}
	return edge.JSON(w, http.StatusOK, listResponse[commands.Process]{Items: ps})
}

func (s *Server) getProcess(w http.ResponseWriter, r *http.Request, p params) error {
	id, err := sandboxID(p)
	var pid string
	if err == nil {
		pid, err = processID(p)
	}
	if err == nil {
		_, err = query(r)
	}
	if err != nil {
		return err
	}
	proc, err := s.commands.Get(r.Context(), id, pid)
	if err != nil {
		return err
	}
	return edge.JSON(w, http.StatusOK, proc)
}

type signalRequest struct {
	Signal string `json:"signal"`
}

func (s *Server) signalProcess(w http.ResponseWriter, r *http.Request, p params) error {
	return s.mutate(w, r, func(body []byte, i *idem) (response, error) {
		var req signalRequest
		id, err := sandboxJSON(r, p, body, &req)
		if err != nil {
			return response{}, err
		}
		pid, err := processID(p)
		if err != nil {
			return response{}, err
		}
		if err := s.commands.Signal(r.Context(), id, pid, req.Signal); err != nil {
			return response{}, err
		}
		b, err := edge.Marshal(map[string]string{"process_id": pid, "signal": req.Signal})
		return response{status: http.StatusAccepted, body: b}, err
	})
}
