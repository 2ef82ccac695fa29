package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
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
