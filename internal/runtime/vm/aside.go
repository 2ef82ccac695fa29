//go:build linux

package vm

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// A deleted sandbox's files are renamed into the runtime's "ended"
// directory, as <id>.ended-<time>-<n>, and removed from there in the
// background after its cgroup. A server that stops before they are gone
// leaves them, and the cgroup they name, to the next start (sweepEnded).

const endedMark = ".ended-"

func (r *Runtime) endedDir() string { return filepath.Join(r.cfg.Dir, "ended") }

// moveAside renames sandbox id's path into the ended directory and returns
// its new path; absent is success (""). Where it cannot be renamed
// (another file system), it is removed before moveAside returns.
func (r *Runtime) moveAside(id, path string) (string, error) {
	to := filepath.Join(r.endedDir(), fmt.Sprintf("%s%s%d-%d", id, endedMark, time.Now().UnixNano(), r.asideSeq.Add(1)))
	err := os.Rename(path, to)
	if err == nil {
		return to, nil
	}
	if _, serr := os.Lstat(path); errors.Is(serr, os.ErrNotExist) {
		return "", nil
	}
	return "", os.RemoveAll(path)
}

// removeLater removes sandbox id's cgroup, then paths, in the background;
// Close waits for it.
func (r *Runtime) removeLater(id string, paths []string) {
	r.removing.Add(1)
	go func() {
		defer r.removing.Done()
		if err := removeCgroup(id); err != nil {
			r.log.Warn("vm: remove a deleted sandbox's cgroup", "sandbox_id", id, "err", err)
		}
		for _, p := range paths {
			if err := os.RemoveAll(p); err != nil {
				r.log.Warn("vm: remove a deleted sandbox's files", "path", p, "err", err)
			}
		}
	}()
}

// sweepEnded removes, in the background, what deletes moved aside before
// the last server stopped, and the cgroups of their sandboxes.
func (r *Runtime) sweepEnded() error {
	if err := os.MkdirAll(r.endedDir(), 0o700); err != nil {
		return err
	}
	ents, err := os.ReadDir(r.endedDir())
	if err != nil {
		return err
	}
	for _, e := range ents {
		id, _, _ := strings.Cut(e.Name(), endedMark)
		r.removeLater(id, []string{filepath.Join(r.endedDir(), e.Name())})
	}
	return nil
}
