package templates

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/minio/minio-go/v7"

	"github.com/spacesandbox/space/internal/blobstore"
	"github.com/spacesandbox/space/internal/blobstore/s3test"
	"github.com/spacesandbox/space/internal/errdefs"
)

func TestMain(m *testing.M) {
	code := m.Run()
	s3test.Stop()
	os.Exit(code)
}

// remoteStores gives n template stores, each in its own directory (a node
// each), sharing one bucket (a real S3 server: versitygw).
func remoteStores(t *testing.T, n int) ([]*Store, *s3test.Server, string) {
	t.Helper()
	srv, url := s3test.Bucket(t)
	s3test.SetEnv(t)
	bs, err := blobstore.Open(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	var out []*Store
	for i := 0; i < n; i++ {
		s, err := Open(t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		s.SetRemote(&Remote{Mirror: bs})
		out = append(out, s)
	}
	bucket := strings.TrimPrefix(url, "s3://")
	return out, srv, bucket[:strings.Index(bucket, "/")]
}

// handMade commits a tree with what a template's digest covers — nested
// directories, a symlink, a setuid file, a file owned by another user, an
// empty file — and an environment, so its digest is over both.
func handMade(t *testing.T, s *Store, name, content string) Template {
	t.Helper()
	build, err := s.NewBuild()
	if err != nil {
		t.Fatal(err)
	}
	root := filepath.Join(build, "rootfs")
	os.MkdirAll(filepath.Join(root, "usr/bin"), 0o755)
	os.MkdirAll(filepath.Join(root, "home/user"), 0o700)
	os.WriteFile(filepath.Join(root, "usr/bin/tool"), []byte(content), 0o755)
	os.Chmod(filepath.Join(root, "usr/bin/tool"), 0o4755)
	os.WriteFile(filepath.Join(root, "home/user/notes"), []byte("mine"), 0o600)
	os.Chown(filepath.Join(root, "home/user/notes"), 1000, 1000)
	os.Chown(filepath.Join(root, "home/user"), 1000, 1000)
	os.WriteFile(filepath.Join(root, "empty"), nil, 0o644)
	os.Symlink("usr/bin/tool", filepath.Join(root, "tool"))
	tpl, err := s.commitMeta(context.Background(), build, name, "v1", "test", meta{Env: map[string]string{"A": "b"}, Workdir: "/home/user"})
	if err != nil {
		t.Fatal(err)
	}
	return tpl
}

// A template committed on one node is in the bucket; another node lists
// it, and fetches it on first use — the same tree, the same digest.
func TestRemoteTemplatesReachEveryNode(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: the tree has files of other owners")
	}
	stores, srv, bucket := remoteStores(t, 2)
	a, b := stores[0], stores[1]
	ctx := context.Background()
	tpl := handMade(t, a, "mine", "tool v1")
	// A push a crash cut short left a multipart upload unfinished.
	mc, err := srv.Client()
	if err != nil {
		t.Fatal(err)
	}
	core := minio.Core{Client: mc}
	if _, err := core.NewMultipartUpload(ctx, bucket, "space/templates/blobs/dead.tar", minio.PutObjectOptions{}); err != nil {
		t.Fatal(err)
	}

	list, err := b.List(ctx)
	if err != nil || len(list) != 1 || list[0].Digest != tpl.Digest || list[0].Env["A"] != "b" {
		t.Fatalf("the other node lists %+v %v", list, err)
	}
	if _, err := b.RootfsPath(tpl.Digest); !errors.Is(err, errdefs.NotFound) {
		t.Fatalf("listing fetched the template: %v", err)
	}
	ref, err := b.Resolve(ctx, "mine:v1")
	if err != nil || ref.Digest != tpl.Digest {
		t.Fatalf("resolve on the other node = %+v %v", ref, err)
	}
	root, err := b.RootfsPath(tpl.Digest)
	if err != nil {
		t.Fatal(err)
	}
	tree, _, err := TreeDigest(ctx, root)
	if err != nil {
		t.Fatal(err)
	}
	if got := contentDigest(tree, meta{Env: map[string]string{"A": "b"}, Workdir: "/home/user"}); got != tpl.Digest {
		t.Fatalf("fetched tree digests to %s, want %s", got, tpl.Digest)
	}
	if env, wd := b.Config(tpl.Digest); env["A"] != "b" || wd != "/home/user" {
		t.Fatalf("config = %v %q", env, wd)
	}
	// By digest too.
	c := stores[1]
	if _, err := c.Resolve(ctx, tpl.Digest); err != nil {
		t.Fatal(err)
	}

	// Untag on one node untags everywhere; gc removes it from the bucket.
	if err := a.Untag(ctx, "mine:v1"); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(filepath.Join(b.dir, "tags")); err != nil {
		t.Fatal(err)
	}
	removed, err := a.GC(ctx, nil)
	if err != nil || len(removed) != 1 || removed[0] != tpl.Digest {
		t.Fatalf("gc = %v %v", removed, err)
	}
	if list, _ := b.List(ctx); len(list) != 0 {
		t.Fatalf("after untag and gc the other node lists %+v", list)
	}
	if _, err := b.remote.Mirror.GetSmall(ctx, blobObject(tpl.Digest, ".json")); !errors.Is(err, errdefs.NotFound) {
		t.Fatalf("gc left the template in the bucket: %v", err)
	}
	for u := range mc.ListIncompleteUploads(ctx, bucket, "space/", true) {
		t.Errorf("gc left an unfinished upload: %+v", u)
	}
}

// A damaged archive in the bucket is refused; nothing of it is left on
// the node.
func TestRemoteTemplateDamaged(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: the tree has files of other owners")
	}
	stores, srv, bucket := remoteStores(t, 2)
	ctx := context.Background()
	tpl := handMade(t, stores[0], "mine", "tool v1")
	tarPath := filepath.Join(srv.Dir, bucket, "space", blobObject(tpl.Digest, ".tar"))
	b, err := os.ReadFile(tarPath)
	if err != nil {
		t.Fatal(err)
	}
	i := strings.Index(string(b), "tool v1")
	b[i] = 'X' // same size, other content
	if err := os.WriteFile(tarPath, b, 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = stores[1].Resolve(ctx, "mine:v1")
	if !errors.Is(err, errdefs.FailedPrecondition) || !strings.Contains(err.Error(), "damaged") {
		t.Fatalf("resolve of a damaged template = %v", err)
	}
	if _, err := os.Stat(filepath.Join(stores[1].dir, "blobs", hexOf(tpl.Digest))); !os.IsNotExist(err) {
		t.Fatalf("a damaged fetch left the blob: %v", err)
	}
	if ents, _ := os.ReadDir(stores[1].ScratchDir()); len(ents) != 0 {
		t.Fatalf("a damaged fetch left scratch files: %v", ents)
	}
}

// Past its cap the node drops the least recently used templates the
// bucket holds and nothing uses; one in use stays; a dropped one comes
// back on use.
func TestRemoteTemplateCache(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: the tree has files of other owners")
	}
	stores, _, _ := remoteStores(t, 2)
	ctx := context.Background()
	one := handMade(t, stores[0], "one", "first")
	two := handMade(t, stores[0], "two", "second")
	three := handMade(t, stores[0], "three", "third")
	node := stores[1]
	inUse := map[string]bool{one.Digest: true}
	node.remote.CacheBytes = 1 // any template is past the cap
	node.remote.InUse = func(context.Context) (map[string]bool, error) { return inUse, nil }
	for _, ref := range []string{"one:v1", "two:v1", "three:v1"} {
		if _, err := node.Resolve(ctx, ref); err != nil {
			t.Fatal(err)
		}
	}
	have := func(d string) bool { _, err := node.RootfsPath(d); return err == nil }
	if !have(one.Digest) || have(two.Digest) || !have(three.Digest) {
		t.Fatalf("after three fetches at a tiny cap: one (in use) %v, two %v, three (just fetched) %v", have(one.Digest), have(two.Digest), have(three.Digest))
	}
	if err := node.Fetch(ctx, two.Digest); err != nil || !have(two.Digest) {
		t.Fatalf("an evicted template did not come back: %v", err)
	}
}

