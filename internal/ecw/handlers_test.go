package ecw

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/binary"
	"encoding/json"
	"io"
	"log/slog"
	"mime/multipart"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/spacesandbox/space/internal/auth"
	"github.com/spacesandbox/space/internal/errdefs"
	"github.com/spacesandbox/space/internal/ids"
	"github.com/spacesandbox/space/internal/lifecycle/enginetest"
	"github.com/spacesandbox/space/internal/sandbox"
	"github.com/spacesandbox/space/internal/sandboxio/sandboxiotest"
)

// harness is the E2B layer over the FAKE engine, a real in-process agent
// (its root a temporary directory), real SQLite tokens, and an API key.
type harness struct {
	eng     *enginetest.Engine
	agent   *sandboxiotest.Agent
	srv     *Server
	key     string
	tokenID string
	signer  *auth.Signer
}

func newHarness(t *testing.T) *harness {
	t.Helper()
	w := enginetest.NewWorld(t)
	srv := New(Config{Engine: w.Engine, Commands: w.Commands, Tokens: w.Tokens, Logger: slog.New(slog.DiscardHandler), Domain: "e2b.test"})
	return &harness{eng: w.Engine, agent: w.IO, srv: srv, key: w.Key, tokenID: w.KeyID, signer: w.Signer}
}

func (h *harness) serve(req *http.Request) *httptest.ResponseRecorder {
	w := httptest.NewRecorder()
	h.srv.ServeHTTP(w, req)
	return w
}

// e2bCode is the code of E2B's error body (0 for another body).
func e2bCode(w *httptest.ResponseRecorder) int {
	var e apiError
	json.Unmarshal(w.Body.Bytes(), &e)
	return e.Code
}

type ecwCase struct {
	name, method, path, body string
	engineFails              error
	status                   int
}

