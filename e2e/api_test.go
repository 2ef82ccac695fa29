package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	apispec "github.com/spacesandbox/space/api"
	"github.com/spacesandbox/space/client"
)

func expectError(t *testing.T, r reply, status int, code string) {
	t.Helper()
	if r.status != status || r.errorCode() != code {
		t.Fatalf("got %d %s, want %d %s", r.status, r.body, status, code)
	}
	if ct := r.header.Get("Content-Type"); ct != "application/json" {
		t.Fatalf("error Content-Type = %q", ct)
	}
}

const fakeSbx = "sbx_aaaaaaaaaaaaaaaaaaaaaaaaaa"
const fakeOp = "op_aaaaaaaaaaaaaaaaaaaaaaaaaa"

// Public endpoints answer without a token; /v1 requires one.
func TestServiceEndpointsAndAuthentication(t *testing.T) {
	s := startServer(t, serverOpts{})
	if r := s.do("GET", "/healthz", "", nil); r.status != 200 {
		t.Fatalf("healthz = %d", r.status)
	}
	if r := s.do("GET", "/readyz", "", nil); r.status != 200 || !bytes.Contains(r.body, []byte(`"ready"`)) {
		t.Fatalf("readyz = %d %s", r.status, r.body)
	}
	if r := s.do("GET", "/openapi-m1.json", "", nil); r.status != 200 || !bytes.Equal(r.body, apispec.OpenAPI) {
		t.Fatalf("openapi = %d (%d bytes)", r.status, len(r.body))
	}
	s.do("GET", "/v1/sandboxes", s.token, nil)
	if r := s.do("GET", "/metrics", "", nil); r.status != 200 || !bytes.Contains(r.body, []byte(`space_http_request_duration_seconds_bucket{code="200",listener="api",method="GET",route="/v1/sandboxes"`)) {
		t.Fatalf("metrics = %d, missing request histogram:\n%.2000s", r.status, r.body)
	}
	for _, tok := range []string{"", "nope", s.token + "x", "space_" + strings.Repeat("a", 52)} {
		r := s.do("GET", "/v1/sandboxes", tok, nil)
		expectError(t, r, 401, "unauthenticated")
		if r.header.Get("WWW-Authenticate") == "" {
			t.Fatal("401 without WWW-Authenticate")
		}
	}
	// Basic auth is not accepted.
	expectError(t, s.do("GET", "/v1/sandboxes", "", nil, "Authorization: Basic "+s.token), 401, "unauthenticated")
	// The token never appears in the server's log.
	if strings.Contains(s.log(), s.token) {
		t.Fatal("API token written to the log")
	}
	expectError(t, s.do("GET", "/v1/nothing", s.token, nil), 404, "not_found")
	expectError(t, s.do("GET", "/v1/sandboxes/", s.token, nil), 404, "not_found")
	r := s.do("PUT", "/v1/sandboxes", s.token, []byte("{}"))
	expectError(t, r, 405, "method_not_allowed")
	if r.header.Get("Allow") != "GET, POST" {
		t.Fatalf("Allow = %q", r.header.Get("Allow"))
	}
}

// A server with no runtime (a production build on a host where none works)
// runs, says it is not ready and why, and refuses creates with 503.
func TestNoRuntimeIsNotReady(t *testing.T) {
	s := startServer(t, serverOpts{bin: spaceBin, args: []string{"--runtime", "auto", "--runsc", "/nonexistent/runsc", "--qemu", "/nonexistent/qemu", "--build-seed=false"}})
	r := s.do("GET", "/readyz", "", nil)
	if r.status != 503 || !bytes.Contains(r.body, []byte("no sandbox runtime")) {
		t.Fatalf("readyz = %d %s", r.status, r.body)
	}
	expectError(t, s.do("POST", "/v1/sandboxes", s.token, []byte(`{}`)), 503, "unavailable")
	expectError(t, s.do("POST", "/v1/sandboxes/"+fakeSbx+":pause", s.token, nil), 404, "not_found")
}

