package e2e

import (
	"bytes"
	"encoding/json"
	"mime/multipart"
	"strings"
	"testing"

	"github.com/spacesandbox/space/internal/ecw"
)

// ecwDo sends a request to the E2B-compatible listener.
func (s *server) ecwDo(method, path string, body []byte, headers ...string) reply {
	s.t.Helper()
	return s.doAt(s.ecwAddr, method, path, "", body, headers...)
}

// expectE2BError checks E2B's error body: {"code": <status>, "message": …}.
func expectE2BError(t *testing.T, r reply, status int) {
	t.Helper()
	var e struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	}
	if r.status != status || json.Unmarshal(r.body, &e) != nil || e.Code != status || e.Message == "" {
		t.Fatalf("got %d %s, want %d with an E2B error body", r.status, r.body, status)
	}
	if ct := r.header.Get("Content-Type"); ct != "application/json" {
		t.Fatalf("error Content-Type = %q", ct)
	}
}

// The E2B control plane's contract: status codes and error bodies the SDKs
// decide on, on the fake runtime.
func TestECWControlPlaneContract(t *testing.T) {
	s := startServer(t, serverOpts{})
	key := "X-API-KEY: " + s.token

	expectE2BError(t, s.ecwDo("GET", "/v2/sandboxes", nil), 401)
	expectE2BError(t, s.ecwDo("GET", "/v2/sandboxes", nil, "X-API-KEY: space_wrong"), 401)
	expectE2BError(t, s.ecwDo("GET", "/sandboxes/"+fakeSbx, nil, key), 404)
	expectE2BError(t, s.ecwDo("GET", "/sandboxes/abc123", nil, key), 404)    // E2B-shaped, not ours
	expectE2BError(t, s.ecwDo("GET", "/sandboxes/not-an-id", nil, key), 400) // E2B: "Invalid sandbox ID"
	expectE2BError(t, s.ecwDo("DELETE", "/sandboxes/"+fakeSbx, nil, key), 404)
	expectE2BError(t, s.ecwDo("POST", "/sandboxes/"+fakeSbx+"/pause", nil, key), 404)
	expectE2BError(t, s.ecwDo("POST", "/v2/sandboxes/"+fakeSbx+"/connect", []byte(`{}`), key), 404)
	expectE2BError(t, s.ecwDo("PUT", "/v2/sandboxes", nil, key), 405)
	// A route the layer does not have: a plain 404, as E2B's API answers,
	// not an error body the SDKs would read as "sandbox not found".
	if r := s.ecwDo("GET", "/no/such/thing", nil, key); r.status != 404 || json.Valid(r.body) {
		t.Fatalf("unknown route = %d %s", r.status, r.body)
	}

	// Bad creates change nothing.
	for _, body := range []string{
		`{"templateID":"test","surprise":1}`,
		`{"templateID":"test","timeout":0}`,
		`{"templateID":"test","timeout":"soon"}`,
		`{"templateID":"test","allow_internet_access":"yes"}`,
		`{"templateID":"test","network":{"denyOut":["not a cidr or name!"]}}`,
		`{"templateID":"test","network":{"rules":{"example.com":[]}}}`,
		`{"templateID":"test","autoPauseMemory":false}`,
		`{"templateID":"BAD TEMPLATE"}`,
		`{"templateID":`,
		`{"templateID":"test"}{}`,
	} {
		expectE2BError(t, s.ecwDo("POST", "/v2/sandboxes", []byte(body), key), 400)
	}
	expectE2BError(t, s.ecwDo("POST", "/v2/sandboxes", append([]byte(`{"metadata":{"a":"`), append(bytes.Repeat([]byte("x"), 2<<20), '"', '}', '}')...), key), 413)
	if r := s.ecwDo("GET", "/v2/sandboxes", nil, key); r.status != 200 || string(r.body) != "[]\n" {
		t.Fatalf("list after refused creates: %d %s", r.status, r.body)
	}

	// Every E2B SDK up to 2.50 sends allow_internet_access: true: it creates,
	// and the sandbox's policy says so on both APIs.
	r0 := s.ecwDo("POST", "/v2/sandboxes", []byte(`{"templateID":"test","allow_internet_access":true,"network":{"denyOut":["198.51.100.0/24"],"allowOut":["pypi.org"],"allowPublicTraffic":false}}`), key)
	var withNet struct{ SandboxID, TrafficAccessToken string }
	if r0.status != 201 || json.Unmarshal(r0.body, &withNet) != nil || withNet.TrafficAccessToken == "" {
		t.Fatalf("create with allow_internet_access = %d %s", r0.status, r0.body)
	}
	if n := s.do("GET", "/v1/sandboxes/"+withNet.SandboxID, s.token, nil); n.status != 200 ||
		!strings.Contains(string(n.body), `"network":{"egress":"public","allow":["pypi.org"],"deny":["198.51.100.0/24"],"public_ingress":false,"ingress_token":"`+withNet.TrafficAccessToken+`"}`) {
		t.Fatalf("native view of the E2B network = %d %s", n.status, n.body)
	}
	if u := s.ecwDo("PUT", "/sandboxes/"+withNet.SandboxID+"/network", []byte(`{"denyOut":["0.0.0.0/0"],"allowOut":["203.0.113.0/24"]}`), key); u.status != 204 {
		t.Fatalf("updateNetwork = %d %s", u.status, u.body)
	}
	if g := s.ecwDo("GET", "/sandboxes/"+withNet.SandboxID, nil, key); g.status != 200 ||
		!strings.Contains(string(g.body), `"network":{"allowOut":["203.0.113.0/24"],"denyOut":["0.0.0.0/0"],"allowPublicTraffic":false},"allowInternetAccess":false`) {
		t.Fatalf("getInfo after updateNetwork = %d %s", g.status, g.body)
	}
	expectE2BError(t, s.ecwDo("PUT", "/sandboxes/"+withNet.SandboxID+"/network", []byte(`{"denyOut":["nope nope"]}`), key), 400)
	s.ecwDo("DELETE", "/sandboxes/"+withNet.SandboxID, nil, key)

	// A create answers 201 with what the SDKs read.
	r := s.ecwDo("POST", "/v2/sandboxes", []byte(`{"templateID":"test","timeout":300,"metadata":{"k":"v"},"envVars":{"A":"1"}}`), key)
	var created struct {
		SandboxID, TemplateID, ClientID, EnvdVersion, EnvdAccessToken string
	}
	if r.status != 201 || json.Unmarshal(r.body, &created) != nil || !strings.HasPrefix(created.SandboxID, "sbx_") ||
		created.EnvdVersion != ecw.EnvdVersion || created.EnvdAccessToken == "" || created.ClientID == "" {
		t.Fatalf("create = %d %s", r.status, r.body)
	}
	id := created.SandboxID
	// The same sandbox through the native API.
	if n := s.do("GET", "/v1/sandboxes/"+id, s.token, nil); n.status != 200 || !strings.Contains(string(n.body), `"timeout_action":"delete"`) || !strings.Contains(string(n.body), `"k":"v"`) {
		t.Fatalf("native view = %d %s", n.status, n.body)
	}
	var detail struct {
		State    string
		EndAt    string `json:"endAt"`
		Metadata map[string]string
	}
	r = s.ecwDo("GET", "/sandboxes/"+id, nil, key)
	if r.status != 200 || json.Unmarshal(r.body, &detail) != nil || detail.State != "running" || detail.Metadata["k"] != "v" || detail.EndAt == "" {
		t.Fatalf("get = %d %s", r.status, r.body)
	}
	expectE2BError(t, s.ecwDo("POST", "/sandboxes/"+id+"/resume", []byte(`{}`), key), 409)
	if r := s.ecwDo("POST", "/v2/sandboxes/"+id+"/connect", []byte(`{"timeout":60}`), key); r.status != 200 {
		t.Fatalf("connect running = %d %s", r.status, r.body)
	}
	expectE2BError(t, s.ecwDo("POST", "/sandboxes/"+id+"/timeout", []byte(`{}`), key), 400)
	expectE2BError(t, s.ecwDo("POST", "/sandboxes/"+id+"/timeout", []byte(`{"timeout":-5}`), key), 400)
	if r := s.ecwDo("POST", "/sandboxes/"+id+"/timeout", []byte(`{"timeout":120}`), key); r.status != 204 {
		t.Fatalf("timeout = %d %s", r.status, r.body)
	}
	if r := s.ecwDo("POST", "/sandboxes/"+id+"/refreshes", []byte(`{"duration":30}`), key); r.status != 204 {
		t.Fatalf("refreshes = %d %s", r.status, r.body)
	}
	if r := s.ecwDo("GET", "/sandboxes/"+id+"/metrics", nil, key); r.status != 200 || string(r.body) != "[]\n" {
		t.Fatalf("metrics = %d %s", r.status, r.body)
	}

	// Lists: filters, bad queries, paging through X-Next-Token.
	for _, q := range []string{"?bogus=1", "?state=sleeping", "?limit=0", "?limit=101", "?metadata=a%3D%25zz"} {
		expectE2BError(t, s.ecwDo("GET", "/v2/sandboxes"+q, nil, key), 400)
	}
	r2 := s.ecwDo("POST", "/sandboxes", []byte(`{"templateID":"test"}`), key)
	if r2.status != 201 {
		t.Fatalf("second create (v1 path) = %d %s", r2.status, r2.body)
	}
	seen := map[string]bool{}
	next := ""
	for pages := 0; ; pages++ {
		r := s.ecwDo("GET", "/v2/sandboxes?limit=1&nextToken="+next, nil, key)
		var items []struct{ SandboxID string }
		if r.status != 200 || json.Unmarshal(r.body, &items) != nil || len(items) > 1 {
			t.Fatalf("page = %d %s", r.status, r.body)
		}
		for _, it := range items {
			if seen[it.SandboxID] {
				t.Fatalf("paging repeated %s", it.SandboxID)
			}
			seen[it.SandboxID] = true
		}
		if next = r.header.Get("X-Next-Token"); next == "" {
			break
		}
		if pages > 5 {
			t.Fatal("paging does not end")
		}
	}
	if len(seen) != 2 {
		t.Fatalf("paging saw %v", seen)
	}
	if r := s.ecwDo("GET", "/v2/sandboxes?metadata=k%3Dv", nil, key); !strings.Contains(string(r.body), id) || strings.Count(string(r.body), "sandboxID") != 1 {
		t.Fatalf("metadata filter = %s", r.body)
	}

	// Pause is a suspend; a second pause is 409; resume restores (201).
	expectE2BError(t, s.ecwDo("POST", "/sandboxes/"+id+"/pause", []byte(`{"memory":false}`), key), 400)
	if r := s.ecwDo("POST", "/sandboxes/"+id+"/pause", nil, key); r.status != 204 {
		t.Fatalf("pause = %d %s", r.status, r.body)
	}
	if n := s.do("GET", "/v1/sandboxes/"+id, s.token, nil); !strings.Contains(string(n.body), `"state":"suspended"`) {
		t.Fatalf("E2B pause must be a suspend: %s", n.body)
	}
	expectE2BError(t, s.ecwDo("POST", "/sandboxes/"+id+"/pause", nil, key), 409)
	if r := s.ecwDo("GET", "/v2/sandboxes?state=paused", nil, key); !strings.Contains(string(r.body), id) {
		t.Fatalf("paused list = %s", r.body)
	}
	if r := s.ecwDo("POST", "/sandboxes/"+id+"/resume", []byte(`{"timeout":60}`), key); r.status != 201 {
		t.Fatalf("resume = %d %s", r.status, r.body)
	}
	if r := s.ecwDo("DELETE", "/sandboxes/"+id, nil, key); r.status != 204 {
		t.Fatalf("kill = %d %s", r.status, r.body)
	}
	expectE2BError(t, s.ecwDo("GET", "/sandboxes/"+id, nil, key), 404)
	expectE2BError(t, s.ecwDo("DELETE", "/sandboxes/"+id, nil, key), 404)
}

