package api

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"testing/iotest"
	"time"

	"github.com/spacesandbox/space/internal/commands"
	"github.com/spacesandbox/space/internal/errdefs"
	"github.com/spacesandbox/space/internal/ids"
	"github.com/spacesandbox/space/internal/sandbox"
)

// handlerCase is one request to one handler and the answer it must get.
// Paths name sandboxes by role: {R} running, {P} paused, {U} a well-formed
// id nobody has, and {PID} a well-formed process id nobody started.
type handlerCase struct {
	name         string
	method, path string
	body         string
	agentDown    bool  // the sandbox's agent stopped answering
	engineFails  error // the engine refuses mutations with this
	status       int
	code         string // error code ("" on success)
}

// Every control-plane handler's error paths — malformed id, bad body or
// query, not found, wrong state, a failing agent or engine — and one success,
// against the FAKE engine and a real in-process agent.
func TestControlPlaneHandlers(t *testing.T) {
	cases := []handlerCase{
		{name: "create: unknown field", method: "POST", path: "/v1/sandboxes", body: `{"x":1}`, status: 400, code: "invalid_argument"},
		{name: "create: out of range", method: "POST", path: "/v1/sandboxes", body: `{"resources":{"vcpus":100000}}`, status: 400, code: "invalid_argument"},
		{name: "create: not JSON", method: "POST", path: "/v1/sandboxes", body: `{`, status: 400, code: "invalid_argument"},
		{name: "create: at capacity", method: "POST", path: "/v1/sandboxes", body: `{}`, engineFails: errdefs.New(errdefs.ResourceExhausted, "full"), status: 429, code: "resource_exhausted"},
		{name: "create", method: "POST", path: "/v1/sandboxes", body: `{}`, status: 202},

		{name: "list: unknown parameter", method: "GET", path: "/v1/sandboxes?colour=red", status: 400, code: "invalid_argument"},
		{name: "list: bad limit", method: "GET", path: "/v1/sandboxes?limit=0", status: 400, code: "invalid_argument"},
		{name: "list: bad state", method: "GET", path: "/v1/sandboxes?state=sleepy", status: 400, code: "invalid_argument"},
		{name: "list", method: "GET", path: "/v1/sandboxes?state=running", status: 200},

		{name: "get: malformed id", method: "GET", path: "/v1/sandboxes/sbx_nope", status: 400, code: "invalid_argument"},
		{name: "get: not found", method: "GET", path: "/v1/sandboxes/{U}", status: 404, code: "not_found"},
		{name: "get: unknown parameter", method: "GET", path: "/v1/sandboxes/{R}?x=1", status: 400, code: "invalid_argument"},
		{name: "get", method: "GET", path: "/v1/sandboxes/{R}", status: 200},

		{name: "pause: malformed id", method: "POST", path: "/v1/sandboxes/x:pause", status: 400, code: "invalid_argument"},
		{name: "pause: body with fields", method: "POST", path: "/v1/sandboxes/{R}:pause", body: `{"now":true}`, status: 400, code: "invalid_argument"},
		{name: "pause: not found", method: "POST", path: "/v1/sandboxes/{U}:pause", status: 404, code: "not_found"},
		{name: "pause: wrong state", method: "POST", path: "/v1/sandboxes/{P}:pause", status: 409, code: "failed_precondition"},
		{name: "pause: engine unavailable", method: "POST", path: "/v1/sandboxes/{R}:pause", engineFails: errdefs.New(errdefs.Unavailable, "runtime gone"), status: 503, code: "unavailable"},
		{name: "pause", method: "POST", path: "/v1/sandboxes/{R}:pause", status: 202},
		{name: "suspend: not found", method: "POST", path: "/v1/sandboxes/{U}:suspend", status: 404, code: "not_found"},
		{name: "suspend", method: "POST", path: "/v1/sandboxes/{P}:suspend", status: 202},
		{name: "wake: malformed id", method: "POST", path: "/v1/sandboxes/sbx_:wake", status: 400, code: "invalid_argument"},
		{name: "wake", method: "POST", path: "/v1/sandboxes/{P}:wake", status: 202},
		{name: "delete: not found", method: "DELETE", path: "/v1/sandboxes/{U}", status: 404, code: "not_found"},
		{name: "delete: query", method: "DELETE", path: "/v1/sandboxes/{R}?force=1", status: 400, code: "invalid_argument"},
		{name: "delete", method: "DELETE", path: "/v1/sandboxes/{P}", status: 202},

		{name: "network: malformed id", method: "PUT", path: "/v1/sandboxes/nope/network", body: `{}`, status: 400, code: "invalid_argument"},
		{name: "network: read-only field", method: "PUT", path: "/v1/sandboxes/{R}/network", body: `{"ingress_token":"x"}`, status: 400, code: "invalid_argument"},
		{name: "network: unknown field", method: "PUT", path: "/v1/sandboxes/{R}/network", body: `{"firewall":1}`, status: 400, code: "invalid_argument"},
		{name: "network: not found", method: "PUT", path: "/v1/sandboxes/{U}/network", body: `{}`, status: 404, code: "not_found"},
		{name: "network", method: "PUT", path: "/v1/sandboxes/{R}/network", body: `{}`, status: 200},
		{name: "metrics: malformed id", method: "GET", path: "/v1/sandboxes/nope/metrics", status: 400, code: "invalid_argument"},
		{name: "metrics: unknown parameter", method: "GET", path: "/v1/sandboxes/{R}/metrics?from=1", status: 400, code: "invalid_argument"},
		{name: "metrics: malformed start", method: "GET", path: "/v1/sandboxes/{R}/metrics?start=yesterday", status: 400, code: "invalid_argument"},
		{name: "metrics: not found", method: "GET", path: "/v1/sandboxes/{U}/metrics", status: 404, code: "not_found"},
		{name: "metrics", method: "GET", path: "/v1/sandboxes/{R}/metrics?start=2026-01-01T00:00:00Z", status: 200},

		{name: "command: malformed id", method: "POST", path: "/v1/sandboxes/x/commands", body: `{"command":["true"]}`, status: 400, code: "invalid_argument"},
		{name: "command: empty", method: "POST", path: "/v1/sandboxes/{R}/commands", body: `{"command":[]}`, status: 400, code: "invalid_argument"},
		{name: "command: not found", method: "POST", path: "/v1/sandboxes/{U}/commands", body: `{"command":["true"]}`, status: 404, code: "not_found"},
		{name: "command: wrong state", method: "POST", path: "/v1/sandboxes/{P}/commands", body: `{"command":["true"]}`, status: 409, code: "failed_precondition"},
		{name: "command: agent failure", method: "POST", path: "/v1/sandboxes/{R}/commands", body: `{"command":["true"]}`, agentDown: true, status: 503, code: "unavailable"},
		{name: "command", method: "POST", path: "/v1/sandboxes/{R}/commands", body: `{"command":["true"]}`, status: 201},

		{name: "processes: malformed id", method: "GET", path: "/v1/sandboxes/bad/processes", status: 400, code: "invalid_argument"},
		{name: "processes: not found", method: "GET", path: "/v1/sandboxes/{U}/processes", status: 404, code: "not_found"},
		{name: "processes: wrong state", method: "GET", path: "/v1/sandboxes/{P}/processes", status: 409, code: "failed_precondition"},
		{name: "processes: agent failure", method: "GET", path: "/v1/sandboxes/{R}/processes", agentDown: true, status: 503, code: "unavailable"},
		{name: "processes", method: "GET", path: "/v1/sandboxes/{R}/processes", status: 200},
		{name: "process: malformed id", method: "GET", path: "/v1/sandboxes/{R}/processes/p1", status: 400, code: "invalid_argument"},
		{name: "process: not found", method: "GET", path: "/v1/sandboxes/{R}/processes/{PID}", status: 404, code: "not_found"},
		{name: "process: wrong state", method: "GET", path: "/v1/sandboxes/{P}/processes/{PID}", status: 409, code: "failed_precondition"},
		{name: "process: agent failure", method: "GET", path: "/v1/sandboxes/{R}/processes/{PID}", agentDown: true, status: 503, code: "unavailable"},
		{name: "signal: no signal", method: "POST", path: "/v1/sandboxes/{R}/processes/{PID}:signal", body: `{}`, status: 400, code: "invalid_argument"},
		{name: "signal: malformed process", method: "POST", path: "/v1/sandboxes/{R}/processes/x:signal", body: `{"signal":"SIGTERM"}`, status: 400, code: "invalid_argument"},
		{name: "signal: not found", method: "POST", path: "/v1/sandboxes/{R}/processes/{PID}:signal", body: `{"signal":"SIGTERM"}`, status: 404, code: "not_found"},
		{name: "signal: wrong state", method: "POST", path: "/v1/sandboxes/{P}/processes/{PID}:signal", body: `{"signal":"SIGTERM"}`, status: 409, code: "failed_precondition"},
		{name: "signal: agent failure", method: "POST", path: "/v1/sandboxes/{R}/processes/{PID}:signal", body: `{"signal":"SIGTERM"}`, agentDown: true, status: 503, code: "unavailable"},

		{name: "read file: no path", method: "GET", path: "/v1/sandboxes/{R}/files", status: 400, code: "invalid_argument"},
		{name: "read file: relative path", method: "GET", path: "/v1/sandboxes/{R}/files?path=etc/passwd", status: 400, code: "invalid_argument"},
		{name: "read file: malformed id", method: "GET", path: "/v1/sandboxes/x/files?path=/etc/passwd", status: 400, code: "invalid_argument"},
		{name: "read file: not found", method: "GET", path: "/v1/sandboxes/{R}/files?path=/nope", status: 404, code: "not_found"},
		{name: "read file: sandbox not found", method: "GET", path: "/v1/sandboxes/{U}/files?path=/etc/passwd", status: 404, code: "not_found"},
		{name: "read file: wrong state", method: "GET", path: "/v1/sandboxes/{P}/files?path=/etc/passwd", status: 409, code: "failed_precondition"},
		{name: "read file: agent failure", method: "GET", path: "/v1/sandboxes/{R}/files?path=/etc/passwd", agentDown: true, status: 503, code: "unavailable"},
		{name: "read file", method: "GET", path: "/v1/sandboxes/{R}/files?path=/etc/passwd", status: 200},
		{name: "write file: bad mode", method: "PUT", path: "/v1/sandboxes/{R}/files?path=/tmp/x&mode=999", body: "data", status: 400, code: "invalid_argument"},
		{name: "write file: unknown parameter", method: "PUT", path: "/v1/sandboxes/{R}/files?path=/tmp/x&owner=me", body: "data", status: 400, code: "invalid_argument"},
		{name: "write file: wrong state", method: "PUT", path: "/v1/sandboxes/{P}/files?path=/tmp/x", body: "data", status: 409, code: "failed_precondition"},
		{name: "write file: onto a directory", method: "PUT", path: "/v1/sandboxes/{R}/files?path=/etc", body: "data", status: 409, code: "failed_precondition"},
		{name: "write file: agent failure", method: "PUT", path: "/v1/sandboxes/{R}/files?path=/tmp/x", body: "data", agentDown: true, status: 503, code: "unavailable"},
		{name: "write file", method: "PUT", path: "/v1/sandboxes/{R}/files?path=/tmp/x", body: "data", status: 200},
		{name: "delete file: bad recursive", method: "DELETE", path: "/v1/sandboxes/{R}/files?path=/tmp&recursive=maybe", status: 400, code: "invalid_argument"},
		{name: "delete file: not found", method: "DELETE", path: "/v1/sandboxes/{R}/files?path=/nope", status: 404, code: "not_found"},
		{name: "delete file: body", method: "DELETE", path: "/v1/sandboxes/{R}/files?path=/etc/passwd", body: "x", status: 400, code: "invalid_argument"},
		{name: "delete file: agent failure", method: "DELETE", path: "/v1/sandboxes/{R}/files?path=/etc/passwd", agentDown: true, status: 503, code: "unavailable"},
		{name: "list files: bad depth", method: "GET", path: "/v1/sandboxes/{R}/files:list?path=/etc&depth=0", status: 400, code: "invalid_argument"},
		{name: "list files: not found", method: "GET", path: "/v1/sandboxes/{R}/files:list?path=/nope", status: 404, code: "not_found"},
		{name: "list files: wrong state", method: "GET", path: "/v1/sandboxes/{P}/files:list?path=/etc", status: 409, code: "failed_precondition"},
		{name: "list files", method: "GET", path: "/v1/sandboxes/{R}/files:list?path=/etc&depth=2", status: 200},
		{name: "stat: not found", method: "GET", path: "/v1/sandboxes/{R}/files:stat?path=/nope", status: 404, code: "not_found"},
		{name: "stat: agent failure", method: "GET", path: "/v1/sandboxes/{R}/files:stat?path=/etc", agentDown: true, status: 503, code: "unavailable"},
		{name: "stat", method: "GET", path: "/v1/sandboxes/{R}/files:stat?path=/etc/passwd", status: 200},
		{name: "mkdir: relative", method: "POST", path: "/v1/sandboxes/{R}/files:mkdir", body: `{"path":"rel"}`, status: 400, code: "invalid_argument"},
		{name: "mkdir: bad mode", method: "POST", path: "/v1/sandboxes/{R}/files:mkdir", body: `{"path":"/d","mode":"rwx"}`, status: 400, code: "invalid_argument"},
		{name: "mkdir: wrong state", method: "POST", path: "/v1/sandboxes/{P}/files:mkdir", body: `{"path":"/d"}`, status: 409, code: "failed_precondition"},
		{name: "mkdir: agent failure", method: "POST", path: "/v1/sandboxes/{R}/files:mkdir", body: `{"path":"/d"}`, agentDown: true, status: 503, code: "unavailable"},
		{name: "mkdir", method: "POST", path: "/v1/sandboxes/{R}/files:mkdir", body: `{"path":"/d/e"}`, status: 200},
		{name: "move: no destination", method: "POST", path: "/v1/sandboxes/{R}/files:move", body: `{"from":"/etc/passwd"}`, status: 400, code: "invalid_argument"},
		{name: "move: not found", method: "POST", path: "/v1/sandboxes/{R}/files:move", body: `{"from":"/nope","to":"/x"}`, status: 404, code: "not_found"},
		{name: "move: agent failure", method: "POST", path: "/v1/sandboxes/{R}/files:move", body: `{"from":"/etc/passwd","to":"/x"}`, agentDown: true, status: 503, code: "unavailable"},

		{name: "templates", method: "GET", path: "/v1/templates", status: 200},
		{name: "templates: unknown parameter", method: "GET", path: "/v1/templates?all=1", status: 400, code: "invalid_argument"},
		{name: "template: not found", method: "GET", path: "/v1/templates/nosuch:latest", status: 404, code: "not_found"},
		{name: "build: no template store", method: "POST", path: "/v1/templates", body: `{}`, status: 503, code: "unavailable"},
		{name: "warm pool: bad reference", method: "GET", path: "/v1/warm-pools/BAD:x", status: 400, code: "invalid_argument"},
		{name: "warm pool: not found", method: "GET", path: "/v1/warm-pools/nosuch:latest", status: 404, code: "not_found"},
		{name: "warm pool", method: "GET", path: "/v1/warm-pools/seed:latest", status: 200},
		{name: "set warm pool: no min_ready", method: "PUT", path: "/v1/warm-pools/seed:latest", body: `{}`, status: 400, code: "invalid_argument"},
		{name: "set warm pool: not found", method: "PUT", path: "/v1/warm-pools/nosuch:latest", body: `{"min_ready":1}`, status: 404, code: "not_found"},
		{name: "set warm pool", method: "PUT", path: "/v1/warm-pools/seed:latest", body: `{"min_ready":2}`, status: 200},

		{name: "operation: malformed id", method: "GET", path: "/v1/operations/op_", status: 400, code: "invalid_argument"},
		{name: "operation: not found", method: "GET", path: "/v1/operations/{OP}", status: 404, code: "not_found"},
		{name: "operations: malformed sandbox", method: "GET", path: "/v1/operations?sandbox_id=x", status: 400, code: "invalid_argument"},
		{name: "operations", method: "GET", path: "/v1/operations?sandbox_id={R}", status: 200},

		{name: "no such endpoint", method: "GET", path: "/v1/nothing", status: 404, code: "not_found"},
		{name: "wrong method", method: "PATCH", path: "/v1/sandboxes", status: 405, code: "method_not_allowed"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			run := h.eng.Add(sandbox.Running)
			paused := h.eng.Add(sandbox.Paused)
			path := strings.NewReplacer("{R}", run.ID, "{P}", paused.ID, "{U}", ids.New(ids.Sandbox),
				"{PID}", ids.New(ids.Process), "{OP}", ids.New(ids.Operation)).Replace(tc.path)
			if tc.agentDown {
				h.agent.Stop()
			}
			h.eng.Fail = tc.engineFails
			w := h.call(h.api, tc.method, path, tc.body, h.token)
			if w.Code != tc.status || errorCode(w) != tc.code {
				t.Fatalf("%s %s: %d %s, want %d %q", tc.method, path, w.Code, w.Body, tc.status, tc.code)
			}
		})
	}
}