func TestSandboxEndpoints(t *testing.T) {
	s := startServer(t, serverOpts{})
	// Create with every field.
	body := `{"template":"seed:latest","runtime":"fake","resources":{"vcpus":2,"memory_mib":1024,"disk_mib":4096},"env":{"A":"1"},"metadata":{"team":"x"},"auto_lifecycle":{"idle_timeout":"5m","idle_action":"suspend"}}`
	r := s.do("POST", "/v1/sandboxes", s.token, []byte(body))
	if r.status != 202 {
		t.Fatalf("create = %d %s", r.status, r.body)
	}
	var created client.CreateSandboxResponse
	r.json(t, &created)
	sb, op := created.Sandbox, created.Operation
	if !strings.HasPrefix(sb.ID, "sbx_") || !strings.HasPrefix(op.ID, "op_") || sb.State != "starting" || op.Kind != "create" || op.SandboxID != sb.ID {
		t.Fatalf("create response = %s", r.body)
	}
	if r.header.Get("Location") != "/v1/operations/"+op.ID {
		t.Fatalf("Location = %q", r.header.Get("Location"))
	}
	if sb.Resources.VCPUs != 2 || sb.Env["A"] != "1" || sb.Metadata["team"] != "x" || sb.AutoLifecycle.IdleAction != "suspend" || !strings.HasPrefix(sb.Template.Digest, "sha256:") {
		t.Fatalf("create ignored fields: %s", r.body)
	}
	if done := s.waitOp(op.ID); done.State != "succeeded" || done.CompletedAt == nil {
		t.Fatalf("create op = %+v", done)
	}
	r = s.do("GET", "/v1/sandboxes/"+sb.ID, s.token, nil)
	var got client.Sandbox
	r.json(t, &got)
	if r.status != 200 || got.State != "running" {
		t.Fatalf("get = %d %s", r.status, r.body)
	}

	// Lifecycle through every transition, and the refusals.
	step := func(action string, wantFinal string) string {
		t.Helper()
		method, path := "POST", "/v1/sandboxes/"+sb.ID+":"+action
		if action == "delete" {
			method, path = "DELETE", "/v1/sandboxes/"+sb.ID
		}
		r := s.do(method, path, s.token, nil)
		if r.status != 202 {
			t.Fatalf("%s = %d %s", action, r.status, r.body)
		}
		var out struct{ Operation client.Operation }
		r.json(t, &out)
		if out.Operation.Kind != action || r.header.Get("Location") != "/v1/operations/"+out.Operation.ID {
			t.Fatalf("%s response = %s", action, r.body)
		}
		if done := s.waitOp(out.Operation.ID); done.State != "succeeded" {
			t.Fatalf("%s op = %+v", action, done)
		}
		st, _ := s.client().GetSandbox(context.Background(), sb.ID)
		if st.State != wantFinal {
			t.Fatalf("after %s state = %s, want %s", action, st.State, wantFinal)
		}
		return out.Operation.ID
	}
	// wake of running succeeds at once.
	r = s.do("POST", "/v1/sandboxes/"+sb.ID+":wake", s.token, nil)
	var wake struct{ Operation client.Operation }
	r.json(t, &wake)
	if r.status != 202 || wake.Operation.State != "succeeded" {
		t.Fatalf("wake of running = %d %s", r.status, r.body)
	}
	step("pause", "paused")
	expectError(t, s.do("POST", "/v1/sandboxes/"+sb.ID+":pause", s.token, nil), 409, "failed_precondition")
	step("suspend", "suspended")
	expectError(t, s.do("POST", "/v1/sandboxes/"+sb.ID+":pause", s.token, nil), 409, "failed_precondition")
	expectError(t, s.do("POST", "/v1/sandboxes/"+sb.ID+":suspend", s.token, nil), 409, "failed_precondition")
	step("wake", "running")
	step("suspend", "suspended")
	step("wake", "running")
	step("delete", "deleted")
	expectError(t, s.do("DELETE", "/v1/sandboxes/"+sb.ID, s.token, nil), 404, "not_found")
	expectError(t, s.do("POST", "/v1/sandboxes/"+sb.ID+":wake", s.token, nil), 409, "failed_precondition")

	// Operations of the sandbox, in order.
	r = s.do("GET", "/v1/operations?sandbox_id="+sb.ID, s.token, nil)
	var ops client.List[client.Operation]
	r.json(t, &ops)
	var kinds []string
	for _, o := range ops.Items {
		kinds = append(kinds, o.Kind)
	}
	if got := strings.Join(kinds, ","); got != "create,wake,pause,suspend,wake,suspend,wake,delete" || ops.NextCursor != nil {
		t.Fatalf("operations = %s", got)
	}
	r = s.do("GET", "/v1/operations/"+ops.Items[0].ID, s.token, nil)
	if r.status != 200 {
		t.Fatalf("get operation = %d", r.status)
	}
	// Deleted sandboxes leave the default list but stay inspectable.
	r = s.do("GET", "/v1/sandboxes", s.token, nil)
	if !bytes.Equal(bytes.TrimSpace(r.body), []byte(`{"items":[],"next_cursor":null}`)) {
		t.Fatalf("list after delete = %s", r.body)
	}
	r = s.do("GET", "/v1/sandboxes?state=deleted", s.token, nil)
	if !bytes.Contains(r.body, []byte(sb.ID)) {
		t.Fatalf("state=deleted list = %s", r.body)
	}
}