// Every E2B control-plane handler's error paths and one success each. E2B's
// body carries the status as its code.
func TestControlHandlers(t *testing.T) {
	cases := []ecwCase{
		{name: "create: unknown field", method: "POST", path: "/sandboxes", body: `{"x":1}`, status: 400},
		{name: "create: unsupported field", method: "POST", path: "/sandboxes", body: `{"mcp":{}}`, status: 400},
		{name: "create: negative timeout", method: "POST", path: "/v2/sandboxes", body: `{"timeout":-5}`, status: 400},
		{name: "create: not JSON", method: "POST", path: "/sandboxes", body: `{`, status: 400},
		{name: "create: at capacity", method: "POST", path: "/sandboxes", body: `{}`, engineFails: errdefs.New(errdefs.ResourceExhausted, "full"), status: 429},
		{name: "create", method: "POST", path: "/sandboxes", body: `{"templateID":"base","metadata":{"a":"b"}}`, status: 201},
		{name: "list v1: v2-only parameter", method: "GET", path: "/sandboxes?limit=5", status: 400},
		{name: "list v1", method: "GET", path: "/sandboxes", status: 200},
		{name: "list v2: bad state", method: "GET", path: "/v2/sandboxes?state=sleepy", status: 400},
		{name: "list v2: bad limit", method: "GET", path: "/v2/sandboxes?limit=0", status: 400},
		{name: "list v2: bad metadata", method: "GET", path: "/v2/sandboxes?metadata=a%3D%25ZZ", status: 400},
		{name: "list v2", method: "GET", path: "/v2/sandboxes?state=running,paused", status: 200},
		{name: "get: an id E2B would parse, not ours", method: "GET", path: "/sandboxes/nope", status: 404},
		{name: "get: an id E2B refuses to parse", method: "GET", path: "/sandboxes/NOT_AN_ID!", status: 400},
		{name: "get: too many dashes", method: "GET", path: "/sandboxes/a-b-c", status: 400},
		{name: "get: with a client id", method: "GET", path: "/sandboxes/{R}-6532622b", status: 200},
		{name: "kill: malformed id", method: "DELETE", path: "/sandboxes/x.y", status: 400},
		{name: "get: not found", method: "GET", path: "/sandboxes/{U}", status: 404},
		{name: "get", method: "GET", path: "/sandboxes/{R}", status: 200},
		{name: "kill: not found", method: "DELETE", path: "/sandboxes/{U}", status: 404},
		{name: "kill: engine unavailable", method: "DELETE", path: "/sandboxes/{R}", engineFails: errdefs.New(errdefs.Unavailable, "down"), status: 503},
		{name: "kill", method: "DELETE", path: "/sandboxes/{R}", status: 204},
		{name: "pause: memory false", method: "POST", path: "/sandboxes/{R}/pause", body: `{"memory":false}`, status: 400},
		{name: "pause: not found", method: "POST", path: "/sandboxes/{U}/pause", status: 404},
		{name: "pause: already paused", method: "POST", path: "/sandboxes/{S}/pause", status: 409},
		{name: "pause: wrong state", method: "POST", path: "/sandboxes/{F}/pause", status: 409},
		{name: "pause", method: "POST", path: "/sandboxes/{R}/pause", status: 204},
		{name: "resume: running", method: "POST", path: "/sandboxes/{R}/resume", status: 409},
		{name: "resume: bad body", method: "POST", path: "/sandboxes/{S}/resume", body: `{"timeout":"soon"}`, status: 400},
		{name: "resume: not found", method: "POST", path: "/sandboxes/{U}/resume", status: 404},
		{name: "resume", method: "POST", path: "/sandboxes/{S}/resume", body: `{"timeout":60}`, status: 201},
		{name: "connect: memory false", method: "POST", path: "/sandboxes/{R}/connect", body: `{"memory":false}`, status: 400},
		{name: "connect: not found", method: "POST", path: "/v2/sandboxes/{U}/connect", status: 404},
		{name: "connect: bad timeout", method: "POST", path: "/sandboxes/{R}/connect", body: `{"timeout":-1}`, status: 400},
		{name: "connect: running", method: "POST", path: "/sandboxes/{R}/connect", body: `{"timeout":60}`, status: 200},
		{name: "connect: paused", method: "POST", path: "/sandboxes/{S}/connect", status: 201},
		{name: "connect: failed", method: "POST", path: "/sandboxes/{F}/connect", status: 409},
		{name: "timeout: missing", method: "POST", path: "/sandboxes/{R}/timeout", body: `{}`, status: 400},
		{name: "timeout: unknown field", method: "POST", path: "/sandboxes/{R}/timeout", body: `{"timeout":5,"x":1}`, status: 400},
		{name: "timeout: not found", method: "POST", path: "/sandboxes/{U}/timeout", body: `{"timeout":5}`, status: 404},
		{name: "timeout: paused (E2B keeps timeouts of running sandboxes only)", method: "POST", path: "/sandboxes/{S}/timeout", body: `{"timeout":5}`, status: 404},
		{name: "refresh: paused", method: "POST", path: "/sandboxes/{S}/refreshes", status: 404},
		{name: "timeout", method: "POST", path: "/sandboxes/{R}/timeout", body: `{"timeout":5}`, status: 204},
		{name: "refresh: not found", method: "POST", path: "/sandboxes/{U}/refreshes", status: 404},
		{name: "refresh", method: "POST", path: "/sandboxes/{R}/refreshes", status: 204},
		{name: "metrics: not found", method: "GET", path: "/sandboxes/{U}/metrics", status: 404},
		{name: "metrics", method: "GET", path: "/sandboxes/{R}/metrics", status: 200},
		{name: "network: not found", method: "PUT", path: "/sandboxes/{U}/network", body: `{}`, status: 404},
		{name: "network: bad body", method: "PUT", path: "/sandboxes/{R}/network", body: `{"allowOut":"all"}`, status: 400},
		{name: "network: engine refuses", method: "PUT", path: "/sandboxes/{R}/network", body: `{}`, engineFails: errdefs.New(errdefs.FailedPrecondition, "no network"), status: 409},
		{name: "network", method: "PUT", path: "/sandboxes/{R}/network", body: `{"denyOut":["10.0.0.0/8"]}`, status: 204},
		{name: "fork: count 0", method: "POST", path: "/sandboxes/{R}/fork", body: `{"count":0}`, status: 400},
		{name: "fork: count 17", method: "POST", path: "/sandboxes/{R}/fork", body: `{"count":17}`, status: 400},
		{name: "fork: unknown field", method: "POST", path: "/sandboxes/{R}/fork", body: `{"counts":2}`, status: 400},
		{name: "fork: not found", method: "POST", path: "/sandboxes/{U}/fork", status: 404},
		{name: "fork: paused", method: "POST", path: "/sandboxes/{S}/fork", status: 409},
		{name: "fork", method: "POST", path: "/sandboxes/{R}/fork", body: `{"count":2,"timeout":60}`, status: 201},
		{name: "snapshot", method: "POST", path: "/sandboxes/{R}/snapshots", body: `{"name":"warm"}`, status: 201},
		{name: "snapshot: paused", method: "POST", path: "/sandboxes/{S}/snapshots", status: 409},
		{name: "snapshot: not found", method: "POST", path: "/sandboxes/{U}/snapshots", status: 404},
		{name: "snapshot: unknown field", method: "POST", path: "/sandboxes/{R}/snapshots", body: `{"tag":"x"}`, status: 400},
		{name: "list snapshots", method: "GET", path: "/snapshots?sandboxID={R}&limit=10", status: 200},
		{name: "list snapshots: bad limit", method: "GET", path: "/snapshots?limit=0", status: 400},
		{name: "list snapshots: unknown parameter", method: "GET", path: "/snapshots?x=1", status: 400},
		{name: "delete snapshot: not found", method: "DELETE", path: "/templates/snap_aaaaaaaaaaaaaaaaaaaaaaaaaa", status: 404},
		{name: "delete a template", method: "DELETE", path: "/templates/base", status: 400},
		{name: "wrong method", method: "PATCH", path: "/sandboxes", status: 405},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			path := strings.NewReplacer("{R}", h.eng.Add(sandbox.Running).ID, "{S}", h.eng.Add(sandbox.Suspended).ID,
				"{F}", h.eng.Add(sandbox.Failed).ID, "{U}", ids.New(ids.Sandbox)).Replace(tc.path)
			h.eng.Fail = tc.engineFails
			req := httptest.NewRequest(tc.method, path, strings.NewReader(tc.body))
			req.Header.Set("X-API-KEY", h.key)
			w := h.serve(req)
			if w.Code != tc.status || (tc.status >= 400 && e2bCode(w) != tc.status) {
				t.Fatalf("%s %s: %d %s, want %d", tc.method, path, w.Code, w.Body, tc.status)
			}
		})
	}
}

