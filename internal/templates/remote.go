package templates

// A template store's copy in a blob store (--blob-store): every committed
// template and tag is stored there too, and a template this node lacks is
// fetched from there, so the templates outlive the node's disk (and, with
// several nodes, are built once). The local store becomes a cache, capped
// in size.
//
// Objects, under the blob store's prefix:
//
//	templates/blobs/<hex>.tar    the blob directory (rootfs/ and meta.json), one tar stream
//	templates/blobs/<hex>.json   its descriptor: meta, and the tar's size and SHA-256; written last
//	templates/tags/<name>/<tag>  "sha256:<hex>"
//
// A fetched template is checked twice: the tar against the descriptor's
// SHA-256 while it streams, then the unpacked tree against the digest it
// is named by (templates are content-addressed).

import (
	"archive/tar"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/spacesandbox/space/internal/durable"
	"github.com/spacesandbox/space/internal/errdefs"
)

// Mirror is the object store a template store keeps its copy in
// (internal/blobstore). Names are slash-separated.
type Mirror interface {
	// PutStream stores what r yields as object name and returns its size
	// and SHA-256.
	PutStream(ctx context.Context, name string, r io.Reader) (int64, string, error)
	// Open reads object name; errdefs.NotFound when there is none.
	Open(ctx context.Context, name string) (io.ReadCloser, error)
	// PutSmall stores a small object in one PUT; GetSmall reads it
	// (errdefs.NotFound when there is none).
	PutSmall(ctx context.Context, name string, b []byte) error
	GetSmall(ctx context.Context, name string) ([]byte, error)
	// List returns the object names under prefix.
	List(ctx context.Context, prefix string) ([]string, error)
	// Remove deletes object name; absent is success.
	Remove(ctx context.Context, name string) error
	// AbortIncomplete drops the multipart uploads under prefix a crash
	// left unfinished.
	AbortIncomplete(ctx context.Context, prefix string) error
}

// Remote configures a store's copy in a blob store.
type Remote struct {
	Mirror Mirror
	// CacheBytes caps the local copies (0: no cap): the least recently
	// used templates that are in the blob store and not InUse are removed
	// from the node past it.
	CacheBytes int64
	// InUse reports the digests sandboxes and snapshots use; they stay on
	// the node.
	InUse func(ctx context.Context) (map[string]bool, error)
	// Log, when set, is told of fetches and evictions.
	Log *slog.Logger
}

// descriptor is a stored template's index object.
type descriptor struct {
	Meta      meta   `json:"meta"`
	TarSize   int64  `json:"tar_size"`
	TarSHA256 string `json:"tar_sha256"`
}

func blobObject(digest, ext string) string { return "templates/blobs/" + hexOf(digest) + ext }
func tagObject(name, tag string) string    { return "templates/tags/" + name + "/" + tag }

// SetRemote makes the store keep its templates in r.Mirror too. Call it
// before the store is used.
func (s *Store) SetRemote(r *Remote) { s.remote = r }