// envd's contract on SPACE: routing by header, access tokens, file and
// Connect error shapes, on the fake runtime.
func TestECWEnvdContract(t *testing.T) {
	s := startServer(t, serverOpts{})
	key := "X-API-KEY: " + s.token
	r := s.ecwDo("POST", "/v2/sandboxes", []byte(`{"templateID":"test","timeout":300}`), key)
	var sb struct{ SandboxID, EnvdAccessToken string }
	if r.status != 201 || json.Unmarshal(r.body, &sb) != nil {
		t.Fatalf("create = %d %s", r.status, r.body)
	}
	r = s.ecwDo("POST", "/v2/sandboxes", []byte(`{"templateID":"test","timeout":300}`), key)
	var other struct{ SandboxID, EnvdAccessToken string }
	json.Unmarshal(r.body, &other)
	route := []string{"E2b-Sandbox-Id: " + sb.SandboxID, "E2b-Sandbox-Port: 49983"}
	tok := "X-Access-Token: " + sb.EnvdAccessToken
	withTok := append(route, tok, "Authorization: Basic cm9vdDo=") // root:

	if r := s.ecwDo("GET", "/health", nil, route...); r.status != 204 {
		t.Fatalf("health = %d %s", r.status, r.body)
	}
	expectE2BError(t, s.ecwDo("GET", "/files?path=/etc/passwd", nil, route...), 401)
	expectE2BError(t, s.ecwDo("GET", "/files?path=/etc/passwd", nil, append(route, "X-Access-Token: "+other.EnvdAccessToken)...), 401)
	expectE2BError(t, s.ecwDo("GET", "/files?path=/etc/passwd", nil, "E2b-Sandbox-Id: "+sb.SandboxID, "E2b-Sandbox-Port: 8080", tok), 502)
	expectE2BError(t, s.ecwDo("GET", "/files?path=/nope", nil, withTok...), 404)
	expectE2BError(t, s.ecwDo("GET", "/files?path=/hello.txt&bogus=1", nil, withTok...), 400)
	expectE2BError(t, s.ecwDo("GET", "/files?path=/", nil, withTok...), 400)
	if r := s.ecwDo("POST", "/files?path=/hello.txt", []byte("hello"), append(withTok, "Content-Type: application/octet-stream")...); r.status != 200 || !strings.Contains(string(r.body), `"path":"/hello.txt"`) {
		t.Fatalf("octet-stream upload = %d %s", r.status, r.body)
	}
	if r := s.ecwDo("GET", "/files?path=/hello.txt", nil, withTok...); r.status != 200 || string(r.body) != "hello" || r.header.Get("Content-Length") != "5" {
		t.Fatalf("read = %d %s", r.status, r.body)
	}
	// Uploads: octet-stream needs a path; multipart needs a "file" part.
	expectE2BError(t, s.ecwDo("POST", "/files", []byte("x"), append(withTok, "Content-Type: application/octet-stream")...), 400)
	expectE2BError(t, s.ecwDo("POST", "/files?path=/x", []byte("x"), append(withTok, "Content-Encoding: br")...), 400)
	expectE2BError(t, s.ecwDo("POST", "/files?path=/x", []byte("not gzip"), append(withTok, "Content-Encoding: gzip")...), 400)
	var mp bytes.Buffer
	mw := multipart.NewWriter(&mp)
	fw, _ := mw.CreateFormField("other")
	fw.Write([]byte("x"))
	mw.Close()
	expectE2BError(t, s.ecwDo("POST", "/files?path=/x", mp.Bytes(), append(withTok, "Content-Type: "+mw.FormDataContentType())...), 400)
	// The full path in a part's file name is kept (not just its base).
	mp.Reset()
	mw = multipart.NewWriter(&mp)
	h := make(map[string][]string)
	h["Content-Disposition"] = []string{`form-data; name="file"; filename="/deep/er/f.txt"`}
	pw, _ := mw.CreatePart(h)
	pw.Write([]byte("deep"))
	mw.Close()
	if r := s.ecwDo("POST", "/files", mp.Bytes(), append(withTok, "Content-Type: "+mw.FormDataContentType())...); r.status != 200 || !strings.Contains(string(r.body), `"path":"/deep/er/f.txt"`) {
		t.Fatalf("multipart upload = %d %s", r.status, r.body)
	}
	if r := s.ecwDo("GET", "/files?path=/deep/er/f.txt", nil, withTok...); string(r.body) != "deep" {
		t.Fatalf("read back = %d %s", r.status, r.body)
	}
	// As envd (#14 item 11): ?path= wins over a part's file name, whatever
	// that says; two files for one path in one upload are refused.
	multi := func(names ...string) ([]byte, string) {
		var b bytes.Buffer
		mw := multipart.NewWriter(&b)
		for _, n := range names {
			pw, _ := mw.CreatePart(map[string][]string{"Content-Disposition": {`form-data; name="file"; filename="` + n + `"`}})
			pw.Write([]byte("from " + n))
		}
		mw.Close()
		return b.Bytes(), "Content-Type: " + mw.FormDataContentType()
	}
	body, ct := multi("../../etc/evil")
	if r := s.ecwDo("POST", "/files?path=/tmp/chosen.txt", body, append(withTok, ct)...); r.status != 200 || !strings.Contains(string(r.body), `"path":"/tmp/chosen.txt"`) {
		t.Fatalf("upload with ?path= and a hostile file name = %d %s", r.status, r.body)
	}
	if r := s.ecwDo("GET", "/files?path=/etc/evil", nil, withTok...); r.status != 404 {
		t.Fatalf("the part's file name was used: %d %s", r.status, r.body)
	}
	body, ct = multi("/tmp/twice", "/tmp/../tmp/twice")
	expectE2BError(t, s.ecwDo("POST", "/files", body, append(withTok, ct)...), 400)

	// Connect RPC: unary errors are Connect JSON errors with HTTP statuses.
	rpc := append(withTok, "Content-Type: application/json")
	if r := s.ecwDo("POST", "/filesystem.Filesystem/Stat", []byte(`{"path":"/deep/er/f.txt"}`), rpc...); r.status != 200 || !strings.Contains(string(r.body), `"FILE_TYPE_FILE"`) {
		t.Fatalf("Stat = %d %s", r.status, r.body)
	}
	for _, c := range []struct {
		path, body string
		status     int
		code       string
	}{
		{"/filesystem.Filesystem/Stat", `{"path":"/nope"}`, 404, "not_found"},
		{"/filesystem.Filesystem/Stat", `{"path":""}`, 400, "invalid_argument"},
		{"/filesystem.Filesystem/Stat", `{"path":`, 400, "invalid_argument"},
		{"/filesystem.Filesystem/MakeDir", `{"path":"/deep"}`, 409, "already_exists"},
		{"/filesystem.Filesystem/GetWatcherEvents", `{"watcherId":"nope"}`, 404, "not_found"},
		{"/process.Process/SendSignal", `{"process":{"pid":424242},"signal":"SIGNAL_SIGKILL"}`, 404, "not_found"},
		{"/process.Process/SendSignal", `{"process":{"pid":1},"signal":"SIGNAL_UNSPECIFIED"}`, 400, "invalid_argument"},
		{"/process.Process/SendInput", `{"process":{}}`, 400, "invalid_argument"},
	} {
		r := s.ecwDo("POST", c.path, []byte(c.body), rpc...)
		var ce struct{ Code, Message string }
		if r.status != c.status || json.Unmarshal(r.body, &ce) != nil || ce.Code != c.code {
			t.Fatalf("%s %s = %d %s, want %d %s", c.path, c.body, r.status, r.body, c.status, c.code)
		}
	}
	if r := s.ecwDo("POST", "/process.Process/List", []byte(`{}`), rpc...); r.status != 200 || !json.Valid(r.body) {
		t.Fatalf("List = %d %s", r.status, r.body)
	}
	expectE2BError(t, s.ecwDo("POST", "/process.Process/List", []byte(`{}`), append(route, "Content-Type: application/json")...), 401)

	// A streaming call's error travels in the end-of-stream frame.
	r = s.ecwDo("POST", "/process.Process/Connect", connectFrame(0, []byte(`{"process":{"pid":424242}}`)), append(withTok, "Content-Type: application/connect+json")...)
	if r.status != 200 || len(r.body) < 5 || r.body[0] != 2 || !strings.Contains(string(r.body[5:]), `"code":"not_found"`) {
		t.Fatalf("streaming error = %d %q", r.status, r.body)
	}
	// A stream that starts a process ends with its end event.
	r = s.ecwDo("POST", "/process.Process/Start", connectFrame(0, []byte(`{"process":{"cmd":"/bin/sh","args":["-c","echo hi; exit 4"]}}`)), append(withTok, "Content-Type: application/connect+json")...)
	if r.status != 200 || !strings.Contains(string(r.body), `"start"`) || !strings.Contains(string(r.body), `"stdout":"aGkK"`) || !strings.Contains(string(r.body), `"exitCode":4`) {
		t.Fatalf("Start stream = %d %q", r.status, r.body)
	}

	// A deleted sandbox's envd is gone (502), token or not.
	s.ecwDo("DELETE", "/sandboxes/"+sb.SandboxID, nil, key)
	expectE2BError(t, s.ecwDo("GET", "/files?path=/etc/passwd", nil, withTok...), 502)
	expectE2BError(t, s.ecwDo("GET", "/health", nil, route...), 502)
}

// connectFrame is one Connect streaming envelope.
func connectFrame(flags byte, msg []byte) []byte {
	n := len(msg)
	return append([]byte{flags, byte(n >> 24), byte(n >> 16), byte(n >> 8), byte(n)}, msg...)
}
