//go:build linux

package vm

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"

	"github.com/spacesandbox/space/internal/errdefs"
	"github.com/spacesandbox/space/internal/runtime"
)

// imageBuilds makes each template image once, however many creates ask.
type imageBuilds struct {
	mu    sync.Mutex
	locks map[string]*sync.Mutex
}

func (b *imageBuilds) lock(key string) *sync.Mutex {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.locks == nil {
		b.locks = map[string]*sync.Mutex{}
	}
	l, ok := b.locks[key]
	if !ok {
		l = &sync.Mutex{}
		b.locks[key] = l
	}
	return l
}

// image returns the read-only ext4 image of a template at a disk size: the
// template's tree copied into a sparse file system of exactly that size (so
// the disk limit is the file system's), made once with mkfs.ext4 -d and
// shared by every sandbox as the backing file of its overlay.
func (r *Runtime) image(ctx context.Context, spec runtime.Spec) (string, error) {
	digest := strings.TrimPrefix(spec.Template.Digest, "sha256:")
	key := fmt.Sprintf("%s-%dM", digest, spec.Resources.DiskMiB)
	path := filepath.Join(r.cfg.Dir, "images", key+".ext4")
	l := r.images.lock(key)
	l.Lock()
	defer l.Unlock()
	if _, err := os.Stat(path); err == nil {
		return path, nil
	}
	rootfs, err := r.cfg.Templates.RootfsPath(spec.Template.Digest)
	if err != nil {
		return "", err
	}
	tmp := path + ".tmp"
	os.Remove(tmp)
	f, err := os.Create(tmp)
	if err != nil {
		return "", err
	}
	err = f.Truncate(int64(spec.Resources.DiskMiB) << 20)
	f.Close()
	if err != nil {
		return "", err
	}
	out, err := exec.CommandContext(ctx, "mkfs.ext4", "-q", "-F", "-L", "space", "-d", rootfs,
		"-E", "lazy_itable_init=1,lazy_journal_init=1", tmp).CombinedOutput()
	if err != nil {
		os.Remove(tmp)
		return "", fmt.Errorf("make the template's ext4 image: %v: %s", err, strings.TrimSpace(string(out)))
	}
	if err := fsync(tmp); err != nil {
		return "", err
	}
	os.Chmod(tmp, 0o400)
	return path, os.Rename(tmp, path)
}

// pruneImages removes the VMs of template-snapshot builds a crash
// interrupted (their QEMU, cgroup and files: no sandbox record names them,
// so Recover never would), then the ext4 images and template snapshots made from
// templates the template store no longer holds (`space template gc` keeps
// every template a sandbox uses, so no overlay loses its backing file).
// Leftovers of an interrupted build (*.tmp) go too: no build runs yet.
func (r *Runtime) pruneImages(ctx context.Context) {
	if vms, err := os.ReadDir(filepath.Join(r.cfg.Dir, "sandboxes")); err == nil {
		for _, e := range vms {
			if id := e.Name(); strings.HasPrefix(id, templateVMPrefix) {
				if err := r.Delete(ctx, runtime.Spec{SandboxID: id}); err != nil {
					r.log.Warn("remove an interrupted template-snapshot VM", "vm", id, "err", err)
				}
			}
		}
	}
	dir := filepath.Join(r.cfg.Dir, "images")
	entries, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	gone := map[string]bool{}
	for _, e := range entries {
		name := e.Name()
		hex, _, ok := strings.Cut(name, "-")
		if !ok || len(hex) != 64 {
			continue
		}
		stale, known := gone[hex]
		if !known {
			_, err := r.cfg.Templates.RootfsPath("sha256:" + hex)
			stale = errdefs.KindOf(err) == errdefs.NotFound
			gone[hex] = stale
		}
		if stale || strings.HasSuffix(name, ".tmp") {
			if err := os.RemoveAll(filepath.Join(dir, name)); err != nil {
				r.log.Warn("remove a derived template image", "path", name, "err", err)
				continue
			}
			r.log.Info("removed a derived image of a removed template", "path", name)
		}
	}
}
