package templates

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"
	"syscall"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/spacesandbox/space/internal/errdefs"
)

// MaxImageBytes bounds the flattened file system of an imported image.
const MaxImageBytes int64 = 32 << 30

// ImportOCI imports a container image archive — `docker save` output or a
// tar of an OCI image layout — as name:tag. Layers are applied in order with
// their whiteouts; the image's Env and WorkingDir become the template's.
// A broken archive is InvalidArgument and leaves nothing behind.
func (s *Store) ImportOCI(ctx context.Context, archive, name, tag string, progress io.Writer) (Template, error) {
	if !nameRE.MatchString(name) || !tagRE.MatchString(tag) {
		return Template{}, errdefs.New(errdefs.InvalidArgument, "template %s:%s: invalid name or tag", name, tag)
	}
	scratch, err := os.MkdirTemp(filepath.Join(s.dir, "tmp"), "oci-")
	if err != nil {
		return Template{}, err
	}
	defer os.RemoveAll(scratch)
	img, err := openImage(archive, scratch)
	if err != nil {
		return Template{}, archiveError(err, "not a docker-save or OCI layout image archive: %v", err)
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		return Template{}, errdefs.Wrap(errdefs.InvalidArgument, err, "image config: %v", err)
	}
	dir, err := s.NewBuild()
	if err != nil {
		return Template{}, err
	}
	fmt.Fprintf(progress, "applying layers of %s\n", archive)
	rc := mutate.Extract(img)
	err = untar(ctx, rc, filepath.Join(dir, "rootfs"))
	rc.Close()
	if err != nil {
		s.Discard(dir)
		return Template{}, archiveError(err, "image layers: %v", err)
	}
	m := meta{Workdir: cfg.Config.WorkingDir}
	for _, kv := range cfg.Config.Env {
		if k, v, ok := strings.Cut(kv, "="); ok && envKeyRE.MatchString(k) {
			if m.Env == nil {
				m.Env = map[string]string{}
			}
			m.Env[k] = v
		}
	}
	return s.commitMeta(ctx, dir, name, tag, "oci", m)
}

// archiveError is a failed import: the archive's fault (InvalidArgument),
// unless the server's disk filled up unpacking it (507 resource_exhausted).
func archiveError(err error, format string, args ...any) error {
	if errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT) {
		return errdefs.Wrap(errdefs.InsufficientStorage, err, "the server's storage is full: the image does not fit; nothing of it was kept")
	}
	return errdefs.Wrap(errdefs.InvalidArgument, err, format, args...)
}

// openImage reads a docker-save tarball, or else a tar of an OCI layout
// (extracted into scratch).
func openImage(archive, scratch string) (v1.Image, error) {
	if img, err := tarball.ImageFromPath(archive, nil); err == nil {
		if _, err := img.Manifest(); err == nil {
			return img, nil
		}
	}
	f, err := os.Open(archive)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	lay := filepath.Join(scratch, "layout")
	if err := untar(context.Background(), f, lay); err != nil {
		return nil, err
	}
	idx, err := layout.ImageIndexFromPath(lay)
	if err != nil {
		return nil, err
	}
	im, err := idx.IndexManifest()
	if err != nil {
		return nil, err
	}
	for _, d := range im.Manifests {
		if d.MediaType.IsImage() {
			return idx.Image(d.Digest)
		}
	}
	return nil, errors.New("the OCI layout holds no image")
}

// untar unpacks a tar stream into dir. Every path resolves inside dir: ".."
// is refused and links are never followed out of it (os.Root).
func untar(ctx context.Context, r io.Reader, dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return err
	}
	defer root.Close()
	tr := tar.NewReader(r)
	var total int64
	for {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		name := path.Clean("/" + h.Name)
		if name == "/" {
			continue
		}
		if strings.Contains(h.Name, "..") && path.Clean(h.Name) != strings.TrimPrefix(name, "/") {
			return fmt.Errorf("entry %q leaves the root", h.Name)
		}
		rel := strings.TrimPrefix(name, "/")
		if parent := path.Dir(rel); parent != "." {
			if err := root.MkdirAll(parent, 0o755); err != nil {
				return fmt.Errorf("%s: %w", h.Name, err)
			}
		}
		mode := os.FileMode(h.Mode) & (os.ModePerm | os.ModeSetuid | os.ModeSetgid | os.ModeSticky)
		switch h.Typeflag {
		case tar.TypeDir:
			if err := root.MkdirAll(rel, 0o755); err != nil {
				return fmt.Errorf("%s: %w", h.Name, err)
			}
		case tar.TypeReg:
			total += h.Size
			if total > MaxImageBytes {
				return fmt.Errorf("the image is larger than %d bytes", MaxImageBytes)
			}
			root.Remove(rel)
			f, err := root.OpenFile(rel, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
			if err != nil {
				return fmt.Errorf("%s: %w", h.Name, err)
			}
			_, err = io.Copy(f, tr)
			f.Close()
			if err != nil {
				return fmt.Errorf("%s: %w", h.Name, err)
			}
		case tar.TypeSymlink:
			root.Remove(rel)
			if err := root.Symlink(h.Linkname, rel); err != nil {
				return fmt.Errorf("%s: %w", h.Name, err)
			}
		case tar.TypeLink:
			target := strings.TrimPrefix(path.Clean("/"+h.Linkname), "/")
			root.Remove(rel)
			if err := root.Link(target, rel); err != nil {
				return fmt.Errorf("%s: %w", h.Name, err)
			}
		default:
			continue // devices and fifos: the runtime provides /dev
		}
		if h.Typeflag != tar.TypeSymlink {
			if err := root.Chmod(rel, mode); err != nil {
				return fmt.Errorf("%s: %w", h.Name, err)
			}
		}
		if err := root.Lchown(rel, h.Uid, h.Gid); err != nil {
			return fmt.Errorf("%s: %w", h.Name, err)
		}
	}
}
