package ecw

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/spacesandbox/space/internal/ids"
	"github.com/spacesandbox/space/internal/lifecycle/enginetest"
	"github.com/spacesandbox/space/internal/sandbox"
	"github.com/spacesandbox/space/internal/usage"
)

// sdkSignature signs as E2B's JS SDK does (getSignature): base64 of the
// SHA-256 of path:operation:user:token[:expiration], its padding cut.
func sdkSignature(path, op, user, token string, exp int64) string {
	raw := path + ":" + op + ":" + user + ":" + token
	if exp != 0 {
		raw += ":" + strconv.FormatInt(exp, 10)
	}
	sum := sha256.Sum256([]byte(raw))
	return "v1_" + strings.TrimRight(base64.StdEncoding.EncodeToString(sum[:]), "=")
}

// Signed /files URLs: valid ones work with no access token — addressed by
// header or on a plain URL that names no sandbox — and wrong, expired,
// misused or revoked ones are refused with 401.
func TestSignedFileURLs(t *testing.T) {
	h := newHarness(t)
	os.WriteFile(filepath.Join(h.agent.Root, "signed.txt"), []byte("signed content"), 0o644)
	sb := h.eng.Add(sandbox.Running)
	other := h.eng.Add(sandbox.Running)
	token := h.signer.SandboxAccessToken(sb.ID, h.tokenID)
	signed := func(method, path, user, tok string, exp int64, header bool, body string) *httptest.ResponseRecorder {
		t.Helper()
		q := url.Values{"path": {path}}
		if user != "" {
			q.Set("username", user)
		}
		op := "read"
		if method == "POST" {
			op = "write"
		}
		q.Set("signature", sdkSignature(path, op, user, tok, exp))
		if exp != 0 {
			q.Set("signature_expiration", strconv.FormatInt(exp, 10))
		}
		req := httptest.NewRequest(method, "http://127.0.0.1:49983/files?"+q.Encode(), strings.NewReader(body))
		if header {
			req.Header.Set("E2b-Sandbox-Id", sb.ID)
		}
		if method == "POST" {
			req.Header.Set("Content-Type", "application/octet-stream")
		}
		return h.serve(req)
	}
	for _, header := range []bool{true, false} {
		name := map[bool]string{true: "addressed", false: "plain URL"}[header]
		t.Run(name, func(t *testing.T) {
			if w := signed("GET", "/signed.txt", "", token, 0, header, ""); w.Code != 200 || w.Body.String() != "signed content" {
				t.Errorf("valid download: %d %s", w.Code, w.Body)
			}
			if w := signed("GET", "/signed.txt", "root", token, time.Now().Add(time.Minute).Unix(), header, ""); w.Code != 200 {
				t.Errorf("valid download with expiry and user: %d %s", w.Code, w.Body)
			}
			if w := signed("POST", "/up.txt", "root", token, 0, header, "uploaded"); w.Code != 200 {
				t.Errorf("valid upload: %d %s", w.Code, w.Body)
			}
			if b, _ := os.ReadFile(filepath.Join(h.agent.Root, "up.txt")); string(b) != "uploaded" {
				t.Errorf("upload wrote %q", b)
			}
			refused := map[string]*httptest.ResponseRecorder{
				"wrong token":             signed("GET", "/signed.txt", "", token+"x", 0, header, ""),
				"another sandbox's":       signed("GET", "/signed.txt", "", h.signer.SandboxAccessToken(other.ID, h.tokenID)+"x", 0, header, ""),
				"expired":                 signed("GET", "/signed.txt", "", token, time.Now().Add(-time.Minute).Unix(), header, ""),
				"another path":            tamper(h, sb.ID, token, "/signed.txt", "/etc/passwd", header),
				"read signature to write": tamperMethod(h, sb.ID, token, header),
			}
			for what, w := range refused {
				if w.Code != 401 || e2bCode(w) != 401 {
					t.Errorf("%s: %d %s, want 401", what, w.Code, w.Body)
				}
			}
			if w := refused["expired"]; !strings.Contains(w.Body.String(), "expired") {
				t.Errorf("expired: %s", w.Body)
			}
		})
	}
	// A signature for the addressed sandbox made with another sandbox's
	// token, and one made by a revoked API token, are refused.
	otherTok := h.signer.SandboxAccessToken(other.ID, h.tokenID)
	if w := signed("GET", "/signed.txt", "", otherTok, 0, true, ""); w.Code != 401 {
		t.Errorf("another sandbox's signature: %d", w.Code)
	}
	if err := h.srv.cfg.Tokens.Revoke(context.Background(), h.tokenID); err != nil {
		t.Fatal(err)
	}
	if w := signed("GET", "/signed.txt", "", token, 0, true, ""); w.Code != 401 {
		t.Errorf("revoked API token's signature: %d %s", w.Code, w.Body)
	}
	req := httptest.NewRequest("GET", "/files?path=/signed.txt&signature=v1_x&signature_expiration=soon", nil)
	if w := h.serve(req); w.Code != 400 {
		t.Errorf("malformed expiration: %d %s", w.Code, w.Body)
	}
}

