package sandboxio

import (
	"context"
	"time"

	"github.com/spacesandbox/space/internal/agent/proto"
)

// Watching a directory in a sandbox: the agent keeps numbered events
// (inotify's, inside the sandbox) until they are read; a reader continues
// after the last sequence number it saw, across reconnects.

// WatchEvent is one change; Name is relative to the watched directory and
// Op one of create, write, remove, rename (moved away) and chmod.
type WatchEvent struct {
	Seq  uint64
	Name string
	Op   string
	Dir  bool
}

// WatchBatch is one read: Lost says events were dropped before these (the
// reader was too slow), Closed that the directory is gone and nothing more
// will come.
type WatchBatch struct {
	Events       []WatchEvent
	Lost, Closed bool
}

// Watch starts watching dir (with recursive, its whole tree) and returns
// the watch's id.
func (a *Agent) Watch(ctx context.Context, dir string, recursive bool) (string, error) {
	h, err := a.c.WatchStart(ctx, proto.WatchRequest{Path: dir, Recursive: recursive})
	return h.ID, a.fail("watch directory", err)
}

// WatchEvents returns the events after sequence number after, waiting up
// to wait for one.
func (a *Agent) WatchEvents(ctx context.Context, id string, after uint64, wait time.Duration) (WatchBatch, error) {
	r, err := a.c.WatchRead(ctx, proto.WatchRead{ID: id, After: after, Wait: wait})
	if err != nil {
		return WatchBatch{}, a.fail("read watch events", err)
	}
	b := WatchBatch{Lost: r.Lost, Closed: r.Closed, Events: make([]WatchEvent, len(r.Events))}
	for i, e := range r.Events {
		b.Events[i] = WatchEvent(e)
	}
	return b, nil
}

// Unwatch ends a watch.
func (a *Agent) Unwatch(ctx context.Context, id string) error {
	return a.fail("stop watching", a.c.WatchStop(ctx, id))
}
