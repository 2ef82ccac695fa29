package e2e

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// tourScript extracts the README's five-minute tour: every ```sh block
// between "## A five-minute tour" and the next "## " heading, except the one
// that starts the server (the test starts it).
func tourScript(t *testing.T) string {
	b, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	text := string(b)
	start := strings.Index(text, "## A five-minute tour")
	if start < 0 {
		t.Fatal("README has no five-minute tour")
	}
	text = text[start+1:]
	if end := strings.Index(text, "\n## "); end >= 0 {
		text = text[:end]
	}
	var script strings.Builder
	blocks := 0
	for {
		i := strings.Index(text, "```sh\n")
		if i < 0 {
			break
		}
		text = text[i+6:]
		j := strings.Index(text, "```")
		block := text[:j]
		text = text[j+3:]
		if strings.TrimSpace(block) == "make serve" {
			continue
		}
		script.WriteString(block)
		blocks++
	}
	if blocks < 4 {
		t.Fatalf("found only %d tour blocks", blocks)
	}
	return script.String()
}

// Every command of the README's tour runs, as written, against a real
// server (gVisor and seed:latest where gVisor runs).
func TestREADMETour(t *testing.T) {
	if testing.Short() {
		t.Skip("the tour builds seed:latest")
	}
	script := tourScript(t)
	var s *server
	if ok, _ := gvisorAvailable(); ok {
		dataDir := seedDataDir(t)
		t.Cleanup(func() { killGVisorLeftovers(dataDir) })
		s = startServer(t, serverOpts{bin: spaceBin, dataDir: dataDir, args: []string{"--runtime", "gvisor", "--build-seed=false"}})
		t.Cleanup(func() { cleanupGVisor(s) })
	} else {
		requireGVisor(t) // fails in CI; elsewhere the fake runtime stands in
		s = startRuntimeServer(t, "fake")
	}
	binDir := t.TempDir()
	os.Symlink(spaceBin, filepath.Join(binDir, "space"))
	script = strings.NewReplacer(
		"$(sudo cat /var/lib/space/api-token)", s.token,
		"127.0.0.1:8080", s.apiAddr,
		"127.0.0.1:8090", s.dpAddr,
		"bin/space ", filepath.Join(binDir, "space")+" ",
	).Replace(script)
	cmd := exec.Command("bash", "-euo", "pipefail", "-c", script)
	cmd.Dir = ".."
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		t.Fatalf("the tour failed: %v\n--- stdout\n%s\n--- stderr\n%s\n--- script\n%s", err, out.String(), errb.String(), script)
	}
	for _, want := range []string{`"status":"ready"`, "hello from ", "42\n", "from a file\n", "/work/hello.py", "operation op_",
		"event: process_exited", "Hello from SPACE", "Kept.", "--- sandbox sbx_", "wake succeeded", "deleted; transcripts removed"} {
		if !strings.Contains(out.String(), want) {
			t.Fatalf("tour output lacks %q:\n%s\n%s", want, out.String(), errb.String())
		}
	}
}
