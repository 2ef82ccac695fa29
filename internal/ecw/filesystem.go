package ecw

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"io/fs"
	"strconv"
	"sync"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	pb "github.com/spacesandbox/space/internal/ecw/gen/filesystem"
	"github.com/spacesandbox/space/internal/ecw/gen/filesystem/filesystemconnect"
	"github.com/spacesandbox/space/internal/errdefs"
	"github.com/spacesandbox/space/internal/sandboxio"
)

// filesystemService is envd's filesystem.Filesystem on the sandbox's agent.
type filesystemService struct {
	filesystemconnect.UnimplementedFilesystemHandler
	s *Server

	mu       sync.Mutex // guards watchers
	watchers map[string]*watcher
}

var _ filesystemconnect.FilesystemHandler = (*filesystemService)(nil)

// toEntry is an entry as envd describes it: mode is the POSIX permission
// bits (493 for 0755) and permissions their string with the type letter
// ("drwxr-xr-x"); a directory's size is its own; a symlink is described by
// what it leads to — its type and permission bits, and symlinkTarget the
// path with every link followed (the link's own path when it dangles).
func toEntry(e sandboxio.Entry) *pb.EntryInfo {
	perm, _ := strconv.ParseUint(e.Mode, 8, 32)
	mode := fs.FileMode(perm)
	out := &pb.EntryInfo{Name: e.Name, Path: e.Path, Size: e.Size, Owner: e.Owner, Group: e.Group, ModifiedTime: timestamppb.New(e.ModTime),
		Mode: uint32(perm)}
	switch e.Type {
	case "file":
		out.Type = pb.FileType_FILE_TYPE_FILE
	case "dir":
		out.Type = pb.FileType_FILE_TYPE_DIRECTORY
		mode |= fs.ModeDir
	case "symlink":
		mode |= fs.ModeSymlink
		target := e.Resolved
		if target == "" {
			target = e.Path
		}
		out.SymlinkTarget = &target
		tperm, _ := strconv.ParseUint(e.TargetMode, 8, 32)
		out.Mode = uint32(tperm)
		switch e.TargetType {
		case "file":
			out.Type = pb.FileType_FILE_TYPE_FILE
		case "dir":
			out.Type = pb.FileType_FILE_TYPE_DIRECTORY
		}
	}
	if out.Owner == "" {
		out.Owner = strconv.Itoa(e.UID)
	}
	if out.Group == "" {
		out.Group = strconv.Itoa(e.GID)
	}
	out.Permissions = mode.String()
	return out
}

func (f *filesystemService) path(ctx context.Context, p string) (string, *sandboxCtx, error) {
	sc := sandboxFrom(ctx)
	name, err := resolvePath(ctx, sc, p)
	return name, sc, err
}

func (f *filesystemService) Stat(ctx context.Context, req *connect.Request[pb.StatRequest]) (*connect.Response[pb.StatResponse], error) {
	name, sc, err := f.path(ctx, req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	e, err := sc.agent.Stat(ctx, name)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&pb.StatResponse{Entry: toEntry(e)}), nil
}

// MakeDir makes a directory and its parents; an existing one is AlreadyExists.
func (f *filesystemService) MakeDir(ctx context.Context, req *connect.Request[pb.MakeDirRequest]) (*connect.Response[pb.MakeDirResponse], error) {
	name, sc, err := f.path(ctx, req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	if e, err := sc.agent.Stat(ctx, name); err == nil {
		if e.Type == "dir" {
			return nil, errdefs.New(errdefs.Conflict, "directory %s already exists", name)
		}
		return nil, errdefs.New(errdefs.InvalidArgument, "%s exists and is not a directory", name)
	}
	e, err := sc.agent.MakeDir(ctx, sandboxio.Mkdir{Path: name, User: sc.user})
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&pb.MakeDirResponse{Entry: toEntry(e)}), nil
}

func (f *filesystemService) Move(ctx context.Context, req *connect.Request[pb.MoveRequest]) (*connect.Response[pb.MoveResponse], error) {
	from, sc, err := f.path(ctx, req.Msg.GetSource())
	if err != nil {
		return nil, err
	}
	to, _, err := f.path(ctx, req.Msg.GetDestination())
	if err != nil {
		return nil, err
	}
	e, err := sc.agent.Move(ctx, from, to)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&pb.MoveResponse{Entry: toEntry(e)}), nil
}

