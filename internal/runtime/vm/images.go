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
