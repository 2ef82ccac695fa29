package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// A data directory holds the database (sandbox env values in clear), the
// signing key and the first token: it is 0700 and its files 0600, whoever
// made it — the server or the CLI, new or already there with a wider mode
// (issue #14, item 13).
func TestDataDirIsPrivate(t *testing.T) {
	byCLI := filepath.Join(t.TempDir(), "made-by-cli")
	if out, err := exec.Command(spaceFakeBin, "template", "list", "--data-dir", byCLI).CombinedOutput(); err != nil {
		t.Fatalf("template list: %v\n%s", err, out)
	}
	wide := filepath.Join(t.TempDir(), "was-0755")
	os.Mkdir(wide, 0o755)
	s := startServer(t, serverOpts{dataDir: wide})
	s.createRunning()
	for _, dir := range []string{byCLI, wide} {
		if fi, err := os.Stat(dir); err != nil {
			t.Error(err)
		} else if fi.Mode().Perm() != 0o700 {
			t.Errorf("%s is %v, want 0700", dir, fi.Mode().Perm())
		}
	}
	for _, f := range []string{"space.db", "space.db-wal", "api-token", "attach.key"} {
		if fi, err := os.Stat(filepath.Join(wide, f)); err != nil {
			t.Error(err)
		} else if fi.Mode().Perm()&0o077 != 0 {
			t.Errorf("%s is %v, want no access for group and others", f, fi.Mode().Perm())
		}
	}
}

// One process owns a data directory (#14 item 14): a second server on it
// stops at once naming the owner; a template build is refused while a
// server runs there; listing beside it leaves its unfinished builds alone.
func TestOneOwnerPerDataDir(t *testing.T) {
	s := startServer(t, serverOpts{})
	out, err := exec.Command(spaceFakeBin, "serve", "--runtime", "fake", "--data-dir", s.dataDir,
		"--api-addr", "127.0.0.1:0", "--data-plane-addr", "127.0.0.1:0", "--ecw-addr", "").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "owned by process") {
		t.Fatalf("second server on the same data dir: %v\n%s", err, out)
	}
	inProgress := filepath.Join(s.dataDir, "templates", "tmp", "build-in-progress")
	if err := os.MkdirAll(inProgress, 0o700); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(spaceFakeBin, "template", "list", "--data-dir", s.dataDir).CombinedOutput(); err != nil {
		t.Fatalf("template list beside a server: %v\n%s", err, out)
	}
	if _, err := os.Stat(inProgress); err != nil {
		t.Fatalf("template list removed the server's build in progress: %v", err)
	}
	out, err = exec.Command(spaceFakeBin, "template", "build", "test", "--data-dir", s.dataDir).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "owned by process") {
		t.Fatalf("template build beside a server: %v\n%s", err, out)
	}
	// The server is unharmed.
	s.createRunning()
}