// A route the layer does not have is a plain 404, as E2B's API answers it:
// no JSON error body whose code the SDKs would read as "sandbox not found".
func TestUnknownRouteIsNotSandboxNotFound(t *testing.T) {
	h := newHarness(t)
	for _, path := range []string{"/volumes", "/sandboxes/" + ids.New(ids.Sandbox) + "/logs", "/v3/anything"} {
		req := httptest.NewRequest("GET", path, nil)
		req.Header.Set("X-API-KEY", h.key)
		w := h.serve(req)
		if w.Code != 404 || e2bCode(w) != 0 || strings.HasPrefix(w.Header().Get("Content-Type"), "application/json") {
			t.Errorf("%s: %d %q %s", path, w.Code, w.Header().Get("Content-Type"), w.Body)
		}
	}
}

func TestControlNeedsAKey(t *testing.T) {
	h := newHarness(t)
	for _, key := range []string{"", "space_wrong"} {
		req := httptest.NewRequest("GET", "/sandboxes", nil)
		req.Header.Set("X-API-KEY", key)
		if w := h.serve(req); w.Code != 401 || e2bCode(w) != 401 {
			t.Fatalf("key %q: %d %s", key, w.Code, w.Body)
		}
	}
	if w := h.serve(httptest.NewRequest("GET", "/health", nil)); w.Code != 200 {
		t.Fatalf("health: %d", w.Code)
	}
}

// envdCase is one request to a sandbox's envd (E2b-Sandbox-Id routing).
type envdCase struct {
	name        string
	method, url string
	body        []byte
	contentType string
	encoding    string
	sandbox     string // R (running), P (paused), U (unknown), "bad" (malformed)
	token       string // "ok", "other" (another sandbox's), ""
	port        string
	agentDown   bool
	status      int
}

