package e2e

import (
	"encoding/json"
	"os/exec"
	"strings"
	"testing"

	"github.com/spacesandbox/space/client"
)

// seed:latest builds from Debian packages with a stable digest, and a
// sandbox from it runs Python and git (gVisor).
func TestSeedTemplate(t *testing.T) {
	if testing.Short() {
		t.Skip("building seed:latest takes about a minute")
	}
	requireGVisor(t)
	dataDir := t.TempDir()
	t.Cleanup(func() { killGVisorLeftovers(dataDir) })
	build := func() string {
		out, err := exec.Command(spaceBin, "template", "build", "seed", "--data-dir", dataDir, "--json").Output()
		if err != nil {
			t.Fatalf("build seed: %v", err)
		}
		var tpl struct{ Digest string }
		json.Unmarshal(out, &tpl)
		return tpl.Digest
	}
	first, second := build(), build()
	if first == "" || first != second {
		t.Fatalf("two builds of seed: %s vs %s", first, second)
	}
	s := startServer(t, serverOpts{bin: spaceBin, dataDir: dataDir, template: "seed:latest",
		args: []string{"--runtime", "gvisor", "--build-seed=false"}})
	t.Cleanup(func() { cleanupGVisor(s) })
	r := s.do("GET", "/v1/templates/seed:latest", s.token, nil)
	if r.status != 200 || !strings.Contains(string(r.body), first) {
		t.Fatalf("GET template = %d %s", r.status, r.body)
	}
	sbx := s.createRunning()
	sb, _ := s.client().GetSandbox(t.Context(), sbx)
	if sb.Template.Digest != first {
		t.Fatalf("sandbox records digest %s, want %s", sb.Template.Digest, first)
	}
	tr, _ := s.runCommand(sbx, map[string]any{"command": []string{"python3", "-c", "print(6*7)"}})
	if string(tr.stdout) != "42\n" || *tr.exitCode != 0 {
		t.Fatalf("python3: %q %q", tr.stdout, tr.stderr)
	}
	tr, _ = s.runCommand(sbx, map[string]any{"command": []string{"git", "--version"}})
	if !strings.HasPrefix(string(tr.stdout), "git version ") {
		t.Fatalf("git: %q %q", tr.stdout, tr.stderr)
	}
	tr, _ = s.runCommand(sbx, map[string]any{"command": []string{"sh", "-c", "id user && test -d /home/user && curl --version | head -1"}})
	if *tr.exitCode != 0 || !strings.Contains(string(tr.stdout), "uid=1000(user)") {
		t.Fatalf("user and curl: %q %q", tr.stdout, tr.stderr)
	}
	// A command as the template's user: its ids, home and working directory.
	tr, _ = s.runCommand(sbx, map[string]any{"command": []string{"sh", "-c", "id -un; id -u; pwd; echo $HOME $USER"}, "user": "user"})
	if string(tr.stdout) != "user\n1000\n/home/user\n/home/user user\n" || *tr.exitCode != 0 {
		t.Fatalf("command as user: %q %q", tr.stdout, tr.stderr)
	}
	tr, _ = s.runCommand(sbx, map[string]any{"command": []string{"true"}, "user": "nobody-here"})
	if !tr.complete || tr.errCode != "user_not_found" {
		t.Fatalf("unknown user: %+v", tr)
	}
	// A spec on seed: a failing package install fails the build clearly and
	// leaves no template; a real package installs.
	op, r := s.postTemplate("application/json", "", []byte(`{"name":"broken-pkgs","base":"seed:latest","packages":["space-no-such-package"]}`))
	if op == nil || op.State != "failed" || op.Error == nil || !strings.Contains(op.Error.Message, "apt-get install failed") {
		t.Fatalf("failing package install: %s %+v", r.body, op)
	}
	expectError(t, s.do("GET", "/v1/templates/broken-pkgs:latest", s.token, nil), 404, "not_found")
	op, r = s.postTemplate("application/json", "", []byte(`{"name":"with-jq","base":"seed:latest","packages":["jq"]}`))
	if op == nil || op.State != "succeeded" {
		t.Fatalf("jq build: %s %+v", r.body, op)
	}
	out, _, _ := s.client().CreateSandbox(t.Context(), client.CreateSandboxRequest{Template: "with-jq:latest"}, "")
	s.waitOp(out.Operation.ID)
	tr, _ = s.runCommand(out.Sandbox.ID, map[string]any{"command": []string{"sh", "-c", "echo '{\"a\":42}' | jq .a"}})
	if string(tr.stdout) != "42\n" {
		t.Fatalf("jq in a sandbox from the spec: %q %q", tr.stdout, tr.stderr)
	}
}
