package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net/http"

	"github.com/spacesandbox/space/internal/errdefs"
	"github.com/spacesandbox/space/internal/jsonbody"
)

// MaxJSONBody bounds every JSON request body.
const MaxJSONBody = 1 << 20

type errorBody struct {
	Error errorDetail `json:"error"`
}

type errorDetail struct {
	Code    string         `json:"code"`
	Message string         `json:"message"`
	Details map[string]any `json:"details,omitempty"`
}

// errorResponse renders err as the API's error envelope. Errors without a
// kind are internal: their text goes to the log, never to the client.
func errorResponse(err error) (int, []byte) {
	kind, msg, details := errdefs.Public(err)
	b, _ := json.Marshal(errorBody{Error: errorDetail{Code: kind.Code, Message: msg, Details: details}})
	return kind.Status, append(b, '\n')
}

func writeError(w http.ResponseWriter, r *http.Request, log *slog.Logger, err error) {
	status, body := errorResponse(err)
	if status >= 500 {
		log.Error("request failed", "method", r.Method, "path", r.URL.Path, "err", err)
	}
	writeRaw(w, status, body)
}

func writeRaw(w http.ResponseWriter, status int, body []byte) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	w.Write(body)
}

func marshal(v any) ([]byte, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("encode response: %w", err)
	}
	return append(b, '\n'), nil
}

func writeJSON(w http.ResponseWriter, r *http.Request, log *slog.Logger, status int, v any) {
	b, err := marshal(v)
	if err != nil {
		writeError(w, r, log, err)
		return
	}
	writeRaw(w, status, b)
}

// readBody reads a request body of at most limit bytes.
func readBody(w http.ResponseWriter, r *http.Request, limit int64) ([]byte, error) {
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

// decodeJSON strictly decodes body into v: one JSON object, no unknown
// fields, nothing after it. An empty body leaves v as it is.
func decodeJSON(contentType string, body []byte, v any) error {
	if len(bytes.TrimSpace(body)) == 0 {
		return nil
	}
	if contentType != "" {
		mt, _, err := mime.ParseMediaType(contentType)
		if err != nil || (mt != "application/json" && mt != "application/*+json") {
			return errdefs.New(errdefs.InvalidArgument, "request body must be application/json")
		}
	}
	return jsonbody.Decode(bytes.NewReader(body), v)
}

// errInvalid is an invalid_argument naming a field.
func errInvalid(field, msg string) error {
	return errdefs.New(errdefs.InvalidArgument, "%s: %s", field, msg).WithDetails(map[string]any{"field": field})
}