func TestAuthenticationAndProbes(t *testing.T) {
	h := newHarness(t)
	if w := h.call(h.api, "GET", "/v1/sandboxes", "", ""); w.Code != 401 || errorCode(w) != "unauthenticated" || w.Header().Get("WWW-Authenticate") == "" {
		t.Fatalf("no token: %d %s %v", w.Code, w.Body, w.Header())
	}
	if w := h.call(h.api, "GET", "/v1/sandboxes", "", "space_wrong"); w.Code != 401 {
		t.Fatalf("wrong token: %d %s", w.Code, w.Body)
	}
	if w := h.call(h.api, "GET", "/healthz", "", ""); w.Code != 200 {
		t.Fatalf("healthz: %d", w.Code)
	}
	if w := h.call(h.api, "GET", "/readyz", "", ""); w.Code != 200 || !strings.Contains(w.Body.String(), `"ready"`) {
		t.Fatalf("readyz: %d %s", w.Code, w.Body)
	}
	h.eng.NotReady = errdefs.New(errdefs.Unavailable, "no runtime")
	if w := h.call(h.api, "GET", "/readyz", "", ""); w.Code != 503 || !strings.Contains(w.Body.String(), "no runtime") {
		t.Fatalf("readyz not ready: %d %s", w.Code, w.Body)
	}
}

