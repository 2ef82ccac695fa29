package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/spacesandbox/space/client"
)

// runExample runs examples/first_sandbox.py with stdin and returns stdout,
// stderr and the exit code.
func runExample(t *testing.T, env []string, stdin string, args ...string) (string, string, int) {
	t.Helper()
	cmd := exec.Command("python3", append([]string{"../examples/first_sandbox.py"}, args...)...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdin = strings.NewReader(stdin)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return out.String(), errb.String(), code
}

func exampleEnv(s *server, apiURL string) []string {
	tpl := s.template
	if tpl == "" {
		tpl = "seed:latest"
	}
	return []string{"SPACE_API_URL=" + apiURL, "SPACE_DATA_PLANE_URL=http://" + s.dpAddr, "SPACE_API_TOKEN=" + s.token, "SPACE_TEMPLATE=" + tpl,
		"HTTP_PROXY=http://127.0.0.1:9", "http_proxy=http://127.0.0.1:9"} // proxies must be ignored
}

var runDirRE = regexp.MustCompile(`Run directory: (/tmp/space-first-sandbox-\S+)`)

type exampleState struct {
	APIOrigin string `json:"api_origin"`
	Requests  []struct {
		Name, Method, Path, Outcome string
		Body                        json.RawMessage
		IdempotencyKey              string `json:"idempotency_key"`
	} `json:"requests"`
	IDs         map[string]any `json:"ids"`
	Transcripts []string       `json:"transcripts"`
	Deleted     bool           `json:"deleted"`
}

// checkRunDir verifies the run directory: private, state.json with every
// mutation's method, path, body and key, ids, and no token anywhere.
func checkRunDir(t *testing.T, dir string, tokens ...string) exampleState {
	t.Helper()
	fi, err := os.Stat(dir)
	if err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("run directory %s: %v %v", dir, fi.Mode(), err)
	}
	var st exampleState
	b, err := os.ReadFile(filepath.Join(dir, "state.json"))
	if err != nil || json.Unmarshal(b, &st) != nil {
		t.Fatalf("state.json: %v\n%s", err, b)
	}
	for _, r := range st.Requests {
		if r.Method == "" || !strings.HasPrefix(r.Path, "/v1/") || len(r.IdempotencyKey) < 16 || r.Body == nil {
			t.Fatalf("request record incomplete: %+v", r)
		}
	}
	filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err != nil || fi.IsDir() {
			return nil
		}
		b, _ := os.ReadFile(p)
		for _, tok := range append(tokens, "spat_") { // no API token, no attachment token
			if tok != "" && bytes.Contains(b, []byte(tok)) {
				t.Fatalf("%s contains a token", p)
			}
		}
		return nil
	})
	return st
}

// exampleRuntime is gVisor where it runs, else the fake runtime.
func exampleRuntime(t *testing.T) *server {
	if ok, _ := gvisorAvailable(); ok {
		return startRuntimeServer(t, "gvisor")
	}
	return startRuntimeServer(t, "fake")
}

// The walkthrough end to end: once deleting, once keeping; then inspect,
// suspend/wake and delete on the kept run.
func TestFirstSandboxExample(t *testing.T) {
	s := exampleRuntime(t)
	env := exampleEnv(s, "http://"+s.apiAddr)

	out, errOut, code := runExample(t, env, "y\n")
	if code != 0 || !strings.Contains(out, "Hello from SPACE\n/tmp\n") || !strings.Contains(out, "Command completed successfully") {
		t.Fatalf("example (delete) exit %d:\n%s\n%s", code, out, errOut)
	}
	dir := runDirRE.FindStringSubmatch(out)[1]
	if !strings.HasPrefix(out, "Run directory: ") {
		t.Fatal("the run directory is not printed first")
	}
	st := checkRunDir(t, dir, s.token)
	if !st.Deleted || len(st.Transcripts) != 0 || len(st.Requests) != 3 {
		t.Fatalf("after delete: %+v", st)
	}
	if sb, _ := s.client().GetSandbox(context.Background(), st.IDs["sandbox_id"].(string)); sb == nil || sb.State != "deleted" {
		t.Fatalf("sandbox after the example's delete: %+v", sb)
	}
	if m, _ := filepath.Glob(filepath.Join(dir, "*.events")); len(m) != 0 {
		t.Fatalf("transcripts left after delete: %v", m)
	}

	out, errOut, code = runExample(t, env, "\n")
	if code != 0 || !strings.Contains(out, "Kept.") {
		t.Fatalf("example (keep) exit %d:\n%s\n%s", code, out, errOut)
	}
	dir = runDirRE.FindStringSubmatch(out)[1]
	st = checkRunDir(t, dir, s.token)
	sbx := st.IDs["sandbox_id"].(string)
	if m, _ := filepath.Glob(filepath.Join(dir, "command-*.events")); len(m) != 1 {
		t.Fatalf("transcript missing: %v", m)
	}
	if out, _, code := runExample(t, env, "", "inspect", dir); code != 0 || !strings.Contains(out, "--- sandbox "+sbx) || strings.Contains(out, "inspection failed") {
		t.Fatalf("inspect exit %d:\n%s", code, out)
	}
	before := len(st.Requests)
	runExample(t, env, "", "inspect", dir)
	if st2 := checkRunDir(t, dir, s.token); len(st2.Requests) != before {
		t.Fatal("inspect made a mutation")
	}
	// Inspect refuses a run made against other origins.
	other := append(append([]string{}, env...), "SPACE_API_URL=http://127.0.0.2:1")
	if _, errOut, code := runExample(t, other, "", "inspect", dir); code == 0 || !strings.Contains(errOut, "refusing") {
		t.Fatalf("inspect with other origins: %d %s", code, errOut)
	}
	for _, step := range [][]string{{"suspend", dir, "--pause"}, {"wake", dir}, {"suspend", dir}, {"wake", dir}} {
		out, errOut, code := runExample(t, env, "", step...)
		if code != 0 {
			t.Fatalf("%v exit %d:\n%s\n%s", step, code, out, errOut)
		}
		if step[0] == "wake" && !strings.Contains(out, "Hello from SPACE") {
			t.Fatalf("wake did not rerun the command:\n%s", out)
		}
	}
	if out, _, code := runExample(t, env, "n\n", "delete", dir); code != 0 || !strings.Contains(out, "Not deleted") {
		t.Fatalf("delete declined: %d %s", code, out)
	}
	if out, errOut, code := runExample(t, env, "y\n", "delete", dir); code != 0 || !strings.Contains(out, "deleted") {
		t.Fatalf("delete exit %d:\n%s\n%s", code, out, errOut)
	}
	st = checkRunDir(t, dir, s.token)
	if !st.Deleted {
		t.Fatal("state.json does not record the delete")
	}
	// Deleting again is a failure (404), not proof of deletion.
	os.WriteFile(filepath.Join(dir, "state.json"), bytes.Replace(mustRead(t, filepath.Join(dir, "state.json")), []byte(`"delete_operation_id"`), []byte(`"old_delete_operation_id"`), 1), 0o600)
	if _, errOut, code := runExample(t, env, "y\n", "delete", dir); code == 0 || !strings.Contains(errOut, "404") {
		t.Fatalf("second delete: %d %s", code, errOut)
	}
}

