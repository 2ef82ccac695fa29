package sandboxio

import (
	"context"
	"errors"
	"io"
	"time"

	"github.com/spacesandbox/space/internal/agent/proto"
	"github.com/spacesandbox/space/internal/agentclient"
	"github.com/spacesandbox/space/internal/errdefs"
)

// chunk is how much of a file travels per agent call.
const chunk = 1 << 20

// Entry is a file, directory or link in a sandbox, as the native API shows it.
type Entry struct {
	Path    string    `json:"path"`
	Name    string    `json:"name"`
	Type    string    `json:"type"` // file, dir, symlink, other
	Size    int64     `json:"size"`
	Mode    string    `json:"mode"` // octal permission bits, e.g. "0644"
	ModTime time.Time `json:"mtime"`
	Target  string    `json:"symlink_target,omitempty"`
	// Resolved is a symlink's target with every link followed, absolute
	// in the sandbox; TargetType and TargetMode describe what is there
	// (empty when the link dangles or loops). The E2B layer shows them;
	// the native API's entry does not.
	Resolved   string `json:"-"`
	TargetType string `json:"-"`
	TargetMode string `json:"-"`
	UID        int    `json:"uid"`
	GID        int    `json:"gid"`
	Owner      string `json:"owner,omitempty"` // user name of UID in the sandbox
	Group      string `json:"group,omitempty"` // group name of GID in the sandbox
	// Metadata is the user-defined metadata of a file or directory: its
	// extended attributes user.e2b.<key>, as E2B's envd keeps them.
	Metadata map[string]string `json:"metadata,omitempty"`
}

// Listing is a directory's entries to some depth.
type Listing struct {
	Items []Entry `json:"items"`
	// Truncated is true when the listing hit the agent's entry limit.
	Truncated bool `json:"truncated,omitempty"`
}

func entry(e proto.Entry) Entry { return Entry(e) }

// Stat describes one path.
func (a *Agent) Stat(ctx context.Context, path string) (Entry, error) {
	e, err := a.c.Stat(ctx, path)
	return entry(e), a.fail("stat", err)
}

// List lists a directory to depth levels (1: its children).
func (a *Agent) List(ctx context.Context, path string, depth int) (Listing, error) {
	l, err := a.c.List(ctx, path, depth)
	if err != nil {
		return Listing{}, a.fail("list files", err)
	}
	out := Listing{Items: make([]Entry, 0, len(l.Items)), Truncated: l.Truncated}
	for _, e := range l.Items {
		out.Items = append(out.Items, entry(e))
	}
	return out, nil
}

// File streams a sandbox file: Size bytes exactly (its size when opened), or,
// with Size -1 (a /proc file whose size is known only at its end), until its
// end. A read that cannot deliver all of it fails rather than end short.
type File struct {
	Size int64
	r    *agentclient.FileReader
}

func (f *File) Read(p []byte) (int, error) {
	n, err := f.r.Read(p)
	if err != nil && !errors.Is(err, io.EOF) {
		err = fail("read file", err)
	}
	return n, err
}

// Open opens a file for reading; its first chunk is already read, so a
// missing or unreadable file fails here.
func (a *Agent) Open(ctx context.Context, path string) (*File, error) {
	r, err := a.c.OpenFile(ctx, path, chunk)
	if err != nil {
		return nil, a.fail("read file", err)
	}
	return &File{Size: r.Size, r: r}, nil
}

// ReadSmall reads a whole file of at most max bytes; a larger one is
// ResourceExhausted.
func (a *Agent) ReadSmall(ctx context.Context, path string, max int) ([]byte, error) {
	res, data, err := a.c.ReadFile(ctx, path, 0, max)
	if err != nil {
		return nil, a.fail("read file", err)
	}
	if res.Size > int64(max) {
		return nil, errdefs.New(errdefs.ResourceExhausted, "%s is larger than %d bytes", path, max)
	}
	return data, nil
}

// Write is a file to write: the agent writes it to a temporary file and
// renames it over Path once all of it arrived.
type Write struct {
	Path string
	Mode uint32 // permission bits; 0 means 0644
	// User owns the file and the directories the write makes (name or
	// uid; "" is the agent's user, root).
	User string
	// Metadata replaces the file's user-defined metadata (printable ASCII
	// keys and values; a bad one is InvalidArgument).
	Metadata map[string]string
}

// source remembers why reading the data failed.
type source struct {
	r   io.Reader
	err error
}

func (s *source) Read(p []byte) (int, error) {
	n, err := s.r.Read(p)
	if err != nil && !errors.Is(err, io.EOF) {
		s.err = err
	}
	return n, err
}

// WriteFile writes all of data to w.Path; nothing is replaced unless all of
// it arrived. When reading data fails (the client's upload broke) the error
// is InvalidArgument with data's error in its chain.
func (a *Agent) WriteFile(ctx context.Context, w Write, data io.Reader) (Entry, error) {
	src := &source{r: data}
	e, err := a.c.WriteFileAs(ctx, proto.WriteBegin{Path: w.Path, Mode: w.Mode, User: w.User, Metadata: w.Metadata}, src, chunk)
	if err != nil {
		var pe *proto.Error
		if src.err != nil && !errors.As(err, &pe) && !errors.Is(err, agentclient.ErrClosed) {
			return Entry{}, errdefs.Wrap(errdefs.InvalidArgument, src.err, "reading the request body failed")
		}
		return Entry{}, a.fail("write file", err)
	}
	return entry(e), nil
}

// Remove removes a path (a directory only with recursive).
func (a *Agent) Remove(ctx context.Context, path string, recursive bool) error {
	return a.fail("delete file", a.c.Remove(ctx, path, recursive))
}

// Mkdir is a directory to make, with its parents.
type Mkdir struct {
	Path string
	Mode uint32 // 0 means 0755
	User string // owns the directories made (see Write)
}

// MakeDir makes a directory and its missing parents.
func (a *Agent) MakeDir(ctx context.Context, m Mkdir) (Entry, error) {
	e, err := a.c.MkdirAs(ctx, proto.MkdirRequest{Path: m.Path, Mode: m.Mode, User: m.User})
	return entry(e), a.fail("mkdir", err)
}

// Move renames a path.
func (a *Agent) Move(ctx context.Context, from, to string) (Entry, error) {
	e, err := a.c.Move(ctx, from, to)
	return entry(e), a.fail("move", err)
}