// The data plane's handlers: session ids, attachment tokens, bodies, and a
// failing agent.
func TestDataPlaneHandlers(t *testing.T) {
	type dcase struct {
		name, method, suffix, body string
		token                      string // "attach", "other" (another session's), "bad", ""
		agentDown                  bool
		status                     int
		code                       string
	}
	cases := []dcase{
		{name: "events: malformed session", method: "GET", suffix: "/v1/sessions/x/events", token: "attach", status: 404, code: "not_found"},
		{name: "events: no token", method: "GET", suffix: "/events", status: 401, code: "unauthenticated"},
		{name: "events: bad token", method: "GET", suffix: "/events", token: "bad", status: 401, code: "unauthenticated"},
		{name: "events: another session's token", method: "GET", suffix: "/events", token: "other", status: 403, code: "permission_denied"},
		{name: "events: agent failure", method: "GET", suffix: "/events", token: "attach", agentDown: true, status: 503, code: "unavailable"},
		{name: "events", method: "GET", suffix: "/events", token: "attach", status: 200},
		{name: "stdin: query", method: "POST", suffix: "/stdin?x=1", body: "hi", token: "attach", status: 400, code: "invalid_argument"},
		{name: "stdin: agent failure", method: "POST", suffix: "/stdin", body: "hi", token: "attach", agentDown: true, status: 503, code: "unavailable"},
		{name: "close stdin: body", method: "POST", suffix: "/stdin:close", body: `{"x":1}`, token: "attach", status: 400, code: "invalid_argument"},
		{name: "close stdin: agent failure", method: "POST", suffix: "/stdin:close", token: "attach", agentDown: true, status: 503, code: "unavailable"},
		{name: "resize: out of range", method: "POST", suffix: ":resize", body: `{"cols":0,"rows":24}`, token: "attach", status: 400, code: "invalid_argument"},
		{name: "resize: unknown field", method: "POST", suffix: ":resize", body: `{"cols":80,"rows":24,"x":1}`, token: "attach", status: 400, code: "invalid_argument"},
		{name: "resize: agent failure", method: "POST", suffix: ":resize", body: `{"cols":80,"rows":24}`, token: "attach", agentDown: true, status: 503, code: "unavailable"},
		{name: "no such endpoint", method: "GET", suffix: "/v1/other", status: 404, code: "not_found"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			run := h.eng.Add(sandbox.Running)
			create := func() *commands.Session {
				s, err := h.cmds.Create(context.Background(), run.ID, commands.CreateRequest{Command: []string{"true"}, Stdin: true})
				if err != nil {
					t.Fatal(err)
				}
				return s
			}
			sess, other := create(), create()
			tok := map[string]string{"attach": sess.Attach.Token, "other": other.Attach.Token, "bad": "spat_bad"}[tc.token]
			path := tc.suffix
			if !strings.HasPrefix(path, "/v1/") {
				path = "/v1/sessions/" + sess.SessionID + path
			}
			if tc.agentDown {
				h.agent.Stop()
			}
			w := h.call(h.data, tc.method, path, tc.body, tok)
			if w.Code != tc.status || errorCode(w) != tc.code {
				t.Fatalf("%s %s: %d %s, want %d %q", tc.method, path, w.Code, w.Body, tc.status, tc.code)
			}
			if tc.code == "" && tc.method == "GET" && !strings.Contains(w.Body.String(), "event: process_exited") {
				t.Fatalf("stream ended without process_exited:\n%s", w.Body)
			}
		})
	}
}

