package e2e

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/rand"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/spacesandbox/space/client"
)

func tarLayer(t *testing.T, files map[string]string, links map[string]string, bins map[string]string) v1.Layer {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for p, body := range files {
		tw.WriteHeader(&tar.Header{Name: p, Mode: 0o644, Size: int64(len(body)), Typeflag: tar.TypeReg})
		tw.Write([]byte(body))
	}
	for p, src := range bins {
		b, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		tw.WriteHeader(&tar.Header{Name: p, Mode: 0o755, Size: int64(len(b)), Typeflag: tar.TypeReg})
		tw.Write(b)
	}
	for p, target := range links {
		tw.WriteHeader(&tar.Header{Name: p, Typeflag: tar.TypeSymlink, Linkname: target})
	}
	tw.Close()
	b := buf.Bytes()
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil })
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// imageArchive is img as a docker-save archive tagged ref.
func imageArchive(t *testing.T, img v1.Image, ref string) []byte {
	t.Helper()
	archive := filepath.Join(t.TempDir(), "image.tar")
	r, _ := name.ParseReference(ref)
	if err := tarball.WriteToFile(archive, r, img); err != nil {
		t.Fatal(err)
	}
	body, err := os.ReadFile(archive)
	if err != nil {
		t.Fatal(err)
	}
	return body
}

// waitBuild polls a build operation to its end.
func (s *server) postTemplate(contentType, query string, body []byte) (*client.Operation, reply) {
	s.t.Helper()
	r := s.do("POST", "/v1/templates"+query, s.token, body, "Content-Type: "+contentType)
	if r.status != 202 {
		return nil, r
	}
	var out struct{ Operation client.Operation }
	r.json(s.t, &out)
	return s.waitOp(out.Operation.ID), r
}

// An image archive made here (two layers, the second whiting out a file of
// the first) imports, and a sandbox from it sees the right files and the
// image's environment; a broken archive fails and leaves no template.
func TestTemplateImportOCIGVisor(t *testing.T) {
	requireGVisor(t)
	s := startRuntimeServer(t, "gvisor")
	img, err := mutate.AppendLayers(empty.Image,
		tarLayer(t, map[string]string{"etc/kept": "kept\n", "etc/removed": "gone\n"}, map[string]string{"bin/sh": "busybox", "bin/cat": "busybox", "bin/ls": "busybox"},
			map[string]string{"bin/busybox": "/usr/bin/busybox"}),
		tarLayer(t, map[string]string{"etc/.wh.removed": "", "etc/added": "added\n"}, nil, nil))
	if err != nil {
		t.Fatal(err)
	}
	cfg, _ := img.ConfigFile()
	cfg = cfg.DeepCopy()
	cfg.Config.Env = []string{"PATH=/bin", "FROM_IMAGE=yes"}
	img, _ = mutate.ConfigFile(img, cfg)
	body := imageArchive(t, img, "example.invalid/e2e:v1")
	// Through the Go client: the archive streamed as application/x-tar.
	started, err := s.client().ImportTemplate(context.Background(), "imported", "v1", bytes.NewReader(body))
	if err != nil {
		t.Fatalf("import: %v", err)
	}
	op := s.waitOp(started.ID)
	if op.State != "succeeded" || op.Kind != "build" {
		t.Fatalf("import = %+v", op)
	}
	tpl, err := s.client().GetTemplate(context.Background(), "imported:v1")
	if err != nil || !strings.HasPrefix(tpl.Digest, "sha256:") || tpl.Ref() != "imported:v1" {
		t.Fatalf("GetTemplate: %+v %v", tpl, err)
	}
	if list, err := s.client().ListTemplates(context.Background()); err != nil || !slices.ContainsFunc(list, func(x client.Template) bool { return x.Ref() == "imported:v1" && x.Digest == tpl.Digest }) {
		t.Fatalf("ListTemplates: %+v %v", list, err)
	}
	out, _, err := s.client().CreateSandbox(context.Background(), client.CreateSandboxRequest{Template: "imported:v1"}, "")
	if err != nil {
		t.Fatal(err)
	}
	if done := s.waitOp(out.Operation.ID); done.State != "succeeded" {
		t.Fatalf("create from import: %+v", done.Error)
	}
	sbx := out.Sandbox.ID
	base := "/v1/sandboxes/" + sbx + "/files"
	for p, want := range map[string]string{"/etc/kept": "kept\n", "/etc/added": "added\n"} {
		if r := s.do("GET", base+"?path="+p, s.token, nil); r.status != 200 || string(r.body) != want {
			t.Fatalf("%s = %d %q", p, r.status, r.body)
		}
	}
	expectError(t, s.do("GET", base+"?path=/etc/removed", s.token, nil), 404, "not_found")
	tr, _ := s.runCommand(sbx, map[string]any{"command": []string{"sh", "-c", "echo $FROM_IMAGE; ls /etc"}})
	if !strings.HasPrefix(string(tr.stdout), "yes\n") || strings.Contains(string(tr.stdout), "removed") {
		t.Fatalf("inside the imported sandbox: %q", tr.stdout)
	}

	op, _ = s.postTemplate("application/x-tar", "?name=broken&tag=v1", bytes.Repeat([]byte("junk"), 4096))
	if op == nil || op.State != "failed" || op.Error == nil || op.Error.Code != "invalid_argument" {
		t.Fatalf("broken archive: %+v", op)
	}
	expectError(t, s.do("GET", "/v1/templates/broken:v1", s.token, nil), 404, "not_found")
	// Spec builds: unknown base is refused at once; files land.
	expectError(t, s.do("POST", "/v1/templates", s.token, []byte(`{"name":"x","base":"nope:latest"}`)), 404, "not_found")
	expectError(t, s.do("POST", "/v1/templates", s.token, []byte(`{"name":"x","base":"test:latest","start_command":["sleep","1"]}`)), 400, "invalid_argument")
	started, err = s.client().BuildTemplate(context.Background(), client.TemplateSpec{Name: "withfile", Base: "test:latest", Env: map[string]string{"TPL": "1"}, Workdir: "/work",
		Files: []client.TemplateFile{{Path: "/work/hello.txt", Content: []byte("hello\n")}}}, "")
	if err != nil {
		t.Fatalf("spec build: %v", err)
	}
	if op = s.waitOp(started.ID); op.State != "succeeded" {
		t.Fatalf("spec build = %+v", op)
	}
	out, _, _ = s.client().CreateSandbox(context.Background(), client.CreateSandboxRequest{Template: "withfile:latest"}, "")
	s.waitOp(out.Operation.ID)
	tr, _ = s.runCommand(out.Sandbox.ID, map[string]any{"command": []string{"sh", "-c", "pwd; echo $TPL; cat hello.txt"}})
	if string(tr.stdout) != "/work\n1\nhello\n" {
		t.Fatalf("sandbox from spec: %q %q", tr.stdout, tr.stderr)
	}
	_ = http.StatusOK
}

