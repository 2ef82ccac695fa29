// Package templates stores sandbox templates: immutable, content-addressed
// root file systems. A template's digest is a SHA-256 over its tree (paths,
// types, modes, owners, contents and link targets — not timestamps), so the
// same content always has the same digest. Tags such as seed:latest name a
// digest; sandboxes record the digest they were created from.
//
// Layout under the store's directory:
//
//	blobs/<hex>/rootfs/     the tree, never modified once committed
//	blobs/<hex>/meta.json   when and from what it was built
//	tags/<name>/<tag>       "sha256:<hex>"
//	tmp/                    builds in progress; cleared at open
package templates

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/spacesandbox/space/internal/errdefs"
	"github.com/spacesandbox/space/internal/sandbox"
)

// Template is one tagged template.
type Template struct {
	Name      string            `json:"name"`
	Tag       string            `json:"tag"`
	Digest    string            `json:"digest"`
	CreatedAt time.Time         `json:"created_at"`
	SizeBytes int64             `json:"size_bytes"`
	Source    string            `json:"source"`
	Env       map[string]string `json:"env,omitempty"`
	Workdir   string            `json:"workdir,omitempty"`
}

// Ref is the template's name:tag.
func (t Template) Ref() string { return t.Name + ":" + t.Tag }

type meta struct {
	Digest    string            `json:"digest"`
	CreatedAt time.Time         `json:"created_at"`
	SizeBytes int64             `json:"size_bytes"`
	Source    string            `json:"source"`
	Env       map[string]string `json:"env,omitempty"`
	Workdir   string            `json:"workdir,omitempty"`
	Base      string            `json:"base,omitempty"`
}

// Store is a template store in a directory. Safe for concurrent use within
// one process.
type Store struct {
	dir     string
	mu      sync.Mutex // serialises commits, tags and removal
	remote  *Remote    // the blob store copy (remote.go); nil: none
	fetchMu sync.Mutex // one fetch from the blob store at a time
}