func (h *harness) envd(t *testing.T, tc envdCase) *httptest.ResponseRecorder {
	t.Helper()
	run, paused := h.eng.Add(sandbox.Running), h.eng.Add(sandbox.Paused)
	id := map[string]string{"R": run.ID, "P": paused.ID, "U": ids.New(ids.Sandbox), "bad": "sbx_bad"}[tc.sandbox]
	req := httptest.NewRequest(tc.method, tc.url, bytes.NewReader(tc.body))
	req.Header.Set("E2b-Sandbox-Id", id)
	if tc.port != "" {
		req.Header.Set("E2b-Sandbox-Port", tc.port)
	}
	switch tc.token {
	case "ok":
		req.Header.Set("X-Access-Token", h.signer.SandboxAccessToken(id, h.tokenID))
	case "other":
		req.Header.Set("X-Access-Token", h.signer.SandboxAccessToken(paused.ID, h.tokenID))
	}
	if tc.contentType != "" {
		req.Header.Set("Content-Type", tc.contentType)
	}
	if tc.encoding != "" {
		req.Header.Set("Content-Encoding", tc.encoding)
	}
	if tc.agentDown {
		h.agent.Stop()
	}
	return h.serve(req)
}

func multipartBody(t *testing.T, field, name, content string) ([]byte, string) {
	var b bytes.Buffer
	mw := multipart.NewWriter(&b)
	fw, err := mw.CreateFormFile(field, name)
	if err != nil {
		t.Fatal(err)
	}
	io.WriteString(fw, content)
	mw.Close()
	return b.Bytes(), mw.FormDataContentType()
}

// envd's HTTP handlers (/health, /files) behind inSandbox: the port, the
// access token, the sandbox's state, the query, the body and the agent.
func TestEnvdFileHandlers(t *testing.T) {
	gz := func(s string) []byte {
		var b bytes.Buffer
		zw := gzip.NewWriter(&b)
		io.WriteString(zw, s)
		zw.Close()
		return b.Bytes()
	}
	mp, mpType := multipartBody(t, "file", "/tmp/from-form", "form data")
	noFile, noFileType := multipartBody(t, "other", "x", "y")
	cases := []envdCase{
		{name: "health", method: "GET", url: "/health", sandbox: "R", status: 204},
		{name: "health: paused", method: "GET", url: "/health", sandbox: "P", status: 502},
		{name: "health: unknown", method: "GET", url: "/health", sandbox: "U", status: 502},
		{name: "health: malformed id", method: "GET", url: "/health", sandbox: "bad", status: 502},
		{name: "other port without ingress", method: "GET", url: "/health", sandbox: "R", port: "8080", status: 502},

		{name: "download: no token", method: "GET", url: "/files?path=/etc/passwd", sandbox: "R", status: 401},
		{name: "download: another sandbox's token", method: "GET", url: "/files?path=/etc/passwd", sandbox: "R", token: "other", status: 401},
		{name: "download: unknown parameter", method: "GET", url: "/files?path=/etc/passwd&x=1", sandbox: "R", token: "ok", status: 400},
		{name: "download: no path", method: "GET", url: "/files", sandbox: "R", token: "ok", status: 400},
		{name: "download: not found", method: "GET", url: "/files?path=/nope", sandbox: "R", token: "ok", status: 404},
		{name: "download: a directory", method: "GET", url: "/files?path=/etc", sandbox: "R", token: "ok", status: 400},
		{name: "download: paused", method: "GET", url: "/files?path=/etc/passwd", sandbox: "P", token: "ok", status: 502},
		{name: "download: unknown sandbox", method: "GET", url: "/files?path=/etc/passwd", sandbox: "U", token: "ok", status: 502},
		{name: "download: agent failure", method: "GET", url: "/files?path=/etc/passwd", sandbox: "R", token: "ok", agentDown: true, status: 503},
		{name: "download", method: "GET", url: "/files?path=/etc/passwd", sandbox: "R", token: "ok", status: 200},
		{name: "download: relative to home", method: "GET", url: "/files?path=../etc/passwd&username=root", sandbox: "R", token: "ok", status: 200},

		{name: "upload: no token", method: "POST", url: "/files?path=/tmp/x", body: []byte("x"), sandbox: "R", status: 401},
		{name: "upload: unknown parameter", method: "POST", url: "/files?path=/tmp/x&mode=1", body: []byte("x"), sandbox: "R", token: "ok", status: 400},
		{name: "upload: no destination", method: "POST", url: "/files", body: []byte("x"), contentType: "application/octet-stream", sandbox: "R", token: "ok", status: 400},
		{name: "upload: bad gzip", method: "POST", url: "/files?path=/tmp/x", body: []byte("not gzip"), encoding: "gzip", sandbox: "R", token: "ok", status: 400},
		{name: "upload: unknown encoding", method: "POST", url: "/files?path=/tmp/x", body: []byte("x"), encoding: "br", sandbox: "R", token: "ok", status: 400},
		{name: "upload: multipart without a file", method: "POST", url: "/files", body: noFile, contentType: noFileType, sandbox: "R", token: "ok", status: 400},
		{name: "upload: onto a directory", method: "POST", url: "/files?path=/etc", body: []byte("x"), contentType: "application/octet-stream", sandbox: "R", token: "ok", status: 400},
		{name: "upload: paused", method: "POST", url: "/files?path=/tmp/x", body: []byte("x"), sandbox: "P", token: "ok", status: 502},
		{name: "upload: agent failure", method: "POST", url: "/files?path=/tmp/x", body: []byte("x"), contentType: "application/octet-stream", sandbox: "R", token: "ok", agentDown: true, status: 503},
		{name: "upload: unknown user", method: "POST", url: "/files?path=/tmp/x", body: []byte("x"), contentType: "application/octet-stream", sandbox: "R", token: "ok", status: 400},
		{name: "upload: octet-stream", method: "POST", url: "/files?path=/tmp/x&username=root", body: []byte("x"), contentType: "application/octet-stream", sandbox: "R", token: "ok", status: 200},
		{name: "upload: gzip", method: "POST", url: "/files?path=/tmp/z&username=root", body: gz("zipped"), encoding: "gzip", contentType: "application/octet-stream", sandbox: "R", token: "ok", status: 200},
		{name: "upload: multipart", method: "POST", url: "/files?username=root", body: mp, contentType: mpType, sandbox: "R", token: "ok", status: 200},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			w := h.envd(t, tc)
			if w.Code != tc.status || (tc.status >= 400 && e2bCode(w) != tc.status) {
				t.Fatalf("%s %s: %d %s, want %d", tc.method, tc.url, w.Code, w.Body, tc.status)
			}
		})
	}
}