func TestBadInputIsRejected(t *testing.T) {
	s := startServer(t, serverOpts{})
	id := s.createRunning()
	cases := []struct {
		name, method, path, body string
		headers                  []string
		status                   int
		code                     string
	}{
		{"unknown field", "POST", "/v1/sandboxes", `{"templte":"seed:latest"}`, nil, 400, "invalid_argument"},
		{"wrong type", "POST", "/v1/sandboxes", `{"resources":{"vcpus":"two"}}`, nil, 400, "invalid_argument"},
		{"malformed JSON", "POST", "/v1/sandboxes", `{"template":`, nil, 400, "invalid_argument"},
		{"trailing data", "POST", "/v1/sandboxes", `{} {}`, nil, 400, "invalid_argument"},
		{"array body", "POST", "/v1/sandboxes", `[]`, nil, 400, "invalid_argument"},
		{"bad template", "POST", "/v1/sandboxes", `{"template":"../etc"}`, nil, 400, "invalid_argument"},
		{"unknown template", "POST", "/v1/sandboxes", `{"template":"missing:v1"}`, nil, 404, "not_found"},
		{"unknown runtime", "POST", "/v1/sandboxes", `{"runtime":"vmware"}`, nil, 400, "invalid_argument"},
		{"too many vcpus", "POST", "/v1/sandboxes", `{"resources":{"vcpus":1000}}`, nil, 400, "invalid_argument"},
		{"negative memory", "POST", "/v1/sandboxes", `{"resources":{"memory_mib":-1}}`, nil, 400, "invalid_argument"},
		{"bad env name", "POST", "/v1/sandboxes", `{"env":{"A=B":"c"}}`, nil, 400, "invalid_argument"},
		{"bad idle action", "POST", "/v1/sandboxes", `{"auto_lifecycle":{"idle_action":"reboot"}}`, nil, 400, "invalid_argument"},
		{"bad idle timeout", "POST", "/v1/sandboxes", `{"auto_lifecycle":{"idle_timeout":"1ns"}}`, nil, 400, "invalid_argument"},
		{"form content type", "POST", "/v1/sandboxes", `{}`, []string{"Content-Type: application/x-www-form-urlencoded"}, 400, "invalid_argument"},
		{"body on pause", "POST", "/v1/sandboxes/" + id + ":pause", `{"force":true}`, nil, 400, "invalid_argument"},
		{"unknown verb", "POST", "/v1/sandboxes/" + id + ":explode", ``, nil, 404, "not_found"},
		{"empty id with verb", "POST", "/v1/sandboxes/:pause", ``, nil, 404, "not_found"},
		{"malformed sandbox id", "GET", "/v1/sandboxes/sbx_x", ``, nil, 400, "invalid_argument"},
		{"operation id as sandbox id", "GET", "/v1/sandboxes/" + fakeOp, ``, nil, 400, "invalid_argument"},
		{"unknown sandbox", "GET", "/v1/sandboxes/" + fakeSbx, ``, nil, 404, "not_found"},
		{"unknown sandbox pause", "POST", "/v1/sandboxes/" + fakeSbx + ":pause", ``, nil, 404, "not_found"},
		{"unknown sandbox delete", "DELETE", "/v1/sandboxes/" + fakeSbx, ``, nil, 404, "not_found"},
		{"malformed operation id", "GET", "/v1/operations/op_", ``, nil, 400, "invalid_argument"},
		{"unknown operation", "GET", "/v1/operations/" + fakeOp, ``, nil, 404, "not_found"},
		{"bad state filter", "GET", "/v1/sandboxes?state=zombie", ``, nil, 400, "invalid_argument"},
		{"limit zero", "GET", "/v1/sandboxes?limit=0", ``, nil, 400, "invalid_argument"},
		{"limit too big", "GET", "/v1/sandboxes?limit=501", ``, nil, 400, "invalid_argument"},
		{"limit not a number", "GET", "/v1/sandboxes?limit=ten", ``, nil, 400, "invalid_argument"},
		{"bad cursor", "GET", "/v1/sandboxes?cursor=!!!", ``, nil, 400, "invalid_argument"},
		{"unknown query", "GET", "/v1/sandboxes?stat=running", ``, nil, 400, "invalid_argument"},
		{"repeated query", "GET", "/v1/sandboxes?limit=1&limit=2", ``, nil, 400, "invalid_argument"},
		{"bad sandbox_id filter", "GET", "/v1/operations?sandbox_id=nope", ``, nil, 400, "invalid_argument"},
		{"bad idempotency key", "POST", "/v1/sandboxes", `{}`, []string{"Idempotency-Key: " + strings.Repeat("k", 300)}, 400, "invalid_argument"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var body []byte
			if c.body != "" {
				body = []byte(c.body)
			}
			expectError(t, s.do(c.method, c.path, s.token, body, c.headers...), c.status, c.code)
		})
	}
	// A body over the limit is 413.
	big := append([]byte(`{"metadata":{"a":"`), bytes.Repeat([]byte("x"), 2<<20)...)
	expectError(t, s.do("POST", "/v1/sandboxes", s.token, append(big, `"}}`...)), 413, "payload_too_large")
	// None of the rejected creates made a sandbox.
	page, err := s.client().ListSandboxes(context.Background(), "", client.ListOptions{})
	if err != nil || len(page.Items) != 1 {
		t.Fatalf("after bad input: %d sandboxes, %v", len(page.Items), err)
	}
}