var (
	nameRE   = regexp.MustCompile(`^[a-z0-9][a-z0-9_.\-]{0,62}$`)
	tagRE    = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.\-]{0,127}$`)
	digestRE = regexp.MustCompile(`^sha256:[0-9a-f]{64}$`)
)

// ParseRef splits name[:tag] (tag defaults to latest) and checks both.
func ParseRef(ref string) (name, tag string, err error) {
	name, tag, ok := strings.Cut(ref, ":")
	if !ok {
		tag = "latest"
	}
	if !nameRE.MatchString(name) || !tagRE.MatchString(tag) {
		return "", "", errdefs.New(errdefs.InvalidArgument, "template reference %q: want name[:tag] with lowercase name", ref)
	}
	return name, tag, nil
}

// OpenShared opens a store that another process owns (a running server)
// without disturbing it: an unfinished build there is that process's work in
// progress, not a leftover. Reading and tagging are safe; building is not.
func OpenShared(dir string) (*Store, error) {
	return &Store{dir: dir}, nil // its owner made (or will make) it
}

// Open opens (creating) a store and discards unfinished builds. Only the
// owner of the data directory may: see OpenShared.
func Open(dir string) (*Store, error) {
	for _, d := range []string{"blobs", "tags", "tmp"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			return nil, fmt.Errorf("template store: %w", err)
		}
	}
	// A build interrupted by a crash leaves only files here: nothing
	// visible, and nothing kept.
	ents, _ := os.ReadDir(filepath.Join(dir, "tmp"))
	for _, e := range ents {
		os.RemoveAll(filepath.Join(dir, "tmp", e.Name()))
	}
	return &Store{dir: dir}, nil
}

func hexOf(digest string) string { return strings.TrimPrefix(digest, "sha256:") }

// RootfsPath is the root file system of a template digest.
func (s *Store) RootfsPath(digest string) (string, error) { return RootfsIn(s.dir, digest) }

// RootfsIn is the root file system of a template digest in the store at
// dir, read without opening the store (which tidies it: for a reader
// beside a running server, such as `space bench --baseline`).
func RootfsIn(dir, digest string) (string, error) {
	if !digestRE.MatchString(digest) {
		return "", errdefs.New(errdefs.InvalidArgument, "malformed digest %q", digest)
	}
	p := filepath.Join(dir, "blobs", hexOf(digest), "rootfs")
	if _, err := os.Stat(p); err != nil {
		return "", errdefs.New(errdefs.NotFound, "template %s not found", digest)
	}
	return p, nil
}

// Resolve maps a reference to its digest (lifecycle.Templates).
// With a blob store, a template the node lacks is fetched from there.
func (s *Store) Resolve(ctx context.Context, ref string) (sandbox.TemplateRef, error) {
	if strings.HasPrefix(ref, "sha256:") {
		if err := s.Fetch(ctx, ref); err != nil {
			return sandbox.TemplateRef{}, err
		}
		return sandbox.TemplateRef{Ref: ref, Digest: ref}, nil
	}
	t, err := s.Get(ref)
	if errors.Is(err, errdefs.NotFound) && s.remote != nil {
		t, err = s.getRemote(ctx, ref)
	}
	if err != nil {
		return sandbox.TemplateRef{}, err
	}
	return sandbox.TemplateRef{Ref: t.Ref(), Digest: t.Digest}, nil
}

// getRemote reads a tag the node lacks from the blob store, fetches what
// it names and tags it on the node.
func (s *Store) getRemote(ctx context.Context, ref string) (Template, error) {
	name, tag, err := ParseRef(ref)
	if err != nil {
		return Template{}, err
	}
	digest, err := s.remoteTag(ctx, name, tag)
	if err != nil {
		return Template{}, err
	}
	if digest == "" {
		return Template{}, errdefs.New(errdefs.NotFound, "template %s:%s not found", name, tag)
	}
	if err := s.Fetch(ctx, digest); err != nil {
		return Template{}, err
	}
	s.mu.Lock()
	err = s.tagLocked(name, tag, digest)
	s.mu.Unlock()
	if err != nil {
		return Template{}, err
	}
	return s.Get(ref)
}

// Get returns the template a name:tag names.
func (s *Store) Get(ref string) (Template, error) {
	name, tag, err := ParseRef(ref)
	if err != nil {
		return Template{}, err
	}
	b, err := os.ReadFile(filepath.Join(s.dir, "tags", name, tag))
	if errors.Is(err, fs.ErrNotExist) {
		return Template{}, errdefs.New(errdefs.NotFound, "template %s:%s not found", name, tag)
	}
	if err != nil {
		return Template{}, fmt.Errorf("read tag %s:%s: %w", name, tag, err)
	}
	digest := strings.TrimSpace(string(b))
	m, err := s.meta(digest)
	if err != nil {
		return Template{}, err
	}
	return m.template(name, tag, digest), nil
}

// template is the Template name:tag names, of the content m describes.
func (m meta) template(name, tag, digest string) Template {
	return Template{Name: name, Tag: tag, Digest: digest, CreatedAt: m.CreatedAt, SizeBytes: m.SizeBytes, Source: m.Source, Env: m.Env, Workdir: m.Workdir}
}

func (s *Store) meta(digest string) (meta, error) {
	var m meta
	b, err := os.ReadFile(filepath.Join(s.dir, "blobs", hexOf(digest), "meta.json"))
	if err != nil {
		return m, errdefs.Wrap(errdefs.NotFound, err, "template %s not found", digest)
	}
	if err := json.Unmarshal(b, &m); err != nil {
		return m, fmt.Errorf("decode template meta %s: %w", digest, err)
	}
	return m, nil
}

// List returns every tagged template, sorted by reference: the node's and,
// with a blob store, those only the blob store holds.
func (s *Store) List(ctx context.Context) ([]Template, error) {
	out, err := s.localList()
	if err != nil || s.remote == nil {
		return out, err
	}
	have := map[string]bool{}
	for _, t := range out {
		have[t.Ref()] = true
	}
	tags, err := s.remoteTags(ctx)
	if err != nil {
		return out, nil // the node's own still list
	}
	for ref, digest := range tags {
		name, tag, _ := strings.Cut(ref, ":")
		if have[ref] || !nameRE.MatchString(name) || !tagRE.MatchString(tag) {
			continue
		}
		b, err := s.remote.Mirror.GetSmall(ctx, blobObject(digest, ".json"))
		var d descriptor
		if err != nil || json.Unmarshal(b, &d) != nil {
			continue
		}
		out = append(out, d.Meta.template(name, tag, digest))
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Ref() < out[j].Ref() })
	return out, nil
}

// localList returns the node's tagged templates, sorted by reference.
func (s *Store) localList() ([]Template, error) {
	var out []Template
	names, err := os.ReadDir(filepath.Join(s.dir, "tags"))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil // a shared store its owner has not made
	}
	if err != nil {
		return nil, err
	}
	for _, n := range names {
		tags, _ := os.ReadDir(filepath.Join(s.dir, "tags", n.Name()))
		for _, t := range tags {
			if strings.HasPrefix(t.Name(), ".") {
				continue
			}
			tpl, err := s.Get(n.Name() + ":" + t.Name())
			if err != nil {
				continue
			}
			out = append(out, tpl)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Ref() < out[j].Ref() })
	return out, nil
}

// Ready reports whether at least one template exists to create sandboxes
// from.
func (s *Store) Ready() error {
	list, err := s.localList() // (readiness probes come often: the node's own first)
	if err == nil && len(list) == 0 && s.remote != nil {
		list, err = s.List(context.Background())
	}
	if err != nil {
		return err
	}
	if len(list) == 0 {
		return errors.New("no template exists yet (seed:latest is built on first start, or run `space template build seed`)")
	}
	return nil
}

// ScratchDir is a directory for temporary files (uploads) that is cleared
// when the store is opened.
func (s *Store) ScratchDir() string { return filepath.Join(s.dir, "tmp") }

// NewBuild returns an empty directory for a build; its rootfs goes in
// <dir>/rootfs. Commit or Discard it.
func (s *Store) NewBuild() (string, error) {
	var b [8]byte
	rand.Read(b[:])
	dir := filepath.Join(s.dir, "tmp", hex.EncodeToString(b[:]))
	if err := os.MkdirAll(filepath.Join(dir, "rootfs"), 0o755); err != nil {
		return "", err
	}
	return dir, nil
}

// Discard removes a build that will not be committed.
func (s *Store) Discard(build string) { os.RemoveAll(build) }

// Commit digests a build's rootfs, stores it (unless the same content is
// already stored) and tags it name:tag. The build directory is consumed.
func (s *Store) Commit(ctx context.Context, build, name, tag, source string) (Template, error) {
	return s.commitMeta(ctx, build, name, tag, source, meta{})
}

// Config returns the environment and working directory a template asks for.
func (s *Store) Config(digest string) (env map[string]string, workdir string) {
	m, err := s.meta(digest)
	if err != nil {
		return nil, ""
	}
	return m.Env, m.Workdir
}

// commitMeta is Commit with the template's configuration. The configuration
// is part of the digest, so two templates differing only in env differ.
func (s *Store) commitMeta(ctx context.Context, build, name, tag, source string, m meta) (Template, error) {
	defer os.RemoveAll(build)
	if !nameRE.MatchString(name) || !tagRE.MatchString(tag) {
		return Template{}, errdefs.New(errdefs.InvalidArgument, "template %s:%s: invalid name or tag", name, tag)
	}
	rootfs := filepath.Join(build, "rootfs")
	digest, size, err := TreeDigest(ctx, rootfs)
	if err != nil {
		return Template{}, fmt.Errorf("digest template: %w", err)
	}
	digest = contentDigest(digest, m)
	s.mu.Lock()
	defer s.mu.Unlock()
	blob := filepath.Join(s.dir, "blobs", hexOf(digest))
	if _, err := os.Stat(filepath.Join(blob, "meta.json")); err != nil {
		os.RemoveAll(blob)
		if err := os.MkdirAll(blob, 0o755); err != nil {
			return Template{}, err
		}
		if err := os.Rename(rootfs, filepath.Join(blob, "rootfs")); err != nil {
			return Template{}, fmt.Errorf("store template: %w", err)
		}
		m.Digest, m.CreatedAt, m.SizeBytes, m.Source = digest, time.Now().UTC(), size, source
		b, _ := json.MarshalIndent(m, "", "  ")
		// meta.json is written last: a blob without it is incomplete.
		if err := writeAtomic(filepath.Join(blob, "meta.json"), b); err != nil {
			return Template{}, err
		}
	}
	if err := s.tagLocked(name, tag, digest); err != nil {
		return Template{}, err
	}
	if s.remote != nil {
		// Built once, kept where every node (and a replaced disk) finds it.
		if err := s.push(ctx, digest); err != nil {
			return Template{}, err
		}
		if err := s.pushTag(ctx, name, tag, digest); err != nil {
			return Template{}, err
		}
	}
	return s.Get(name + ":" + tag)
}

// contentDigest is a template's digest: its tree's, or — when it asks for
// an environment or working directory — a digest over both, so templates
// differing only in env differ.
func contentDigest(tree string, m meta) string {
	if len(m.Env) == 0 && m.Workdir == "" {
		return tree
	}
	cfg, _ := json.Marshal(struct {
		Tree    string            `json:"tree"`
		Env     map[string]string `json:"env"`
		Workdir string            `json:"workdir"`
	}{tree, m.Env, m.Workdir})
	sum := sha256.Sum256(cfg)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// Tag points name:tag at an existing digest (in the blob store too).
func (s *Store) Tag(ctx context.Context, name, tag, digest string) error {
	if !nameRE.MatchString(name) || !tagRE.MatchString(tag) {
		return errdefs.New(errdefs.InvalidArgument, "template %s:%s: invalid name or tag", name, tag)
	}
	if _, err := s.meta(digest); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.remote != nil {
		if err := s.push(ctx, digest); err != nil {
			return err
		}
		if err := s.pushTag(ctx, name, tag, digest); err != nil {
			return err
		}
	}
	return s.tagLocked(name, tag, digest)
}

// tagLocked writes a tag. Precondition: s.mu held.
func (s *Store) tagLocked(name, tag, digest string) error {
	if err := os.MkdirAll(filepath.Join(s.dir, "tags", name), 0o755); err != nil {
		return err
	}
	return writeAtomic(filepath.Join(s.dir, "tags", name, tag), []byte(digest+"\n"))
}

// Untag removes name:tag, in the blob store too (the content stays until
// GC).
func (s *Store) Untag(ctx context.Context, ref string) error {
	name, tag, err := ParseRef(ref)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	remoteHad := false
	if s.remote != nil {
		d, err := s.remoteTag(ctx, name, tag)
		if err != nil {
			return err
		}
		if remoteHad = d != ""; remoteHad {
			if err := s.remote.Mirror.Remove(ctx, tagObject(name, tag)); err != nil {
				return err
			}
		}
	}
	if err := os.Remove(filepath.Join(s.dir, "tags", name, tag)); errors.Is(err, fs.ErrNotExist) {
		if remoteHad {
			return nil
		}
		return errdefs.New(errdefs.NotFound, "template %s:%s not found", name, tag)
	} else if err != nil {
		return err
	}
	os.Remove(filepath.Join(s.dir, "tags", name)) // only if now empty
	return nil
}

// GC removes stored content no tag names and inUse does not claim, on the
// node and in the blob store. It returns the digests removed.
func (s *Store) GC(ctx context.Context, inUse func(digest string) bool) ([]string, error) {
	var remoteRemoved []string
	if s.remote != nil {
		tags, err := s.remoteTags(ctx)
		if err != nil {
			return nil, err
		}
		remoteTagged := map[string]bool{}
		for _, d := range tags {
			remoteTagged[d] = true
		}
		if remoteRemoved, err = s.remoteGC(ctx, remoteTagged, inUse); err != nil {
			return remoteRemoved, err
		}
		// A template tagged only in the blob store stays on the node too.
		prev := inUse
		inUse = func(d string) bool { return remoteTagged[d] || (prev != nil && prev(d)) }
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	tagged := map[string]bool{}
	names, _ := os.ReadDir(filepath.Join(s.dir, "tags"))
	for _, n := range names {
		tags, _ := os.ReadDir(filepath.Join(s.dir, "tags", n.Name()))
		for _, t := range tags {
			b, err := os.ReadFile(filepath.Join(s.dir, "tags", n.Name(), t.Name()))
			if err == nil {
				tagged[strings.TrimSpace(string(b))] = true
			}
		}
	}
	var removed []string
	blobs, err := os.ReadDir(filepath.Join(s.dir, "blobs"))
	if err != nil {
		return nil, err
	}
	for _, b := range blobs {
		d := "sha256:" + b.Name()
		if tagged[d] || (inUse != nil && inUse(d)) {
			continue
		}
		if err := os.RemoveAll(filepath.Join(s.dir, "blobs", b.Name())); err != nil {
			return removed, err
		}
		removed = append(removed, d)
	}
	for _, d := range remoteRemoved {
		if !slices.Contains(removed, d) {
			removed = append(removed, d)
		}
	}
	return removed, nil
}

func writeAtomic(path string, b []byte) error {
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