// rpcCase is one call of envd's Connect services. Unary calls answer with
// an HTTP status and {"code"}; server streams with 200 and an end-of-stream
// message that carries the error.
type rpcCase struct {
	name, procedure, msg string
	stream               bool
	sandbox              string // R or P
	agentDown            bool
	code                 string // Connect code, "" for success
}

func (h *harness) rpc(t *testing.T, tc rpcCase) (code string, body []byte) {
	t.Helper()
	sbx := "R"
	if tc.sandbox != "" {
		sbx = tc.sandbox
	}
	ec := envdCase{method: "POST", url: "/" + tc.procedure, body: []byte(tc.msg), contentType: "application/json", sandbox: sbx, token: "ok", agentDown: tc.agentDown}
	if tc.stream {
		ec.contentType = "application/connect+json"
		frame := make([]byte, 5, 5+len(tc.msg))
		binary.BigEndian.PutUint32(frame[1:], uint32(len(tc.msg)))
		ec.body = append(frame, tc.msg...)
	}
	w := h.envd(t, ec)
	if w.Code == 502 {
		return "unavailable (502)", w.Body.Bytes()
	}
	if !tc.stream {
		var e struct{ Code string }
		if w.Code != 200 {
			json.Unmarshal(w.Body.Bytes(), &e)
			return e.Code, w.Body.Bytes()
		}
		return "", w.Body.Bytes()
	}
	// Walk the envelopes to the end-of-stream one (flag 2).
	b := w.Body.Bytes()
	for len(b) >= 5 {
		n := int(binary.BigEndian.Uint32(b[1:5]))
		if len(b) < 5+n {
			break
		}
		if b[0]&2 != 0 {
			var end struct{ Error *struct{ Code string } }
			json.Unmarshal(b[5:5+n], &end)
			if end.Error != nil {
				return end.Error.Code, w.Body.Bytes()
			}
			return "", w.Body.Bytes()
		}
		b = b[5+n:]
	}
	t.Fatalf("%s: no end of stream in %d %q", tc.procedure, w.Code, w.Body)
	return "", nil
}