// An image that does not fit the server's disk (#14's disk-full build):
// the upload or the build fails with 507 resource_exhausted — not 400 or
// 500 — and leaves no template and nothing in the scratch area; the server
// serves on. The templates' scratch area is an 8 MiB tmpfs the test mounts
// (needs root).
func TestTemplateImportOnFullDiskGVisor(t *testing.T) {
	requireGVisor(t)
	requireRoot(t)
	s := startRuntimeServer(t, "gvisor")
	scratch := filepath.Join(s.dataDir, "templates", "tmp")
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=8m", "space-e2e-buildfull", scratch).CombinedOutput(); err != nil {
		t.Fatalf("mount: %v %s", err, out)
	}
	t.Cleanup(func() { syscall.Unmount(scratch, syscall.MNT_DETACH) })
	big := make([]byte, 5<<20) // the upload fits; unpacking it does not
	rand.Read(big)             // incompressible
	img, err := mutate.AppendLayers(empty.Image, tarLayer(t, map[string]string{"big.bin": string(big)}, nil, nil))
	if err != nil {
		t.Fatal(err)
	}
	body := imageArchive(t, img, "example.invalid/big:v1")
	op, r := s.postTemplate("application/x-tar", "?name=big&tag=v1", body)
	switch {
	case op == nil:
		expectError(t, r, 507, "resource_exhausted") // the upload itself did not fit
	case op.State != "failed" || op.Error == nil || op.Error.Code != "resource_exhausted":
		t.Fatalf("build on a full disk = %+v", op)
	}
	expectError(t, s.do("GET", "/v1/templates/big:v1", s.token, nil), 404, "not_found")
	if left, _ := os.ReadDir(scratch); len(left) != 0 {
		t.Fatalf("the failed build left %d entries in the scratch area", len(left))
	}
	s.createRunning()
}
