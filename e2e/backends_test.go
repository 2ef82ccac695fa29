package e2e

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"

	"github.com/spacesandbox/space/client"
	"github.com/spacesandbox/space/internal/blobstore/s3test"
	"github.com/spacesandbox/space/internal/store/postgres/pgtest"
)

// TestProductionBackends drives a gvisor server whose state is in
// PostgreSQL and whose suspend snapshots are in an S3 bucket — real servers
// both (a throwaway PostgreSQL cluster, versitygw) — through what only
// those backends can get wrong: a second server on the same database, a
// wake whose local snapshot is gone, a damaged object in the bucket, and
// SIGKILL of the server during an upload and during a download. It logs
// suspend and wake times with 64 MiB dirty, to and from the bucket (space
// bench measures them at 200 MiB).
func TestProductionBackends(t *testing.T) {
	requireGVisor(t)
	srv, bucketURL := s3test.Bucket(t)
	dbURL := pgtest.URL(t)
	env := append(s3test.Env(), "SPACE_STORE="+dbURL, "SPACE_BLOB_STORE="+bucketURL)
	bucket := strings.TrimPrefix(bucketURL, "s3://")
	bucket = bucket[:strings.Index(bucket, "/")]
	s := startRuntimeServerEnv(t, "gvisor", env)
	if log := s.log(); !strings.Contains(log, `"store":"postgres"`) || !strings.Contains(log, "suspend snapshots are kept in the blob store") {
		t.Fatalf("the server does not say it runs on PostgreSQL and S3:\n%s", grepLines(log, "serving"))
	}
	if strings.Contains(s.log(), s3test.SecretKey) {
		t.Fatal("the server logged the S3 secret")
	}

	// One server per database: a second one refuses to start.
	second := exec.Command(spaceBin, "serve", "--data-dir", t.TempDir(), "--api-addr", "127.0.0.1:0", "--data-plane-addr", "127.0.0.1:0", "--ecw-addr", "", "--runtime", "gvisor")
	second.Env = append(os.Environ(), env...)
	out, err := second.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "another SPACE server is using this PostgreSQL database") {
		t.Fatalf("a second server on the same database: %v\n%s", err, out)
	}

	sbx := s.createRunning()
	snapDir := filepath.Join(s.dataDir, "snapshots", sbx)
	s.do("PUT", "/v1/sandboxes/"+sbx+"/files?path=/root/kept.txt", s.token, []byte("kept across nodes"))
	// A process that counts, and 64 MiB of memory it dirtied (big enough to
	// catch an upload and a download in flight).
	sess := s.command(sbx, map[string]any{"command": []string{"sh", "-c", "i=0; while true; do echo $i > /tmp/counter; echo tick-$i; i=$((i+1)); sleep 0.2; done"}})
	st, _ := s.attach(sess.Attach.URL, sess.Attach.Token, "")
	collect(t, st, &transcript{}, func(tr *transcript) bool { return len(tr.ids) >= 3 })
	if tr, _ := s.runCommand(sbx, map[string]any{"command": []string{"sh", "-c", "head -c 67108864 /dev/urandom > /tmp/dirty && echo ok"}}); strings.TrimSpace(string(tr.stdout)) != "ok" {
		t.Fatalf("dirty 64 MiB: %q %v", tr.stdout, tr.events)
	}
	alive := func(when string) {
		t.Helper()
		read := func() int {
			r := s.do("GET", "/v1/sandboxes/"+sbx+"/files?path=/tmp/counter", s.token, nil)
			n, err := strconv.Atoi(strings.TrimSpace(string(r.body)))
			if r.status != 200 || err != nil {
				t.Fatalf("%s: counter = %d %q", when, r.status, r.body)
			}
			return n
		}
		a := read()
		time.Sleep(700 * time.Millisecond)
		if b := read(); b <= a {
			t.Fatalf("%s: the counting process stopped (%d then %d)", when, a, b)
		}
		if r := s.do("GET", "/v1/sandboxes/"+sbx+"/files?path=/root/kept.txt", s.token, nil); string(r.body) != "kept across nodes" {
			t.Fatalf("%s: file = %d %q", when, r.status, r.body)
		}
	}
	timed := func(action, want string) time.Duration {
		t.Helper()
		start := time.Now()
		s.lifecycle(sbx, action, want)
		return time.Since(start)
	}

	// Suspend stores the snapshot in the bucket; a wake with the local
	// copy gone fetches it, and the sandbox carries on.
	suspendS3 := timed("suspend", "suspended")
	manifest := readManifest(t, srv, bucket, sbx)
	wakeLocal := timed("wake", "running")
	alive("after a wake from the local copy")
	timed("suspend", "suspended")
	if err := os.RemoveAll(snapDir); err != nil {
		t.Fatal(err)
	}
	wakeS3 := timed("wake", "running")
	alive("after a wake from the bucket")
	t.Logf("64 MiB dirty, gvisor: suspend to disk + bucket %v (%d files); wake from the local copy %v; wake from the bucket %v",
		suspendS3.Round(time.Millisecond), len(manifest.Files), wakeLocal.Round(time.Millisecond), wakeS3.Round(time.Millisecond))
	t.Logf("server's own timings:\n%s", grepLines(s.log(), "blob store"))
	if m := s.do("GET", "/metrics", "", nil); !strings.Contains(string(m.body), `space_blobstore_transfer_duration_seconds_count{direction="get",outcome="succeeded"} 1`) ||
		!strings.Contains(string(m.body), `space_blobstore_transfer_bytes_total{direction="put"}`) {
		t.Fatalf("the blob store's transfers are not in /metrics:\n%s", grepLines(string(m.body), "blobstore"))
	}

	// SIGKILL during the upload: the suspend resumes at restart and ends
	// stored, with nothing left of the interrupted upload.
	c := s.client()
	op, _, err := c.Lifecycle(context.Background(), "suspend", sbx, "")
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "an upload in flight", func() bool { return len(objectsOf(t, srv, bucket, sbx)) > len(manifest.Files)+1 })
	s.kill()
	s.start()
	if done := s.waitOp(op.ID); done.State != "succeeded" {
		t.Fatalf("suspend interrupted by SIGKILL ended %s: %+v", done.State, done.Error)
	}
	manifest = readManifest(t, srv, bucket, sbx)
	for _, o := range objectsOf(t, srv, bucket, sbx) {
		if !strings.HasSuffix(o, "/manifest.json") && !strings.Contains(o, "/"+manifest.Upload+"/") {
			t.Errorf("orphan object after an interrupted upload: %s", o)
		}
	}
	if n := incompleteUploads(t, srv, bucket); n != 0 {
		t.Errorf("%d incomplete multipart uploads left", n)
	}

	// SIGKILL during the download: the wake resumes at restart and ends
	// running.
	if err := os.RemoveAll(snapDir); err != nil {
		t.Fatal(err)
	}
	op, _, err = c.Lifecycle(context.Background(), "wake", sbx, "")
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "a download in flight", func() bool { _, err := os.Stat(snapDir + ".fetch"); return err == nil })
	s.kill()
	s.start()
	if done := s.waitOp(op.ID); done.State != "succeeded" {
		t.Fatalf("wake interrupted by SIGKILL ended %s: %+v", done.State, done.Error)
	}
	alive("after a download interrupted by SIGKILL")
	if _, err := os.Stat(snapDir + ".fetch"); !os.IsNotExist(err) {
		t.Errorf("the interrupted download's scratch directory is left: %v", err)
	}

	// A damaged object: the wake fails with the reason, the sandbox stays
	// suspended, and a retry says the same.
	s.lifecycle(sbx, "suspend", "suspended")
	manifest = readManifest(t, srv, bucket, sbx)
	var biggest File
	for _, f := range manifest.Files {
		if f.Size > biggest.Size {
			biggest = f
		}
	}
	victim := filepath.Join(srv.Dir, bucket, "space/snapshots", sbx, manifest.Upload, biggest.Path)
	flipByte(t, victim, biggest.Size/2)
	os.RemoveAll(snapDir)
	for try := 0; try < 2; try++ {
		op, _, err := c.Lifecycle(context.Background(), "wake", sbx, "")
		if err != nil {
			t.Fatal(err)
		}
		done := s.waitOp(op.ID)
		if done.State != "failed" || done.Error == nil || !strings.Contains(done.Error.Message, "damaged") {
			t.Fatalf("wake from a damaged snapshot (try %d) = %s %+v", try, done.State, done.Error)
		}
		if sb, err := c.GetSandbox(context.Background(), sbx); err != nil || sb.State != "suspended" {
			t.Fatalf("after a failed wake the sandbox is %+v %v, want suspended", sb, err)
		}
	}
	// Delete takes its snapshot out of the bucket.
	s.lifecycle(sbx, "delete", "deleted")
	waitFor(t, "the bucket emptied of the deleted sandbox", func() bool { return len(objectsOf(t, srv, bucket, sbx)) == 0 })

	// The templates are in the bucket too: a node that lost its template
	// store fetches what a create needs.
	waitFor(t, "the templates pushed", func() bool { return strings.Contains(s.log(), "the node's templates are in the blob store") })
	s.kill()
	if err := os.RemoveAll(filepath.Join(s.dataDir, "templates")); err != nil {
		t.Fatal(err)
	}
	s.start()
	fresh := s.createRunning()
	if tr, _ := s.runCommand(fresh, map[string]any{"command": []string{"echo", "from a fetched template"}}); strings.TrimSpace(string(tr.stdout)) != "from a fetched template" {
		t.Fatalf("a sandbox of a fetched template: %q %v", tr.stdout, tr.events)
	}
	if !strings.Contains(s.log(), "template fetched from the blob store") {
		t.Fatal("the server did not say it fetched the template")
	}

	// A named snapshot is in the bucket once ready: a create from it after
	// the node lost its copy fetches it; deleting it empties its prefix.
	s.do("PUT", "/v1/sandboxes/"+fresh+"/files?path=/root/named.txt", s.token, []byte("in the named snapshot"))
	snap, sop, err := c.CreateSnapshot(context.Background(), fresh, "stored", "")
	if err != nil {
		t.Fatal(err)
	}
	if op := s.waitOp(sop.ID); op.State != "succeeded" {
		t.Fatalf("named snapshot: %+v", op.Error)
	}
	snapID := snap.ID
	if got, err := c.GetSnapshot(context.Background(), snapID); err != nil || got.State != "ready" || got.Name != "stored" || got.SizeBytes <= 0 || got.SandboxID != fresh {
		t.Fatalf("GetSnapshot: %+v %v", got, err)
	}
	readManifest(t, srv, bucket, snapID)
	if err := os.RemoveAll(filepath.Join(s.dataDir, "snapshots", snapID)); err != nil {
		t.Fatal(err)
	}
	from, _, err := c.CreateSandbox(context.Background(), client.CreateSandboxRequest{Snapshot: snapID}, "")
	if err != nil {
		t.Fatal(err)
	}
	if op := s.waitOp(from.Operation.ID); op.State != "succeeded" {
		t.Fatalf("create from a snapshot only the bucket holds: %+v", op.Error)
	}
	if r := s.do("GET", "/v1/sandboxes/"+from.Sandbox.ID+"/files?path=/root/named.txt", s.token, nil); string(r.body) != "in the named snapshot" {
		t.Fatalf("sandbox from the fetched snapshot: file = %d %q", r.status, r.body)
	}
	if !strings.Contains(grepLines(s.log(), "snapshot fetched from the blob store"), snapID) {
		t.Fatal("the server did not say it fetched the named snapshot")
	}
	if err := c.DeleteSnapshot(context.Background(), snapID); err != nil {
		t.Fatalf("delete the snapshot: %v", err)
	}
	if objs := objectsOf(t, srv, bucket, snapID); len(objs) != 0 {
		t.Errorf("after the snapshot's delete the bucket still holds %v", objs)
	}
}

