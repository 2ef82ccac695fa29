package api

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"testing"

	"github.com/spacesandbox/space/internal/auth"
	"github.com/spacesandbox/space/internal/commands"
	"github.com/spacesandbox/space/internal/lifecycle/enginetest"
	"github.com/spacesandbox/space/internal/sandboxio/sandboxiotest"
	"github.com/spacesandbox/space/internal/store/sqlite"
)

// harness is a control plane and a data plane over the fakes, a real SQLite
// store (tokens, idempotency) and a token to call them with.
type harness struct {
	t     *testing.T
	eng   *enginetest.Engine
	agent *sandboxiotest.Agent
	api   *Server
	data  *DataPlane
	token string
	cmds  *commands.Service
}

func newHarness(t *testing.T) *harness {
	t.Helper()
	st, err := sqlite.Open(context.Background(), filepath.Join(t.TempDir(), "space.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	tokens := auth.New(st)
	_, tok, err := tokens.Create(context.Background(), "test")
	if err != nil {
		t.Fatal(err)
	}
	eng := enginetest.New()
	ag := sandboxiotest.Start(t)
	cmds := commands.New(commands.Config{Agents: &enginetest.Agents{Engine: eng, IO: ag}, Signer: auth.NewSigner(bytes.Repeat([]byte{7}, 32)), DataPlaneURL: "http://data.test"})
	log := slog.New(slog.DiscardHandler)
	return &harness{t: t, eng: eng, agent: ag, token: tok, cmds: cmds,
		api:  New(Config{Engine: eng, Commands: cmds, Store: st, Tokens: tokens, Logger: log, BootID: "test"}),
		data: NewDataPlane(DataPlaneConfig{Commands: cmds, Store: st, Logger: log, BootID: "test", Tokens: tokens}),
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
	var b errorBody
	json.Unmarshal(w.Body.Bytes(), &b)
	return b.Error.Code
}

func newRecorder() *httptest.ResponseRecorder { return httptest.NewRecorder() }