func (f *filesystemService) ListDir(ctx context.Context, req *connect.Request[pb.ListDirRequest]) (*connect.Response[pb.ListDirResponse], error) {
	name, sc, err := f.path(ctx, req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	depth := int(req.Msg.GetDepth())
	if depth == 0 {
		depth = 1
	}
	if depth > 16 {
		return nil, errdefs.New(errdefs.InvalidArgument, "depth must be at most 16")
	}
	l, err := sc.agent.List(ctx, name, depth)
	if err != nil {
		return nil, err
	}
	out := &pb.ListDirResponse{Entries: make([]*pb.EntryInfo, 0, len(l.Items))}
	for _, e := range l.Items {
		out.Entries = append(out.Entries, toEntry(e))
	}
	return connect.NewResponse(out), nil
}

// Remove deletes a file or a whole directory tree.
func (f *filesystemService) Remove(ctx context.Context, req *connect.Request[pb.RemoveRequest]) (*connect.Response[pb.RemoveResponse], error) {
	name, sc, err := f.path(ctx, req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	// As envd (os.RemoveAll): a path that is not there is already removed.
	if err := sc.agent.Remove(ctx, name, true); err != nil && !errors.Is(err, errdefs.NotFound) {
		return nil, err
	}
	return connect.NewResponse(&pb.RemoveResponse{}), nil
}

// Watching. SPACE's agent has no inotify channel; a watcher polls the
// directory every pollEvery and reports what changed between two looks:
// created, removed, written (size or time changed) and chmod (mode changed).
// Changes that undo themselves within one interval are not seen.

const pollEvery = 200 * time.Millisecond

// maxWatcherEvents bounds the events a watcher holds for GetWatcherEvents.
const maxWatcherEvents = 10000

// watcherIdle removes a watcher nobody asked for events this long.
const watcherIdle = 10 * time.Minute

type snapshot map[string]sandboxio.Entry

func look(ctx context.Context, ag *sandboxio.Agent, dir string, recursive bool) (snapshot, error) {
	depth := 1
	if recursive {
		depth = 16
	}
	l, err := ag.List(ctx, dir, depth)
	if err != nil {
		return nil, err
	}
	s := make(snapshot, len(l.Items))
	for _, e := range l.Items {
		s[e.Path] = e
	}
	return s, nil
}

// diff lists the events between two looks, names relative to dir.
func diff(dir string, before, after snapshot, withEntry bool) []*pb.FilesystemEvent {
	var out []*pb.FilesystemEvent
	ev := func(e sandboxio.Entry, t pb.EventType) {
		name := e.Path[len(dir):]
		if len(name) > 0 && name[0] == '/' {
			name = name[1:]
		}
		fe := &pb.FilesystemEvent{Name: name, Type: t}
		if withEntry && t != pb.EventType_EVENT_TYPE_REMOVE {
			fe.Entry = toEntry(e)
		}
		out = append(out, fe)
	}
	for p, a := range after {
		b, ok := before[p]
		switch {
		case !ok:
			ev(a, pb.EventType_EVENT_TYPE_CREATE)
		case a.Size != b.Size || !a.ModTime.Equal(b.ModTime):
			ev(a, pb.EventType_EVENT_TYPE_WRITE)
		case a.Mode != b.Mode:
			ev(a, pb.EventType_EVENT_TYPE_CHMOD)
		}
	}
	for p, b := range before {
		if _, ok := after[p]; !ok {
			ev(b, pb.EventType_EVENT_TYPE_REMOVE)
		}
	}
	return out
}

// WatchDir streams a directory's changes until the client goes away.
func (f *filesystemService) WatchDir(ctx context.Context, req *connect.Request[pb.WatchDirRequest], stream *connect.ServerStream[pb.WatchDirResponse]) error {
	name, sc, err := f.path(ctx, req.Msg.GetPath())
	if err != nil {
		return err
	}
	prev, err := look(ctx, sc.agent, name, req.Msg.GetRecursive())
	if err != nil {
		return err
	}
	if err := stream.Send(&pb.WatchDirResponse{Event: &pb.WatchDirResponse_Start{Start: &pb.WatchDirResponse_StartEvent{}}}); err != nil {
		return err
	}
	t := time.NewTicker(pollEvery)
	defer t.Stop()
	quiet := time.Now()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		cur, err := look(ctx, sc.agent, name, req.Msg.GetRecursive())
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return connect.NewError(connect.CodeUnavailable, errors.New("the watched directory is gone or the sandbox stopped running"))
		}
		for _, e := range diff(name, prev, cur, req.Msg.GetIncludeEntry()) {
			if err := stream.Send(&pb.WatchDirResponse{Event: &pb.WatchDirResponse_Filesystem{Filesystem: e}}); err != nil {
				return err
			}
			quiet = time.Now()
		}
		if time.Since(quiet) >= f.s.cfg.Keepalive {
			if err := stream.Send(&pb.WatchDirResponse{Event: &pb.WatchDirResponse_Keepalive{Keepalive: &pb.WatchDirResponse_KeepAlive{}}}); err != nil {
				return err
			}
			quiet = time.Now()
		}
		prev = cur
	}
}