// Templates a node made before it had a bucket are pushed.
func TestPushTemplatesMadeBefore(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: the tree has files of other owners")
	}
	stores, _, _ := remoteStores(t, 2)
	ctx := context.Background()
	remote := stores[0].remote
	stores[0].remote = nil
	tpl := handMade(t, stores[0], "old", "made offline")
	stores[0].remote = remote
	if _, err := stores[1].Resolve(ctx, "old:v1"); !errors.Is(err, errdefs.NotFound) {
		t.Fatalf("before the push: %v", err)
	}
	if err := stores[0].Push(ctx); err != nil {
		t.Fatal(err)
	}
	if ref, err := stores[1].Resolve(ctx, "old:v1"); err != nil || ref.Digest != tpl.Digest {
		t.Fatalf("after the push: %+v %v", ref, err)
	}
}

// An archive changed together with its descriptor (a SHA-256 that matches)
// is still refused: the unpacked tree must digest to the template's name.
func TestRemoteTemplateTreeMustMatchItsDigest(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: the tree has files of other owners")
	}
	stores, srv, bucket := remoteStores(t, 2)
	ctx := context.Background()
	tpl := handMade(t, stores[0], "mine", "tool v1")
	tarPath := filepath.Join(srv.Dir, bucket, "space", blobObject(tpl.Digest, ".tar"))
	b, err := os.ReadFile(tarPath)
	if err != nil {
		t.Fatal(err)
	}
	b[strings.Index(string(b), "tool v1")] = 'X'
	if err := os.WriteFile(tarPath, b, 0o644); err != nil {
		t.Fatal(err)
	}
	m := stores[0].remote.Mirror
	raw, err := m.GetSmall(ctx, blobObject(tpl.Digest, ".json"))
	if err != nil {
		t.Fatal(err)
	}
	var d descriptor
	if err := json.Unmarshal(raw, &d); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(b)
	d.TarSHA256 = hex.EncodeToString(sum[:])
	raw, _ = json.Marshal(d)
	if err := m.PutSmall(ctx, blobObject(tpl.Digest, ".json"), raw); err != nil {
		t.Fatal(err)
	}
	_, err = stores[1].Resolve(ctx, "mine:v1")
	if !errors.Is(err, errdefs.FailedPrecondition) || !strings.Contains(err.Error(), "do not match its digest") {
		t.Fatalf("resolve of a template whose files changed = %v", err)
	}
}
