package api

import (
	"errors"
	"io"
	"net/http"
	"net/url"
	"path"
	"strconv"

	"github.com/spacesandbox/space/internal/edge"
	"github.com/spacesandbox/space/internal/errdefs"
	"github.com/spacesandbox/space/internal/sandboxio"
)

// MaxFileSize bounds one file upload.
const MaxFileSize int64 = 16 << 30

// filePath checks a path query parameter: absolute, no NUL. The agent
// resolves it inside the sandbox; nothing on the host is opened by it.
func filePath(v string, field string) (string, error) {
	if v == "" || v[0] != '/' || len(v) > 4096 {
		return "", errdefs.New(errdefs.InvalidArgument, "%s must be an absolute path", field).WithDetails(map[string]any{"field": field})
	}
	for i := 0; i < len(v); i++ {
		if v[i] == 0 {
			return "", errdefs.New(errdefs.InvalidArgument, "%s must not contain NUL", field).WithDetails(map[string]any{"field": field})
		}
	}
	return path.Clean(v), nil
}

func parseMode(s string, def uint32) (uint32, error) {
	if s == "" {
		return def, nil
	}
	m, err := strconv.ParseUint(s, 8, 32)
	if err != nil || m > 0o7777 {
		return 0, errdefs.New(errdefs.InvalidArgument, "mode must be octal permission bits, like 0644").WithDetails(map[string]any{"field": "mode"})
	}
	return uint32(m), nil
}

// fileTarget checks a files request — sandbox id, query parameters (only
// allowed, always with "path"), path — and finds the running sandbox's agent.
func (s *Server) fileTarget(r *http.Request, p params, allowed ...string) (*sandboxio.Agent, string, url.Values, error) {
	id, err := sandboxID(p)
	if err != nil {
		return nil, "", nil, err
	}
	q, err := query(r, append(allowed, "path")...)
	if err != nil {
		return nil, "", nil, err
	}
	name, err := filePath(q.Get("path"), "path")
	if err != nil {
		return nil, "", nil, err
	}
	ag, _, err := s.commands.Agents().Agent(r.Context(), id)
	if err != nil {
		return nil, "", nil, err
	}
	return ag, name, q, nil
}

func (s *Server) readFile(w http.ResponseWriter, r *http.Request, p params) error {
	ag, name, _, err := s.fileTarget(r, p)
	if err != nil {
		return err
	}
	f, err := ag.Open(r.Context(), name)
	if err != nil {
		return err
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	if f.Size >= 0 { // else chunked: a /proc file's size is known at its end
		w.Header().Set("Content-Length", strconv.FormatInt(f.Size, 10))
	}
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
	if r.Method == http.MethodHead {
		return nil
	}
	// Streamed in chunks: the server never holds more than one in memory.
	if n, err := io.Copy(w, f); err != nil {
		s.log.Warn("file read ended early", "sandbox_id", p["id"], "path", name, "sent", n, "size", f.Size, "err", err)
		panic(http.ErrAbortHandler) // the client sees a truncated body, never a short "success"
	}
	return nil
}

func (s *Server) writeFile(w http.ResponseWriter, r *http.Request, p params) error {
	if r.ContentLength > MaxFileSize {
		return errdefs.New(errdefs.TooLarge, "file exceeds %d bytes", MaxFileSize)
	}
	ag, name, q, err := s.fileTarget(r, p, "mode")
	if err != nil {
		return err
	}
	mode, err := parseMode(q.Get("mode"), 0o644)
	if err != nil {
		return err
	}
	body := http.MaxBytesReader(w, r.Body, MaxFileSize)
	e, err := ag.WriteFile(r.Context(), sandboxio.Write{Path: name, Mode: mode}, body)
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			err = errdefs.New(errdefs.TooLarge, "file exceeds %d bytes", MaxFileSize)
		}
		return err
	}
	return edge.JSON(w, http.StatusOK, e)
}

func (s *Server) deleteFile(w http.ResponseWriter, r *http.Request, p params) error {
	return s.mutate(w, r, func(body []byte, i *idem) (response, error) {
		ag, name, q, err := s.fileTarget(r, p, "recursive")
		if err != nil {
			return response{}, err
		}
		recursive := false
		switch q.Get("recursive") {
		case "", "false":
		case "true":
			recursive = true
		default:
			return response{}, errdefs.New(errdefs.InvalidArgument, "recursive must be true or false")
		}
		if len(body) > 0 {
			return response{}, errdefs.New(errdefs.InvalidArgument, "DELETE takes no body")
		}
		if err := ag.Remove(r.Context(), name, recursive); err != nil {
			return response{}, err
		}
		b, err := edge.Marshal(map[string]string{"path": name})
		return response{status: http.StatusOK, body: b}, err
	})
}

func (s *Server) listFiles(w http.ResponseWriter, r *http.Request, p params) error {
	ag, name, q, err := s.fileTarget(r, p, "depth")
	if err != nil {
		return err
	}
	depth := 1
	if d := q.Get("depth"); d != "" {
		if depth, err = strconv.Atoi(d); err != nil || depth < 1 || depth > 16 {
			return errdefs.New(errdefs.InvalidArgument, "depth must be an integer between 1 and 16")
		}
	}
	l, err := ag.List(r.Context(), name, depth)
	if err != nil {
		return err
	}
	return edge.JSON(w, http.StatusOK, l)
}

func (s *Server) statFile(w http.ResponseWriter, r *http.Request, p params) error {
	ag, name, _, err := s.fileTarget(r, p)
	if err != nil {
		return err
	}
	e, err := ag.Stat(r.Context(), name)
	if err != nil {
		return err
	}
	return edge.JSON(w, http.StatusOK, e)
}

type mkdirRequest struct {
	Path string `json:"path"`
	Mode string `json:"mode,omitempty"`
}

type moveRequest struct {
	From string `json:"from"`
	To   string `json:"to"`
}

func (s *Server) mkdirFile(w http.ResponseWriter, r *http.Request, p params) error {
	return s.mutate(w, r, func(body []byte, i *idem) (response, error) {
		var req mkdirRequest
		id, err := sandboxJSON(r, p, body, &req)
		if err != nil {
			return response{}, err
		}
		name, err := filePath(req.Path, "path")
		if err != nil {
			return response{}, err
		}
		mode, err := parseMode(req.Mode, 0o755)
		if err != nil {
			return response{}, err
		}
		ag, _, err := s.commands.Agents().Agent(r.Context(), id)
		if err != nil {
			return response{}, err
		}
		e, err := ag.MakeDir(r.Context(), sandboxio.Mkdir{Path: name, Mode: mode})
		if err != nil {
			return response{}, err
		}
		b, err := edge.Marshal(e)
		return response{status: http.StatusOK, body: b}, err
	})
}

func (s *Server) moveFile(w http.ResponseWriter, r *http.Request, p params) error {
	return s.mutate(w, r, func(body []byte, i *idem) (response, error) {
		var req moveRequest
		id, err := sandboxJSON(r, p, body, &req)
		if err != nil {
			return response{}, err
		}
		from, err := filePath(req.From, "from")
		if err != nil {
			return response{}, err
		}
		to, err := filePath(req.To, "to")
		if err != nil {
			return response{}, err
		}
		ag, _, err := s.commands.Agents().Agent(r.Context(), id)
		if err != nil {
			return response{}, err
		}
		e, err := ag.Move(r.Context(), from, to)
		if err != nil {
			return response{}, err
		}
		b, err := edge.Marshal(e)
		return response{status: http.StatusOK, body: b}, err
	})
}