// envd's Connect handlers: invalid requests, missing paths and processes,
// existing directories, a sandbox that is not running, a failing agent.
func TestEnvdRPCHandlers(t *testing.T) {
	const fs, proc = "filesystem.Filesystem/", "process.Process/"
	cases := []rpcCase{
		{name: "stat: empty path", procedure: fs + "Stat", msg: `{"path":""}`, code: "invalid_argument"},
		{name: "stat: not found", procedure: fs + "Stat", msg: `{"path":"/nope"}`, code: "not_found"},
		{name: "stat: paused", procedure: fs + "Stat", msg: `{"path":"/etc"}`, sandbox: "P", code: "unavailable (502)"},
		{name: "stat: agent failure", procedure: fs + "Stat", msg: `{"path":"/etc"}`, agentDown: true, code: "unavailable"},
		{name: "stat", procedure: fs + "Stat", msg: `{"path":"/etc/passwd"}`},
		{name: "make dir: exists", procedure: fs + "MakeDir", msg: `{"path":"/etc"}`, code: "already_exists"},
		{name: "make dir: a file is there", procedure: fs + "MakeDir", msg: `{"path":"/etc/passwd"}`, code: "invalid_argument"},
		{name: "make dir: agent failure", procedure: fs + "MakeDir", msg: `{"path":"/new"}`, agentDown: true, code: "unavailable"},
		{name: "make dir: unknown user", procedure: fs + "MakeDir", msg: `{"path":"/new/deep"}`, code: "invalid_argument"},
		{name: "make dir", procedure: fs + "MakeDir?username=root", msg: `{"path":"/new/deep"}`},
		{name: "move: not found", procedure: fs + "Move", msg: `{"source":"/nope","destination":"/x"}`, code: "not_found"},
		{name: "move: no destination", procedure: fs + "Move", msg: `{"source":"/etc/passwd"}`, code: "invalid_argument"},
		{name: "move", procedure: fs + "Move", msg: `{"source":"/etc/passwd","destination":"/passwd"}`},
		{name: "list: too deep", procedure: fs + "ListDir", msg: `{"path":"/","depth":17}`, code: "invalid_argument"},
		{name: "list: not found", procedure: fs + "ListDir", msg: `{"path":"/nope"}`, code: "not_found"},
		{name: "list: agent failure", procedure: fs + "ListDir", msg: `{"path":"/"}`, agentDown: true, code: "unavailable"},
		{name: "list", procedure: fs + "ListDir", msg: `{"path":"/","depth":2}`},
		{name: "remove: not there (a no-op, as envd)", procedure: fs + "Remove", msg: `{"path":"/nope"}`},
		{name: "remove", procedure: fs + "Remove", msg: `{"path":"/etc"}`},
		{name: "create watcher: not found", procedure: fs + "CreateWatcher", msg: `{"path":"/nope"}`, code: "not_found"},
		{name: "create watcher", procedure: fs + "CreateWatcher", msg: `{"path":"/etc"}`},
		{name: "watcher events: unknown watcher", procedure: fs + "GetWatcherEvents", msg: `{"watcherId":"nope"}`, code: "not_found"},
		{name: "remove watcher: unknown watcher", procedure: fs + "RemoveWatcher", msg: `{"watcherId":"nope"}`, code: "not_found"},
		{name: "watch dir: not found", procedure: fs + "WatchDir", msg: `{"path":"/nope"}`, stream: true, code: "not_found"},

		{name: "list processes: agent failure", procedure: proc + "List", msg: `{}`, agentDown: true, code: "unavailable"},
		{name: "list processes", procedure: proc + "List", msg: `{}`},
		{name: "signal: no selector", procedure: proc + "SendSignal", msg: `{"signal":"SIGNAL_SIGTERM"}`, code: "invalid_argument"},
		{name: "signal: not found", procedure: proc + "SendSignal", msg: `{"process":{"pid":999999},"signal":"SIGNAL_SIGTERM"}`, code: "not_found"},
		{name: "input: not found", procedure: proc + "SendInput", msg: `{"process":{"tag":"nope"},"input":{"stdin":"aGk="}}`, code: "not_found"},
		{name: "close stdin: not found", procedure: proc + "CloseStdin", msg: `{"process":{"pid":999999}}`, code: "not_found"},
		{name: "update: not found", procedure: proc + "Update", msg: `{"process":{"pid":999999}}`, code: "not_found"},
		{name: "start: no command", procedure: proc + "Start", msg: `{"process":{}}`, stream: true, code: "invalid_argument"},
		{name: "start: agent failure", procedure: proc + "Start", msg: `{"process":{"cmd":"true"}}`, stream: true, agentDown: true, code: "unavailable"},
		{name: "start", procedure: proc + "Start", msg: `{"process":{"cmd":"true"}}`, stream: true},
		{name: "connect: not found", procedure: proc + "Connect", msg: `{"process":{"pid":999999}}`, stream: true, code: "not_found"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			code, body := h.rpc(t, tc)
			if code != tc.code {
				t.Fatalf("%s %s: code %q (%s), want %q", tc.procedure, tc.msg, code, body, tc.code)
			}
		})
	}
}

