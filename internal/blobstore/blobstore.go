// Package blobstore keeps suspended sandboxes' snapshots in S3-compatible
// object storage (--blob-store s3://bucket/prefix?endpoint=…&region=…), so a
// snapshot outlives the node's disk.
//
// A snapshot is a directory of files. Put uploads each file under a new
// upload generation, <prefix>/snapshots/<key>/<upload>/<path>, streamed from
// disk (multipart, bounded memory), with its SHA-256 in the object's
// metadata; it then writes <prefix>/snapshots/<key>/manifest.json — every
// file's path, size and SHA-256 — in one PUT, which is atomic in S3: a
// reader sees the previous snapshot or the new one, never half of one. Only
// then are older generations deleted. Get reads the manifest, streams every
// file into a scratch directory while hashing it, refuses a file whose
// size or hash differs (a corrupted or truncated object), and renames the
// directory into place. Credentials come from the usual places (AWS_ACCESS_KEY_ID
// and AWS_SECRET_ACCESS_KEY, ~/.aws/credentials, MINIO_*), never from the URL,
// and are never logged.
package blobstore

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"

	"github.com/spacesandbox/space/internal/durable"
	"github.com/spacesandbox/space/internal/errdefs"
)

// IsURL says spec names an S3 bucket (s3://).
func IsURL(spec string) bool { return strings.HasPrefix(spec, "s3://") }

// S3 is a blob store in an S3-compatible bucket.
type S3 struct {
	c      *minio.Client
	bucket string
	prefix string // "" or ending in "/"
	where  string // bucket/prefix at endpoint, for errors and logs
}

// Manifest is a snapshot's index: the object that makes it visible.
type Manifest struct {
	Version int       `json:"version"`
	Upload  string    `json:"upload"`
	Created time.Time `json:"created"`
	Files   []File    `json:"files"`
}

// File is one file of a snapshot.
type File struct {
	Path   string      `json:"path"` // slash-separated, relative to the snapshot
	Size   int64       `json:"size"`
	SHA256 string      `json:"sha256"`
	Mode   fs.FileMode `json:"mode"`
}

const (
	manifestName = "manifest.json"
	maxManifest  = 4 << 20
	partSize     = 16 << 20 // multipart part size; memory per upload thread
	threads      = 4
)

// Open opens the bucket an s3:// URL names: s3://bucket/prefix?endpoint=http://host:port&region=r.
// Without endpoint, AWS's regional endpoint is used. It checks the bucket
// exists and can be listed.
func Open(ctx context.Context, spec string) (*S3, error) {
	u, err := url.Parse(spec)
	if err != nil || u.Scheme != "s3" || u.Host == "" {
		return nil, errors.New("--blob-store must be s3://bucket[/prefix][?endpoint=URL&region=REGION]")
	}
	if u.User != nil {
		return nil, errors.New("--blob-store must not carry credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or ~/.aws/credentials)")
	}
	q := u.Query()
	for k := range q {
		if k != "endpoint" && k != "region" {
			return nil, fmt.Errorf("--blob-store: unknown parameter %q (endpoint, region)", k)
		}
	}
	region := q.Get("region")
	endpoint, secure := "", true
	if e := q.Get("endpoint"); e != "" {
		eu, err := url.Parse(e)
		if err != nil || (eu.Scheme != "http" && eu.Scheme != "https") || eu.Host == "" {
			return nil, errors.New("--blob-store: endpoint must be http://host:port or https://host:port")
		}
		endpoint, secure = eu.Host, eu.Scheme == "https"
	} else {
		if region == "" {
			region = "us-east-1"
		}
		endpoint = "s3." + region + ".amazonaws.com"
	}
	creds := credentials.NewChainCredentials([]credentials.Provider{
		&credentials.EnvAWS{}, &credentials.FileAWSCredentials{}, &credentials.EnvMinio{}, &credentials.IAM{},
	})
	c, err := minio.New(endpoint, &minio.Options{Creds: creds, Secure: secure, Region: region})
	if err != nil {
		return nil, fmt.Errorf("blob store client: %w", err)
	}
	prefix := strings.Trim(u.Path, "/")
	if prefix != "" {
		prefix += "/"
	}
	s := &S3{c: c, bucket: u.Host, prefix: prefix, where: u.Host + "/" + prefix + " at " + endpoint}
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	ok, err := c.BucketExists(cctx, s.bucket)
	if err != nil {
		return nil, fmt.Errorf("reach blob store %s: %w", s.where, err)
	}
	if !ok {
		return nil, fmt.Errorf("blob store bucket %s does not exist", s.bucket)
	}
	return s, nil
}