func TestSandboxCapacity(t *testing.T) {
	s := startServer(t, serverOpts{args: []string{"--runtime", "fake", "--max-sandboxes", "2"}})
	a := s.createRunning()
	s.createRunning()
	r := s.do("POST", "/v1/sandboxes", s.token, []byte(`{}`))
	expectError(t, r, 429, "resource_exhausted")
	// Deleting one frees a place.
	op, _, err := s.client().Lifecycle(context.Background(), "delete", a, "")
	if err != nil {
		t.Fatal(err)
	}
	s.waitOp(op.ID)
	s.createRunning()
}

// A refusal that depends on the moment is not stored under the key: the
// client that retries with the same key, as it is told to, gets through once
// the moment passes (#14 item 7).
func TestIdempotencyKeepsOnlyFinalOutcomes(t *testing.T) {
	s := startServer(t, serverOpts{args: []string{"--runtime", "fake", "--max-sandboxes", "1"}})
	a := s.createRunning()
	expectError(t, s.do("POST", "/v1/sandboxes", s.token, []byte(`{}`), "Idempotency-Key: full-1"), 429, "resource_exhausted")
	op, _, err := s.client().Lifecycle(context.Background(), "delete", a, "")
	if err != nil {
		t.Fatal(err)
	}
	s.waitOp(op.ID)
	r := s.do("POST", "/v1/sandboxes", s.token, []byte(`{}`), "Idempotency-Key: full-1")
	if r.status != 202 || r.header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("retry after the limit cleared = %d %s %v, want a fresh 202", r.status, r.body, r.header)
	}
	// Now final: replayed.
	again := s.do("POST", "/v1/sandboxes", s.token, []byte(`{}`), "Idempotency-Key: full-1")
	if again.status != 202 || again.header.Get("Idempotent-Replayed") != "true" || !bytes.Equal(again.body, r.body) {
		t.Fatalf("replay = %d %s", again.status, again.body)
	}
	var created client.CreateSandboxResponse
	r.json(t, &created)
	s.waitOp(created.Operation.ID)
	id := created.Sandbox.ID
	// 409 for a state that does not allow it (pause a suspended sandbox),
	// then the state changes and the same request with the same key runs.
	lifecycle := func(verb string) {
		op, _, err := s.client().Lifecycle(context.Background(), verb, id, "")
		if err != nil {
			t.Fatal(err)
		}
		s.waitOp(op.ID)
	}
	lifecycle("suspend")
	expectError(t, s.do("POST", "/v1/sandboxes/"+id+":pause", s.token, nil, "Idempotency-Key: pause-1"), 409, "failed_precondition")
	lifecycle("wake")
	w := s.do("POST", "/v1/sandboxes/"+id+":pause", s.token, nil, "Idempotency-Key: pause-1")
	if w.status != 202 || w.header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("pause after wake with the refused key = %d %s, want a fresh 202", w.status, w.body)
	}
}

// FAKE runtime with a slow step, to hold an operation in flight.
func TestOneOperationInFlightFakeSlowRuntime(t *testing.T) {
	s := startServer(t, serverOpts{env: []string{"SPACE_FAKE_DELAY=400ms"}})
	id := s.createRunning()
	r := s.do("POST", "/v1/sandboxes/"+id+":suspend", s.token, nil, "Idempotency-Key: susp-1")
	if r.status != 202 {
		t.Fatalf("suspend = %d %s", r.status, r.body)
	}
	expectError(t, s.do("POST", "/v1/sandboxes/"+id+":pause", s.token, nil), 409, "conflict")
	expectError(t, s.do("DELETE", "/v1/sandboxes/"+id, s.token, nil), 409, "conflict")
	// The same request with the same key is not a conflict: it is a replay.
	again := s.do("POST", "/v1/sandboxes/"+id+":suspend", s.token, nil, "Idempotency-Key: susp-1")
	if again.status != 202 || again.header.Get("Idempotent-Replayed") != "true" || !bytes.Equal(again.body, r.body) {
		t.Fatalf("replay while in flight = %d %s", again.status, again.body)
	}
	sb, _ := s.client().GetSandbox(context.Background(), id)
	if sb.State != "suspending" {
		t.Fatalf("state in flight = %s", sb.State)
	}
}

