package agent

import (
	"context"
	"encoding/binary"
	"errors"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/spacesandbox/space/internal/agent/proto"
)

// Watching directories with inotify: each watch has its own inotify
// instance read by a goroutine through Go's poller, one kernel watch per
// directory (a recursive watch adds one for each directory as it appears),
// and a bounded buffer of numbered events the host reads with long polls —
// so a reader that reconnects continues after the last event it saw.

const (
	maxWatches      = 64    // per agent
	maxWatchEvents  = 4096  // buffered per watch
	maxWatchDirs    = 16384 // kernel watches per watch
	watchIdle       = 10 * time.Minute
	watchMask       = unix.IN_CREATE | unix.IN_MODIFY | unix.IN_DELETE | unix.IN_MOVED_FROM | unix.IN_MOVED_TO | unix.IN_ATTRIB | unix.IN_DELETE_SELF | unix.IN_MOVE_SELF | unix.IN_ONLYDIR
	inotifyEventLen = unix.SizeofInotifyEvent
)

type watch struct {
	id        string
	root      string // real path of the watched directory
	recursive bool
	f         *os.File // the inotify instance

	mu      sync.Mutex         // guards the fields below
	dirs    map[int32]string   // kernel watch → directory relative to root ("" for root)
	events  []proto.WatchEvent // oldest first, at most maxWatchEvents
	next    uint64             // the next event's sequence number (from 1)
	lostTo  uint64             // events up to this were dropped
	changed chan struct{}      // closed on a new event or close
	closed  bool
	read    time.Time // last read, for expiry
}

type watches struct {
	mu sync.Mutex // guards m
	m  map[string]*watch
}

func (a *Agent) watchStart(p proto.WatchRequest) (proto.WatchHandle, error) {
	name, err := cleanPath(p.Path)
	if err != nil {
		return proto.WatchHandle{}, err
	}
	fi, err := a.fs.Stat(name)
	if err != nil {
		return proto.WatchHandle{}, fileError("watch", name, err)
	}
	if !fi.IsDir() {
		return proto.WatchHandle{}, proto.Errorf(proto.CodeFailedPrecondition, "watch %s: not a directory", name)
	}
	a.expireWatches()
	a.watches.mu.Lock()
	n := len(a.watches.m)
	a.watches.mu.Unlock()
	if n >= maxWatches {
		return proto.WatchHandle{}, proto.Errorf(proto.CodeResourceExhausted, "%d directory watches are open; stop one first", maxWatches)
	}
	fd, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
	if err != nil {
		return proto.WatchHandle{}, fileError("watch", name, err)
	}
	w := &watch{id: randomSuffix(), root: filepath.Join(a.cfg.Root, name), recursive: p.Recursive,
		f: os.NewFile(uintptr(fd), "inotify"), dirs: map[int32]string{}, next: 1, changed: make(chan struct{}), read: time.Now()}
	if err := w.add("", false); err != nil {
		w.f.Close()
		return proto.WatchHandle{}, fileError("watch", name, err)
	}
	a.watches.mu.Lock()
	if a.watches.m == nil {
		a.watches.m = map[string]*watch{}
	}
	a.watches.m[w.id] = w
	a.watches.mu.Unlock()
	go w.run()
	return proto.WatchHandle{ID: w.id}, nil
}

// add watches the directory rel (and, recursively, the directories under
// it). With announce, what is found under it is reported as created: it
// appeared before its kernel watch did.
func (w *watch) add(rel string, announce bool) error {
	wd, err := unix.InotifyAddWatch(int(w.f.Fd()), filepath.Join(w.root, rel), watchMask)
	if err != nil {
		return err
	}
	w.mu.Lock()
	w.dirs[int32(wd)] = rel
	full := len(w.dirs) >= maxWatchDirs
	w.mu.Unlock()
	if !w.recursive || full {
		return nil
	}
	entries, err := os.ReadDir(filepath.Join(w.root, rel))
	if err != nil {
		return nil // gone meanwhile: its removal is reported
	}
	for _, e := range entries {
		child := path.Join(rel, e.Name())
		if announce {
			w.emit(child, proto.WatchCreate, e.IsDir())
		}
		if e.IsDir() && e.Type()&fs.ModeSymlink == 0 {
			w.add(child, announce)
		}
	}
	return nil
}

func (w *watch) emit(name, op string, dir bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return
	}
	// A file written in many pieces is one write until someone reads.
	if n := len(w.events); op == proto.WatchWrite && n > 0 && w.events[n-1].Name == name && w.events[n-1].Op == op {
		return
	}
	// A path made just as its directory's watch was added can be both
	// announced by the walk and reported by the kernel: once is enough.
	if op == proto.WatchCreate {
		for i := len(w.events) - 1; i >= 0 && i >= len(w.events)-64; i-- {
			if e := w.events[i]; e.Name == name {
				if e.Op == proto.WatchCreate {
					return
				}
				break
			}
		}
	}
	if len(w.events) == maxWatchEvents {
		w.lostTo = w.events[0].Seq
		w.events = w.events[1:]
	}
	w.events = append(w.events, proto.WatchEvent{Seq: w.next, Name: name, Op: op, Dir: dir})
	w.next++
	close(w.changed)
	w.changed = make(chan struct{})
}

