package api

import (
	"bufio"
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/spacesandbox/space/internal/auth"
	"github.com/spacesandbox/space/internal/edge"
	"github.com/spacesandbox/space/internal/errdefs"
	"github.com/spacesandbox/space/internal/httpguard"
	"github.com/spacesandbox/space/internal/ids"
	"github.com/spacesandbox/space/internal/lifecycle"
	"github.com/spacesandbox/space/internal/sandbox"
)

// followEvery is how often the stream re-reads the operations it has shown
// in flight, and maxFollowed how many it follows at once: in a cluster a
// node records an operation's outcome in the shared store, where this
// process's engine does not see it written.
const (
	followEvery = time.Second
	maxFollowed = 512
)

// eventsSettle is how long the stream lets a burst of changes gather
// before it reads them (a create writes its sandbox and operation several
// times in a few milliseconds; a client wants the last state once).
const eventsSettle = 50 * time.Millisecond

// events streams the token's project's sandbox and operation changes as
// Server-Sent Events (GET /v1/events): "ready" first, then a "sandbox" or
// "operation" event with the whole record each time one changes. It has no
// event ids: a client that reconnects reads the lists again. The stream
// ends with an "error" event when the token is revoked or expires; a
// "resync" event says changes were dropped (the client read too slowly).
func (s *Server) events(w http.ResponseWriter, r *http.Request, _ params) error {
	q, err := query(r, "sandbox_id")
	if err != nil {
		return err
	}
	only := q.Get("sandbox_id")
	if q.Has("sandbox_id") && !ids.Valid(ids.Sandbox, only) {
		return errdefs.New(errdefs.InvalidArgument, "malformed sandbox_id %q", truncate(only, 64))
	}
	tok, _ := auth.TokenOf(r.Context())
	ctx := r.Context()
	if only != "" {
		// Another project's sandbox answers as one that does not exist.
		if sb, err := s.engine.Get(ctx, only); err != nil || sb.Project != tok.Project || sb.Pool != "" {
			return errdefs.New(errdefs.NotFound, "sandbox %s not found", only)
		}
	}
	httpguard.Exempt(ctx) // an authenticated stream: not held to the connection cap
	changes := s.engine.Watch(ctx)

	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	bw := bufio.NewWriterSize(w, 32<<10)
	out := &sseWriter{w: bw}
	flush := func() error {
		if err := bw.Flush(); err != nil {
			return err
		}
		return rc.Flush()
	}
	out.jsonEvent("", "ready", map[string]any{"project": tok.Project, "keepalive_seconds": int(s.EventsKeepalive.Seconds())})
	if err := flush(); err != nil {
		return nil
	}
	// stillValid ends the stream of a token revoked or expired since it
	// opened (checked at every batch and keepalive).
	stillValid := func() bool {
		if s.tokens == nil || tok.ID == "" {
			return true
		}
		if _, err := s.tokens.Active(ctx, tok.ID); err != nil {
			if errors.Is(err, errdefs.Unauthenticated) {
				kind, msg, _ := errdefs.Public(err)
				out.jsonEvent("", "error", map[string]any{"code": kind.Code, "message": msg})
				flush()
			}
			return false
		}
		return true
	}
	keepalive := time.NewTicker(s.EventsKeepalive)
	defer keepalive.Stop()
	follow := time.NewTicker(followEvery)
	defer follow.Stop()
	inFlight := map[string]sandbox.OpState{} // operations shown, not yet ended
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-keepalive.C:
			if !stillValid() {
				return nil
			}
			out.ping()
		case <-follow.C:
			if len(inFlight) == 0 {
				continue
			}
			var moved []lifecycle.Change
			read := map[string]*sandbox.Operation{}
			for id, was := range inFlight {
				op, err := s.engine.Operation(ctx, id)
				if err != nil {
					delete(inFlight, id)
				} else if op.State != was {
					moved, read[id] = append(moved, lifecycle.Change{Operation: id}), op
				}
			}
			if len(moved) == 0 {
				continue
			}
			if !stillValid() {
				return nil
			}
			s.writeChanges(ctx, out, tok.Project, only, moved, read, inFlight)
		case <-changes.C():
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(eventsSettle):
			}
			if !stillValid() {
				return nil
			}
			taken, lost := changes.Take()
			if lost {
				out.jsonEvent("", "resync", map[string]any{"message": "this stream fell behind and changes were dropped: read the lists again"})
			}
			s.writeChanges(ctx, out, tok.Project, only, taken, nil, inFlight)
		}
		if err := flush(); err != nil {
			return nil
		}
	}
}

// writeChanges writes the current record of each change that belongs to
// project (and to sandbox only, when set); records that vanished or are
// not the client's are skipped. Operations in read were read a moment ago
// and are not read again. It keeps inFlight, the operations written that
// have not ended, with the state they were shown in.
func (s *Server) writeChanges(ctx context.Context, out *sseWriter, project, only string, cs []lifecycle.Change, read map[string]*sandbox.Operation, inFlight map[string]sandbox.OpState) {
	seen := map[string]bool{}
	for _, c := range cs {
		if c.Operation != "" && !seen[c.Operation] {
			seen[c.Operation] = true
			op, ok := read[c.Operation]
			var err error
			if !ok {
				op, err = s.engine.Operation(ctx, c.Operation)
			}
			if err != nil {
				delete(inFlight, c.Operation)
			}
			if err == nil && op.Project == project && (only == "" || op.SandboxID == only) {
				out.jsonEvent("", "operation", op)
				if op.State.Terminal() {
					delete(inFlight, op.ID)
				} else if _, ok := inFlight[op.ID]; ok || len(inFlight) < maxFollowed {
					inFlight[op.ID] = op.State
				}
				if c.Sandbox == "" && op.SandboxID != "" && !seen[op.SandboxID] {
					c.Sandbox = op.SandboxID // an operation's end changes its sandbox
				}
			}
		}
		if c.Sandbox != "" && !seen[c.Sandbox] && (only == "" || c.Sandbox == only) {
			seen[c.Sandbox] = true
			sb, err := s.engine.Get(ctx, c.Sandbox)
			if err == nil && sb.Project == project && sb.Pool == "" {
				out.jsonEvent("", "sandbox", s.present(sb))
			}
		}
	}
}

// whoami describes the token making the request (GET /v1/token): its id,
// name, project, role and expiry, never its value.
func (s *Server) whoami(w http.ResponseWriter, r *http.Request, _ params) error {
	if _, err := query(r); err != nil {
		return err
	}
	tok, _ := auth.TokenOf(r.Context())
	return edge.JSON(w, http.StatusOK, TokenOut(tok))
}