// Push stores every local tag and the template it names in the blob store
// (templates built before the store had a remote, or by the offline CLI).
func (s *Store) Push(ctx context.Context) error {
	if s.remote == nil {
		return nil
	}
	list, err := s.localList()
	if err != nil {
		return err
	}
	var errs []error
	for _, t := range list {
		if err := s.push(ctx, t.Digest); err != nil {
			errs = append(errs, fmt.Errorf("push %s: %w", t.Ref(), err))
			continue
		}
		if err := s.pushTag(ctx, t.Name, t.Tag, t.Digest); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// push uploads a local template unless the blob store has it.
func (s *Store) push(ctx context.Context, digest string) error {
	m := s.remote.Mirror
	if _, err := m.GetSmall(ctx, blobObject(digest, ".json")); err == nil {
		return nil // content-addressed: already there
	} else if !errors.Is(err, errdefs.NotFound) {
		return err
	}
	md, err := s.meta(digest)
	if err != nil {
		return err
	}
	blob := filepath.Join(s.dir, "blobs", hexOf(digest))
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(tarTree(ctx, pw, blob)) }()
	size, sum, err := m.PutStream(ctx, blobObject(digest, ".tar"), pr)
	pr.CloseWithError(err)
	if err != nil {
		return fmt.Errorf("upload template %s: %w", digest, err)
	}
	b, _ := json.Marshal(descriptor{Meta: md, TarSize: size, TarSHA256: sum})
	if err := m.PutSmall(ctx, blobObject(digest, ".json"), b); err != nil {
		return fmt.Errorf("upload template %s: %w", digest, err)
	}
	return nil
}

func (s *Store) pushTag(ctx context.Context, name, tag, digest string) error {
	if err := s.remote.Mirror.PutSmall(ctx, tagObject(name, tag), []byte(digest+"\n")); err != nil {
		return fmt.Errorf("store tag %s:%s: %w", name, tag, err)
	}
	return nil
}

// remoteTag reads a tag from the blob store ("" when there is none).
func (s *Store) remoteTag(ctx context.Context, name, tag string) (string, error) {
	b, err := s.remote.Mirror.GetSmall(ctx, tagObject(name, tag))
	if errors.Is(err, errdefs.NotFound) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	d := strings.TrimSpace(string(b))
	if !digestRE.MatchString(d) {
		return "", errdefs.New(errdefs.FailedPrecondition, "the blob store's tag %s:%s is damaged", name, tag)
	}
	return d, nil
}

// Fetch makes sure the node has template digest, fetching it from the blob
// store when it does not; errdefs.NotFound when neither has it.
func (s *Store) Fetch(ctx context.Context, digest string) error {
	if !digestRE.MatchString(digest) {
		return errdefs.New(errdefs.InvalidArgument, "malformed digest %q", digest)
	}
	if _, err := s.meta(digest); err == nil {
		s.touch(digest)
		return nil
	}
	if s.remote == nil {
		return errdefs.New(errdefs.NotFound, "template %s not found", digest)
	}
	// One fetch of a digest at a time; the others find it done.
	s.fetchMu.Lock()
	defer s.fetchMu.Unlock()
	if _, err := s.meta(digest); err == nil {
		return nil
	}
	start := time.Now()
	if err := s.fetch(ctx, digest); err != nil {
		return err
	}
	s.log("template fetched from the blob store", "digest", digest, "ms", time.Since(start).Milliseconds())
	s.evict(ctx, digest)
	return nil
}

func (s *Store) fetch(ctx context.Context, digest string) error {
	m := s.remote.Mirror
	b, err := m.GetSmall(ctx, blobObject(digest, ".json"))
	if errors.Is(err, errdefs.NotFound) {
		return errdefs.New(errdefs.NotFound, "template %s not found", digest)
	}
	if err != nil {
		return err
	}
	var d descriptor
	if err := json.Unmarshal(b, &d); err != nil || d.Meta.Digest != digest {
		return damaged(digest, "its descriptor cannot be read")
	}
	r, err := m.Open(ctx, blobObject(digest, ".tar"))
	if err != nil {
		if errors.Is(err, errdefs.NotFound) {
			return damaged(digest, "its archive is missing")
		}
		return err
	}
	defer r.Close()
	scratch, err := os.MkdirTemp(s.ScratchDir(), "fetch-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(scratch)
	h := sha256.New()
	cr := &countingReader{r: io.TeeReader(io.LimitReader(r, d.TarSize+1), h)}
	if err := untar(ctx, cr, scratch); err != nil {
		return damaged(digest, "its archive cannot be unpacked: %v", err)
	}
	io.Copy(io.Discard, cr) // the tar's zero padding counts in its hash
	if cr.n != d.TarSize || hex.EncodeToString(h.Sum(nil)) != d.TarSHA256 {
		return damaged(digest, "its archive does not match its SHA-256")
	}
	tree, _, err := TreeDigest(ctx, filepath.Join(scratch, "rootfs"))
	if err != nil {
		return err
	}
	if contentDigest(tree, d.Meta) != digest {
		return damaged(digest, "its files do not match its digest")
	}
	if err := durable.SyncTree(scratch); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	blob := filepath.Join(s.dir, "blobs", hexOf(digest))
	os.RemoveAll(blob)
	return os.Rename(scratch, blob)
}

func damaged(digest, format string, args ...any) error {
	return errdefs.New(errdefs.FailedPrecondition, "the blob store's copy of template %s is damaged: "+format, append([]any{digest}, args...)...).
		WithDetails(map[string]any{"reason": "template_corrupt"})
}

type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

// tarTree writes dir (a blob: rootfs/ and meta.json) as a tar stream:
// directories, regular files, symbolic links, with modes and owners —
// what TreeDigest covers.
func tarTree(ctx context.Context, w io.Writer, dir string) error {
	tw := tar.NewWriter(w)
	err := filepath.WalkDir(dir, func(p string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil || rel == "." {
			return err
		}
		fi, err := e.Info()
		if err != nil {
			return err
		}
		var link string
		if fi.Mode()&fs.ModeSymlink != 0 {
			if link, err = os.Readlink(p); err != nil {
				return err
			}
		}
		h, err := tar.FileInfoHeader(fi, link)
		if err != nil {
			return err
		}
		h.Name = filepath.ToSlash(rel)
		if fi.IsDir() {
			h.Name += "/"
		}
		if st, ok := fi.Sys().(*syscall.Stat_t); ok {
			h.Uid, h.Gid = int(st.Uid), int(st.Gid)
		}
		h.Uname, h.Gname = "", ""
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if !fi.Mode().IsRegular() {
			return nil
		}
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		defer f.Close()
		_, err = io.Copy(tw, f)
		return err
	})
	if err != nil {
		return err
	}
	return tw.Close()
}

// touch records that a template was used now (the cache keeps the most
// recently used).
func (s *Store) touch(digest string) {
	now := time.Now()
	os.Chtimes(filepath.Join(s.dir, "blobs", hexOf(digest), "meta.json"), now, now)
}

// evict removes least recently used templates from the node until the
// cache fits its cap; only templates the blob store holds and no sandbox
// or snapshot uses go, and never keep (the one about to be used).
func (s *Store) evict(ctx context.Context, keep string) {
	r := s.remote
	if r == nil || r.CacheBytes <= 0 {
		return
	}
	inUse := map[string]bool{}
	if r.InUse != nil {
		u, err := r.InUse(ctx)
		if err != nil {
			s.log("template cache: cannot tell what is in use; nothing evicted", "err", err)
			return
		}
		inUse = u
	}
	type entry struct {
		digest string
		size   int64
		used   time.Time
	}
	var all []entry
	var total int64
	blobs, _ := os.ReadDir(filepath.Join(s.dir, "blobs"))
	for _, b := range blobs {
		d := "sha256:" + b.Name()
		m, err := s.meta(d)
		if err != nil {
			continue
		}
		fi, err := os.Stat(filepath.Join(s.dir, "blobs", b.Name(), "meta.json"))
		if err != nil {
			continue
		}
		all = append(all, entry{d, m.SizeBytes, fi.ModTime()})
		total += m.SizeBytes
	}
	sort.Slice(all, func(i, j int) bool { return all[i].used.Before(all[j].used) })
	for _, e := range all {
		if total <= r.CacheBytes {
			return
		}
		if inUse[e.digest] || e.digest == keep {
			continue
		}
		if _, err := r.Mirror.GetSmall(ctx, blobObject(e.digest, ".json")); err != nil {
			continue // the node's copy is the only one
		}
		s.mu.Lock()
		err := os.RemoveAll(filepath.Join(s.dir, "blobs", hexOf(e.digest)))
		s.mu.Unlock()
		if err != nil {
			s.log("template cache: evict", "digest", e.digest, "err", err)
			continue
		}
		total -= e.size
		s.log("template evicted from the node's cache (kept in the blob store)", "digest", e.digest, "bytes", e.size)
	}
}

// remoteTags reads every tag in the blob store: name:tag → digest (tags
// that cannot be read are left out).
func (s *Store) remoteTags(ctx context.Context) (map[string]string, error) {
	objs, err := s.remote.Mirror.List(ctx, "templates/tags/")
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, o := range objs {
		name, tag, ok := strings.Cut(strings.TrimPrefix(o, "templates/tags/"), "/")
		if !ok {
			continue
		}
		if d, err := s.remoteTag(ctx, name, tag); err == nil && d != "" {
			out[name+":"+tag] = d
		}
	}
	return out, nil
}

// remoteGC removes from the blob store the templates no tag there names
// (tagged) and inUse does not claim, and returns them.
func (s *Store) remoteGC(ctx context.Context, tagged map[string]bool, inUse func(string) bool) ([]string, error) {
	m := s.remote.Mirror
	if err := m.AbortIncomplete(ctx, "templates/"); err != nil {
		return nil, err
	}
	objs, err := m.List(ctx, "templates/blobs/")
	if err != nil {
		return nil, err
	}
	var removed []string
	var errs []error
	seen := map[string]bool{}
	for _, o := range objs {
		base := strings.TrimPrefix(o, "templates/blobs/")
		hex := strings.TrimSuffix(strings.TrimSuffix(base, ".json"), ".tar")
		d := "sha256:" + hex
		if seen[d] || tagged[d] || (inUse != nil && inUse(d)) {
			continue
		}
		seen[d] = true
		// The descriptor goes first: without it the archive is no template.
		if err := errors.Join(m.Remove(ctx, blobObject(d, ".json")), m.Remove(ctx, blobObject(d, ".tar"))); err != nil {
			errs = append(errs, err)
			continue
		}
		removed = append(removed, d)
	}
	return removed, errors.Join(errs...)
}

// log reports what the blob store copy did, when the remote has a logger.
func (s *Store) log(msg string, args ...any) {
	if s.remote != nil && s.remote.Log != nil {
		s.remote.Log.Info(msg, args...)
	}
}
