package server

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spacesandbox/space/internal/procfs"
)

// MakeDataDir makes the data directory private (0700), whoever made it and
// however: it holds the database (sandbox env values in clear), keys and
// tokens.
func MakeDataDir(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("make data directory: %w", err)
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return fmt.Errorf("make data directory private: %w", err)
	}
	return nil
}

// LockFile is the data directory's owner lock.
const LockFile = "space.lock"

// ErrDataDirInUse reports that another process owns the data directory.
var ErrDataDirInUse = errors.New("data directory in use")

// DataDirLock is the ownership of a data directory: one server (or one CLI
// command that changes it) at a time. The kernel releases it when the
// process ends, however it ends.
type DataDirLock struct{ f *os.File }

// orphanWait bounds how long LockDataDir waits for a lock whose owner has
// ended (see LockDataDir).
const orphanWait = 10 * time.Second

// LockDataDir takes the data directory for this process. When another holds
// it, the error wraps ErrDataDirInUse and names that process.
//
// A lock whose recorded owner has ended (or is ending) is waited for, up to
// orphanWait: a server killed while it started a child leaves the lock with
// that child until its exec closes the descriptor (a child between fork and
// exec holds a copy of its parent's), and a killed server's threads may still
// be tearing down. A restart right after a SIGKILL must not be refused for
// that.
func LockDataDir(ctx context.Context, dir string) (*DataDirLock, error) {
	p := filepath.Join(dir, LockFile)
	f, err := os.OpenFile(p, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open data directory lock: %w", err)
	}
	deadline := time.Now().Add(orphanWait)
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			break
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			f.Close()
			return nil, fmt.Errorf("lock data directory: %w", err)
		}
		pid := lockOwner(p)
		if pid > 0 && ownerEnded(pid) && time.Now().Before(deadline) {
			select {
			case <-ctx.Done():
				f.Close()
				return nil, fmt.Errorf("lock data directory: %w", ctx.Err())
			case <-time.After(10 * time.Millisecond):
			}
			continue
		}
		f.Close()
		holder := "another process"
		if pid > 0 {
			holder = fmt.Sprintf("process %d", pid)
		}
		return nil, fmt.Errorf("%w: %s is owned by %s (a running space server, or a template command); one server per data directory", ErrDataDirInUse, dir, holder)
	}
	// Say who holds it, for the error above (advisory: the lock is what counts).
	f.Truncate(0)
	f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	return &DataDirLock{f: f}, nil
}

// lockOwner is the pid the lock's last owner wrote, or 0.
func lockOwner(path string) int {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 {
		return 0
	}
	return pid
}

// ownerEnded reports whether process pid is gone or on its way out.
func ownerEnded(pid int) bool {
	p, err := procfs.Stat(pid)
	return err != nil || p.Ending()
}

// Release gives the data directory up.
func (l *DataDirLock) Release() {
	if l != nil && l.f != nil {
		l.f.Close()
	}
}
