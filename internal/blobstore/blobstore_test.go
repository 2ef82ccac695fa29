package blobstore_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

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

func open(t *testing.T) (*blobstore.S3, *s3test.Server, string) {
	t.Helper()
	srv, url := s3test.Bucket(t)
	s3test.SetEnv(t)
	s, err := blobstore.Open(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	bucket := strings.TrimPrefix(url, "s3://")
	bucket = bucket[:strings.Index(bucket, "/")]
	return s, srv, bucket
}

// snapshotDir writes a snapshot-like tree: nested files, an empty one, and
// one big enough to be sent in several parts.
func snapshotDir(t *testing.T, big int) (string, map[string][]byte) {
	t.Helper()
	dir := t.TempDir()
	files := map[string][]byte{
		"current":          []byte("gen-1"),
		"gen-1/empty":      {},
		"gen-1/pages.img":  random(t, big),
		"gen-1/state.json": []byte(`{"x":1}`),
	}
	for p, b := range files {
		full := filepath.Join(dir, p)
		os.MkdirAll(filepath.Dir(full), 0o700)
		if err := os.WriteFile(full, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return dir, files
}

func random(t *testing.T, n int) []byte {
	b := make([]byte, n)
	rand.Read(b)
	return b
}

func assertTree(t *testing.T, dir string, want map[string][]byte) {
	t.Helper()
	got := 0
	filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		got++
		rel, _ := filepath.Rel(dir, p)
		b, _ := os.ReadFile(p)
		if !bytes.Equal(b, want[rel]) {
			t.Errorf("%s differs after the round trip (%d bytes, want %d)", rel, len(b), len(want[rel]))
		}
		return nil
	})
	if got != len(want) {
		t.Errorf("%d files fetched, want %d", got, len(want))
	}
}

func objects(t *testing.T, srv *s3test.Server, bucket string) []string {
	t.Helper()
	c, err := srv.Client()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for o := range c.ListObjects(context.Background(), bucket, minio.ListObjectsOptions{Recursive: true}) {
		if o.Err != nil {
			t.Fatal(o.Err)
		}
		out = append(out, o.Key)
	}
	return out
}

func TestRoundTripAndReplace(t *testing.T) {
	s, srv, bucket := open(t)
	ctx := context.Background()
	dir, files := snapshotDir(t, 40<<20+123) // three parts
	n, err := s.Put(ctx, "sbx_a", dir)
	if err != nil {
		t.Fatal(err)
	}
	if n != int64(40<<20+123+5+7) {
		t.Errorf("Put stored %d bytes", n)
	}
	out := filepath.Join(t.TempDir(), "got")
	if _, err := s.Get(ctx, "sbx_a", out); err != nil {
		t.Fatal(err)
	}
	assertTree(t, out, files)

	// A new snapshot replaces the old one whole; the old generation goes.
	dir2, files2 := snapshotDir(t, 1<<20)
	if _, err := s.Put(ctx, "sbx_a", dir2); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(ctx, "sbx_a", out); err != nil {
		t.Fatal(err)
	}
	assertTree(t, out, files2)
	if objs := objects(t, srv, bucket); len(objs) != len(files2)+1 {
		t.Errorf("after a replace the bucket holds %d objects, want %d (files + manifest): %v", len(objs), len(files2)+1, objs)
	}
	if keys, err := s.Keys(ctx); err != nil || len(keys) != 1 || keys[0] != "sbx_a" {
		t.Errorf("Keys = %v %v", keys, err)
	}
	if err := s.Delete(ctx, "sbx_a"); err != nil {
		t.Fatal(err)
	}
	if objs := objects(t, srv, bucket); len(objs) != 0 {
		t.Errorf("after Delete the bucket holds %v", objs)
	}
	if _, err := s.Get(ctx, "sbx_a", out); !errors.Is(err, errdefs.NotFound) {
		t.Errorf("Get of a deleted snapshot = %v, want not found", err)
	}
}

// A damaged object — a flipped byte, a truncation, a missing file — fails
// the Get with a reason, and nothing is left where the snapshot would go.
func TestDamagedSnapshotIsRefused(t *testing.T) {
	for _, tc := range []struct {
		name   string
		damage func(path string) error
		want   string
	}{
		{"FlippedByte", func(p string) error {
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			b[len(b)/2] ^= 0xff
			return os.WriteFile(p, b, 0o644)
		}, "does not match its SHA-256"},
		{"Truncated", func(p string) error { return os.Truncate(p, 1000) }, "is 1000 bytes"},
		{"Missing", os.Remove, "damaged"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, srv, bucket := open(t)
			ctx := context.Background()
			dir, _ := snapshotDir(t, 3<<20)
			if _, err := s.Put(ctx, "sbx_b", dir); err != nil {
				t.Fatal(err)
			}
			var victim string
			for _, o := range objects(t, srv, bucket) {
				if strings.HasSuffix(o, "/pages.img") {
					victim = filepath.Join(srv.Dir, bucket, o)
				}
			}
			if err := tc.damage(victim); err != nil {
				t.Fatal(err)
			}
			out := filepath.Join(t.TempDir(), "got")
			_, err := s.Get(ctx, "sbx_b", out)
			if !errors.Is(err, errdefs.FailedPrecondition) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Get of a damaged snapshot = %v, want failed_precondition saying %q", err, tc.want)
			}
			if _, err := os.Stat(out); !os.IsNotExist(err) {
				t.Errorf("a damaged Get left %s: %v", out, err)
			}
			if _, err := os.Stat(out + ".fetch"); !os.IsNotExist(err) {
				t.Errorf("a damaged Get left its scratch directory: %v", err)
			}
		})
	}
}

