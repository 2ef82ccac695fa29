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
	"sync"
	"testing"
	"time"

	"github.com/spacesandbox/space/internal/auth"
	"github.com/spacesandbox/space/internal/commands"
	"github.com/spacesandbox/space/internal/errdefs"
	"github.com/spacesandbox/space/internal/ids"
	"github.com/spacesandbox/space/internal/lifecycle"
	"github.com/spacesandbox/space/internal/sandbox"
	"github.com/spacesandbox/space/internal/sandboxio"
	"github.com/spacesandbox/space/internal/sandboxio/sandboxiotest"
	"github.com/spacesandbox/space/internal/store"
	"github.com/spacesandbox/space/internal/store/sqlite"
)

// fakeEngine is a FAKE lifecycle engine for handler tests: sandboxes and
// operations in maps, transitions checked by sandbox.Plan, and an error it
// returns from its next mutation when one is set.
type fakeEngine struct {
	mu    sync.Mutex
	sbs   map[string]*sandbox.Sandbox
	ops   map[string]*sandbox.Operation
	fail  error // returned by mutations while set
	ready error
}

func newFakeEngine() *fakeEngine {
	return &fakeEngine{sbs: map[string]*sandbox.Sandbox{}, ops: map[string]*sandbox.Operation{}}
}

func (f *fakeEngine) add(state sandbox.State) *sandbox.Sandbox {
	f.mu.Lock()
	defer f.mu.Unlock()
	sb := &sandbox.Sandbox{ID: ids.New(ids.Sandbox), State: state, Runtime: "fake", CreatedAt: time.Now().UTC()}
	f.sbs[sb.ID] = sb
	return sb
}

func (f *fakeEngine) op(kind sandbox.OpKind, sbID string) *sandbox.Operation {
	op := &sandbox.Operation{ID: ids.New(ids.Operation), Kind: kind, SandboxID: sbID, State: sandbox.OpPending, CreatedAt: time.Now().UTC()}
	f.ops[op.ID] = op
	return op
}

func (f *fakeEngine) Create(ctx context.Context, req lifecycle.CreateRequest, render lifecycle.Render) (*sandbox.Sandbox, *sandbox.Operation, error) {
	if err := req.Normalize(lifecycle.DefaultLimits); err != nil {
		return nil, nil, err
	}
	if f.fail != nil {
		return nil, nil, f.fail
	}
	sb := f.add(sandbox.Starting)
	f.mu.Lock()
	defer f.mu.Unlock()
	return sb, f.op(sandbox.OpCreate, sb.ID), nil
}

func (f *fakeEngine) Get(ctx context.Context, id string) (*sandbox.Sandbox, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	sb, ok := f.sbs[id]
	if !ok {
		return nil, errdefs.New(errdefs.NotFound, "sandbox %s not found", id)
	}
	c := *sb
	return &c, nil
}

func (f *fakeEngine) List(ctx context.Context, q store.SandboxQuery) (store.Page[sandbox.Sandbox], error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var p store.Page[sandbox.Sandbox]
	for _, sb := range f.sbs {
		if q.State == "" || sb.State == q.State {
			p.Items = append(p.Items, *sb)
		}
	}
	return p, nil
}

func (f *fakeEngine) step(kind sandbox.OpKind, id string) (*sandbox.Operation, error) {
	if f.fail != nil {
		return nil, f.fail
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	sb, ok := f.sbs[id]
	if !ok {
		return nil, errdefs.New(errdefs.NotFound, "sandbox %s not found", id)
	}
	tr, err := sandbox.Plan(kind, sb.State)
	if err != nil {
		return nil, errdefs.Wrap(errdefs.FailedPrecondition, err, "%v", err)
	}
	sb.State = tr.Through
	return f.op(kind, id), nil
}

func (f *fakeEngine) Pause(ctx context.Context, id string, _ lifecycle.Render) (*sandbox.Operation, error) {
	return f.step(sandbox.OpPause, id)
}

func (f *fakeEngine) Suspend(ctx context.Context, id string, _ lifecycle.Render) (*sandbox.Operation, error) {
	return f.step(sandbox.OpSuspend, id)
}

func (f *fakeEngine) Wake(ctx context.Context, id string, _ lifecycle.Render) (*sandbox.Operation, error) {
	return f.step(sandbox.OpWake, id)
}

func (f *fakeEngine) Delete(ctx context.Context, id string, _ lifecycle.Render) (*sandbox.Operation, error) {
	return f.step(sandbox.OpDelete, id)
}

func (f *fakeEngine) UpdateNetwork(ctx context.Context, id string, n sandbox.Network) (*sandbox.Sandbox, error) {
	sb, err := f.Get(ctx, id)
	if err != nil {
		return nil, err
	}
	sb.Network = &n
	return sb, nil
}

func (f *fakeEngine) Operation(ctx context.Context, id string) (*sandbox.Operation, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	op, ok := f.ops[id]
	if !ok {
		return nil, errdefs.New(errdefs.NotFound, "operation %s not found", id)
	}
	return op, nil
}

func (f *fakeEngine) Operations(ctx context.Context, q store.OperationQuery) (store.Page[sandbox.Operation], error) {
	return store.Page[sandbox.Operation]{}, nil
}

func (f *fakeEngine) StartBuild(ctx context.Context, ref string, _ lifecycle.Render, build func(ctx context.Context) error) (*sandbox.Operation, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.op(sandbox.OpBuild, ""), nil
}

func (f *fakeEngine) WarmPool(ctx context.Context, template string) (lifecycle.WarmPool, error) {
	if template != "seed:latest" {
		return lifecycle.WarmPool{}, errdefs.New(errdefs.NotFound, "template %s not found", template)
	}
	return lifecycle.WarmPool{Template: template}, nil
}

func (f *fakeEngine) SetWarmPool(ctx context.Context, template string, minReady int) (lifecycle.WarmPool, error) {
	if _, err := f.WarmPool(ctx, template); err != nil {
		return lifecycle.WarmPool{}, err
	}
	return lifecycle.WarmPool{Template: template, MinReady: minReady}, nil
}

func (f *fakeEngine) Ready() error                      { return f.ready }
func (f *fakeEngine) Runtimes() ([]string, string)      { return []string{"fake"}, "fake" }
func (f *fakeEngine) RuntimeDetails() map[string]string { return map[string]string{"fake": "FAKE engine"} }

// fakeAgents is commands.Agents over the fake engine's records and one real
// agent serving in this process (sandboxiotest): a running sandbox gets it,
// others get the engine's refusal.
type fakeAgents struct {
	eng   *fakeEngine
	agent *sandboxiotest.Agent
}

func (a *fakeAgents) Agent(ctx context.Context, id string) (*sandboxio.Agent, *sandbox.Sandbox, error) {
	sb, err := a.eng.Get(ctx, id)
	if err != nil {
		return nil, nil, err
	}
	if sb.State != sandbox.Running {
		return nil, nil, errdefs.New(errdefs.FailedPrecondition, "sandbox %s is %s", id, sb.State)
	}
	return a.agent.Agent, sb, nil
}

func (a *fakeAgents) Attached(string) func() { return func() {} }

// harness is a control plane and a data plane over the fakes, a real SQLite
// store (tokens, idempotency) and a token to call them with.
type harness struct {
	t     *testing.T
	eng   *fakeEngine
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
	eng := newFakeEngine()
	ag := sandboxiotest.Start(t)
	cmds := commands.New(commands.Config{Agents: &fakeAgents{eng: eng, agent: ag}, Signer: auth.NewSigner(bytes.Repeat([]byte{7}, 32)), DataPlaneURL: "http://data.test"})
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