// tamper signs one path and asks for another.
func tamper(h *harness, id, token, signedPath, askedPath string, header bool) *httptest.ResponseRecorder {
	req := httptest.NewRequest("GET", "/files?"+url.Values{"path": {askedPath}, "signature": {sdkSignature(signedPath, "read", "", token, 0)}}.Encode(), nil)
	if header {
		req.Header.Set("E2b-Sandbox-Id", id)
	}
	return h.serve(req)
}

// tamperMethod uploads with a signature made for reading.
func tamperMethod(h *harness, id, token string, header bool) *httptest.ResponseRecorder {
	q := url.Values{"path": {"/x"}, "signature": {sdkSignature("/x", "read", "", token, 0)}}
	req := httptest.NewRequest("POST", "/files?"+q.Encode(), strings.NewReader("x"))
	req.Header.Set("Content-Type", "application/octet-stream")
	if header {
		req.Header.Set("E2b-Sandbox-Id", id)
	}
	return h.serve(req)
}

// File metadata as envd keeps it: X-Metadata-* headers on an upload become
// the file's metadata (keys lower-cased), returned by the upload, Stat and
// ListDir; a second upload replaces it; a bad value is a 400.
func TestFileMetadata(t *testing.T) {
	h := newHarness(t)
	upload := func(path string, meta map[string]string) *httptest.ResponseRecorder {
		sb := h.eng.Add(sandbox.Running)
		req := httptest.NewRequest("POST", "/files?username=root&path="+path, bytes.NewReader([]byte("data")))
		req.Header.Set("E2b-Sandbox-Id", sb.ID)
		req.Header.Set("X-Access-Token", h.signer.SandboxAccessToken(sb.ID, h.tokenID))
		req.Header.Set("Content-Type", "application/octet-stream")
		for k, v := range meta {
			req.Header.Set("X-Metadata-"+k, v)
		}
		return h.serve(req)
	}
	w := upload("/m.txt", map[string]string{"Owner": "agent-7", "purpose": "a test: 1 2 3"})
	var out []entryInfo
	if err := json.Unmarshal(w.Body.Bytes(), &out); err != nil || len(out) != 1 {
		t.Fatalf("upload: %d %s", w.Code, w.Body)
	}
	want := map[string]string{"owner": "agent-7", "purpose": "a test: 1 2 3"}
	if !equalMaps(out[0].Metadata, want) {
		t.Errorf("upload answered metadata %v, want %v", out[0].Metadata, want)
	}
	_, body := h.rpc(t, rpcCase{procedure: "filesystem.Filesystem/Stat", msg: `{"path":"/m.txt"}`})
	var st struct {
		Entry struct{ Metadata map[string]string }
	}
	json.Unmarshal(body, &st)
	if !equalMaps(st.Entry.Metadata, want) {
		t.Errorf("stat: %s", body)
	}
	_, body = h.rpc(t, rpcCase{procedure: "filesystem.Filesystem/ListDir", msg: `{"path":"/","depth":1}`})
	if !strings.Contains(string(body), `"owner":"agent-7"`) {
		t.Errorf("list: %s", body)
	}
	// An upload replaces the metadata (none: none left).
	upload("/m.txt", nil)
	_, body = h.rpc(t, rpcCase{procedure: "filesystem.Filesystem/Stat", msg: `{"path":"/m.txt"}`})
	if strings.Contains(string(body), "metadata") {
		t.Errorf("metadata kept after an upload without it: %s", body)
	}
	if w := upload("/bad.txt", map[string]string{"k": "caf\u00e9"}); w.Code != 400 {
		t.Errorf("non-ASCII value: %d %s", w.Code, w.Body)
	}
	if w := upload("/big.txt", map[string]string{"k": strings.Repeat("v", 5000)}); w.Code != 400 {
		t.Errorf("oversized metadata: %d %s", w.Code, w.Body)
	}
	if _, err := os.Stat(filepath.Join(h.agent.Root, "bad.txt")); err == nil {
		t.Errorf("a refused upload left its file")
	}
}

