package agent_test

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/spacesandbox/space/internal/agent/proto"
	"github.com/spacesandbox/space/internal/agentclient"
)

// next reads a watch's events after after until want of them arrived (or
// a few seconds passed), as "op name" lines.
func next(t *testing.T, c *agentclient.Client, id string, after *uint64, want int) []string {
	t.Helper()
	var got []string
	deadline := time.Now().Add(5 * time.Second)
	for len(got) < want && time.Now().Before(deadline) {
		r, err := c.WatchRead(context.Background(), proto.WatchRead{ID: id, After: *after, Wait: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range r.Events {
			got = append(got, e.Op+" "+e.Name)
			*after = e.Seq
		}
	}
	return got
}

// A recursive watch reports create, write, chmod, rename and remove by
// inotify, in a directory made after the watch began too; a reader that
// continues after the last number it saw gets each event once.
func TestAgentOnHostWatch(t *testing.T) {
	c, root := startAgentOnHost(t)
	ctx := context.Background()
	os.MkdirAll(filepath.Join(root, "w"), 0o755)
	h, err := c.WatchStart(ctx, proto.WatchRequest{Path: "/w", Recursive: true})
	if err != nil {
		t.Fatal(err)
	}
	var after uint64
	f := filepath.Join(root, "w", "a.txt")
	os.WriteFile(f, []byte("one"), 0o644)
	os.Chmod(f, 0o600)
	os.Rename(f, filepath.Join(root, "w", "b.txt"))
	os.Remove(filepath.Join(root, "w", "b.txt"))
	got := strings.Join(next(t, c, h.ID, &after, 6), ", ")
	want := "create a.txt, write a.txt, chmod a.txt, rename a.txt, create b.txt, remove b.txt"
	if got != want {
		t.Errorf("events:\n got %s\nwant %s", got, want)
	}
	// A new subdirectory is watched from the moment it appears.
	os.MkdirAll(filepath.Join(root, "w", "sub", "deep"), 0o755)
	time.Sleep(100 * time.Millisecond)
	os.WriteFile(filepath.Join(root, "w", "sub", "deep", "x"), nil, 0o644)
	got = strings.Join(next(t, c, h.ID, &after, 3), ", ")
	if got != "create sub, create sub/deep, create sub/deep/x" {
		t.Errorf("nested: %s", got)
	}
	// Nothing more: a read after the last number waits and returns none.
	if r, err := c.WatchRead(ctx, proto.WatchRead{ID: h.ID, After: after, Wait: 200 * time.Millisecond}); err != nil || len(r.Events) != 0 {
		t.Errorf("repeat read: %+v, %v", r, err)
	}
	// Removing the watched directory closes the watch.
	os.RemoveAll(filepath.Join(root, "w"))
	closed := false
	for i := 0; i < 20 && !closed; i++ {
		r, err := c.WatchRead(ctx, proto.WatchRead{ID: h.ID, After: after, Wait: 500 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		if n := len(r.Events); n > 0 {
			after = r.Events[n-1].Seq
		}
		closed = r.Closed
	}
	if !closed {
		t.Error("watch not closed after its directory was removed")
	}
	if err := c.WatchStop(ctx, h.ID); err != nil {
		t.Error(err)
	}
	if _, err := c.WatchRead(ctx, proto.WatchRead{ID: h.ID}); err == nil {
		t.Error("a stopped watch still answers")
	}
	if _, err := c.WatchStart(ctx, proto.WatchRequest{Path: "/nope"}); err == nil {
		t.Error("watching a missing directory")
	}
}

// BenchmarkWatchLatency: from a file's creation to its event in the host's
// hands (the agent in this process, over a socket pair).
func BenchmarkWatchLatency(b *testing.B) {
	c, root := startAgentOnHost(b)
	ctx := context.Background()
	h, err := c.WatchStart(ctx, proto.WatchRequest{Path: "/"})
	if err != nil {
		b.Fatal(err)
	}
	var after uint64
	for i := 0; b.Loop(); i++ {
		if err := os.WriteFile(filepath.Join(root, "f"+strconv.Itoa(i)), nil, 0o644); err != nil {
			b.Fatal(err)
		}
		r, err := c.WatchRead(ctx, proto.WatchRead{ID: h.ID, After: after, Wait: time.Second})
		if err != nil || len(r.Events) == 0 {
			b.Fatalf("%+v %v", r, err)
		}
		after = r.Events[len(r.Events)-1].Seq
	}
}
