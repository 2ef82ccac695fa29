package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/spacesandbox/space/client"
)

// tenant is one project of the projects test and a token of each role.
type tenant struct {
	name                    string
	admin, member, readOnly string // token values
	memberID, readOnlyID    string // token ids
}

// mkTenant makes project name (as the owner) and a token of each role in it.
func mkTenant(t *testing.T, s *server, name string) tenant {
	t.Helper()
	if r := s.do("POST", "/v1/projects", s.token, []byte(`{"name":"`+name+`"}`)); r.status != 201 {
		t.Fatalf("create project %s = %d %s", name, r.status, r.body)
	}
	tn := tenant{name: name}
	for _, role := range []string{"admin", "member", "read-only"} {
		r := s.do("POST", "/v1/tokens", s.token, []byte(fmt.Sprintf(`{"name":"%s-%s","project":"%s","role":"%s"}`, name, role, name, role)))
		var out struct {
			Token client.Token `json:"token"`
			Value string       `json:"value"`
		}
		r.json(t, &out)
		if r.status != 201 || out.Value == "" || out.Token.Project != name || out.Token.Role != role {
			t.Fatalf("create %s token of %s = %d %s", role, name, r.status, r.body)
		}
		switch role {
		case "admin":
			tn.admin = out.Value
		case "member":
			tn.member, tn.memberID = out.Value, out.Token.ID
		case "read-only":
			tn.readOnly, tn.readOnlyID = out.Value, out.Token.ID
		}
	}
	return tn
}

// createIn creates a running sandbox with token tok and returns its id.
func createIn(t *testing.T, s *server, tok, body string) string {
	t.Helper()
	r := s.do("POST", "/v1/sandboxes", tok, []byte(body))
	var out client.CreateSandboxResponse
	r.json(t, &out)
	if r.status != 202 {
		t.Fatalf("create = %d %s", r.status, r.body)
	}
	if op := waitOpAs(t, s, tok, out.Operation.ID); op.State != "succeeded" {
		t.Fatalf("create failed: %+v", op.Error)
	}
	return out.Sandbox.ID
}