// String names the store for logs (no credentials).
func (s *S3) String() string { return "s3://" + s.where }

func (s *S3) dir(key string) string { return s.prefix + "snapshots/" + key + "/" }

// Put uploads the files under dir as the snapshot key, replacing the one
// before it only once every byte is stored.
func (s *S3) Put(ctx context.Context, key, dir string) (int64, error) {
	var n int64
	upload := newUpload()
	m := Manifest{Version: 1, Upload: upload, Created: time.Now().UTC()}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.Type().IsRegular() {
			return nil
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		f, err := s.putFile(ctx, p, s.dir(key)+upload+"/"+filepath.ToSlash(rel))
		if err != nil {
			return fmt.Errorf("upload %s: %w", rel, err)
		}
		f.Path = filepath.ToSlash(rel)
		m.Files = append(m.Files, f)
		n += f.Size
		return nil
	})
	if err != nil {
		s.removeUpload(context.WithoutCancel(ctx), key, upload)
		return 0, err
	}
	b, _ := json.Marshal(m)
	if err := s.writeSmall(ctx, s.dir(key)+manifestName, b, "application/json"); err != nil {
		s.removeUpload(context.WithoutCancel(ctx), key, upload)
		return 0, fmt.Errorf("write snapshot manifest: %w", err)
	}
	// The new snapshot is the one readers see: older generations go.
	if err := s.Prune(ctx, key); err != nil {
		return n, err
	}
	return n, nil
}

// putFile uploads one file; it hashes the file first (from the page cache)
// so the object carries its SHA-256, then streams it by ranges.
func (s *S3) putFile(ctx context.Context, p, object string) (File, error) {
	f, err := os.Open(p)
	if err != nil {
		return File{}, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return File{}, err
	}
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return File{}, err
	}
	sum := hex.EncodeToString(h.Sum(nil))
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return File{}, err
	}
	_, err = s.c.PutObject(ctx, s.bucket, object, f, fi.Size(), minio.PutObjectOptions{
		ContentType: "application/octet-stream", PartSize: partSize, NumThreads: threads,
		UserMetadata: map[string]string{"sha256": sum},
	})
	if err != nil {
		return File{}, err
	}
	return File{Size: fi.Size(), SHA256: sum, Mode: fi.Mode().Perm()}, nil
}

// Get downloads the snapshot key into dir, which must not exist yet (a
// scratch directory beside it is used and renamed into place). A file
// whose size or SHA-256 is not the manifest's fails the Get with
// errdefs.FailedPrecondition and leaves nothing at dir; NotFound when
// there is no snapshot.
func (s *S3) Get(ctx context.Context, key, dir string) (int64, error) {
	var n int64
	m, err := s.manifest(ctx, key)
	if err != nil {
		return 0, err
	}
	tmp := dir + ".fetch"
	if err := os.RemoveAll(tmp); err != nil {
		return 0, err
	}
	if err := os.MkdirAll(tmp, 0o700); err != nil {
		return 0, err
	}
	defer os.RemoveAll(tmp)
	for _, f := range m.Files {
		if !filepath.IsLocal(filepath.FromSlash(f.Path)) {
			return 0, corrupt(key, "it names a file outside the snapshot: %q", f.Path)
		}
		if err := s.getFile(ctx, key, m.Upload, f, filepath.Join(tmp, filepath.FromSlash(f.Path))); err != nil {
			return 0, err
		}
		n += f.Size
	}
	if err := durable.SyncTree(tmp); err != nil {
		return 0, err
	}
	if err := os.RemoveAll(dir); err != nil {
		return 0, err
	}
	if err := os.Rename(tmp, dir); err != nil {
		return 0, err
	}
	return n, nil
}