func TestIdempotentReplay(t *testing.T) {
	s := startServer(t, serverOpts{})
	body := []byte(`{"metadata":{"n":"1"}}`)
	first := s.do("POST", "/v1/sandboxes", s.token, body, "Idempotency-Key: create-1")
	if first.status != 202 || first.header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("first = %d %v", first.status, first.header)
	}
	for i := 0; i < 3; i++ {
		r := s.do("POST", "/v1/sandboxes", s.token, body, "Idempotency-Key: create-1")
		if r.status != 202 || r.header.Get("Idempotent-Replayed") != "true" || !bytes.Equal(r.body, first.body) ||
			r.header.Get("Location") != first.header.Get("Location") {
			t.Fatalf("replay %d = %d %s", i, r.status, r.body)
		}
	}
	// Same key, different body / path / method → 422, nothing done.
	expectError(t, s.do("POST", "/v1/sandboxes", s.token, []byte(`{"metadata":{"n":"2"}}`), "Idempotency-Key: create-1"), 422, "idempotency_key_reused")
	var created client.CreateSandboxResponse
	first.json(t, &created)
	expectError(t, s.do("POST", "/v1/sandboxes/"+created.Sandbox.ID+":pause", s.token, nil, "Idempotency-Key: create-1"), 422, "idempotency_key_reused")
	page, _ := s.client().ListSandboxes(context.Background(), "", client.ListOptions{})
	if len(page.Items) != 1 {
		t.Fatalf("%d sandboxes after replays, want 1", len(page.Items))
	}
	// An error answer is replayed too (the first outcome stands).
	s.waitOp(created.Operation.ID)
	e1 := s.do("POST", "/v1/sandboxes/"+created.Sandbox.ID+":wake", s.token, []byte(`{"x":1}`), "Idempotency-Key: bad-1")
	e2 := s.do("POST", "/v1/sandboxes/"+created.Sandbox.ID+":wake", s.token, []byte(`{"x":1}`), "Idempotency-Key: bad-1")
	if e1.status != 400 || e2.status != 400 || e2.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("error replay = %d / %d %v", e1.status, e2.status, e2.header)
	}
}

// 50 identical creates at once with one key make exactly one sandbox and
// 50 identical answers.
func TestConcurrentIdempotentCreates(t *testing.T) {
	s := startServer(t, serverOpts{})
	const n = 50
	replies := make([]reply, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			replies[i] = s.do("POST", "/v1/sandboxes", s.token, []byte(`{"env":{"K":"v"}}`), "Idempotency-Key: same-key")
		}()
	}
	close(start)
	wg.Wait()
	fresh := 0
	for i, r := range replies {
		if r.status != 202 || !bytes.Equal(r.body, replies[0].body) {
			t.Fatalf("reply %d = %d %s, want the same 202 as reply 0 (%s)", i, r.status, r.body, replies[0].body)
		}
		if r.header.Get("Idempotent-Replayed") != "true" {
			fresh++
		}
	}
	if fresh != 1 {
		t.Fatalf("%d replies were not marked replayed, want exactly 1", fresh)
	}
	page, _ := s.client().ListSandboxes(context.Background(), "", client.ListOptions{Limit: 500})
	if len(page.Items) != 1 {
		t.Fatalf("%d sandboxes, want 1", len(page.Items))
	}
	ops, _ := s.client().ListOperations(context.Background(), "", client.ListOptions{Limit: 500})
	if len(ops.Items) != 1 {
		t.Fatalf("%d operations, want 1", len(ops.Items))
	}
}