// A manifest naming a path outside the snapshot is refused before anything
// is written.
func TestHostileManifest(t *testing.T) {
	s, srv, bucket := open(t)
	ctx := context.Background()
	c, _ := srv.Client()
	body := `{"version":1,"upload":"u1","files":[{"path":"../../escaped","size":1,"sha256":"x"}]}`
	if _, err := c.PutObject(ctx, bucket, "space/snapshots/sbx_c/manifest.json", strings.NewReader(body), int64(len(body)), minio.PutObjectOptions{}); err != nil {
		t.Fatal(err)
	}
	base := t.TempDir()
	_, err := s.Get(ctx, "sbx_c", filepath.Join(base, "a", "got"))
	if !errors.Is(err, errdefs.FailedPrecondition) {
		t.Fatalf("Get = %v, want failed_precondition", err)
	}
	if _, err := os.Stat(filepath.Join(base, "escaped")); !os.IsNotExist(err) {
		t.Error("a hostile manifest wrote outside the snapshot")
	}
}

// What an upload cut short left (objects no manifest names) is removed by
// Prune; the snapshot stays whole.
func TestPruneRemovesInterruptedUploads(t *testing.T) {
	s, srv, bucket := open(t)
	ctx := context.Background()
	dir, files := snapshotDir(t, 1<<20)
	if _, err := s.Put(ctx, "sbx_d", dir); err != nil {
		t.Fatal(err)
	}
	c, _ := srv.Client()
	if _, err := c.PutObject(ctx, bucket, "space/snapshots/sbx_d/u999-dead/gen-1/pages.img", strings.NewReader("partial"), 7, minio.PutObjectOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := s.Prune(ctx, "sbx_d"); err != nil {
		t.Fatal(err)
	}
	for _, o := range objects(t, srv, bucket) {
		if strings.Contains(o, "u999-dead") {
			t.Errorf("Prune left %s", o)
		}
	}
	out := filepath.Join(t.TempDir(), "got")
	if _, err := s.Get(ctx, "sbx_d", out); err != nil {
		t.Fatal(err)
	}
	assertTree(t, out, files)
}

// Snapshots stream both ways: memory stays bounded by the part size and
// threads, not the snapshot's size.
func TestMemoryStaysBounded(t *testing.T) {
	s, _, _ := open(t)
	ctx := context.Background()
	dir := t.TempDir()
	const size = 256 << 20
	f, _ := os.Create(filepath.Join(dir, "pages.img"))
	chunk := random(t, 1<<20)
	for i := 0; i < size>>20; i++ {
		f.Write(chunk)
	}
	f.Close()
	runtime.GC()
	var base runtime.MemStats
	runtime.ReadMemStats(&base)
	var peak atomic.Uint64
	stop := make(chan struct{})
	go func() {
		var m runtime.MemStats
		for {
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
			runtime.ReadMemStats(&m)
			if m.HeapInuse > peak.Load() {
				peak.Store(m.HeapInuse)
			}
		}
	}()
	if _, err := s.Put(ctx, "sbx_e", dir); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(ctx, "sbx_e", filepath.Join(t.TempDir(), "got")); err != nil {
		t.Fatal(err)
	}
	close(stop)
	grew := int64(peak.Load()) - int64(base.HeapInuse)
	t.Logf("heap grew by %d MiB moving %d MiB each way", grew>>20, size>>20)
	if grew > 128<<20 {
		t.Errorf("heap grew by %d MiB moving a %d MiB snapshot: not streamed", grew>>20, size>>20)
	}
}

func TestOpenRefusesBadURLs(t *testing.T) {
	for _, u := range []string{
		"http://bucket/x", "s3://", "s3://user:secret@bucket/p", "s3://bucket/p?endpoint=ftp://x",
		"s3://bucket/p?color=blue",
	} {
		_, err := blobstore.Open(context.Background(), u)
		if err == nil {
			t.Errorf("Open(%q) succeeded", u)
		} else if strings.Contains(err.Error(), "secret") {
			t.Errorf("Open(%q) error shows the secret: %v", u, err)
		}
	}
	srv, _ := s3test.Bucket(t)
	s3test.SetEnv(t)
	if _, err := blobstore.Open(context.Background(), "s3://nosuchbucket/p?endpoint="+srv.Endpoint); err == nil || !strings.Contains(err.Error(), "does not exist") {
		t.Errorf("Open of a missing bucket = %v", err)
	}
}
