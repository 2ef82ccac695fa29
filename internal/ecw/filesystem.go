package ecw

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"path"
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
		Mode: uint32(perm), Metadata: e.Metadata}
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

// Watching. The agent watches with inotify inside the sandbox and keeps
// numbered events; WatchDir streams them as they come (a long poll each
// round), and the CreateWatcher family keeps the last number read, so no
// event is lost or repeated between two GetWatcherEvents calls.

// watchWait is how long one read of a watch's events waits for one.
const watchWait = 10 * time.Second

// watcherIdle removes a watcher nobody asked for events this long (the
// agent drops its side after the same time).
const watcherIdle = 10 * time.Minute

var watchOps = map[string]pb.EventType{
	"create": pb.EventType_EVENT_TYPE_CREATE,
	"write":  pb.EventType_EVENT_TYPE_WRITE,
	"remove": pb.EventType_EVENT_TYPE_REMOVE,
	"rename": pb.EventType_EVENT_TYPE_RENAME,
	"chmod":  pb.EventType_EVENT_TYPE_CHMOD,
}

// toEvents makes envd's events of a batch, with each entry when asked (a
// removed or renamed path has none; one gone meanwhile neither).
func toEvents(ctx context.Context, ag *sandboxio.Agent, dir string, b sandboxio.WatchBatch, withEntry bool) []*pb.FilesystemEvent {
	out := make([]*pb.FilesystemEvent, 0, len(b.Events))
	for _, e := range b.Events {
		fe := &pb.FilesystemEvent{Name: e.Name, Type: watchOps[e.Op]}
		if withEntry && e.Op != "remove" && e.Op != "rename" {
			if en, err := ag.Stat(ctx, path.Join(dir, e.Name)); err == nil {
				fe.Entry = toEntry(en)
			}
		}
		out = append(out, fe)
	}
	return out
}

// unwatch ends an agent's watch after its request is gone.
func unwatch(ag *sandboxio.Agent, id string) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ag.Unwatch(ctx, id)
}

// WatchDir streams a directory's changes until the client goes away.
func (f *filesystemService) WatchDir(ctx context.Context, req *connect.Request[pb.WatchDirRequest], stream *connect.ServerStream[pb.WatchDirResponse]) error {
	name, sc, err := f.path(ctx, req.Msg.GetPath())
	if err != nil {
		return err
	}
	id, err := sc.agent.Watch(ctx, name, req.Msg.GetRecursive())
	if err != nil {
		return err
	}
	defer unwatch(sc.agent, id)
	if err := stream.Send(&pb.WatchDirResponse{Event: &pb.WatchDirResponse_Start{Start: &pb.WatchDirResponse_StartEvent{}}}); err != nil {
		return err
	}
	var after uint64
	quiet := time.Now()
	for {
		b, err := sc.agent.WatchEvents(ctx, id, after, min(watchWait, f.s.cfg.Keepalive))
		if ctx.Err() != nil {
			return nil
		}
		if err != nil {
			return connect.NewError(connect.CodeUnavailable, errors.New("the sandbox stopped running"))
		}
		for _, e := range toEvents(ctx, sc.agent, name, b, req.Msg.GetIncludeEntry()) {
			if err := stream.Send(&pb.WatchDirResponse{Event: &pb.WatchDirResponse_Filesystem{Filesystem: e}}); err != nil {
				return err
			}
			quiet = time.Now()
		}
		if n := len(b.Events); n > 0 {
			after = b.Events[n-1].Seq
		}
		if b.Closed {
			return connect.NewError(connect.CodeNotFound, fmt.Errorf("the watched directory %s was removed", name))
		}
		if time.Since(quiet) >= f.s.cfg.Keepalive {
			if err := stream.Send(&pb.WatchDirResponse{Event: &pb.WatchDirResponse_Keepalive{Keepalive: &pb.WatchDirResponse_KeepAlive{}}}); err != nil {
				return err
			}
			quiet = time.Now()
		}
	}
}

// watcher is a watch read by GetWatcherEvents.
type watcher struct {
	sandboxID string
	agentID   string // the agent's watch
	dir       string
	withEntry bool

	mu    sync.Mutex // guards after, asked
	after uint64     // the last event read
	asked time.Time
}

func (f *filesystemService) CreateWatcher(ctx context.Context, req *connect.Request[pb.CreateWatcherRequest]) (*connect.Response[pb.CreateWatcherResponse], error) {
	name, sc, err := f.path(ctx, req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	f.expire()
	f.mu.Lock()
	n := len(f.watchers)
	f.mu.Unlock()
	if n >= 1000 {
		return nil, errdefs.New(errdefs.ResourceExhausted, "too many watchers; remove some first")
	}
	aid, err := sc.agent.Watch(ctx, name, req.Msg.GetRecursive())
	if err != nil {
		return nil, err
	}
	var b [12]byte
	rand.Read(b[:])
	id := hex.EncodeToString(b[:])
	f.mu.Lock()
	if f.watchers == nil {
		f.watchers = map[string]*watcher{}
	}
	f.watchers[id] = &watcher{sandboxID: sc.sb.ID, agentID: aid, dir: name, withEntry: req.Msg.GetIncludeEntry(), asked: time.Now()}
	f.mu.Unlock()
	return connect.NewResponse(&pb.CreateWatcherResponse{WatcherId: id}), nil
}

// expire forgets watchers nobody asked for events for watcherIdle.
func (f *filesystemService) expire() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for id, w := range f.watchers {
		w.mu.Lock()
		idle := time.Since(w.asked) > watcherIdle
		w.mu.Unlock()
		if idle {
			delete(f.watchers, id)
		}
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

func (f *filesystemService) drop(id string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.watchers, id)
}

func (f *filesystemService) GetWatcherEvents(ctx context.Context, req *connect.Request[pb.GetWatcherEventsRequest]) (*connect.Response[pb.GetWatcherEventsResponse], error) {
	id := req.Msg.GetWatcherId()
	w, err := f.watcher(ctx, id)
	if err != nil {
		return nil, err
	}
	ag := sandboxFrom(ctx).agent
	w.mu.Lock()
	defer w.mu.Unlock()
	w.asked = time.Now()
	b, err := ag.WatchEvents(ctx, w.agentID, w.after, 0)
	if err != nil {
		if errors.Is(err, errdefs.NotFound) {
			f.drop(id) // the agent forgot it (it restarted, or it expired)
			return nil, errdefs.New(errdefs.NotFound, "watcher %q not found", id)
		}
		return nil, err
	}
	if b.Closed && len(b.Events) == 0 {
		f.drop(id)
		unwatch(ag, w.agentID)
		return nil, errdefs.New(errdefs.NotFound, "the watched directory %s was removed", w.dir)
	}
	if n := len(b.Events); n > 0 {
		w.after = b.Events[n-1].Seq
	}
	return connect.NewResponse(&pb.GetWatcherEventsResponse{Events: toEvents(ctx, ag, w.dir, b, w.withEntry)}), nil
}

func (f *filesystemService) RemoveWatcher(ctx context.Context, req *connect.Request[pb.RemoveWatcherRequest]) (*connect.Response[pb.RemoveWatcherResponse], error) {
	w, err := f.watcher(ctx, req.Msg.GetWatcherId())
	if err != nil {
		return nil, err
	}
	f.drop(req.Msg.GetWatcherId())
	unwatch(sandboxFrom(ctx).agent, w.agentID)
	return connect.NewResponse(&pb.RemoveWatcherResponse{}), nil
}
