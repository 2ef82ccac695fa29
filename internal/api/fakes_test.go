package api

import (
	"bytes"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/spacesandbox/space/internal/commands"
	"github.com/spacesandbox/space/internal/lifecycle/enginetest"
	"github.com/spacesandbox/space/internal/sandboxio/sandboxiotest"
)

// harness is a control plane and a data plane over the fakes, a real SQLite
// store (tokens, idempotency) and a token to call them with.
type harness struct {
	eng   *enginetest.Engine
	agent *sandboxiotest.Agent
	api   *Server
	data  *DataPlane
	token string
	cmds  *commands.Service
}

func newHarness(t *testing.T) *harness {
	t.Helper()
	w := enginetest.NewWorld(t)
	log := slog.New(slog.DiscardHandler)
	return &harness{eng: w.Engine, agent: w.IO, token: w.Key, cmds: w.Commands,
		api:  New(Config{Engine: w.Engine, Commands: w.Commands, Store: w.Store, Tokens: w.Tokens, Logger: log, BootID: "test"}),
		data: NewDataPlane(DataPlaneConfig{Commands: w.Commands, Store: w.Store, Logger: log, BootID: "test", Tokens: w.Tokens}),
	}
}

// call sends a request with the harness's API token to h.
func (h *harness) call(srv http.Handler, method, path, body, token string) *httptest.ResponseRecorder {
	var r io.Reader
	if body != "" {
		r = bytes.NewBufferString(body)
	}
	req := httptest.NewRequest(method, path, r)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if body != "" && body[0] == '{' {
		req.Header.Set("Content-Type", "application/json")
	}
	w := httptest.NewRecorder()
	srv.ServeHTTP(w, req)
	return w
}

// errorCode is the code of an error envelope ("" for another body).
func errorCode(w *httptest.ResponseRecorder) string {
	return codeOf(w.Body.Bytes())
}