// Has says whether key has a complete snapshot stored (its manifest).
func (s *S3) Has(ctx context.Context, key string) (bool, error) {
	_, err := s.manifest(ctx, key)
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, errdefs.NotFound):
		return false, nil
	}
	return false, err
}

func (s *S3) manifest(ctx context.Context, key string) (*Manifest, error) {
	b, err := s.readSmall(ctx, s.dir(key)+manifestName)
	switch {
	case errors.Is(err, errdefs.NotFound):
		return nil, errdefs.New(errdefs.NotFound, "the blob store has no snapshot of %s", key)
	case errors.Is(err, errHash):
		return nil, corrupt(key, "its manifest does not match its SHA-256")
	case errors.Is(err, errTooLarge):
		return nil, corrupt(key, "its manifest cannot be read")
	case err != nil:
		return nil, fmt.Errorf("read snapshot manifest: %w", err)
	}
	var m Manifest
	if json.Unmarshal(b, &m) != nil || m.Version != 1 || m.Upload == "" || strings.ContainsAny(m.Upload, "/.") {
		return nil, corrupt(key, "its manifest cannot be read")
	}
	return &m, nil
}

func (s *S3) getFile(ctx context.Context, key, upload string, f File, dst string) error {
	if err := os.MkdirAll(filepath.Dir(dst), 0o700); err != nil {
		return err
	}
	obj, err := s.c.GetObject(ctx, s.bucket, s.dir(key)+upload+"/"+f.Path, minio.GetObjectOptions{})
	if err != nil {
		return fmt.Errorf("download %s: %w", f.Path, err)
	}
	defer obj.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, f.Mode.Perm()|0o600)
	if err != nil {
		return err
	}
	defer out.Close()
	h := sha256.New()
	// One more byte than expected shows a longer object.
	n, err := io.Copy(io.MultiWriter(out, h), io.LimitReader(obj, f.Size+1))
	if err != nil {
		if minio.ToErrorResponse(err).Code == "NoSuchKey" {
			return corrupt(key, "its file %s is missing", f.Path)
		}
		return fmt.Errorf("download %s: %w", f.Path, err)
	}
	if n != f.Size {
		return corrupt(key, "its file %s is %d bytes, the manifest says %d", f.Path, n, f.Size)
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != f.SHA256 {
		return corrupt(key, "its file %s does not match its SHA-256", f.Path)
	}
	return out.Close()
}

// corrupt is the error of a snapshot that cannot be trusted.
func corrupt(key, format string, args ...any) error {
	return errdefs.New(errdefs.FailedPrecondition, "the stored snapshot of %s is damaged: "+format, append([]any{key}, args...)...).
		WithDetails(map[string]any{"reason": "snapshot_corrupt"})
}

// Delete removes the snapshot key and everything under it.
func (s *S3) Delete(ctx context.Context, key string) error {
	return errors.Join(s.abortIncomplete(ctx, s.dir(key)), s.removeWhere(ctx, s.dir(key), func(string) bool { return true }))
}

// abortIncomplete aborts the multipart uploads under prefix that were never
// completed (their parts take space but are no object).
func (s *S3) abortIncomplete(ctx context.Context, prefix string) error {
	var errs []error
	for u := range s.c.ListIncompleteUploads(ctx, s.bucket, prefix, true) {
		if u.Err != nil {
			return fmt.Errorf("list incomplete uploads: %w", u.Err)
		}
		if err := s.c.RemoveIncompleteUpload(ctx, s.bucket, u.Key); err != nil {
			errs = append(errs, fmt.Errorf("abort incomplete upload of %s: %w", u.Key, err))
		}
	}
	return errors.Join(errs...)
}