func equalMaps(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// A sandbox that is not running answers as E2B's edge does: 502 with
// {"sandboxId", "message": "The sandbox was not found", "code": 502}.
func TestGoneBodyIsE2Bs(t *testing.T) {
	h := newHarness(t)
	w := h.envd(t, envdCase{method: "GET", url: "/health", sandbox: "P"})
	var body map[string]any
	json.Unmarshal(w.Body.Bytes(), &body)
	if w.Code != http.StatusBadGateway || body["message"] != "The sandbox was not found" || body["code"] != float64(502) || !strings.HasPrefix(body["sandboxId"].(string), "sbx_") {
		t.Errorf("%d %s", w.Code, w.Body)
	}
}

// getMetrics answers the sampled series as E2B's API does, bounded by
// start and end (Unix seconds); a malformed bound is a 400, an unknown
// sandbox a 404.
func TestMetricsSeries(t *testing.T) {
	h := newHarness(t)
	sb := h.eng.Add(sandbox.Running)
	sampler := usage.New(usage.Config{Sandboxes: h.eng, Agents: &enginetest.Agents{Engine: h.eng, IO: h.agent}})
	sampler.SampleAll(context.Background())
	sampler.SampleAll(context.Background())
	h.srv.cfg.Usage = sampler
	get := func(path string) *httptest.ResponseRecorder {
		req := httptest.NewRequest("GET", path, nil)
		req.Header.Set("X-API-KEY", h.key)
		return h.serve(req)
	}
	w := get("/sandboxes/" + sb.ID + "/metrics")
	var series []map[string]any
	if err := json.Unmarshal(w.Body.Bytes(), &series); err != nil || w.Code != 200 || len(series) != 2 {
		t.Fatalf("%d %s", w.Code, w.Body)
	}
	for _, k := range []string{"timestamp", "timestampUnix", "cpuCount", "cpuUsedPct", "memUsed", "memTotal", "memCache", "diskUsed", "diskTotal"} {
		if _, ok := series[0][k]; !ok {
			t.Errorf("sample has no %s: %v", k, series[0])
		}
	}
	future := strconv.FormatInt(time.Now().Add(time.Hour).Unix(), 10)
	if w := get("/sandboxes/" + sb.ID + "/metrics?start=" + future); w.Code != 200 || strings.TrimSpace(w.Body.String()) != "[]" {
		t.Errorf("start in the future: %d %s", w.Code, w.Body)
	}
	if w := get("/sandboxes/" + sb.ID + "/metrics?end=yesterday"); w.Code != 400 {
		t.Errorf("malformed end: %d %s", w.Code, w.Body)
	}
	if w := get("/sandboxes/" + ids.New(ids.Sandbox) + "/metrics"); w.Code != 404 {
		t.Errorf("unknown sandbox: %d %s", w.Code, w.Body)
	}
}

// CreateWatcher and GetWatcherEvents over the agent's inotify watch: each
// event once, with its entry when asked, a removed watcher refused.
func TestWatcherEvents(t *testing.T) {
	h := newHarness(t)
	sb := h.eng.Add(sandbox.Running)
	os.MkdirAll(filepath.Join(h.agent.Root, "w"), 0o755)
	call := func(proc, msg string) (int, map[string]any) {
		req := httptest.NewRequest("POST", "/filesystem.Filesystem/"+proc, strings.NewReader(msg))
		req.Header.Set("E2b-Sandbox-Id", sb.ID)
		req.Header.Set("X-Access-Token", h.signer.SandboxAccessToken(sb.ID, h.tokenID))
		req.Header.Set("Content-Type", "application/json")
		w := h.serve(req)
		var out map[string]any
		json.Unmarshal(w.Body.Bytes(), &out)
		return w.Code, out
	}
	code, out := call("CreateWatcher", `{"path":"/w","recursive":true,"includeEntry":true}`)
	id, _ := out["watcherId"].(string)
	if code != 200 || id == "" {
		t.Fatalf("create watcher: %d %v", code, out)
	}
	os.WriteFile(filepath.Join(h.agent.Root, "w", "f.txt"), []byte("abc"), 0o644)
	var events []any
	for i := 0; i < 50 && len(events) < 2; i++ {
		_, out = call("GetWatcherEvents", `{"watcherId":"`+id+`"}`)
		evs, _ := out["events"].([]any)
		events = append(events, evs...)
		time.Sleep(20 * time.Millisecond)
	}
	if len(events) != 2 {
		t.Fatalf("events: %v", events)
	}
	first := events[0].(map[string]any)
	if first["name"] != "f.txt" || first["type"] != "EVENT_TYPE_CREATE" || first["entry"].(map[string]any)["path"] != "/w/f.txt" {
		t.Errorf("first event: %v", first)
	}
	if second := events[1].(map[string]any); second["type"] != "EVENT_TYPE_WRITE" {
		t.Errorf("second event: %v", second)
	}
	if _, out = call("GetWatcherEvents", `{"watcherId":"`+id+`"}`); out["events"] != nil {
		t.Errorf("events read twice: %v", out)
	}
	if code, _ := call("RemoveWatcher", `{"watcherId":"`+id+`"}`); code != 200 {
		t.Errorf("remove: %d", code)
	}
	if code, _ := call("GetWatcherEvents", `{"watcherId":"`+id+`"}`); code != 404 {
		t.Errorf("events of a removed watcher: %d", code)
	}
}

// The control plane's error bodies say what E2B's API says for the same
// case (packages/api/internal/handlers and utils/messages.go of e2b-dev/infra):
// {"code": status, "message": …}.
func TestControlErrorBodiesAreE2Bs(t *testing.T) {
	h := newHarness(t)
	running, paused := h.eng.Add(sandbox.Running).ID, h.eng.Add(sandbox.Suspended).ID
	unknown := ids.New(ids.Sandbox)
	cases := []struct {
		method, path, body string
		status             int
		message            string
	}{
		{"GET", "/sandboxes/" + unknown, "", 404, `Sandbox "` + unknown + `" doesn't exist or you don't have access to it`},
		{"GET", "/sandboxes/abc123", "", 404, `Sandbox "abc123" doesn't exist or you don't have access to it`},
		{"DELETE", "/sandboxes/a-b-c", "", 400, "Invalid sandbox ID"},
		{"POST", "/sandboxes/" + paused + "/pause", "", 409, "Error pausing sandbox - sandbox '" + paused + "' is already paused"},
		{"POST", "/sandboxes/" + running + "/resume", "", 409, "Sandbox " + running + " is already running"},
		{"POST", "/sandboxes/" + paused + "/timeout", `{"timeout":5}`, 404, `Sandbox "` + paused + `" doesn't exist or you don't have access to it`},
	}
	for _, c := range cases {
		req := httptest.NewRequest(c.method, c.path, strings.NewReader(c.body))
		req.Header.Set("X-API-KEY", h.key)
		w := h.serve(req)
		var e struct {
			Code    int    `json:"code"`
			Message string `json:"message"`
		}
		if err := json.Unmarshal(w.Body.Bytes(), &e); err != nil || w.Code != c.status || e.Code != c.status || e.Message != c.message {
			t.Errorf("%s %s = %d %s, want %d {%q}", c.method, c.path, w.Code, w.Body, c.status, c.message)
		}
	}
}
