package templates

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/spacesandbox/space/internal/errdefs"
)

func TestBuildTestTemplateIsStableAndResolvable(t *testing.T) {
	if _, err := findBusybox(); err != nil {
		t.Skip("needs Debian's busybox-static: ", err)
	}
	s, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	a, err := s.Build(ctx, "test", io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	b, err := s.Build(ctx, "test", io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if a.Digest != b.Digest || a.Ref() != "test:latest" {
		t.Fatalf("two builds: %s vs %s", a.Digest, b.Digest)
	}
	ref, err := s.Resolve(ctx, "test:latest")
	if err != nil || ref.Digest != a.Digest {
		t.Fatalf("resolve = %+v %v", ref, err)
	}
	if _, err := s.Resolve(ctx, a.Digest); err != nil {
		t.Fatalf("resolve by digest: %v", err)
	}
	root, _ := s.RootfsPath(a.Digest)
	if fi, err := os.Lstat(filepath.Join(root, "bin/sh")); err != nil || fi.Mode()&os.ModeSymlink == 0 {
		t.Fatalf("bin/sh: %v", err)
	}
	if _, err := s.Resolve(ctx, "nope:latest"); !errors.Is(err, errdefs.NotFound) {
		t.Fatalf("unknown = %v", err)
	}
	if _, err := s.Resolve(ctx, "Bad:Ref:x"); !errors.Is(err, errdefs.InvalidArgument) {
		t.Fatalf("malformed = %v", err)
	}
	// Tag, untag, GC.
	if err := s.Tag(context.Background(), "mine", "v1", a.Digest); err != nil {
		t.Fatal(err)
	}
	list, _ := s.List(ctx)
	if len(list) != 2 {
		t.Fatalf("list = %+v", list)
	}
	s.Untag(context.Background(), "test:latest")
	if gone, _ := s.GC(ctx, nil); len(gone) != 0 {
		t.Fatalf("GC removed tagged content: %v", gone)
	}
	s.Untag(context.Background(), "mine:v1")
	if gone, _ := s.GC(ctx, func(string) bool { return true }); len(gone) != 0 {
		t.Fatal("GC removed content in use")
	}
	if gone, _ := s.GC(ctx, nil); len(gone) != 1 {
		t.Fatalf("GC = %v", gone)
	}
	if _, err := s.RootfsPath(a.Digest); !errors.Is(err, errdefs.NotFound) {
		t.Fatal("content still there after GC")
	}
}

func TestFailedBuildLeavesNothing(t *testing.T) {
	dir := t.TempDir()
	s, _ := Open(dir)
	Builtin["broken"] = func(ctx context.Context, rootfs string, _ io.Writer) error {
		os.WriteFile(filepath.Join(rootfs, "half"), []byte("x"), 0o644)
		return errors.New("package install failed")
	}
	defer delete(Builtin, "broken")
	if _, err := s.Build(context.Background(), "broken", io.Discard); err == nil {
		t.Fatal("broken build succeeded")
	}
	for _, d := range []string{"tmp", "blobs", "tags"} {
		ents, _ := os.ReadDir(filepath.Join(dir, d))
		if len(ents) != 0 {
			t.Fatalf("%s not empty after a failed build: %v", d, ents)
		}
	}
	// A crash mid-build leaves a tmp dir: the next Open clears it.
	os.MkdirAll(filepath.Join(dir, "tmp", "crashed", "rootfs"), 0o755)
	Open(dir)
	if ents, _ := os.ReadDir(filepath.Join(dir, "tmp")); len(ents) != 0 {
		t.Fatal("interrupted build survived reopen")
	}
}

func TestTreeDigestIgnoresTimesOnly(t *testing.T) {
	mk := func() string {
		d := t.TempDir()
		os.WriteFile(filepath.Join(d, "a"), []byte("hello"), 0o644)
		os.Mkdir(filepath.Join(d, "sub"), 0o755)
		os.Symlink("../a", filepath.Join(d, "sub/link"))
		return d
	}
	a, b := mk(), mk()
	da, _, _ := TreeDigest(context.Background(), a)
	db, _, _ := TreeDigest(context.Background(), b)
	if da != db {
		t.Fatal("same content, different digest")
	}
	os.Chmod(filepath.Join(b, "a"), 0o600)
	if dc, _, _ := TreeDigest(context.Background(), b); dc == da {
		t.Fatal("mode change not in digest")
	}
	os.Chmod(filepath.Join(b, "a"), 0o644)
	os.WriteFile(filepath.Join(b, "a"), []byte("hellO"), 0o644)
	if dc, _, _ := TreeDigest(context.Background(), b); dc == da {
		t.Fatal("content change not in digest")
	}
}