// Entries as envd describes them: POSIX permission bits, a directory's own
// size, a symlink by what it leads to, listings sorted and depth-first.
func TestEnvdEntries(t *testing.T) {
	h := newHarness(t)
	root := h.agent.Root
	os.MkdirAll(filepath.Join(root, "w", "b", "deep"), 0o755)
	os.Chmod(filepath.Join(root, "w"), 0o750)
	os.WriteFile(filepath.Join(root, "w", "a.txt"), []byte("12345"), 0o640)
	os.WriteFile(filepath.Join(root, "w", "c.txt"), nil, 0o600)
	os.Symlink("b/deep", filepath.Join(root, "w", "link"))
	os.Symlink("/nowhere", filepath.Join(root, "w", "dangling"))
	stat := func(p string) map[string]any {
		t.Helper()
		_, body := h.rpc(t, rpcCase{procedure: "filesystem.Filesystem/Stat", msg: `{"path":"` + p + `"}`})
		var r struct{ Entry map[string]any }
		if err := json.Unmarshal(body, &r); err != nil {
			t.Fatalf("stat %s: %s", p, body)
		}
		return r.Entry
	}
	fi, _ := os.Stat(filepath.Join(root, "w"))
	dir := stat("/w")
	if dir["mode"] != float64(0o750) || dir["permissions"] != "drwxr-x---" || dir["type"] != "FILE_TYPE_DIRECTORY" || dir["size"] != strconv.FormatInt(fi.Size(), 10) {
		t.Errorf("directory: %v (size on disk %d)", dir, fi.Size())
	}
	if f := stat("/w/a.txt"); f["mode"] != float64(0o640) || f["permissions"] != "-rw-r-----" || f["size"] != "5" {
		t.Errorf("file: %v", f)
	}
	if l := stat("/w/link"); l["type"] != "FILE_TYPE_DIRECTORY" || l["symlinkTarget"] != "/w/b/deep" || l["mode"] != float64(0o755) || !strings.HasPrefix(l["permissions"].(string), "L") {
		t.Errorf("symlink: %v", l)
	}
	if d := stat("/w/dangling"); d["symlinkTarget"] != "/w/dangling" || d["type"] != nil {
		t.Errorf("dangling symlink: %v", d)
	}
	_, body := h.rpc(t, rpcCase{procedure: "filesystem.Filesystem/ListDir", msg: `{"path":"/w","depth":3}`})
	var l struct{ Entries []struct{ Path string } }
	json.Unmarshal(body, &l)
	var paths []string
	for _, e := range l.Entries {
		paths = append(paths, e.Path)
	}
	want := "/w/a.txt /w/b /w/b/deep /w/c.txt /w/dangling /w/link"
	if got := strings.Join(paths, " "); got != want {
		t.Errorf("list order:\n got %s\nwant %s", got, want)
	}
}