// Following next_cursor while other clients create sandboxes returns every
// sandbox that existed at the start exactly once, and nothing twice.
func TestPaginationUnderConcurrentInserts(t *testing.T) {
	s := startServer(t, serverOpts{})
	c := s.client()
	ctx := context.Background()
	initial := map[string]bool{}
	for i := 0; i < 30; i++ {
		out, _, err := c.CreateSandbox(ctx, client.CreateSandboxRequest{}, "")
		if err != nil {
			t.Fatal(err)
		}
		initial[out.Sandbox.ID] = true
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := 0; w < 3; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 40; i++ {
				select {
				case <-stop:
					return
				default:
				}
				if _, _, err := c.CreateSandbox(ctx, client.CreateSandboxRequest{}, ""); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	seen := map[string]bool{}
	opts := client.ListOptions{Limit: 4}
	for pages := 0; ; pages++ {
		page, err := c.ListSandboxes(ctx, "", opts)
		if err != nil {
			t.Fatal(err)
		}
		for _, sb := range page.Items {
			if seen[sb.ID] {
				t.Fatalf("%s listed twice", sb.ID)
			}
			seen[sb.ID] = true
		}
		if page.NextCursor == nil {
			break
		}
		opts.Cursor = *page.NextCursor
		if pages > 1000 {
			t.Fatal("pagination does not end")
		}
	}
	close(stop)
	wg.Wait()
	for id := range initial {
		if !seen[id] {
			t.Fatalf("%s missed", id)
		}
	}
}

// FAKE runtime slowed so that SIGKILL lands in the middle of a create: the
// restarted server brings the operation to a terminal state, keeps exactly
// one sandbox, and still replays the original answer for the original key.
func TestSIGKILLMidOperationFakeSlowRuntime(t *testing.T) {
	s := startServer(t, serverOpts{env: []string{"SPACE_FAKE_DELAY=3s"}})
	r := s.do("POST", "/v1/sandboxes", s.token, []byte(`{}`), "Idempotency-Key: kill-1")
	if r.status != 202 {
		t.Fatalf("create = %d %s", r.status, r.body)
	}
	var created client.CreateSandboxResponse
	r.json(t, &created)
	deadline := time.Now().Add(10 * time.Second)
	for {
		op, err := s.client().GetOperation(context.Background(), created.Operation.ID)
		if err != nil {
			t.Fatal(err)
		}
		if op.State == "running" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("operation never ran: %+v", op)
		}
		time.Sleep(10 * time.Millisecond)
	}
	s.kill()
	s.env = nil // restart without the delay
	s.start()
	op := s.waitOp(created.Operation.ID)
	if op.State != "succeeded" {
		t.Fatalf("resumed create = %+v", op)
	}
	sb, err := s.client().GetSandbox(context.Background(), created.Sandbox.ID)
	if err != nil || sb.State != "running" {
		t.Fatalf("sandbox after restart = %+v %v", sb, err)
	}
	again := s.do("POST", "/v1/sandboxes", s.token, []byte(`{}`), "Idempotency-Key: kill-1")
	if again.status != 202 || again.header.Get("Idempotent-Replayed") != "true" || !bytes.Equal(again.body, r.body) {
		t.Fatalf("replay after restart = %d %s", again.status, again.body)
	}
	page, _ := s.client().ListSandboxes(context.Background(), "", client.ListOptions{})
	ops, _ := s.client().ListOperations(context.Background(), "", client.ListOptions{})
	if len(page.Items) != 1 || len(ops.Items) != 1 {
		t.Fatalf("after restart: %d sandboxes, %d operations; want 1 and 1", len(page.Items), len(ops.Items))
	}
	if !strings.Contains(s.log(), "resuming operation left in flight") {
		t.Fatal("the restarted server did not report resuming the operation")
	}
}

// SIGKILL in the middle of a pause, then a lifecycle sequence afterwards:
// nothing stays in a transitional state.
func TestSIGKILLMidPauseFakeSlowRuntime(t *testing.T) {
	s := startServer(t, serverOpts{})
	id := s.createRunning()
	s.signal(15)
	s.env = []string{"SPACE_FAKE_DELAY=5s"}
	s.start()
	op, _, err := s.client().Lifecycle(context.Background(), "pause", id, "")
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	s.kill()
	s.env = nil
	s.start()
	if got := s.waitOp(op.ID); got.State != "succeeded" {
		t.Fatalf("resumed pause = %+v", got)
	}
	sb, _ := s.client().GetSandbox(context.Background(), id)
	if sb.State != "paused" {
		t.Fatalf("state = %s", sb.State)
	}
}

// SIGTERM shuts down gracefully: the process exits 0 and a restarted server
// has everything.
func TestGracefulShutdownAndRestart(t *testing.T) {
	s := startServer(t, serverOpts{})
	id := s.createRunning()
	s.mu.Lock()
	cmd := s.cmd
	s.mu.Unlock()
	s.signal(15)
	if code := cmd.ProcessState.ExitCode(); code != 0 {
		t.Fatalf("exit code after SIGTERM = %d\n%s", code, s.log())
	}
	s.start()
	sb, err := s.client().GetSandbox(context.Background(), id)
	if err != nil || sb.State != "running" {
		t.Fatalf("after restart: %+v %v", sb, err)
	}
	// The admin token file was not rewritten.
	b, _ := os.ReadFile(s.dataDir + "/api-token")
	if strings.TrimSpace(string(b)) != s.token {
		t.Fatal("restart replaced the admin token")
	}
}

func TestTokenCommands(t *testing.T) {
	s := startServer(t, serverOpts{})
	out, _, code := s.runCLI("token", "create", "--name", "ci", "--json")
	if code != 0 {
		t.Fatalf("token create exit %d", code)
	}
	var created struct{ ID, Name, Token string }
	json.Unmarshal([]byte(out), &created)
	if !strings.HasPrefix(created.Token, "space_") {
		t.Fatalf("token create output = %s", out)
	}
	if r := s.do("GET", "/v1/sandboxes", created.Token, nil); r.status != 200 {
		t.Fatalf("new token refused: %d", r.status)
	}
	list, _, _ := s.runCLI("token", "list")
	if !strings.Contains(list, created.ID) || !strings.Contains(list, "admin") || strings.Contains(list, created.Token) {
		t.Fatalf("token list = %s", list)
	}
	if _, _, code := s.runCLI("token", "revoke", created.ID); code != 0 {
		t.Fatalf("revoke exit %d", code)
	}
	deadline := time.Now().Add(5 * time.Second)
	for s.do("GET", "/v1/sandboxes", created.Token, nil).status != 401 {
		if time.Now().After(deadline) {
			t.Fatal("revoked token still accepted")
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// What an API token issued ends with it (#14 item 15): a command session's
// attachment token and an E2B envd access token stop working once the API
// token is revoked; the same credentials of another token keep working.
func TestRevokedTokenEndsWhatItIssued(t *testing.T) {
	s := startServer(t, serverOpts{})
	out, _, code := s.runCLI("token", "create", "--name", "temp", "--json")
	var tmp struct{ ID, Token string }
	if code != 0 || json.Unmarshal([]byte(out), &tmp) != nil {
		t.Fatalf("token create = %d %s", code, out)
	}
	sbx := s.createRunning()
	session := func(token string) (string, string) {
		r := s.do("POST", "/v1/sandboxes/"+sbx+"/commands", token, []byte(`{"command":["echo","hi"]}`))
		var sess struct{ Attach struct{ URL, Token string } }
		if r.status != 201 || json.Unmarshal(r.body, &sess) != nil {
			t.Fatalf("create command = %d %s", r.status, r.body)
		}
		return sess.Attach.URL, sess.Attach.Token
	}
	attach := func(url, token string) int {
		req, _ := http.NewRequest("GET", url, nil)
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	envd := func(apiToken string) []string {
		r := s.ecwDo("POST", "/v2/sandboxes", []byte(`{"templateID":"test","timeout":300}`), "X-API-KEY: "+apiToken)
		var sb struct{ SandboxID, EnvdAccessToken string }
		if r.status != 201 || json.Unmarshal(r.body, &sb) != nil {
			t.Fatalf("E2B create = %d %s", r.status, r.body)
		}
		return []string{"E2b-Sandbox-Id: " + sb.SandboxID, "E2b-Sandbox-Port: 49983", "X-Access-Token: " + sb.EnvdAccessToken, "Authorization: Basic cm9vdDo="}
	}
	url, att := session(tmp.Token)
	keptURL, kept := session(s.token)
	e2bTmp, e2bKept := envd(tmp.Token), envd(s.token)
	if r := s.ecwDo("GET", "/files?path=/etc/hostname", nil, e2bTmp...); r.status != 200 && r.status != 404 {
		t.Fatalf("envd with the temporary token's access token = %d %s", r.status, r.body)
	}
	if _, _, code := s.runCLI("token", "revoke", tmp.ID); code != 0 {
		t.Fatalf("revoke exit %d", code)
	}
	deadline := time.Now().Add(5 * time.Second)
	for attach(url, att) != 401 {
		if time.Now().After(deadline) {
			t.Fatal("an attachment token outlived the revocation of its API token")
		}
		time.Sleep(100 * time.Millisecond)
	}
	expectE2BError(t, s.ecwDo("GET", "/files?path=/etc/hostname", nil, e2bTmp...), 401)
	if st := attach(keptURL, kept); st != 200 {
		t.Fatalf("another token's attachment = %d", st)
	}
	if r := s.ecwDo("GET", "/files?path=/etc/hostname", nil, e2bKept...); r.status == 401 {
		t.Fatalf("another token's envd access = %d %s", r.status, r.body)
	}
}

func TestCLI(t *testing.T) {
	s := startServer(t, serverOpts{})
	out, errOut, code := s.runCLI("sandbox", "create", "--wait", "--json", "--env", "A=1", "--metadata", "who=cli", "--vcpus", "2", "--run-timeout", "30m", "--timeout-action", "suspend")
	if code != 0 {
		t.Fatalf("create exit %d: %s", code, errOut)
	}
	var created client.CreateSandboxResponse
	if err := json.Unmarshal([]byte(out), &created); err != nil {
		t.Fatalf("create --json: %v\n%s", err, out)
	}
	id := created.Sandbox.ID
	if created.Sandbox.State != "running" || created.Operation.State != "succeeded" || created.Sandbox.Resources.VCPUs != 2 ||
		created.Sandbox.AutoLifecycle.Timeout != "30m" || created.Sandbox.AutoLifecycle.TimeoutAction != "suspend" || created.Sandbox.ExpiresAt == nil {
		t.Fatalf("create --wait = %s", out)
	}
	if out, _, _ := s.runCLI("sandbox", "list"); !strings.Contains(out, id) || !strings.Contains(out, "running") {
		t.Fatalf("list = %s", out)
	}
	if out, _, _ := s.runCLI("sandbox", "get", id); !strings.Contains(out, "2 vCPU") || !strings.Contains(out, "suspend after 30m running") || !strings.Contains(out, "EXPIRES") {
		t.Fatalf("get = %s", out)
	}
	for _, c := range []struct{ verb, state string }{{"pause", "paused"}, {"wake", "running"}, {"suspend", "suspended"}, {"wake", "running"}} {
		if _, errOut, code := s.runCLI("sandbox", c.verb, id, "--wait"); code != 0 {
			t.Fatalf("%s exit %d: %s", c.verb, code, errOut)
		}
		sb, _ := s.client().GetSandbox(context.Background(), id)
		if sb.State != c.state {
			t.Fatalf("after %s: %s", c.verb, sb.State)
		}
	}
	// A refused transition exits non-zero with the API's code.
	s.runCLI("sandbox", "pause", id, "--wait")
	_, errOut, code = s.runCLI("sandbox", "pause", id)
	if code != 1 || !strings.Contains(errOut, "failed_precondition") {
		t.Fatalf("pause of paused: exit %d, %s", code, errOut)
	}
	ops, _, _ := s.runCLI("operation", "list", "--sandbox", id, "--json")
	var page client.List[client.Operation]
	json.Unmarshal([]byte(ops), &page)
	if len(page.Items) != 6 {
		t.Fatalf("operation list = %s", ops)
	}
	if out, _, code := s.runCLI("operation", "wait", page.Items[0].ID); code != 0 || !strings.Contains(out, "succeeded") {
		t.Fatalf("operation wait = %d %s", code, out)
	}
	if out, _, code := s.runCLI("operation", "get", page.Items[1].ID, "--json"); code != 0 || !strings.Contains(out, `"kind": "pause"`) {
		t.Fatalf("operation get = %d %s", code, out)
	}
	var samples []client.MetricSample
	if out, errOut, code := s.runCLI("sandbox", "metrics", id, "--since", "1h", "--json"); code != 0 || json.Unmarshal([]byte(out), &samples) != nil {
		t.Fatalf("sandbox metrics: %d %q %q", code, out, errOut)
	}
	if _, _, code := s.runCLI("sandbox", "delete", id, "--wait"); code != 0 {
		t.Fatal("delete failed")
	}

	// The project's warm pool, set and read from the CLI.
	if out, errOut, code := s.runCLI("pool", "set", "seed:latest", "1"); code != 0 || !strings.Contains(out, "seed:latest: min_ready 1") {
		t.Fatalf("pool set: %d %q %q", code, out, errOut)
	}
	waitFor(t, "the pool filled", func() bool {
		out, _, _ := s.runCLI("pool", "get", "seed:latest")
		return strings.Contains(out, "ready 1,")
	})
	var wp client.WarmPool
	if out, errOut, code := s.runCLI("pool", "set", "seed:latest", "0", "--json"); code != 0 || json.Unmarshal([]byte(out), &wp) != nil || wp.MinReady != 0 {
		t.Fatalf("pool set 0: %d %q %q", code, out, errOut)
	}
	if _, _, code := s.runCLI("pool", "set", "seed:latest", "two"); code != 2 {
		t.Fatalf("pool set two: exit %d, want 2", code)
	}
	if _, errOut, code := s.runCLI("pool", "set", "seed:latest", "1000000"); code != 1 || !strings.Contains(errOut, "invalid_argument") {
		t.Fatalf("pool set 1000000: %d %q", code, errOut)
	}
	if _, _, code := s.runCLI("sandbox", "frobnicate"); code != 2 {
		t.Fatalf("unknown verb exit %d, want 2", code)
	}
	if _, errOut, code := s.runCLI("sandbox", "get", "sbx_nope"); code != 1 || !strings.Contains(errOut, "invalid_argument") {
		t.Fatalf("bad id: %d %s", code, errOut)
	}
}

var _ = fmt.Sprint
var _ = http.MethodGet

// TestDefaultIdlePolicyReadsAsWritten: a sandbox that names no idle policy
// shows the server's --idle-timeout the way a client writes a duration
// ("1h30m", not Go's "1h30m0s"), so one compared as a string matches.
func TestDefaultIdlePolicyReadsAsWritten(t *testing.T) {
	s := startServer(t, serverOpts{args: []string{"--runtime", "fake", "--idle-timeout", "90m"}})
	r := s.do("POST", "/v1/sandboxes", s.token, []byte(`{}`))
	var created client.CreateSandboxResponse
	r.json(t, &created)
	if r.status != 202 || created.Sandbox.AutoLifecycle.IdleTimeout != "1h30m" {
		t.Fatalf("create = %d, idle_timeout %q: %s", r.status, created.Sandbox.AutoLifecycle.IdleTimeout, r.body)
	}
}