// File is a snapshot manifest's entry (internal/blobstore).
type File struct {
	Path string `json:"path"`
	Size int64  `json:"size"`
}

type manifestDoc struct {
	Upload string `json:"upload"`
	Files  []File `json:"files"`
}

func readManifest(t *testing.T, srv *s3test.Server, bucket, sbx string) manifestDoc {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(srv.Dir, bucket, "space/snapshots", sbx, "manifest.json"))
	if err != nil {
		t.Fatalf("no snapshot of %s in the bucket: %v", sbx, err)
	}
	var m manifestDoc
	if err := json.Unmarshal(b, &m); err != nil || m.Upload == "" || len(m.Files) == 0 {
		t.Fatalf("manifest = %s %v", b, err)
	}
	return m
}

func objectsOf(t *testing.T, srv *s3test.Server, bucket, sbx string) []string {
	t.Helper()
	c, err := srv.Client()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for o := range c.ListObjects(context.Background(), bucket, minio.ListObjectsOptions{Prefix: "space/snapshots/" + sbx + "/", Recursive: true}) {
		if o.Err != nil {
			t.Fatal(o.Err)
		}
		out = append(out, o.Key)
	}
	return out
}

func incompleteUploads(t *testing.T, srv *s3test.Server, bucket string) int {
	t.Helper()
	c, _ := srv.Client()
	n := 0
	for u := range c.ListIncompleteUploads(context.Background(), bucket, "space/", true) {
		if u.Err == nil {
			n++
		}
	}
	return n
}

func flipByte(t *testing.T, path string, at int64) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := make([]byte, 1)
	f.ReadAt(b, at)
	b[0] ^= 0xff
	if _, err := f.WriteAt(b, at); err != nil {
		t.Fatal(err)
	}
}

// waitFor polls cond every few milliseconds for up to a minute.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("never saw %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