// watcher is a polled watch whose events are collected for GetWatcherEvents.
type watcher struct {
	sandboxID string
	cancel    context.CancelFunc

	mu     sync.Mutex // guards events, err, asked
	events []*pb.FilesystemEvent
	err    error
	asked  time.Time
}

func (f *filesystemService) CreateWatcher(ctx context.Context, req *connect.Request[pb.CreateWatcherRequest]) (*connect.Response[pb.CreateWatcherResponse], error) {
	name, sc, err := f.path(ctx, req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	recursive, withEntry := req.Msg.GetRecursive(), req.Msg.GetIncludeEntry()
	prev, err := look(ctx, sc.agent, name, recursive)
	if err != nil {
		return nil, err
	}
	var b [12]byte
	rand.Read(b[:])
	id := hex.EncodeToString(b[:])
	wctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	w := &watcher{sandboxID: sc.sb.ID, cancel: cancel, asked: time.Now()}
	f.mu.Lock()
	if f.watchers == nil {
		f.watchers = map[string]*watcher{}
	}
	if len(f.watchers) >= 1000 {
		f.mu.Unlock()
		cancel()
		return nil, errdefs.New(errdefs.ResourceExhausted, "too many watchers; remove some first")
	}
	f.watchers[id] = w
	f.mu.Unlock()
	go func() {
		defer f.drop(id)
		t := time.NewTicker(pollEvery)
		defer t.Stop()
		for {
			select {
			case <-wctx.Done():
				return
			case <-t.C:
			}
			w.mu.Lock()
			idle := time.Since(w.asked) > watcherIdle
			w.mu.Unlock()
			if idle {
				return
			}
			cur, err := look(wctx, sc.agent, name, recursive)
			w.mu.Lock()
			if err != nil {
				w.err = err
				w.mu.Unlock()
				// Keep the watcher (and its error) until it is asked for.
				<-wctx.Done()
				return
			}
			w.events = append(w.events, diff(name, prev, cur, withEntry)...)
			if len(w.events) > maxWatcherEvents {
				w.events = w.events[len(w.events)-maxWatcherEvents:]
			}
			w.mu.Unlock()
			prev = cur
		}
	}()
	return connect.NewResponse(&pb.CreateWatcherResponse{WatcherId: id}), nil
}

func (f *filesystemService) drop(id string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if w, ok := f.watchers[id]; ok {
		w.cancel()
		delete(f.watchers, id)
	}
}

func (f *filesystemService) watcher(ctx context.Context, id string) (*watcher, error) {
	f.mu.Lock()
	w, ok := f.watchers[id]
	f.mu.Unlock()
	if !ok || w.sandboxID != sandboxFrom(ctx).sb.ID {
		return nil, errdefs.New(errdefs.NotFound, "watcher %q not found", id)
	}
	return w, nil
}

func (f *filesystemService) GetWatcherEvents(ctx context.Context, req *connect.Request[pb.GetWatcherEventsRequest]) (*connect.Response[pb.GetWatcherEventsResponse], error) {
	w, err := f.watcher(ctx, req.Msg.GetWatcherId())
	if err != nil {
		return nil, err
	}
	w.mu.Lock()
	evs, werr := w.events, w.err
	w.events, w.asked = nil, time.Now()
	w.mu.Unlock()
	if werr != nil {
		f.drop(req.Msg.GetWatcherId())
		return nil, werr
	}
	if evs == nil {
		evs = []*pb.FilesystemEvent{}
	}
	return connect.NewResponse(&pb.GetWatcherEventsResponse{Events: evs}), nil
}

func (f *filesystemService) RemoveWatcher(ctx context.Context, req *connect.Request[pb.RemoveWatcherRequest]) (*connect.Response[pb.RemoveWatcherResponse], error) {
	if _, err := f.watcher(ctx, req.Msg.GetWatcherId()); err != nil {
		return nil, err
	}
	f.drop(req.Msg.GetWatcherId())
	return connect.NewResponse(&pb.RemoveWatcherResponse{}), nil
}