// run reads the kernel's events until the instance is closed.
func (w *watch) run() {
	buf := make([]byte, 64<<10)
	for {
		n, err := w.f.Read(buf)
		if err != nil {
			w.close()
			return
		}
		for off := 0; off+inotifyEventLen <= n; {
			wd := int32(binary.NativeEndian.Uint32(buf[off:]))
			mask := binary.NativeEndian.Uint32(buf[off+4:])
			nameLen := int(binary.NativeEndian.Uint32(buf[off+12:]))
			end := off + inotifyEventLen + nameLen
			if end > n {
				break
			}
			name := strings.TrimRight(string(buf[off+inotifyEventLen:end]), "\x00")
			off = end
			w.handle(wd, mask, name)
		}
	}
}

func (w *watch) handle(wd int32, mask uint32, name string) {
	if mask&unix.IN_Q_OVERFLOW != 0 {
		w.mu.Lock()
		w.lostTo = w.next - 1
		w.mu.Unlock()
		return
	}
	w.mu.Lock()
	rel, ok := w.dirs[wd]
	if mask&unix.IN_IGNORED != 0 {
		delete(w.dirs, wd)
	}
	w.mu.Unlock()
	if !ok {
		return
	}
	if mask&(unix.IN_DELETE_SELF|unix.IN_MOVE_SELF) != 0 {
		if rel == "" {
			w.close() // the watched directory itself is gone
		}
		return // its parent reports it
	}
	if name == "" {
		return // about a directory itself: its parent reports it
	}
	full, dir := path.Join(rel, name), mask&unix.IN_ISDIR != 0
	switch {
	case mask&(unix.IN_CREATE|unix.IN_MOVED_TO) != 0:
		w.emit(full, proto.WatchCreate, dir)
		if dir && w.recursive {
			w.add(full, true)
		}
	case mask&unix.IN_MODIFY != 0:
		w.emit(full, proto.WatchWrite, dir)
	case mask&unix.IN_DELETE != 0:
		w.emit(full, proto.WatchRemove, dir)
	case mask&unix.IN_MOVED_FROM != 0:
		w.emit(full, proto.WatchRename, dir)
	case mask&unix.IN_ATTRIB != 0:
		w.emit(full, proto.WatchChmod, dir)
	}
}

func (w *watch) close() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.closed {
		w.closed = true
		close(w.changed)
	}
}

func (a *Agent) watchLookup(id string) (*watch, error) {
	a.watches.mu.Lock()
	defer a.watches.mu.Unlock()
	w, ok := a.watches.m[id]
	if !ok {
		return nil, proto.Errorf(proto.CodeNotFound, "no watch %q", id)
	}
	return w, nil
}

func (a *Agent) watchRead(ctx context.Context, p proto.WatchRead) (proto.WatchEvents, error) {
	w, err := a.watchLookup(p.ID)
	if err != nil {
		return proto.WatchEvents{}, err
	}
	deadline := time.NewTimer(min(p.Wait, time.Minute))
	defer deadline.Stop()
	for {
		w.mu.Lock()
		w.read = time.Now()
		out := proto.WatchEvents{Events: []proto.WatchEvent{}, Closed: w.closed, Lost: p.After < w.lostTo}
		for _, e := range w.events {
			if e.Seq > p.After {
				out.Events = append(out.Events, e)
			}
		}
		changed := w.changed
		w.mu.Unlock()
		if len(out.Events) > 0 || out.Closed || out.Lost || p.Wait <= 0 {
			return out, nil
		}
		select {
		case <-changed:
		case <-deadline.C:
			return out, nil
		case <-ctx.Done():
			return out, nil
		}
	}
}

func (a *Agent) watchStop(id string) error {
	a.watches.mu.Lock()
	w, ok := a.watches.m[id]
	delete(a.watches.m, id)
	a.watches.mu.Unlock()
	if !ok {
		return proto.Errorf(proto.CodeNotFound, "no watch %q", id)
	}
	w.close()
	return w.f.Close()
}

// expireWatches stops watches nobody read for watchIdle (their host went
// away without stopping them).
func (a *Agent) expireWatches() {
	a.watches.mu.Lock()
	var stale []string
	for id, w := range a.watches.m {
		w.mu.Lock()
		if time.Since(w.read) > watchIdle {
			stale = append(stale, id)
		}
		w.mu.Unlock()
	}
	a.watches.mu.Unlock()
	for _, id := range stale {
		if err := a.watchStop(id); err != nil && !errors.Is(err, os.ErrClosed) {
			a.log.Debug("stop idle watch", "watch", id, "err", err)
		}
	}
}