// What a handler answers is what the idempotency key replays: a retry of a
// final refusal gets the same answer, marked replayed.
func TestIdempotentRefusalIsReplayed(t *testing.T) {
	h := newHarness(t)
	send := func() *http.Response {
		req, _ := http.NewRequest("POST", "/v1/sandboxes", strings.NewReader(`{"x":1}`))
		req.Header.Set("Authorization", "Bearer "+h.token)
		req.Header.Set(HeaderIdempotencyKey, "k1")
		w := httptest.NewRecorder()
		h.api.ServeHTTP(w, req)
		return w.Result()
	}
	first, second := send(), send()
	if first.StatusCode != 400 || second.StatusCode != 400 || second.Header.Get(HeaderReplayed) != "true" {
		t.Fatalf("first %d, retry %d replayed=%q", first.StatusCode, second.StatusCode, second.Header.Get(HeaderReplayed))
	}
}

// An upload whose body breaks off (a client gone mid-request: net/http
// reports io.ErrUnexpectedEOF) is refused and replaces nothing — never
// committed as a complete, shorter file.
func TestWriteFileCutShortReplacesNothing(t *testing.T) {
	h := newHarness(t)
	run := h.eng.Add(sandbox.Running)
	body := io.MultiReader(strings.NewReader(strings.Repeat("x", 3<<20)), iotest.ErrReader(io.ErrUnexpectedEOF))
	req := httptest.NewRequest("PUT", "/v1/sandboxes/"+run.ID+"/files?path=/etc/passwd", body)
	req.Header.Set("Authorization", "Bearer "+h.token)
	w := httptest.NewRecorder()
	h.api.ServeHTTP(w, req)
	if w.Code != 400 || errorCode(w) != "invalid_argument" {
		t.Fatalf("cut-short upload: %d %s", w.Code, w.Body)
	}
	if b, _ := os.ReadFile(filepath.Join(h.agent.Root, "etc", "passwd")); !strings.HasPrefix(string(b), "root:") {
		t.Fatalf("the cut-short upload replaced the file (%d bytes)", len(b))
	}
}

