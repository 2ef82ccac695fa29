package e2e

import (
	"os"
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
	// The run's shared build and this one, in another data directory,
	// minutes apart: the same digest.
	_, first := sharedSeed(t)
	second, log, err := buildSeed(dataDir)
	if err != nil {
		t.Fatalf("build seed: %v\n%s", err, log)
	}
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

// sudo in seed:latest works for its user without a password on every
// runtime: the template's setuid sudo in a VM, the agent's sudo helper under
// gVisor (which does not honour setuid). Both follow the template's sudoers:
// a user it does not name is refused.
func TestSeedSudo(t *testing.T) {
	if testing.Short() {
		t.Skip("needs seed:latest")
	}
	requireGVisor(t)
	rts := []string{"gvisor"}
	if ok, why := vmAvailable(); ok {
		rts = append(rts, "vm")
	} else if os.Getenv("SPACE_REQUIRE_VM") == "1" {
		t.Fatalf("SPACE_REQUIRE_VM=1 but the vm runtime cannot run: %s", why)
	}
	s := startSeedServer(t, "auto")
	for _, rt := range rts {
		t.Run(rt, func(t *testing.T) {
			sbx := s.createWithNetwork(t, rt, nil)
			run := func(user, script string) (string, int) {
				tr, _ := s.runCommand(sbx.ID, map[string]any{"command": []string{"sh", "-c", script}, "user": user})
				code := -1
				if tr.exitCode != nil {
					code = *tr.exitCode
				}
				return string(tr.stdout) + string(tr.stderr), code
			}
			if out, code := run("user", "sudo -n true && sudo -n whoami && sudo -n sh -c 'id -u; exit 4'"); code != 4 || out != "root\n0\n" {
				t.Fatalf("sudo as user: exit %d, output %q", code, out)
			}
			if out, code := run("nobody", "sudo -n true"); code != 1 || !strings.HasPrefix(out, "sudo: ") {
				t.Fatalf("sudo as nobody (not in sudoers): exit %d, output %q", code, out)
			}
			if out, code := run("user", "touch /etc/by-user"); code == 0 {
				t.Fatalf("user wrote /etc without sudo: %q", out)
			}
		})
	}
}
