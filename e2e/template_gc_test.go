package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// `space template gc` never removes a template a sandbox still uses, even
// untagged and with the sandbox suspended (its root file system is that
// template), and removes it once the sandbox is deleted.
func TestTemplateGCKeepsTemplatesInUse(t *testing.T) {
	requireGVisor(t)
	s := startRuntimeServer(t, "gvisor")
	sbx := s.createRunning()
	sb, err := s.client().GetSandbox(context.Background(), sbx)
	if err != nil {
		t.Fatal(err)
	}
	digest := sb.Template.Digest
	blob := filepath.Join(s.dataDir, "templates", "blobs", strings.TrimPrefix(digest, "sha256:"))
	s.lifecycle(sbx, "suspend", "suspended")

	if out, errOut, code := s.runCLI("template", "rm", "test:latest"); code != 0 {
		t.Fatalf("template rm = %d %s %s", code, out, errOut)
	}
	out, errOut, code := s.runCLI("template", "gc")
	if code != 0 || strings.Contains(out, digest) {
		t.Fatalf("gc with the template in use = %d %q %s", code, out, errOut)
	}
	if _, err := os.Stat(blob); err != nil {
		t.Fatalf("gc removed a template a sandbox uses: %v", err)
	}
	s.lifecycle(sbx, "wake", "running")
	if tr, _ := s.runCommand(sbx, map[string]any{"command": []string{"cat", "/etc/hostname"}}); tr.exitCode == nil || *tr.exitCode != 0 {
		t.Fatalf("sandbox after gc: %v %q", tr.exitCode, tr.stderr)
	}

	s.lifecycle(sbx, "delete", "deleted")
	out, errOut, code = s.runCLI("template", "gc")
	if code != 0 || !strings.Contains(out, "removed "+digest) {
		t.Fatalf("gc after delete = %d %q %s", code, out, errOut)
	}
	if _, err := os.Stat(blob); !os.IsNotExist(err) {
		t.Fatalf("template content still there: %v", err)
	}
}