// GET /v2/sandboxes as E2B pages it: filters before the limit (no empty page
// while more match), newest first unless order=asc, startedAfter and
// startedBefore, and paging that returns every match once.
func TestListV2Paging(t *testing.T) {
	h := newHarness(t)
	base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var running, paused []string
	for i := range 9 {
		st := sandbox.Running
		if i < 4 {
			st = sandbox.Suspended // the oldest are paused
		}
		sb := h.eng.Add(st)
		sb.CreatedAt = base.Add(time.Duration(i) * time.Minute)
		sb.Metadata = map[string]string{"n": strconv.Itoa(i)}
		if st == sandbox.Running {
			running = append(running, sb.ID)
		} else {
			paused = append(paused, sb.ID)
		}
	}
	page := func(query string) ([]string, string, int) {
		t.Helper()
		req := httptest.NewRequest("GET", "/v2/sandboxes?"+query, nil)
		req.Header.Set("X-API-KEY", h.key)
		w := h.serve(req)
		var items []struct{ SandboxID string }
		json.Unmarshal(w.Body.Bytes(), &items)
		var out []string
		for _, it := range items {
			out = append(out, it.SandboxID)
		}
		return out, w.Header().Get("X-Next-Token"), w.Code
	}
	all := func(query string) []string {
		t.Helper()
		var got []string
		for tok := ""; ; {
			q := query
			if tok != "" {
				q += "&nextToken=" + tok
			}
			items, next, code := page(q)
			if code != 200 || (len(items) == 0 && next != "") {
				t.Fatalf("%s: %d, %d items, next %q", q, code, len(items), next)
			}
			got = append(got, items...)
			if tok = next; tok == "" {
				return got
			}
		}
	}
	rev := func(s []string) []string {
		out := slices.Clone(s)
		slices.Reverse(out)
		return out
	}
	if got := all("state=paused&limit=3"); !slices.Equal(got, rev(paused)) {
		t.Errorf("paused, newest first, 3 a page: %v, want %v", got, rev(paused))
	}
	if got := all("state=running&state=paused&limit=2&order=asc"); !slices.Equal(got, append(slices.Clone(paused), running...)) {
		t.Errorf("both states (as an array), oldest first: %v", got)
	}
	if got := all("state=running,paused&limit=4"); !slices.Equal(got, rev(append(slices.Clone(paused), running...))) {
		t.Errorf("both states, newest first: %v", got)
	}
	if got := all("limit=100&order=asc&startedAfter=" + base.Add(3*time.Minute).Format(time.RFC3339) + "&startedBefore=" + base.Add(6*time.Minute).Format(time.RFC3339)); !slices.Equal(got, []string{paused[3], running[0], running[1]}) {
		t.Errorf("started in [3m, 6m): %v", got)
	}
	if got := all("metadata=n%3D7"); !slices.Equal(got, []string{running[3]}) {
		t.Errorf("metadata n=7: %v", got)
	}
	for _, q := range []string{"order=sideways", "nextToken=garbage", "startedAfter=yesterday", "state=gone"} {
		if _, _, code := page(q); code != 400 {
			t.Errorf("%s: %d, want 400", q, code)
		}
	}
}

// A process stream whose sandbox stops running is cut, as envd's connection
// dies with its sandbox: no end-of-stream frame, a broken body — what the
// SDKs, after a health check that answers 502, report as end of life.
func TestProcessStreamIsCutWhenTheSandboxStops(t *testing.T) {
	h := newHarness(t)
	srv := httptest.NewServer(h.srv)
	defer srv.Close()
	run := h.eng.Add(sandbox.Running)
	msg := []byte(`{"process":{"cmd":"sleep","args":["3"]}}`)
	frame := append([]byte{0, 0, 0, 0, byte(len(msg))}, msg...)
	req, _ := http.NewRequest("POST", srv.URL+"/process.Process/Start?username=root", bytes.NewReader(frame))
	req.Header.Set("Content-Type", "application/connect+json")
	req.Header.Set("E2b-Sandbox-Id", run.ID)
	req.Header.Set("X-Access-Token", h.signer.SandboxAccessToken(run.ID, h.tokenID))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var head [5]byte
	if _, err := io.ReadFull(resp.Body, head[:]); err != nil { // the start event
		t.Fatalf("no start event: %v", err)
	}
	io.CopyN(io.Discard, resp.Body, int64(binary.BigEndian.Uint32(head[1:])))
	// The sandbox is suspended under the stream; its agent goes.
	if _, err := h.eng.Suspend(context.Background(), run.ID, nil); err != nil {
		t.Fatal(err)
	}
	h.agent.Stop()
	rest, err := io.ReadAll(resp.Body)
	if err == nil {
		t.Fatalf("the stream ended cleanly (%q); want the connection cut", rest)
	}
	health, _ := http.NewRequest("GET", srv.URL+"/health", nil)
	health.Header.Set("E2b-Sandbox-Id", run.ID)
	if r, err := http.DefaultClient.Do(health); err != nil || r.StatusCode != 502 {
		t.Fatalf("health of the stopped sandbox: %v %v", r, err)
	}
}