// Prune removes what belongs to no snapshot under key: generations the
// manifest does not name (an upload a crash cut short, the snapshot before
// the current one) and multipart uploads never completed. No upload of key
// may be in flight.
func (s *S3) Prune(ctx context.Context, key string) error {
	if err := s.abortIncomplete(ctx, s.dir(key)); err != nil {
		return err
	}
	m, err := s.manifest(ctx, key)
	keep := ""
	switch {
	case err == nil:
		keep = s.dir(key) + m.Upload + "/"
	case errors.Is(err, errdefs.NotFound):
	default:
		return err
	}
	return s.removeWhere(ctx, s.dir(key), func(name string) bool {
		return name != s.dir(key)+manifestName && (keep == "" || !strings.HasPrefix(name, keep))
	})
}

func (s *S3) removeUpload(ctx context.Context, key, upload string) {
	s.removeWhere(ctx, s.dir(key)+upload+"/", func(string) bool { return true })
}

func (s *S3) removeWhere(ctx context.Context, prefix string, remove func(name string) bool) error {
	objs := make(chan minio.ObjectInfo)
	var listErr error
	go func() {
		defer close(objs)
		for o := range s.c.ListObjects(ctx, s.bucket, minio.ListObjectsOptions{Prefix: prefix, Recursive: true}) {
			if o.Err != nil {
				listErr = o.Err
				return
			}
			if remove(o.Key) {
				objs <- o
			}
		}
	}()
	var errs []error
	for r := range s.c.RemoveObjects(ctx, s.bucket, objs, minio.RemoveObjectsOptions{}) {
		errs = append(errs, fmt.Errorf("remove %s: %w", r.ObjectName, r.Err))
	}
	if listErr != nil {
		errs = append(errs, fmt.Errorf("list %s: %w", prefix, listErr))
	}
	return errors.Join(errs...)
}

// Keys lists the snapshots the store holds (anything under snapshots/,
// also what an interrupted upload left).
func (s *S3) Keys(ctx context.Context) ([]string, error) {
	var keys []string
	for o := range s.c.ListObjects(ctx, s.bucket, minio.ListObjectsOptions{Prefix: s.prefix + "snapshots/"}) {
		if o.Err != nil {
			return nil, fmt.Errorf("list snapshots: %w", o.Err)
		}
		if k := strings.TrimSuffix(strings.TrimPrefix(o.Key, s.prefix+"snapshots/"), "/"); k != "" && !strings.Contains(k, "/") {
			keys = append(keys, k)
		}
	}
	return keys, nil
}

func newUpload() string {
	b := make([]byte, 8)
	rand.Read(b)
	return fmt.Sprintf("u%d-%s", time.Now().UnixNano(), hex.EncodeToString(b))
}

// Objects: single objects under the store's prefix, for what is not a
// snapshot (templates). Names are slash-separated and relative to the
// prefix.

// PutStream stores what r yields as object name, streamed in parts of
// bounded size (the length need not be known), and returns its size and
// SHA-256.
func (s *S3) PutStream(ctx context.Context, name string, r io.Reader) (int64, string, error) {
	h := sha256.New()
	info, err := s.c.PutObject(ctx, s.bucket, s.prefix+name, io.TeeReader(r, h), -1,
		minio.PutObjectOptions{ContentType: "application/octet-stream", PartSize: partSize})
	if err != nil {
		return 0, "", fmt.Errorf("upload %s: %w", name, err)
	}
	return info.Size, hex.EncodeToString(h.Sum(nil)), nil
}

// Open reads object name; errdefs.NotFound when there is none.
func (s *S3) Open(ctx context.Context, name string) (io.ReadCloser, error) {
	obj, err := s.open(ctx, s.prefix+name)
	if errors.Is(err, errdefs.NotFound) {
		return nil, errdefs.New(errdefs.NotFound, "the blob store has no %s", name)
	}
	if err != nil {
		return nil, fmt.Errorf("download %s: %w", name, err)
	}
	return obj, nil
}

// open opens an object (its whole key); errdefs.NotFound when absent.
func (s *S3) open(ctx context.Context, object string) (*minio.Object, error) {
	obj, err := s.c.GetObject(ctx, s.bucket, object, minio.GetObjectOptions{})
	if err != nil {
		return nil, err
	}
	if _, err := obj.Stat(); err != nil {
		obj.Close()
		if minio.ToErrorResponse(err).Code == "NoSuchKey" {
			return nil, errdefs.New(errdefs.NotFound, "no object %s", object)
		}
		return nil, err
	}
	return obj, nil
}