// GET /v1/operations/{id}?wait= is a long poll: a terminal operation
// answers at once; a bad or too long wait is refused.
func TestOperationLongPoll(t *testing.T) {
	h := newHarness(t)
	run := h.eng.Add(sandbox.Running)
	op, err := h.eng.Pause(context.Background(), run.ID, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{"", "?wait=30s", "?wait=5", "?wait=0"} {
		if w := h.call(h.api, "GET", "/v1/operations/"+op.ID+q, "", h.token); w.Code != 200 || !strings.Contains(w.Body.String(), `"state":"succeeded"`) {
			t.Fatalf("GET %s: %d %s", q, w.Code, w.Body)
		}
	}
	for _, q := range []string{"?wait=forever", "?wait=61s", "?wait=-1s", "?wait=1000", "?wait=1s&x=1"} {
		if w := h.call(h.api, "GET", "/v1/operations/"+op.ID+q, "", h.token); w.Code != 400 || errorCode(w) != "invalid_argument" {
			t.Fatalf("GET %s: %d %s", q, w.Code, w.Body)
		}
	}
}

// GET /v1/events streams each change of the project's sandboxes and
// operations once, honours sandbox_id, and ends when its token is revoked.
func TestEventsStream(t *testing.T) {
	h := newHarness(t)
	h.api.EventsKeepalive = 100 * time.Millisecond
	srv := httptest.NewServer(h.api)
	defer srv.Close()
	watched, other := h.eng.Add(sandbox.Running), h.eng.Add(sandbox.Running)
	open := func(q string) (*bufio.Reader, func()) {
		req, _ := http.NewRequest("GET", srv.URL+"/v1/events"+q, nil)
		req.Header.Set("Authorization", "Bearer "+h.token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil || resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" {
			t.Fatalf("GET /v1/events%s: %v %v", q, resp, err)
		}
		return bufio.NewReader(resp.Body), func() { resp.Body.Close() }
	}
	// next returns the next event's name and data (keepalives skipped).
	next := func(r *bufio.Reader) (string, string) {
		var name, data string
		for {
			line, err := r.ReadString('\n')
			if err != nil {
				return "eof", ""
			}
			line = strings.TrimRight(line, "\n")
			switch {
			case strings.HasPrefix(line, "event: "):
				name = line[len("event: "):]
			case strings.HasPrefix(line, "data: "):
				data = line[len("data: "):]
			case line == "" && name != "":
				return name, data
			}
		}
	}
	all, closeAll := open("")
	defer closeAll()
	one, closeOne := open("?sandbox_id=" + watched.ID)
	defer closeOne()
	for _, r := range []*bufio.Reader{all, one} {
		if name, data := next(r); name != "ready" || !strings.Contains(data, `"project":"default"`) {
			t.Fatalf("first event %s %s", name, data)
		}
	}
	if _, err := h.eng.Pause(context.Background(), other.ID, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := h.eng.Pause(context.Background(), watched.ID, nil); err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for len(got) < 4 {
		name, data := next(all)
		for _, id := range []string{watched.ID, other.ID} {
			if strings.Contains(data, `"id":"`+id+`"`) && strings.Contains(data, `"state":"paused"`) {
				got[name+" "+id] = true
			}
			if name == "operation" && strings.Contains(data, `"sandbox_id":"`+id+`"`) && strings.Contains(data, `"kind":"pause"`) {
				got[name+" "+id] = true
			}
		}
		if name == "eof" {
			t.Fatalf("stream ended; got %v", got)
		}
	}
	// The filtered stream names only its sandbox.
	for range 2 {
		name, data := next(one)
		if (name != "operation" && name != "sandbox") || strings.Contains(data, other.ID) {
			t.Fatalf("filtered stream: %s %s", name, data)
		}
	}
	if w := h.call(h.api, "GET", "/v1/events?sandbox_id=nope", "", h.token); w.Code != 400 || errorCode(w) != "invalid_argument" {
		t.Fatalf("bad sandbox_id: %d %s", w.Code, w.Body)
	}
	if w := h.call(h.api, "GET", "/v1/events?sandbox_id="+ids.New(ids.Sandbox), "", h.token); w.Code != 404 || errorCode(w) != "not_found" {
		t.Fatalf("unknown sandbox_id: %d %s", w.Code, w.Body)
	}
	if w := h.call(h.api, "GET", "/v1/token", "", h.token); w.Code != 200 || !strings.Contains(w.Body.String(), `"role":"owner"`) || strings.Contains(w.Body.String(), h.token) {
		t.Fatalf("GET /v1/token: %d %s", w.Code, w.Body)
	}
	// An operation shown running is followed until it ends, also when the
	// end is written where this engine does not see it (a cluster node).
	op := h.eng.Running(sandbox.OpSuspend, watched.ID)
	for {
		name, data := next(one)
		if name == "operation" && strings.Contains(data, op.ID) && strings.Contains(data, `"state":"running"`) {
			break
		}
	}
	h.eng.FinishElsewhere(op.ID)
	ended := make(chan string, 1)
	go func() {
		for {
			name, data := next(one)
			if name == "eof" || (name == "operation" && strings.Contains(data, op.ID) && strings.Contains(data, `"state":"succeeded"`)) {
				ended <- name
				return
			}
		}
	}()
	select {
	case name := <-ended:
		if name == "eof" {
			t.Fatal("stream ended before the operation's end")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the operation's end, written behind the engine's back, never came")
	}
	// Revoking the token ends both streams with an error event.
	tok, err := h.api.tokens.Verify(context.Background(), h.token)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.api.tokens.Revoke(context.Background(), tok.ID); err != nil {
		t.Fatal(err)
	}
	for _, r := range []*bufio.Reader{all, one} {
		name, data := next(r)
		for name == "sandbox" || name == "operation" {
			name, data = next(r)
		}
		if name != "error" || !strings.Contains(data, `"code":"unauthenticated"`) {
			t.Fatalf("after revoke: %s %s", name, data)
		}
		if name, _ := next(r); name != "eof" {
			t.Fatalf("stream goes on after revoke: %s", name)
		}
	}
}
