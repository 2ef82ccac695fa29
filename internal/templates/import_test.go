package templates

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/spacesandbox/space/internal/errdefs"
)

type entry struct {
	name, body, link string
	dir              bool
}

func layerOf(t *testing.T, entries ...entry) v1.Layer {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := &tar.Header{Name: e.name, Mode: 0o644, Typeflag: tar.TypeReg, Size: int64(len(e.body))}
		switch {
		case e.dir:
			h.Typeflag, h.Mode, h.Size = tar.TypeDir, 0o755, 0
		case e.link != "":
			h.Typeflag, h.Linkname, h.Size = tar.TypeSymlink, e.link, 0
		}
		tw.WriteHeader(h)
		tw.Write([]byte(e.body))
	}
	tw.Close()
	b := buf.Bytes()
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil })
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// testImage has two layers; the second whites out /etc/removed.
func testImage(t *testing.T) v1.Image {
	img, err := mutate.AppendLayers(empty.Image,
		layerOf(t, entry{name: "etc/", dir: true}, entry{name: "etc/kept", body: "kept\n"}, entry{name: "etc/removed", body: "gone\n"},
			entry{name: "opt/dir/", dir: true}, entry{name: "opt/dir/old", body: "old\n"}),
		layerOf(t, entry{name: "etc/.wh.removed"}, entry{name: "opt/dir/.wh..wh..opq"}, entry{name: "opt/dir/new", body: "new\n"},
			entry{name: "etc/link", link: "/etc/kept"}, entry{name: "escape", link: "../../../../etc"}))
	if err != nil {
		t.Fatal(err)
	}
	cfg, _ := img.ConfigFile()
	cfg = cfg.DeepCopy()
	cfg.Config.Env = []string{"PATH=/usr/bin:/bin", "IMPORTED=yes"}
	cfg.Config.WorkingDir = "/opt"
	img, err = mutate.ConfigFile(img, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

func checkImported(t *testing.T, s *Store, tpl Template) {
	t.Helper()
	root, err := s.RootfsPath(tpl.Digest)
	if err != nil {
		t.Fatal(err)
	}
	for p, want := range map[string]string{"etc/kept": "kept\n", "opt/dir/new": "new\n"} {
		if b, err := os.ReadFile(filepath.Join(root, p)); err != nil || string(b) != want {
			t.Fatalf("%s = %q %v", p, b, err)
		}
	}
	for _, p := range []string{"etc/removed", "opt/dir/old", "etc/.wh.removed"} {
		if _, err := os.Lstat(filepath.Join(root, p)); err == nil {
			t.Fatalf("%s survived its whiteout", p)
		}
	}
	if target, _ := os.Readlink(filepath.Join(root, "etc/link")); target != "/etc/kept" {
		t.Fatalf("symlink = %q", target)
	}
	if tpl.Env["IMPORTED"] != "yes" || tpl.Workdir != "/opt" {
		t.Fatalf("config not imported: %+v", tpl)
	}
}

func TestImportDockerSave(t *testing.T) {
	s, _ := Open(t.TempDir())
	archive := filepath.Join(t.TempDir(), "img.tar")
	ref, _ := name.ParseReference("example.invalid/img:v1")
	if err := tarball.WriteToFile(archive, ref, testImage(t)); err != nil {
		t.Fatal(err)
	}
	tpl, err := s.ImportOCI(context.Background(), archive, "imported", "v1", io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	checkImported(t, s, tpl)
	again, _ := s.ImportOCI(context.Background(), archive, "imported", "v2", io.Discard)
	if again.Digest != tpl.Digest {
		t.Fatal("the same image imported twice has two digests")
	}
}

func TestImportOCILayout(t *testing.T) {
	s, _ := Open(t.TempDir())
	dir := t.TempDir()
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.AppendImage(testImage(t)); err != nil {
		t.Fatal(err)
	}
	archive := filepath.Join(t.TempDir(), "layout.tar")
	tarDir(t, dir, archive)
	tpl, err := s.ImportOCI(context.Background(), archive, "layout", "v1", io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	checkImported(t, s, tpl)
}

func tarDir(t *testing.T, dir, out string) {
	f, _ := os.Create(out)
	defer f.Close()
	tw := tar.NewWriter(f)
	filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		rel, _ := filepath.Rel(dir, p)
		if rel == "." {
			return nil
		}
		h, _ := tar.FileInfoHeader(fi, "")
		h.Name = rel
		tw.WriteHeader(h)
		if fi.Mode().IsRegular() {
			b, _ := os.ReadFile(p)
			tw.Write(b)
		}
		return nil
	})
	tw.Close()
}

func TestImportBrokenArchiveLeavesNothing(t *testing.T) {
	dir := t.TempDir()
	s, _ := Open(dir)
	archive := filepath.Join(t.TempDir(), "junk.tar")
	os.WriteFile(archive, bytes.Repeat([]byte("not a tar "), 1000), 0o644)
	if _, err := s.ImportOCI(context.Background(), archive, "junk", "v1", io.Discard); !errors.Is(err, errdefs.InvalidArgument) {
		t.Fatalf("broken archive = %v", err)
	}
	for _, d := range []string{"tmp", "blobs", "tags"} {
		if ents, _ := os.ReadDir(filepath.Join(dir, d)); len(ents) != 0 {
			t.Fatalf("%s not empty: %v", d, ents)
		}
	}
}

func TestUntarStaysInside(t *testing.T) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	tw.WriteHeader(&tar.Header{Name: "link", Typeflag: tar.TypeSymlink, Linkname: "/"})
	tw.WriteHeader(&tar.Header{Name: "link/etc/pwned", Typeflag: tar.TypeReg, Mode: 0o644, Size: 1})
	tw.Write([]byte("x"))
	tw.Close()
	dir := t.TempDir()
	if err := untar(context.Background(), &buf, filepath.Join(dir, "root")); err == nil {
		t.Fatal("a write through a symlink to / succeeded")
	}
	if _, err := os.Stat("/etc/pwned"); err == nil {
		os.Remove("/etc/pwned")
		t.Fatal("untar wrote outside its root")
	}
}

func TestBuildSpecFiles(t *testing.T) {
	if _, err := findBusybox(); err != nil {
		t.Skip("needs busybox-static")
	}
	s, _ := Open(t.TempDir())
	ctx := context.Background()
	if _, err := s.Build(ctx, "test", io.Discard); err != nil {
		t.Fatal(err)
	}
	spec := Spec{Name: "mine", Tag: "v1", Base: "test:latest", Env: map[string]string{"A": "1"}, Workdir: "/work",
		Files: []File{{Path: "/work/hello.sh", Content: base64.StdEncoding.EncodeToString([]byte("echo hi\n")), Mode: "0755"}}}
	a, err := s.BuildSpec(ctx, spec, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	spec.Tag = "v2"
	b, _ := s.BuildSpec(ctx, spec, io.Discard)
	if a.Digest != b.Digest {
		t.Fatal("same spec, different digest")
	}
	spec.Env = map[string]string{"A": "2"}
	c, _ := s.BuildSpec(ctx, spec, io.Discard)
	if c.Digest == a.Digest {
		t.Fatal("env is not part of the digest")
	}
	root, _ := s.RootfsPath(a.Digest)
	if fi, err := os.Stat(filepath.Join(root, "work/hello.sh")); err != nil || fi.Mode().Perm() != 0o755 {
		t.Fatalf("file: %v %v", fi, err)
	}
	if env, wd := s.Config(a.Digest); env["A"] != "1" || wd != "/work" {
		t.Fatalf("config = %v %q", env, wd)
	}
	for _, bad := range []Spec{{Name: "x", Base: "nope:latest"}} {
		if _, err := s.BuildSpec(ctx, bad, io.Discard); !errors.Is(err, errdefs.NotFound) {
			t.Fatalf("unknown base = %v", err)
		}
	}
	for _, bad := range []Spec{{Name: "Bad", Base: "test"}, {Name: "x"}, {Name: "x", Base: "test", Packages: []string{"rm -rf /"}},
		{Name: "x", Base: "test", Files: []File{{Path: "rel", Content: ""}}}, {Name: "x", Base: "test", StartCommand: []string{"sleep"}}} {
		if _, err := s.BuildSpec(ctx, bad, io.Discard); !errors.Is(err, errdefs.InvalidArgument) {
			t.Fatalf("%+v = %v", bad, err)
		}
	}
	if _, err := s.BuildSpec(ctx, Spec{Name: "x", Base: "test", Packages: []string{"jq"}}, io.Discard); !errors.Is(err, errdefs.InvalidArgument) {
		t.Fatalf("packages on a non-Debian base = %v", err)
	}
}

// Untrusted archive bytes never panic the unpacker and never write outside
// its directory.
func FuzzUntar(f *testing.F) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	tw.WriteHeader(&tar.Header{Name: "a/b", Typeflag: tar.TypeReg, Mode: 0o644, Size: 1})
	tw.Write([]byte("x"))
	tw.WriteHeader(&tar.Header{Name: "l", Typeflag: tar.TypeSymlink, Linkname: "../../.."})
	tw.WriteHeader(&tar.Header{Name: "l/escaped", Typeflag: tar.TypeReg, Mode: 0o644})
	tw.WriteHeader(&tar.Header{Name: "../up", Typeflag: tar.TypeReg, Mode: 0o644})
	tw.WriteHeader(&tar.Header{Name: "h", Typeflag: tar.TypeLink, Linkname: "/etc/passwd"})
	tw.Close()
	f.Add(buf.Bytes())
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		parent := t.TempDir()
		untar(context.Background(), bytes.NewReader(b), filepath.Join(parent, "root"))
		ents, _ := os.ReadDir(parent)
		if len(ents) != 1 || ents[0].Name() != "root" {
			t.Fatalf("untar wrote beside its root: %v", ents)
		}
	})
}
