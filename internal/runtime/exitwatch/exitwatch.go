//go:build linux

// Package exitwatch tells a runtime, at once, when a sandbox's host process
// ends without the runtime having ended it: out of memory, killed from
// outside, crashed. It watches processes it is not the parent of (they were
// started detached, or by a server that has since restarted) through a
// pidfd in Go's network poller, so a watch costs no thread.
package exitwatch

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/spacesandbox/space/internal/runtime"
)

// Watcher watches one process per sandbox id.
type Watcher struct {
	log *slog.Logger

	mu      sync.Mutex
	watches map[string]*watch
	report  func(runtime.Exit)
}

type watch struct {
	pid    int
	f      *os.File
	reason func() (string, string)
	// ended is set when the runtime itself ends the process (Stop).
	ended bool
}

// New returns a Watcher that reports nothing until OnExit is called.
func New(log *slog.Logger) *Watcher {
	return &Watcher{log: log, watches: map[string]*watch{}}
}

// OnExit sets the function told of every unexpected end (runtime.ExitReporter).
func (w *Watcher) OnExit(f func(runtime.Exit)) {
	w.mu.Lock()
	w.report = f
	w.mu.Unlock()
}

// Watch starts watching pid as sandbox id's process, replacing an earlier
// watch of id. reason is asked, once the process is gone, why it ended: an
// exit reason (runtime.ExitOutOfMemory, runtime.ExitKilled) and a sentence.
// A process that is already gone is reported at once.
func (w *Watcher) Watch(id string, pid int, reason func() (string, string)) error {
	fd, err := unix.PidfdOpen(pid, unix.PIDFD_NONBLOCK)
	if err != nil {
		if errors.Is(err, unix.ESRCH) {
			w.fire(id, &watch{pid: pid, reason: reason})
			return nil
		}
		return fmt.Errorf("pidfd_open %d: %w", pid, err)
	}
	wt := &watch{pid: pid, f: os.NewFile(uintptr(fd), fmt.Sprintf("pidfd:%d", pid)), reason: reason}
	w.mu.Lock()
	if old := w.watches[id]; old != nil {
		old.ended = true
		old.f.Close()
	}
	w.watches[id] = wt
	w.mu.Unlock()
	go w.wait(id, wt)
	return nil
}

// Stop ends the watch of id: the runtime is about to end the process itself
// (suspend, delete), which is not a death to report.
func (w *Watcher) Stop(id string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if wt := w.watches[id]; wt != nil {
		wt.ended = true
		wt.f.Close()
		delete(w.watches, id)
	}
}

// wait blocks (in the poller) until the pidfd is readable: the process
// has ended. A closed file (Stop, a new Watch) ends the wait silently.
func (w *Watcher) wait(id string, wt *watch) {
	rc, err := wt.f.SyscallConn()
	if err != nil {
		return
	}
	for {
		// The poller reports the end at once; every backstop the pidfd is
		// also asked directly (level-triggered), so an end the poller did
		// not report (seen twice in CI runs under heavy load) is reported
		// within it.
		wt.f.SetReadDeadline(time.Now().Add(backstop))
		first := true
		err = rc.Read(func(uintptr) bool {
			if first {
				first = false
				return false // wait for readiness
			}
			return true
		})
		if errors.Is(err, os.ErrDeadlineExceeded) {
			if exited(rc) {
				err = nil
				break
			}
			continue
		}
		break
	}
	w.mu.Lock()
	if wt.ended || w.watches[id] != wt {
		w.mu.Unlock()
		return
	}
	delete(w.watches, id)
	w.mu.Unlock()
	wt.f.Close()
	if err != nil {
		return
	}
	w.fire(id, wt)
}

// backstop is how often a watched pidfd is polled directly.
const backstop = 2 * time.Second

// exited polls a pidfd without blocking: readable means its process ended.
func exited(rc syscall.RawConn) bool {
	ended := false
	rc.Control(func(fd uintptr) {
		p := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		if n, err := unix.Poll(p, 0); err == nil && n > 0 && p[0].Revents&(unix.POLLIN|unix.POLLHUP) != 0 {
			ended = true
		}
	})
	return ended
}

func (w *Watcher) fire(id string, wt *watch) {
	reason, msg := runtime.ExitKilled, fmt.Sprintf("the sandbox's process (pid %d) ended unexpectedly", wt.pid)
	if wt.reason != nil {
		if r, m := wt.reason(); r != "" {
			reason, msg = r, m
		}
	}
	w.mu.Lock()
	report := w.report
	w.mu.Unlock()
	w.log.Warn("sandbox process ended unexpectedly", "sandbox_id", id, "pid", wt.pid, "reason", reason)
	if report != nil {
		report(runtime.Exit{SandboxID: id, Reason: reason, Message: msg})
	}
}

// OOMKilled reports whether the kernel's OOM killer killed a process of
// the cgroup (its path below the hierarchy root, e.g. "space/sbx_…"): the
// oom_kill count of cgroup v2's memory.events or v1's memory.oom_control.
func OOMKilled(cgroup string) bool {
	for _, f := range []string{"/sys/fs/cgroup/" + cgroup + "/memory.events", "/sys/fs/cgroup/memory/" + cgroup + "/memory.oom_control"} {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		var n int
		for _, line := range strings.Split(string(b), "\n") {
			if _, err := fmt.Sscanf(line, "oom_kill %d", &n); err == nil && n > 0 {
				return true
			}
		}
	}
	return false
}
