// Package edge is what every SPACE listener does around its handlers — the
// control plane, the data plane and the E2B layer alike: handlers return their
// failure and the edge writes it in the listener's error format (logging what
// is the server's fault), answers unknown paths and wrong methods, bounds
// request bodies, turns a panic into a 500, and records each request's route,
// status and latency.
package edge

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"runtime/debug"
	"strings"
	"time"

	"github.com/spacesandbox/space/internal/errdefs"
	"github.com/spacesandbox/space/internal/metrics"
)

// MaxJSONBody bounds every JSON request body, on every listener.
const MaxJSONBody = 1 << 20

// Render turns an error into a listener's error body and status. Errors
// without a kind must never show their text (errdefs.Public).
type Render func(err error) (status int, body []byte)

// Edge serves one listener's requests.
type Edge struct {
	// Listener names the listener in metrics and logs ("api", "data", "ecw").
	Listener string
	Metrics  *metrics.Metrics // nil: none recorded
	Log      *slog.Logger
	Render   Render
	// Finished, when set, is told of every request once it is answered:
	// its status and the error its handler returned (nil for none); r is
	// the request as it came in (its context holds what the listener put
	// there before calling Serve).
	Finished func(r *http.Request, status int, err error)
}

type requestIDKey struct{}

// RequestID is the id the edge gave the request (its X-Request-Id).
func RequestID(ctx context.Context) string {
	id, _ := ctx.Value(requestIDKey{}).(string)
	return id
}

// requestID keeps a client's X-Request-Id when it is short and plain, else
// makes one.
func requestID(r *http.Request) string {
	if id := r.Header.Get("X-Request-Id"); len(id) > 0 && len(id) <= 64 && strings.Trim(id, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.") == "" {
		return id
	}
	var b [12]byte
	rand.Read(b[:])
	return "req_" + hex.EncodeToString(b[:])
}

// Dispatch finds and runs the handler of a request. It names the route
// (for metrics; before the handler runs, so a panic is counted under it)
// and returns the handler's failure, which the edge writes.
type Dispatch func(w http.ResponseWriter, r *http.Request, route *string) error

// Serve runs dispatch under the edge: panic recovery (http.ErrAbortHandler
// still aborts the connection), the error it returns written unless the
// response has begun, and the request's metrics.
func (e *Edge) Serve(w http.ResponseWriter, r *http.Request, dispatch Dispatch) {
	start := time.Now()
	sw := &metrics.StatusWriter{ResponseWriter: w}
	route := "unmatched"
	id := requestID(r)
	w.Header().Set("X-Request-Id", id)
	r = r.WithContext(context.WithValue(r.Context(), requestIDKey{}, id))
	var failed error
	defer func() {
		if v := recover(); v != nil {
			if v == http.ErrAbortHandler {
				panic(v)
			}
			e.Log.Error("panic serving request", "listener", e.Listener, "method", r.Method, "path", r.URL.Path, "panic", v, "stack", string(debug.Stack()))
			if sw.Status == 0 {
				e.Fail(sw, r, errdefs.New(errdefs.Internal, "internal error"))
			}
		}
		if e.Metrics != nil {
			e.Metrics.ObserveRequest(e.Listener, route, r.Method, sw.Status, time.Since(start))
		}
		if e.Finished != nil {
			e.Finished(r, sw.Status, failed)
		}
	}()
	if err := dispatch(sw, r, &route); err != nil {
		failed = err
		if sw.Status != 0 {
			// Too late to answer with an error: the status is out.
			e.Log.Warn("request failed after its response began", "listener", e.Listener, "method", r.Method, "path", r.URL.Path, "err", err)
			return
		}
		e.Fail(sw, r, err)
	}
}

// Fail writes err as the listener renders errors. Failures on the server's
// side are logged with their hidden cause: 500 as errors, other 5xx as
// warnings — except 502, the answer for a sandbox that is not running, which
// is the client's business.
func (e *Edge) Fail(w http.ResponseWriter, r *http.Request, err error) {
	status, body := e.Render(err)
	switch {
	case status == http.StatusInternalServerError:
		e.Log.Error("request failed", "listener", e.Listener, "method", r.Method, "path", r.URL.Path, "err", err)
	case status > 500 && status != http.StatusBadGateway:
		e.Log.Warn("request failed", "listener", e.Listener, "method", r.Method, "path", r.URL.Path, "err", err)
	}
	if errors.Is(err, errdefs.Unauthenticated) {
		w.Header().Set("WWW-Authenticate", `Bearer realm="space-`+e.Listener+`"`)
	}
	Raw(w, status, body)
}

// NoRoute is the error for a path no route matches: 405 with Allow when the
// path exists for other methods, else 404.
func NoRoute(w http.ResponseWriter, r *http.Request, allowed []string) error {
	if len(allowed) > 0 {
		w.Header().Set("Allow", strings.Join(allowed, ", "))
		return errdefs.New(errdefs.MethodNotAllowed, "method %s is not allowed here", r.Method)
	}
	return errdefs.New(errdefs.NotFound, "no such endpoint")
}

// Raw writes a JSON body as is; responses are never cached.
func Raw(w http.ResponseWriter, status int, body []byte) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	w.Write(body)
}

// JSON writes v with status; a value that does not marshal is an error and
// nothing is written.
func JSON(w http.ResponseWriter, status int, v any) error {
	b, err := Marshal(v)
	if err != nil {
		return err
	}
	Raw(w, status, b)
	return nil
}

// Marshal is JSON with a trailing newline, as every response body ends.
func Marshal(v any) ([]byte, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, errdefs.Wrap(errdefs.Internal, err, "internal error")
	}
	return append(b, '\n'), nil
}

// ReadBody reads a request body of at most limit bytes: beyond it the
// request is TooLarge, a body that breaks off is InvalidArgument.
func ReadBody(w http.ResponseWriter, r *http.Request, limit int64) ([]byte, error) {
	b, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
	var tooBig *http.MaxBytesError
	if errors.As(err, &tooBig) {
		return nil, errdefs.New(errdefs.TooLarge, "request body exceeds %d bytes", limit)
	}
	if err != nil {
		return nil, errdefs.Wrap(errdefs.InvalidArgument, err, "could not read request body")
	}
	return b, nil
}