// waitOpAs waits for an operation, read with token tok.
func waitOpAs(t *testing.T, s *server, tok, id string) client.Operation {
	t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	for {
		var op client.Operation
		r := s.do("GET", "/v1/operations/"+id, tok, nil)
		r.json(t, &op)
		if r.status != 200 {
			t.Fatalf("get operation %s = %d %s", id, r.status, r.body)
		}
		if op.Done() {
			return op
		}
		if time.Now().After(deadline) {
			t.Fatalf("operation %s still %s", id, op.State)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// lifecycleAs runs a lifecycle verb with tok and waits for it.
func lifecycleAs(t *testing.T, s *server, tok, verb, id string) reply {
	t.Helper()
	method, path := "POST", "/v1/sandboxes/"+id+":"+verb
	if verb == "delete" {
		method, path = "DELETE", "/v1/sandboxes/"+id
	}
	r := s.do(method, path, tok, nil)
	if r.status == 202 {
		var out struct{ Operation client.Operation }
		r.json(t, &out)
		if done := waitOpAs(t, s, tok, out.Operation.ID); done.State != "succeeded" {
			t.Fatalf("%s %s failed: %+v", verb, id, done.Error)
		}
	}
	return r
}

// TestProjects: three projects with a token of each role on a real gVisor
// server. Every authenticated route of the native API (read from the
// server's own OpenAPI document), the data plane and the E2B layer is
// tried on project a's objects with project b's tokens: each answers 404
// (or 403 for the server owner's routes) and nothing of a changes; lists
// never show them. Then roles, quotas (exhaustion and recovery), rate
// limits with Retry-After, idempotency keys per project, the audit log and
// token expiry.
func TestProjects(t *testing.T) {
	requireGVisor(t)
	s := startRuntimeServer(t, "gvisor")
	a, b := mkTenant(t, s, "team-a"), mkTenant(t, s, "team-b")
	c := mkTenant(t, s, "team-c")
	t.Cleanup(func() {
		for _, tn := range []tenant{a, b, c} {
			var page client.List[client.Sandbox]
			s.do("GET", "/v1/sandboxes?limit=500", tn.admin, nil).json(t, &page)
			for _, sb := range page.Items {
				lifecycleAs(t, s, tn.admin, "delete", sb.ID)
			}
		}
	})

	// Project a's objects: a sandbox with a file, a command session, a
	// snapshot, an operation, a template name, a token.
	sbxA := createIn(t, s, a.member, `{"template":"test:latest","env":{"SECRET_ENV":"s3cr3t-env-value"}}`)
	put := s.do("PUT", "/v1/sandboxes/"+sbxA+"/files?path=/tmp/proj.txt", a.member, []byte("a's data"), "Content-Type: application/octet-stream")
	if put.status != 200 && put.status != 201 {
		t.Fatalf("write a's file = %d %s", put.status, put.body)
	}
	cr := s.do("POST", "/v1/sandboxes/"+sbxA+"/commands", a.member, []byte(`{"command":["sh","-c","echo hello-a; sleep 600"]}`))
	var sessA session
	cr.json(t, &sessA)
	if cr.status != 201 {
		t.Fatalf("a's command = %d %s", cr.status, cr.body)
	}
	sr := s.do("POST", "/v1/sandboxes/"+sbxA+"/snapshots", a.member, []byte(`{"name":"a-snap"}`))
	var snapResp struct {
		Snapshot  struct{ ID string }
		Operation client.Operation
	}
	sr.json(t, &snapResp)
	if sr.status != 202 {
		t.Fatalf("a's snapshot = %d %s", sr.status, sr.body)
	}
	snapA, opA := snapResp.Snapshot.ID, snapResp.Operation.ID
	if op := waitOpAs(t, s, a.member, opA); op.State != "succeeded" {
		t.Fatalf("a's snapshot failed: %+v", op.Error)
	}
	if r := s.do("POST", "/v1/snapshots/"+snapA+":tag", a.admin, []byte(`{"template":"atpl:v1"}`)); r.status != 200 {
		t.Fatalf("tag a's snapshot = %d %s", r.status, r.body)
	}
	// And a template a's admin built (a name of a's from then on).
	br := s.do("POST", "/v1/templates", a.admin, []byte(`{"name":"aonly","tag":"v1","base":"test:latest","env":{"BUILT_BY":"team-a"}}`))
	var built struct{ Operation client.Operation }
	br.json(t, &built)
	if br.status != 202 {
		t.Fatalf("a's template build = %d %s", br.status, br.body)
	}
	if op := waitOpAs(t, s, a.admin, built.Operation.ID); op.State != "succeeded" {
		t.Fatalf("a's template build failed: %+v", op.Error)
	}
	aIDs := []string{sbxA, snapA, opA, sessA.SessionID, "atpl", "aonly", a.memberID}

	t.Run("CrossProjectNativeAPI", func(t *testing.T) {
		var spec struct {
			Paths map[string]map[string]json.RawMessage `json:"paths"`
		}
		s.do("GET", "/openapi-m1.json", "", nil).json(t, &spec)
		ownerOnly := map[string]bool{"POST /v1/projects": true, "GET /v1/projects": true, "DELETE /v1/projects/{id}": true, "PUT /v1/projects/{id}/limits": true}
		adminLists := map[string]bool{"GET /v1/tokens": true, "GET /v1/audit": true}
		var routes []string
		for path, methods := range spec.Paths {
			for m := range methods {
				if m == "parameters" {
					continue
				}
				routes = append(routes, strings.ToUpper(m)+" "+path)
			}
		}
		sort.Strings(routes)
		tried := 0
		for _, route := range routes {
			method, path, _ := strings.Cut(route, " ")
			if !strings.HasPrefix(path, "/v1/") || strings.HasPrefix(path, "/v1/sessions/") {
				continue // public routes; the data plane is below
			}
			if ownerOnly[route] || strings.HasPrefix(path, "/v1/nodes") {
				for _, tok := range []string{b.admin, b.member, b.readOnly} {
					p := strings.NewReplacer("{id}", "team-a").Replace(path)
					if strings.HasPrefix(path, "/v1/nodes") {
						p = strings.NewReplacer("{id}", "node_aaaaaaaaaaaaaaaaaaaaaaaaaa").Replace(path)
					}
					if r := s.do(method, p, tok, []byte(`{}`)); r.status != 403 || r.errorCode() != "permission_denied" {
						t.Errorf("%s as a project token = %d %s, want 403", route, r.status, r.body)
					}
				}
				tried++
				continue
			}
			var p string
			switch {
			case strings.Contains(path, "{process_id}"):
				p = strings.NewReplacer("{id}", sbxA, "{process_id}", sessA.ProcessID).Replace(path)
			case strings.HasPrefix(path, "/v1/sandboxes/{id}"):
				p = strings.Replace(path, "{id}", sbxA, 1)
			case strings.HasPrefix(path, "/v1/snapshots/{id}"):
				p = strings.Replace(path, "{id}", snapA, 1)
			case strings.HasPrefix(path, "/v1/operations/{id}"):
				p = strings.Replace(path, "{id}", opA, 1)
			case strings.HasPrefix(path, "/v1/projects/{id}"):
				p = strings.Replace(path, "{id}", "team-a", 1)
			case strings.HasPrefix(path, "/v1/tokens/{id}"):
				p = strings.Replace(path, "{id}", a.memberID, 1)
			case strings.Contains(path, "{name}:{tag}"):
				p = strings.Replace(path, "{name}:{tag}", "atpl:v1", 1)
			case route == "GET /v1/events":
				checkEventsAcrossProjects(t, s, a, b, sbxA)
				tried++
				continue
			case method == "GET": // a list: b's tokens see none of a's objects
				for _, tok := range []string{b.admin, b.member, b.readOnly} {
					r := s.do("GET", path, tok, nil)
					if adminLists[route] && tok != b.admin {
						if r.status != 403 {
							t.Errorf("%s as a non-admin = %d, want 403", route, r.status)
						}
						continue
					}
					if r.status != 200 {
						t.Errorf("%s = %d %s", route, r.status, r.body)
					}
					if route == "GET /v1/audit" {
						// team-b's own tries name a's ids: its log shows
						// only its project's entries.
						if strings.Contains(string(r.body), `"project":"team-a"`) {
							t.Errorf("team-b's audit shows team-a's entries: %s", r.body)
						}
						continue
					}
					for _, id := range aIDs {
						if strings.Contains(string(r.body), id) {
							t.Errorf("%s as team-b lists team-a's %s: %s", route, id, r.body)
						}
					}
				}
				tried++
				continue
			default:
				continue // creates act in the caller's project (checked below)
			}
			if strings.Contains(p, "/files") {
				p += "?path=/tmp/proj.txt"
			}
			for _, tok := range []string{b.admin, b.member, b.readOnly} {
				r := s.do(method, p, tok, []byte(`{}`))
				if r.status != 404 || r.errorCode() != "not_found" {
					t.Errorf("%s on team-a's object as team-b = %d %s, want 404", route, r.status, r.body)
				}
			}
			tried++
		}
		if tried < 40 {
			t.Fatalf("only %d routes tried: is the OpenAPI document served?", tried)
		}
		// Creates that name a's objects do not find them.
		for body, what := range map[string]string{`{"snapshot":"` + snapA + `"}`: "snapshot", `{"template":"atpl:v1"}`: "snapshot tagged as a template",
			`{"template":"aonly:v1"}`: "template"} {
			if r := s.do("POST", "/v1/sandboxes", b.member, []byte(body)); r.status != 404 {
				t.Errorf("team-b creating from team-a's %s = %d %s", what, r.status, r.body)
			}
		}
		if r := s.do("POST", "/v1/tokens", b.admin, []byte(`{"name":"x","project":"team-a","role":"member"}`)); r.status != 404 {
			t.Errorf("team-b's admin making a token in team-a = %d %s", r.status, r.body)
		}
		// The server's owner may look into any project's lists; nobody else.
		for _, q := range []string{"?project=team-a", "?project=*"} {
			if r := s.do("GET", "/v1/sandboxes"+q, s.token, nil); r.status != 200 || !strings.Contains(string(r.body), sbxA) {
				t.Errorf("owner GET /v1/sandboxes%s = %d, without team-a's sandbox", q, r.status)
			}
			if r := s.do("GET", "/v1/operations"+q, b.admin, nil); r.status != 404 {
				t.Errorf("team-b's admin GET /v1/operations%s = %d, want 404", q, r.status)
			}
		}
		// Nothing of a's changed.
		var sb client.Sandbox
		s.do("GET", "/v1/sandboxes/"+sbxA, a.readOnly, nil).json(t, &sb)
		if sb.State != "running" || sb.Project != "team-a" {
			t.Errorf("team-a's sandbox after team-b's tries: %+v", sb)
		}
		if r := s.do("GET", "/v1/sandboxes/"+sbxA+"/files?path=/tmp/proj.txt", a.readOnly, nil); string(r.body) != "a's data" {
			t.Errorf("team-a's file after team-b's tries = %d %q", r.status, r.body)
		}
		if r := s.do("GET", "/v1/snapshots/"+snapA, a.readOnly, nil); r.status != 200 {
			t.Errorf("team-a's snapshot after team-b's tries = %d %s", r.status, r.body)
		}
		if r := s.do("GET", "/v1/tokens/"+a.memberID, a.admin, nil); r.status != 200 || strings.Contains(string(r.body), `"revoked_at":"`) {
			t.Errorf("team-a's token after team-b's tries = %d %s", r.status, r.body)
		}
	})

	t.Run("CrossProjectDataPlane", func(t *testing.T) {
		// An API token is not an attachment token, whoever's it is; a's
		// attachment token works for a's session only.
		for _, tok := range []string{b.admin, b.member, a.member, s.token} {
			if st, resp := s.attach(sessA.Attach.URL, tok, ""); st != nil || resp.StatusCode != 401 {
				t.Errorf("attach with an API token = %d, want 401", resp.StatusCode)
			}
		}
		st, resp := s.attach(sessA.Attach.URL, sessA.Attach.Token, "")
		if st == nil {
			t.Fatalf("attach with its token = %d", resp.StatusCode)
		}
		tr := &transcript{}
		collect(t, st, tr, func(tr *transcript) bool { return strings.Contains(string(tr.stdout), "hello-a") })
		if !strings.Contains(string(tr.stdout), "hello-a") {
			t.Errorf("a's stream = %q", tr.stdout)
		}
		bs := createIn(t, s, b.member, `{"template":"test:latest"}`)
		cb := s.do("POST", "/v1/sandboxes/"+bs+"/commands", b.member, []byte(`{"command":["true"]}`))
		var sessB session
		cb.json(t, &sessB)
		if st, resp := s.attach(sessA.Attach.URL, sessB.Attach.Token, ""); st != nil || (resp.StatusCode != 403 && resp.StatusCode != 401 && resp.StatusCode != 404) {
			t.Errorf("attach to a's session with b's attachment token = %d", resp.StatusCode)
		}
		lifecycleAs(t, s, b.member, "delete", bs)
	})

	t.Run("CrossProjectE2B", func(t *testing.T) {
		ecw := func(method, path, key string) reply {
			body := `{}`
			if strings.HasSuffix(path, "/timeout") {
				body = `{"timeout":30}`
			}
			return s.doAt(s.ecwAddr, method, path, "", []byte(body), "X-API-Key: "+key)
		}
		for _, key := range []string{b.admin, b.member} {
			for _, rt := range []string{"GET /sandboxes/%s", "DELETE /sandboxes/%s", "POST /sandboxes/%s/pause", "POST /sandboxes/%s/connect",
				"POST /sandboxes/%s/resume", "POST /sandboxes/%s/timeout", "POST /sandboxes/%s/refreshes", "POST /sandboxes/%s/fork",
				"POST /sandboxes/%s/snapshots", "PUT /sandboxes/%s/network", "GET /sandboxes/%s/metrics"} {
				method, path, _ := strings.Cut(fmt.Sprintf(rt, sbxA), " ")
				if r := ecw(method, path, key); r.status != 404 {
					t.Errorf("E2B %s on team-a's sandbox as team-b = %d %s", rt, r.status, r.body)
				}
			}
			for _, tpl := range []string{snapA, "aonly"} {
				if r := s.doAt(s.ecwAddr, "POST", "/sandboxes", "", []byte(`{"templateID":"`+tpl+`"}`), "X-API-Key: "+key); r.status != 404 {
					t.Errorf("E2B create from team-a's %s as team-b = %d %s", tpl, r.status, r.body)
				}
			}
			if r := ecw("DELETE", "/templates/"+snapA, key); r.status != 404 {
				t.Errorf("E2B delete of team-a's snapshot as team-b = %d %s", r.status, r.body)
			}
			for _, path := range []string{"/sandboxes", "/v2/sandboxes", "/snapshots", "/snapshots?sandboxID=" + sbxA} {
				r := s.doAt(s.ecwAddr, "GET", path, "", nil, "X-API-Key: "+key)
				if r.status != 200 {
					t.Errorf("E2B GET %s = %d %s", path, r.status, r.body)
				}
				for _, id := range aIDs {
					if strings.Contains(string(r.body), id) {
						t.Errorf("E2B GET %s as team-b lists team-a's %s", path, id)
					}
				}
			}
		}
		// a's own key sees it; a's read-only key cannot change it.
		if r := s.doAt(s.ecwAddr, "GET", "/sandboxes/"+sbxA, "", nil, "X-API-Key: "+a.member); r.status != 200 {
			t.Errorf("E2B get as team-a = %d %s", r.status, r.body)
		}
		if r := ecw("POST", "/sandboxes/"+sbxA+"/pause", a.readOnly); r.status != 403 {
			t.Errorf("E2B pause with a read-only key = %d %s", r.status, r.body)
		}
		// A read-only key's envd access token reads, and changes nothing.
		var detail struct {
			EnvdAccessToken string `json:"envdAccessToken"`
		}
		s.doAt(s.ecwAddr, "GET", "/sandboxes/"+sbxA, "", nil, "X-API-Key: "+a.readOnly).json(t, &detail)
		if detail.EnvdAccessToken == "" {
			t.Fatalf("no envd access token for a read-only key")
		}
		envd := []string{"E2b-Sandbox-Id: " + sbxA, "X-Access-Token: " + detail.EnvdAccessToken}
		if r := s.doAt(s.ecwAddr, "GET", "/files?path=/tmp/proj.txt", "", nil, envd...); r.status != 200 || string(r.body) != "a's data" {
			t.Errorf("envd read with a read-only key's access token = %d %s", r.status, r.body)
		}
		if r := s.doAt(s.ecwAddr, "POST", "/files?path=/tmp/proj.txt", "", []byte("overwritten"), append(envd, "Content-Type: application/octet-stream")...); r.status != 403 {
			t.Errorf("envd write with a read-only key's access token = %d %s", r.status, r.body)
		}
		// envd of a's sandbox without a's access token: refused.
		if r := s.doAt(s.ecwAddr, "GET", "/files?path=/tmp/proj.txt", "", nil, "E2b-Sandbox-Id: "+sbxA, "X-Access-Token: nope"); r.status != 401 {
			t.Errorf("envd of team-a's sandbox without its access token = %d %s", r.status, r.body)
		}
	})

	t.Run("Roles", func(t *testing.T) {
		// read-only: reads, lists, reads files; changes nothing.
		for _, rt := range []struct{ method, path, body string }{
			{"GET", "/v1/sandboxes/" + sbxA, ""}, {"GET", "/v1/sandboxes", ""}, {"GET", "/v1/sandboxes/" + sbxA + "/files?path=/tmp/proj.txt", ""},
			{"GET", "/v1/sandboxes/" + sbxA + "/files:list?path=/tmp", ""}, {"GET", "/v1/operations", ""}, {"GET", "/v1/snapshots", ""},
			{"GET", "/v1/projects/team-a/usage", ""}, {"GET", "/v1/sandboxes/" + sbxA + "/processes", ""},
		} {
			if r := s.do(rt.method, rt.path, a.readOnly, nil); r.status != 200 {
				t.Errorf("read-only %s %s = %d %s", rt.method, rt.path, r.status, r.body)
			}
		}
		for _, rt := range []struct{ method, path, body string }{
			{"POST", "/v1/sandboxes", `{}`}, {"POST", "/v1/sandboxes/" + sbxA + ":pause", ``}, {"DELETE", "/v1/sandboxes/" + sbxA, ``},
			{"PUT", "/v1/sandboxes/" + sbxA + "/files?path=/tmp/proj.txt", `x`}, {"POST", "/v1/sandboxes/" + sbxA + "/commands", `{"command":["true"]}`},
			{"POST", "/v1/sandboxes/" + sbxA + "/snapshots", `{}`}, {"DELETE", "/v1/snapshots/" + snapA, ``},
		} {
			if r := s.do(rt.method, rt.path, a.readOnly, []byte(rt.body)); r.status != 403 || r.errorCode() != "permission_denied" {
				t.Errorf("read-only %s %s = %d %s, want 403", rt.method, rt.path, r.status, r.body)
			}
		}
		// member: sandboxes, not the project's administration.
		for _, rt := range []struct{ method, path, body string }{
			{"POST", "/v1/tokens", `{"name":"x"}`}, {"GET", "/v1/tokens", ``}, {"GET", "/v1/audit", ``},
			{"PUT", "/v1/warm-pools/atpl:v1", `{"min_ready":1}`}, {"PUT", "/v1/projects/team-a/quotas", `{"sandboxes":1}`},
			{"POST", "/v1/snapshots/" + snapA + ":untag", `{}`}, {"POST", "/v1/templates", `{"name":"m","tag":"v1","base":"test:latest"}`},
			{"POST", "/v1/projects", `{"name":"mine"}`}, {"GET", "/v1/nodes", ``},
		} {
			if r := s.do(rt.method, rt.path, a.member, []byte(rt.body)); r.status != 403 {
				t.Errorf("member %s %s = %d %s, want 403", rt.method, rt.path, r.status, r.body)
			}
		}
		// admin: its project's tokens, not more than it holds.
		if r := s.do("POST", "/v1/tokens", a.admin, []byte(`{"name":"o","role":"owner"}`)); r.status != 403 {
			t.Errorf("admin making an owner = %d %s", r.status, r.body)
		}
		r := s.do("POST", "/v1/tokens", a.admin, []byte(`{"name":"ro2","role":"read-only"}`))
		var made struct {
			Token client.Token
			Value string
		}
		r.json(t, &made)
		if r.status != 201 || made.Token.Project != "team-a" {
			t.Fatalf("admin making a read-only token = %d %s", r.status, r.body)
		}
		if r := s.do("GET", "/v1/sandboxes/"+sbxA, made.Value, nil); r.status != 200 {
			t.Errorf("the new token = %d", r.status)
		}
		if r := s.do("DELETE", "/v1/tokens/"+made.Token.ID, a.admin, nil); r.status != 204 {
			t.Errorf("revoke = %d %s", r.status, r.body)
		}
		time.Sleep(1100 * time.Millisecond) // the verification cache's TTL
		if r := s.do("GET", "/v1/sandboxes/"+sbxA, made.Value, nil); r.status != 401 {
			t.Errorf("a revoked token = %d, want 401", r.status)
		}
		var list client.List[client.Token]
		s.do("GET", "/v1/tokens", a.admin, nil).json(t, &list)
		for _, tk := range list.Items {
			if tk.Project != "team-a" {
				t.Errorf("team-a's admin lists %+v", tk)
			}
		}
	})

	t.Run("Quotas", func(t *testing.T) {
		if r := s.do("PUT", "/v1/projects/team-c/limits", s.token, []byte(`{"sandboxes":3,"running_sandboxes":2}`)); r.status != 200 {
			t.Fatalf("set limits = %d %s", r.status, r.body)
		}
		if r := s.do("PUT", "/v1/projects/team-c/quotas", c.admin, []byte(`{"sandboxes":4}`)); r.status != 400 {
			t.Errorf("a quota above the owner's limit = %d %s, want 400", r.status, r.body)
		}
		c1 := createIn(t, s, c.member, `{"template":"test:latest"}`)
		c2 := createIn(t, s, c.member, `{"template":"test:latest"}`)
		refused := func(want string) {
			t.Helper()
			r := s.do("POST", "/v1/sandboxes", c.member, []byte(`{"template":"test:latest"}`))
			var env struct {
				Error struct {
					Code    string
					Details map[string]any
				}
			}
			r.json(t, &env)
			if r.status != 429 || env.Error.Code != "resource_exhausted" || env.Error.Details["quota"] != want {
				t.Fatalf("create past the %s quota = %d %s", want, r.status, r.body)
			}
		}
		refused("running_sandboxes")
		lifecycleAs(t, s, c.member, "suspend", c2) // frees memory, not the sandbox
		c3 := createIn(t, s, c.member, `{"template":"test:latest"}`)
		refused("sandboxes")
		if r := s.do("POST", "/v1/sandboxes/"+c2+":wake", c.member, nil); r.status != 429 {
			t.Errorf("wake past running_sandboxes = %d %s", r.status, r.body)
		}
		var u struct {
			Usage  client.Quotas
			Quotas client.Quotas
		}
		s.do("GET", "/v1/projects/team-c/usage", c.readOnly, nil).json(t, &u)
		if u.Usage.Sandboxes != 3 || u.Usage.RunningSandboxes != 2 || u.Quotas.Sandboxes != 3 {
			t.Errorf("usage = %+v", u)
		}
		// A delete frees its place at once.
		lifecycleAs(t, s, c.member, "delete", c3)
		if r := lifecycleAs(t, s, c.member, "wake", c2); r.status != 202 {
			t.Errorf("wake after a delete freed the quota = %d %s", r.status, r.body)
		}
		refused("running_sandboxes") // c1 and c2 run
		lifecycleAs(t, s, c.member, "delete", c1)
		createIn(t, s, c.member, `{"template":"test:latest"}`) // c2 and this one
		// Other projects are not held to team-c's quotas.
		createIn(t, s, b.member, `{"template":"test:latest"}`)
		// /metrics has the series.
		if m := s.do("GET", "/metrics", "", nil); !strings.Contains(string(m.body), `space_project_usage{project="team-c",resource="sandboxes"} 2`) ||
			!strings.Contains(string(m.body), `space_project_quota{project="team-c",resource="sandboxes"} 3`) {
			t.Errorf("/metrics lacks team-c's series")
		}
	})

	t.Run("RateLimit", func(t *testing.T) {
		r := s.do("POST", "/v1/tokens", s.token, []byte(`{"name":"slow","project":"team-c","role":"read-only","rate_per_sec":1,"burst":2}`))
		var made struct{ Value string }
		r.json(t, &made)
		codes := []int{}
		var limited reply
		for range 4 {
			r := s.do("GET", "/v1/sandboxes", made.Value, nil)
			codes = append(codes, r.status)
			if r.status == 429 {
				limited = r
			}
		}
		if codes[0] != 200 || codes[1] != 200 || limited.status != 429 || limited.errorCode() != "resource_exhausted" {
			t.Fatalf("a token of 1/s burst 2 got %v", codes)
		}
		after, err := strconv.Atoi(limited.header.Get("Retry-After"))
		if err != nil || after < 1 || after > 2 {
			t.Fatalf("Retry-After = %q", limited.header.Get("Retry-After"))
		}
		time.Sleep(time.Duration(after) * time.Second)
		if r := s.do("GET", "/v1/sandboxes", made.Value, nil); r.status != 200 {
			t.Errorf("after Retry-After = %d", r.status)
		}
		// The E2B layer counts against the same rate.
		for range 3 {
			r = s.doAt(s.ecwAddr, "GET", "/sandboxes", "", nil, "X-API-Key: "+made.Value)
		}
		if r.status != 429 || r.header.Get("Retry-After") == "" {
			t.Errorf("E2B past the rate = %d %v", r.status, r.header)
		}
	})

	t.Run("IdempotencyKeysPerProject", func(t *testing.T) {
		body := []byte(`{"template":"test:latest"}`)
		ra := s.do("POST", "/v1/sandboxes", a.member, body, "Idempotency-Key: shared-key-1")
		rb := s.do("POST", "/v1/sandboxes", b.member, body, "Idempotency-Key: shared-key-1")
		var ca, cb client.CreateSandboxResponse
		ra.json(t, &ca)
		rb.json(t, &cb)
		if ra.status != 202 || rb.status != 202 || ca.Sandbox.ID == cb.Sandbox.ID || rb.header.Get("Idempotent-Replayed") != "" {
			t.Fatalf("one key in two projects = %d %s / %d %s", ra.status, ra.body, rb.status, rb.body)
		}
		again := s.do("POST", "/v1/sandboxes", a.member, body, "Idempotency-Key: shared-key-1")
		var cagain client.CreateSandboxResponse
		again.json(t, &cagain)
		if cagain.Sandbox.ID != ca.Sandbox.ID || again.header.Get("Idempotent-Replayed") != "true" {
			t.Errorf("a's retry = %s %v", again.body, again.header)
		}
		waitOpAs(t, s, a.member, ca.Operation.ID)
		waitOpAs(t, s, b.member, cb.Operation.ID)
	})

	t.Run("Audit", func(t *testing.T) {
		// A refusal stored under an Idempotency-Key, answered and then
		// replayed, is recorded with the code the client got.
		for range 2 {
			expectError(t, s.do("POST", "/v1/sandboxes", a.member, []byte(`{"resources":{"vcpus":99}}`), "Idempotency-Key: audit-refused-1"), 400, "invalid_argument")
		}
		time.Sleep(300 * time.Millisecond) // entries are written in the background
		var all []client.AuditEntry
		q := "/v1/audit?limit=500"
		for {
			var page client.List[client.AuditEntry]
			r := s.do("GET", q, a.admin, nil)
			r.json(t, &page)
			if r.status != 200 {
				t.Fatalf("audit = %d %s", r.status, r.body)
			}
			all = append(all, page.Items...)
			if page.NextCursor == nil {
				break
			}
			q = "/v1/audit?limit=500&cursor=" + url.QueryEscape(*page.NextCursor)
		}
		has := func(action, outcome, token string) bool {
			for _, e := range all {
				if e.Action == action && e.Outcome == outcome && (token == "" || e.TokenID == token) && e.RequestID != "" {
					return true
				}
			}
			return false
		}
		if !has("POST /v1/sandboxes", "ok", a.memberID) || !has("POST /v1/sandboxes/{id}:pause", "permission_denied", a.readOnlyID) ||
			!has("POST /v1/snapshots/{id}:tag", "ok", "") || !has("PUT /v1/sandboxes/{id}/files", "ok", a.memberID) {
			t.Errorf("team-a's audit lacks entries: %+v", all)
		}
		refused := 0
		for _, e := range all {
			if e.Action == "POST /v1/sandboxes" && e.TokenID == a.memberID && e.Status == 400 {
				if e.Outcome != "invalid_argument" {
					t.Errorf("a keyed refusal is recorded as %q, not the code the client got", e.Outcome)
				}
				refused++
			}
		}
		if refused != 2 {
			t.Errorf("%d entries of the keyed refusal and its replay, want 2", refused)
		}
		for _, e := range all {
			if e.Project != "team-a" {
				t.Errorf("team-a's audit shows %+v", e)
			}
		}
		raw, _ := json.Marshal(all)
		for _, secret := range []string{"s3cr3t-env-value", a.member, a.admin, a.readOnly, sessA.Attach.Token} {
			if strings.Contains(string(raw), secret) {
				t.Errorf("the audit log holds a secret (%.12s…)", secret)
			}
		}
		// team-b's refused tries on a's objects are in team-b's log.
		var bl client.List[client.AuditEntry]
		s.do("GET", "/v1/audit?limit=500&action=:pause", b.admin, nil).json(t, &bl)
		found := false
		for _, e := range bl.Items {
			found = found || (e.Project == "team-b" && e.Target == sbxA && e.Outcome == "not_found")
			if !strings.Contains(e.Action, ":pause") {
				t.Errorf("action filter let through %q", e.Action)
			}
		}
		if !found {
			t.Errorf("team-b's refused pause of team-a's sandbox is not in team-b's audit: %+v", bl.Items)
		}
		if r := s.do("GET", "/v1/audit?project=team-a", b.admin, nil); r.status != 404 {
			t.Errorf("team-b's admin reading team-a's audit = %d", r.status)
		}
	})

	t.Run("TokenExpiry", func(t *testing.T) {
		r := s.do("POST", "/v1/tokens", a.admin, []byte(`{"name":"brief","role":"read-only","expires_in":"2s"}`))
		var made struct {
			Token client.Token
			Value string
		}
		r.json(t, &made)
		if r.status != 201 || made.Token.ExpiresAt == nil {
			t.Fatalf("expiring token = %d %s", r.status, r.body)
		}
		if r := s.do("GET", "/v1/sandboxes", made.Value, nil); r.status != 200 {
			t.Fatalf("before expiry = %d", r.status)
		}
		time.Sleep(time.Until(*made.Token.ExpiresAt) + 100*time.Millisecond)
		if r := s.do("GET", "/v1/sandboxes", made.Value, nil); r.status != 401 {
			t.Errorf("after expiry = %d, want 401", r.status)
		}
		if r := s.doAt(s.ecwAddr, "GET", "/sandboxes", "", nil, "X-API-Key: "+made.Value); r.status != 401 {
			t.Errorf("E2B after expiry = %d, want 401", r.status)
		}
		if r := s.do("POST", "/v1/tokens", a.admin, []byte(`{"name":"bad","expires_in":"-1d"}`)); r.status != 400 {
			t.Errorf("a negative lifetime = %d", r.status)
		}
	})

	t.Run("DeleteProject", func(t *testing.T) {
		if r := s.do("DELETE", "/v1/projects/team-a", s.token, nil); r.status != 409 {
			t.Errorf("removing a project that holds sandboxes = %d %s", r.status, r.body)
		}
		if r := s.do("DELETE", "/v1/projects/default", s.token, nil); r.status != 409 {
			t.Errorf("removing the default project = %d %s", r.status, r.body)
		}
		if r := s.do("POST", "/v1/projects", s.token, []byte(`{"name":"Not_A_Name"}`)); r.status != 400 {
			t.Errorf("a malformed project name = %d", r.status)
		}
		// Through the Go client: an empty project is read, then removed.
		c := s.client()
		if _, err := c.CreateProject(context.Background(), "short-lived", client.Quotas{}); err != nil {
			t.Fatal(err)
		}
		if p, err := c.GetProject(context.Background(), "short-lived"); err != nil || p.Name != "short-lived" {
			t.Fatalf("GetProject: %+v %v", p, err)
		}
		if err := c.DeleteProject(context.Background(), "team-a"); !client.IsCode(err, "failed_precondition") {
			t.Errorf("DeleteProject of a project that holds sandboxes: %v", err)
		}
		if err := c.DeleteProject(context.Background(), "short-lived"); err != nil {
			t.Fatalf("DeleteProject: %v", err)
		}
		if _, err := c.GetProject(context.Background(), "short-lived"); !client.IsCode(err, "not_found") {
			t.Errorf("GetProject after DeleteProject: %v", err)
		}
	})
}

// checkEventsAcrossProjects: team-b's event stream refuses team-a's
// sandbox as not found, and shows none of team-a's changes, which team-a's
// own stream shows.
func checkEventsAcrossProjects(t *testing.T, s *server, a, b tenant, sbxA string) {
	t.Helper()
	for _, tok := range []string{b.admin, b.member, b.readOnly} {
		if r := s.do("GET", "/v1/events?sandbox_id="+sbxA, tok, nil); r.status != 404 || r.errorCode() != "not_found" {
			t.Errorf("GET /v1/events?sandbox_id= team-a's sandbox as team-b = %d %s, want 404", r.status, r.body)
		}
	}
	open := func(tok string) (*bufio.Reader, func()) {
		req, _ := http.NewRequest("GET", s.url("/v1/events"), nil)
		req.Header.Set("Authorization", "Bearer "+tok)
		resp, err := http.DefaultClient.Do(req)
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("GET /v1/events: %v %v", resp, err)
		}
		return bufio.NewReader(resp.Body), func() { resp.Body.Close() }
	}
	bStream, closeB := open(b.readOnly)
	defer closeB()
	aStream, closeA := open(a.readOnly)
	defer closeA()
	// Both streams are open once each has said ready.
	for _, r := range []*bufio.Reader{aStream, bStream} {
		if line, err := r.ReadString('\n'); err != nil || line != "event: ready\n" {
			t.Fatalf("first line %q %v", line, err)
		}
	}
	r := s.do("PUT", "/v1/sandboxes/"+sbxA+"/network", a.member, []byte(`{"egress":"none"}`))
	if r.status != 200 {
		t.Fatalf("change team-a's sandbox: %d %s", r.status, r.body)
	}
	// team-a hears of it...
	deadline := time.Now().Add(10 * time.Second)
	for heard := false; !heard; {
		line, err := aStream.ReadString('\n')
		if err != nil || time.Now().After(deadline) {
			t.Fatalf("team-a's stream never named its sandbox (%v)", err)
		}
		heard = strings.Contains(line, sbxA)
	}
	// ...team-b, in the same time and a while more, hears nothing of it.
	got := make(chan string, 1)
	go func() {
		var seen strings.Builder
		for {
			line, err := bStream.ReadString('\n')
			seen.WriteString(line)
			if err != nil {
				got <- seen.String()
				return
			}
		}
	}()
	time.Sleep(time.Second)
	closeB()
	if text := <-got; strings.Contains(text, sbxA) || strings.Contains(text, "team-a") {
		t.Errorf("team-b's event stream shows team-a's changes: %s", text)
	}
}
