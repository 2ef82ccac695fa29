package server

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
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

// LockDataDir takes the data directory for this process. When another holds
// it, the error wraps ErrDataDirInUse and names that process.
func LockDataDir(dir string) (*DataDirLock, error) {
	p := filepath.Join(dir, LockFile)
	f, err := os.OpenFile(p, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open data directory lock: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			holder := "another process"
			if b, rerr := os.ReadFile(p); rerr == nil {
				if pid, perr := strconv.Atoi(strings.TrimSpace(string(b))); perr == nil {
					holder = fmt.Sprintf("process %d", pid)
				}
			}
			return nil, fmt.Errorf("%w: %s is owned by %s (a running space server, or a template command); one server per data directory", ErrDataDirInUse, dir, holder)
		}
		return nil, fmt.Errorf("lock data directory: %w", err)
	}
	// Say who holds it, for the error above (advisory: the lock is what counts).
	f.Truncate(0)
	f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	return &DataDirLock{f: f}, nil
}

// Release gives the data directory up.
func (l *DataDirLock) Release() {
	if l != nil && l.f != nil {
		l.f.Close()
	}
}