// PutSmall stores b as object name in one PUT (atomic).
func (s *S3) PutSmall(ctx context.Context, name string, b []byte) error {
	if err := s.writeSmall(ctx, s.prefix+name, b, ""); err != nil {
		return fmt.Errorf("upload %s: %w", name, err)
	}
	return nil
}

// GetSmall reads a small object PutSmall stored, checking its SHA-256;
// errdefs.NotFound when there is none.
func (s *S3) GetSmall(ctx context.Context, name string) ([]byte, error) {
	b, err := s.readSmall(ctx, s.prefix+name)
	switch {
	case errors.Is(err, errdefs.NotFound):
		return nil, errdefs.New(errdefs.NotFound, "the blob store has no %s", name)
	case errors.Is(err, errHash) || errors.Is(err, errTooLarge):
		return nil, errdefs.New(errdefs.FailedPrecondition, "the blob store's %s is damaged", name).
			WithDetails(map[string]any{"reason": "object_corrupt"})
	case err != nil:
		return nil, fmt.Errorf("download %s: %w", name, err)
	}
	return b, nil
}

// A small object read back is refused when it is larger than any this
// package writes, or its bytes are not those whose SHA-256 it carries.
var (
	errTooLarge = errors.New("object too large")
	errHash     = errors.New("object does not match its SHA-256")
)

// writeSmall stores b as an object (its whole key) in one PUT, with its
// SHA-256 in the object's metadata.
func (s *S3) writeSmall(ctx context.Context, object string, b []byte, contentType string) error {
	sum := sha256.Sum256(b)
	_, err := s.c.PutObject(ctx, s.bucket, object, bytes.NewReader(b), int64(len(b)),
		minio.PutObjectOptions{ContentType: contentType, UserMetadata: map[string]string{"sha256": hex.EncodeToString(sum[:])}})
	return err
}

// readSmall reads an object writeSmall stored and checks it against its
// SHA-256: errdefs.NotFound, errTooLarge or errHash.
func (s *S3) readSmall(ctx context.Context, object string) ([]byte, error) {
	obj, err := s.open(ctx, object)
	if err != nil {
		return nil, err
	}
	defer obj.Close()
	b, err := io.ReadAll(io.LimitReader(obj, maxManifest+1))
	if err != nil {
		return nil, err
	}
	if len(b) > maxManifest {
		return nil, errTooLarge
	}
	info, err := obj.Stat()
	if err != nil {
		return nil, err
	}
	sum := sha256.Sum256(b)
	if want := info.UserMetadata["Sha256"]; want != "" && want != hex.EncodeToString(sum[:]) {
		return nil, errHash
	}
	return b, nil
}

// List returns the names of the objects under prefix.
func (s *S3) List(ctx context.Context, prefix string) ([]string, error) {
	var out []string
	for o := range s.c.ListObjects(ctx, s.bucket, minio.ListObjectsOptions{Prefix: s.prefix + prefix, Recursive: true}) {
		if o.Err != nil {
			return nil, fmt.Errorf("list %s: %w", prefix, o.Err)
		}
		out = append(out, strings.TrimPrefix(o.Key, s.prefix))
	}
	return out, nil
}

// AbortIncomplete drops the multipart uploads under prefix never
// completed (their parts take space but are no object).
func (s *S3) AbortIncomplete(ctx context.Context, prefix string) error {
	return s.abortIncomplete(ctx, s.prefix+prefix)
}

// Remove deletes object name (absent is success) and any multipart
// upload of it left incomplete.
func (s *S3) Remove(ctx context.Context, name string) error {
	if err := s.c.RemoveObject(ctx, s.bucket, s.prefix+name, minio.RemoveObjectOptions{}); err != nil && minio.ToErrorResponse(err).Code != "NoSuchKey" {
		return fmt.Errorf("remove %s: %w", name, err)
	}
	return s.abortIncomplete(ctx, s.prefix+name)
}
