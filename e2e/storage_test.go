package e2e

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
)

// A full data directory is reported as what it is: /readyz says not ready
// and why, a create is 202 (and its operation ends) or 507
// resource_exhausted — never 500 internal — and all is well again once
// space is freed (#14 item 10). The data directory is a 16 MiB tmpfs the
// test mounts (needs root).
func TestFullDataDirIsNotInternal(t *testing.T) {
	requireRoot(t)
	dir := filepath.Join(t.TempDir(), "data")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=16m", "space-e2e-full", dir).CombinedOutput(); err != nil {
		t.Fatalf("mount tmpfs: %v %s", err, out)
	}
	t.Cleanup(func() { syscall.Unmount(dir, syscall.MNT_DETACH) }) // after the server stops
	s := startServer(t, serverOpts{dataDir: dir})
	sbx := s.createRunning()
	if r := s.do("GET", "/readyz", "", nil); r.status != 200 {
		t.Fatalf("readyz before = %d %s", r.status, r.body)
	}
	filler := filepath.Join(dir, "filler")
	f, err := os.Create(filler)
	if err != nil {
		t.Fatal(err)
	}
	chunk := make([]byte, 64<<10)
	for {
		if _, err := f.Write(chunk); err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatal(err)
			}
			break
		}
	}
	f.Close()
	r := s.do("GET", "/readyz", "", nil)
	if r.status != 503 || !bytes.Contains(r.body, []byte("cannot take writes")) {
		t.Fatalf("readyz with a full data dir = %d %s, want 503 naming the data directory", r.status, r.body)
	}
	for i := 0; i < 3; i++ {
		r := s.do("POST", "/v1/sandboxes", s.token, []byte(`{}`))
		switch r.status {
		case 202:
			var out struct{ Operation struct{ ID string } }
			r.json(t, &out)
			s.waitOp(out.Operation.ID) // ends (failed or not); it does not hang
		case 507:
			expectError(t, r, 507, "resource_exhausted")
		default:
			t.Fatalf("create with a full data dir = %d %s, want 202 or 507", r.status, r.body)
		}
	}
	// Writing into the fake runtime's sandbox (a directory in the data
	// dir) is a full disk for the sandbox: resource_exhausted, not 500.
	if r := s.do("PUT", "/v1/sandboxes/"+sbx+"/files?path=/big", s.token, bytes.Repeat([]byte("x"), 1<<20)); r.status != 429 {
		t.Fatalf("write into a full sandbox = %d %s, want 429 resource_exhausted", r.status, r.body)
	}
	os.Remove(filler)
	if r := s.do("GET", "/readyz", "", nil); r.status != 200 {
		t.Fatalf("readyz after freeing = %d %s", r.status, r.body)
	}
	s.createRunning()
}