func mustRead(t *testing.T, p string) []byte {
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// A NETWORK FAULT INJECTED between example and server: the server receives
// the DELETE and is then killed before its answer arrives. The retry reuses
// the original Idempotency-Key and body, and the sandbox is deleted once.
func TestFirstSandboxExampleDeleteOutcomeUnknownFaultInjection(t *testing.T) {
	s := startRuntimeServer(t, "fake")
	target, _ := url.Parse("http://" + s.apiAddr)
	var dropDeletes atomic.Bool
	proxy := httputil.NewSingleHostReverseProxy(target)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodDelete && dropDeletes.Load() {
			// Forward the request, then kill the server and hang up.
			body, _ := io.ReadAll(r.Body)
			req, _ := http.NewRequest(r.Method, "http://"+s.apiAddr+r.URL.RequestURI(), bytes.NewReader(body))
			req.Header = r.Header.Clone()
			if resp, err := http.DefaultClient.Do(req); err == nil {
				resp.Body.Close()
			}
			s.kill()
			panic(http.ErrAbortHandler)
		}
		proxy.ServeHTTP(w, r)
	})}
	go srv.Serve(ln)
	defer srv.Close()
	env := exampleEnv(s, "http://"+ln.Addr().String())

	out, errOut, code := runExample(t, env, "\n")
	if code != 0 {
		t.Fatalf("example exit %d:\n%s\n%s", code, out, errOut)
	}
	dir := runDirRE.FindStringSubmatch(out)[1]
	dropDeletes.Store(true)
	if _, errOut, code := runExample(t, env, "y\n", "delete", dir); code == 0 {
		t.Fatalf("a delete whose answer was lost reported success: %s", errOut)
	}
	st := checkRunDir(t, dir, s.token)
	first := st.Requests[len(st.Requests)-1]
	if first.Name != "delete" || first.Outcome != "unknown" {
		t.Fatalf("the lost delete is not recorded as unknown: %+v", first)
	}
	if m, _ := filepath.Glob(filepath.Join(dir, "*.events")); len(m) == 0 {
		t.Fatal("transcripts removed although the delete did not finish")
	}
	dropDeletes.Store(false)
	s.start()
	out, errOut, code = runExample(t, env, "y\n", "delete", dir)
	if code != 0 || !strings.Contains(out, "outcome is unknown") || !strings.Contains(out, first.IdempotencyKey) {
		t.Fatalf("retry exit %d:\n%s\n%s", code, out, errOut)
	}
	st = checkRunDir(t, dir, s.token)
	retry := st.Requests[len(st.Requests)-1]
	if retry.IdempotencyKey != first.IdempotencyKey || retry.Path != first.Path || string(retry.Body) != string(first.Body) || !st.Deleted {
		t.Fatalf("retry %+v differs from the first %+v", retry, first)
	}
	sbx := st.IDs["sandbox_id"].(string)
	ops, _ := s.client().ListOperations(context.Background(), sbx, client.ListOptions{})
	deletes := 0
	for _, op := range ops.Items {
		if op.Kind == "delete" {
			deletes++
		}
	}
	sb, _ := s.client().GetSandbox(context.Background(), sbx)
	if deletes != 1 || sb.State != "deleted" {
		t.Fatalf("%d delete operations, sandbox %s", deletes, sb.State)
	}
}
