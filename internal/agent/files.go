package agent

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"io"
	"io/fs"
	"os"
	"path"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/spacesandbox/space/internal/agent/proto"
)

// fsys is where file operations act. Paths are absolute sandbox paths,
// already cleaned. Inside a sandbox it is the sandbox's own file system;
// for an agent run as a host process in tests it is an os.Root, which
// refuses any path or symlink that leaves the directory.
type fsys interface {
	OpenFile(name string, flag int, perm fs.FileMode) (*os.File, error)
	Stat(name string) (fs.FileInfo, error)
	Lstat(name string) (fs.FileInfo, error)
	MkdirAll(name string, perm fs.FileMode) error
	Remove(name string) error
	RemoveAll(name string) error
	Rename(from, to string) error
	Readlink(name string) (string, error)
	Chmod(name string, mode fs.FileMode) error
	Lchown(name string, uid, gid int) error
	// Metadata is the user-defined metadata of name (see xattr.go).
	Metadata(name string) map[string]string
}

func newFS(root string) (fsys, error) {
	if root == "/" {
		return hostFS{}, nil
	}
	r, err := os.OpenRoot(root)
	if err != nil {
		return nil, err
	}
	return rootFS{r}, nil
}

type hostFS struct{}

func (hostFS) OpenFile(n string, f int, p fs.FileMode) (*os.File, error) { return os.OpenFile(n, f, p) }
func (hostFS) Stat(n string) (fs.FileInfo, error)                        { return os.Stat(n) }
func (hostFS) Lstat(n string) (fs.FileInfo, error)                       { return os.Lstat(n) }
func (hostFS) MkdirAll(n string, p fs.FileMode) error                    { return os.MkdirAll(n, p) }
func (hostFS) Remove(n string) error                                     { return os.Remove(n) }
func (hostFS) RemoveAll(n string) error                                  { return os.RemoveAll(n) }
func (hostFS) Rename(a, b string) error                                  { return os.Rename(a, b) }
func (hostFS) Readlink(n string) (string, error)                         { return os.Readlink(n) }
func (hostFS) Chmod(n string, m fs.FileMode) error                       { return os.Chmod(n, m) }
func (hostFS) Lchown(n string, u, g int) error                           { return os.Lchown(n, u, g) }
func (hostFS) Metadata(n string) map[string]string                       { return readMetadata(n) }

type rootFS struct{ r *os.Root }

func rel(n string) string {
	if n == "/" {
		return "."
	}
	return strings.TrimPrefix(n, "/")
}

func (f rootFS) OpenFile(n string, fl int, p fs.FileMode) (*os.File, error) {
	return f.r.OpenFile(rel(n), fl, p)
}
func (f rootFS) Stat(n string) (fs.FileInfo, error)     { return f.r.Stat(rel(n)) }
func (f rootFS) Metadata(n string) map[string]string    { return rootMetadata(f.r, rel(n)) }
func (f rootFS) Lstat(n string) (fs.FileInfo, error)    { return f.r.Lstat(rel(n)) }
func (f rootFS) MkdirAll(n string, p fs.FileMode) error { return f.r.MkdirAll(rel(n), p) }
func (f rootFS) Remove(n string) error                  { return f.r.Remove(rel(n)) }
func (f rootFS) RemoveAll(n string) error {
	if n == "/" {
		return errors.New("refusing to remove the root")
	}
	return f.r.RemoveAll(rel(n))
}
func (f rootFS) Rename(a, b string) error            { return f.r.Rename(rel(a), rel(b)) }
func (f rootFS) Readlink(n string) (string, error)   { return f.r.Readlink(rel(n)) }
func (f rootFS) Chmod(n string, m fs.FileMode) error { return f.r.Chmod(rel(n), m) }
func (f rootFS) Lchown(n string, u, g int) error     { return f.r.Lchown(rel(n), u, g) }

// cleanPath checks that p is an absolute path and returns it cleaned; ".."
// cannot climb above "/".
func cleanPath(p string) (string, error) {
	if p == "" || p[0] != '/' || strings.IndexByte(p, 0) >= 0 || len(p) > 4096 {
		return "", proto.Errorf(proto.CodeInvalidArgument, "path must be absolute, without NUL, at most 4096 bytes")
	}
	return path.Clean(p), nil
}

// fileError maps a file system error to a call error.
func fileError(op, p string, err error) error {
	var pe *proto.Error
	if errors.As(err, &pe) {
		return pe // the agent's own answer (an unknown user) keeps its code
	}
	for _, m := range fileErrors {
		for _, e := range m.errs {
			if errors.Is(err, e) {
				return proto.Errorf(m.code, "%s %s: %s", op, p, m.what)
			}
		}
	}
	if strings.Contains(err.Error(), "escapes from parent") || strings.Contains(err.Error(), "path escapes") {
		return proto.Errorf(proto.CodePermissionDenied, "%s %s: path leaves the sandbox root", op, p)
	}
	return proto.Errorf(proto.CodeInternal, "%s %s: %v", op, p, err)
}

// fileErrors are the expected file system errors and what a caller is told,
// first match wins (ENOTEMPTY before fs.ErrExist, which it also matches).
var fileErrors = []struct {
	errs       []error
	code, what string
}{
	{[]error{syscall.ENOTEMPTY}, proto.CodeFailedPrecondition, "directory not empty"},
	{[]error{fs.ErrNotExist}, proto.CodeNotFound, "no such file or directory"},
	{[]error{fs.ErrExist}, proto.CodeAlreadyExists, "already exists"},
	{[]error{fs.ErrPermission}, proto.CodePermissionDenied, "permission denied"},
	{[]error{syscall.ENOTDIR}, proto.CodeFailedPrecondition, "not a directory"},
	{[]error{syscall.EISDIR}, proto.CodeFailedPrecondition, "is a directory"},
	{[]error{syscall.ENOSPC, syscall.EDQUOT}, proto.CodeResourceExhausted, "no space left"},
	{[]error{syscall.EROFS}, proto.CodeFailedPrecondition, "read-only file system"},
	{[]error{syscall.EBUSY}, proto.CodeFailedPrecondition, "busy (a mount point, or in use)"},
	{[]error{syscall.ETXTBSY}, proto.CodeFailedPrecondition, "a running program's file"},
	{[]error{syscall.EXDEV}, proto.CodeFailedPrecondition, "source and destination are on different file systems"},
	{[]error{syscall.ELOOP}, proto.CodeFailedPrecondition, "too many levels of symbolic links"},
	{[]error{syscall.ENAMETOOLONG}, proto.CodeInvalidArgument, "name too long"},
	{[]error{syscall.EFBIG}, proto.CodeResourceExhausted, "file too large"},
	{[]error{syscall.EMFILE, syscall.ENFILE, syscall.EMLINK}, proto.CodeResourceExhausted, "too many open files or links"},
}

func (a *Agent) entry(p string, fi fs.FileInfo) proto.Entry {
	f := a.fs
	e := proto.Entry{Path: p, Name: path.Base(p), Size: fi.Size(), Mode: "0" + strconvOct(uint32(fi.Mode().Perm())), ModTime: fi.ModTime().UTC()}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		e.UID, e.GID = int(st.Uid), int(st.Gid)
		e.Owner, e.Group = a.owners(e.UID, e.GID)
	}
	switch {
	case fi.Mode().IsRegular():
		e.Type = "file"
		e.Metadata = f.Metadata(p)
	case fi.IsDir():
		e.Type = "dir"
		e.Metadata = f.Metadata(p)
	case fi.Mode()&fs.ModeSymlink != 0:
		e.Type = "symlink"
		e.Target, _ = f.Readlink(p)
		if res, tfi, ok := a.resolve(p); ok {
			e.Resolved, e.TargetMode = res, "0"+strconvOct(uint32(tfi.Mode().Perm()))
			switch {
			case tfi.Mode().IsRegular():
				e.TargetType = "file"
			case tfi.IsDir():
				e.TargetType = "dir"
			default:
				e.TargetType = "other"
			}
		}
	default:
		e.Type = "other"
	}
	return e
}

// resolve follows the symlink p, and every link its target leads to, inside
// the sandbox's root: the absolute path it ends at and what is there. ok is
// false for a link that dangles or loops.
func (a *Agent) resolve(p string) (string, fs.FileInfo, bool) {
	cur := p
	for range 40 {
		t, err := a.fs.Readlink(cur)
		if err != nil {
			return "", nil, false
		}
		if !path.IsAbs(t) {
			t = path.Join(path.Dir(cur), t)
		}
		cur = path.Clean(t)
		fi, err := a.fs.Lstat(cur)
		if err != nil {
			return "", nil, false
		}
		if fi.Mode()&fs.ModeSymlink == 0 {
			return cur, fi, true
		}
	}
	return "", nil, false
}

func strconvOct(v uint32) string {
	const digits = "01234567"
	var b [11]byte
	i := len(b)
	for {
		i--
		b[i] = digits[v&7]
		v >>= 3
		if v == 0 {
			break
		}
	}
	s := string(b[i:])
	for len(s) < 3 {
		s = "0" + s
	}
	return s
}

// writes tracks files being written in chunks; each goes to a temporary
// file beside its destination and is renamed into place on commit.
type writes struct {
	mu      sync.Mutex // guards m
	m       map[string]*pendingWrite
	maxIdle time.Duration
}

type pendingWrite struct {
	mu      sync.Mutex // serialises chunks
	dst     string
	tmp     string
	f       *os.File
	mode    fs.FileMode
	owner   *account // nil: the agent's user
	meta    map[string]string
	written int64
	touched time.Time
}

func newWrites() *writes { return &writes{m: map[string]*pendingWrite{}, maxIdle: 5 * time.Minute} }

func (a *Agent) stat(path string) (proto.Entry, error) {
	name, err := cleanPath(path)
	if err != nil {
		return proto.Entry{}, err
	}
	fi, err := a.fs.Lstat(name)
	if err != nil {
		return proto.Entry{}, fileError("stat", name, err)
	}
	return a.entry(name, fi), nil
}

func (a *Agent) remove(p proto.RemoveRequest) error {
	name, err := cleanPath(p.Path)
	if err != nil {
		return err
	}
	if name == "/" {
		return proto.Errorf(proto.CodeInvalidArgument, "refusing to remove /")
	}
	if _, err := a.fs.Lstat(name); err != nil {
		return fileError("remove", name, err)
	}
	if p.Recursive {
		err = a.fs.RemoveAll(name)
	} else {
		err = a.fs.Remove(name)
	}
	if err != nil {
		return fileError("remove", name, err)
	}
	return nil
}

func (a *Agent) mkdir(p proto.MkdirRequest) (proto.Entry, error) {
	name, err := cleanPath(p.Path)
	if err != nil {
		return proto.Entry{}, err
	}
	mode := fs.FileMode(p.Mode & 0o7777)
	if mode == 0 {
		mode = 0o755
	}
	if err := a.mkdirAs(name, mode, p.User); err != nil {
		return proto.Entry{}, fileError("mkdir", name, err)
	}
	fi, err := a.fs.Lstat(name)
	if err != nil {
		return proto.Entry{}, fileError("mkdir", name, err)
	}
	return a.entry(name, fi), nil
}

func (a *Agent) move(p proto.MoveRequest) (proto.Entry, error) {
	from, err := cleanPath(p.From)
	if err != nil {
		return proto.Entry{}, err
	}
	to, err := cleanPath(p.To)
	if err != nil {
		return proto.Entry{}, err
	}
	if from == "/" || to == "/" {
		return proto.Entry{}, proto.Errorf(proto.CodeInvalidArgument, "cannot move /")
	}
	if err := a.fs.Rename(from, to); err != nil {
		return proto.Entry{}, fileError("move", from, err)
	}
	fi, err := a.fs.Lstat(to)
	if err != nil {
		return proto.Entry{}, fileError("move", to, err)
	}
	return a.entry(to, fi), nil
}

// maxListEntries bounds one listing.
const maxListEntries = 10000

func (a *Agent) listDir(p proto.ListRequest) (any, []byte, error) {
	name, err := cleanPath(p.Path)
	if err != nil {
		return nil, nil, err
	}
	if p.Depth <= 0 {
		p.Depth = 1
	}
	if p.Depth > 16 {
		return nil, nil, proto.Errorf(proto.CodeInvalidArgument, "depth must be between 1 and 16")
	}
	fi, err := a.fs.Stat(name)
	if err != nil {
		return nil, nil, fileError("list", name, err)
	}
	if !fi.IsDir() {
		return nil, nil, proto.Errorf(proto.CodeFailedPrecondition, "list %s: not a directory", name)
	}
	out := proto.EntryList{Items: []proto.Entry{}}
	var walk func(dir string, depth int) error
	walk = func(dir string, depth int) error {
		d, err := a.fs.OpenFile(dir, os.O_RDONLY|syscall.O_DIRECTORY, 0)
		if err != nil {
			return fileError("list", dir, err)
		}
		ents, err := d.ReadDir(-1)
		d.Close()
		if err != nil {
			return fileError("list", dir, err)
		}
		// By name, each directory's entries right after it, as envd walks.
		slices.SortFunc(ents, func(x, y fs.DirEntry) int { return strings.Compare(x.Name(), y.Name()) })
		for _, de := range ents {
			if len(out.Items) >= maxListEntries {
				out.Truncated = true
				return nil
			}
			child := path.Join(dir, de.Name())
			info, err := de.Info()
			if err != nil {
				continue // vanished meanwhile
			}
			out.Items = append(out.Items, a.entry(child, info))
			if de.IsDir() && depth > 1 {
				if err := walk(child, depth-1); err != nil {
					return err
				}
			}
		}
		return nil
	}
	if err := walk(name, p.Depth); err != nil {
		return nil, nil, err
	}
	return out, nil, nil
}

func (a *Agent) readFile(p proto.ReadFileRequest) (any, []byte, error) {
	name, err := cleanPath(p.Path)
	if err != nil {
		return nil, nil, err
	}
	if p.Offset < 0 || p.Length < 0 {
		return nil, nil, proto.Errorf(proto.CodeInvalidArgument, "offset and length must not be negative")
	}
	if p.Length == 0 || p.Length > proto.MaxBlob {
		p.Length = proto.MaxBlob
	}
	// O_NONBLOCK: opening a FIFO must not wait for a writer (it is refused
	// below); it changes nothing for a regular file.
	f, err := a.fs.OpenFile(name, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, nil, fileError("read", name, err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, nil, fileError("read", name, err)
	}
	if fi.IsDir() {
		return nil, nil, proto.Errorf(proto.CodeFailedPrecondition, "read %s: is a directory", name)
	}
	if !fi.Mode().IsRegular() {
		// A device, FIFO or socket has no end (/dev/zero) or blocks.
		return nil, nil, proto.Errorf(proto.CodeFailedPrecondition, "read %s: not a regular file", name)
	}
	buf := make([]byte, p.Length)
	n, err := f.ReadAt(buf, p.Offset)
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, nil, fileError("read", name, err)
	}
	// A file whose size is not known up front (/proc, /sys: size 0 or a
	// page) ends where a read comes up short, not at its stated size.
	eof := errors.Is(err, io.EOF) || (fi.Size() > 0 && p.Offset+int64(n) >= fi.Size())
	return proto.ReadFileResult{Size: fi.Size(), EOF: eof}, buf[:n], nil
}

func randomSuffix() string {
	var b [8]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func (a *Agent) writeBegin(p proto.WriteBegin) (proto.WriteHandle, error) {
	name, err := cleanPath(p.Path)
	if err != nil {
		return proto.WriteHandle{}, err
	}
	if name == "/" {
		return proto.WriteHandle{}, proto.Errorf(proto.CodeInvalidArgument, "cannot write /")
	}
	mode := fs.FileMode(p.Mode & 0o7777)
	if mode == 0 {
		mode = 0o644
	}
	if fi, err := a.fs.Stat(name); err == nil && fi.IsDir() {
		return proto.WriteHandle{}, proto.Errorf(proto.CodeFailedPrecondition, "write %s: is a directory", name)
	}
	if err := proto.ValidateMetadata(p.Metadata); err != nil {
		return proto.WriteHandle{}, err
	}
	var owner *account
	if p.User != "" {
		u, err := a.lookupUser(p.User)
		if err != nil {
			return proto.WriteHandle{}, err
		}
		owner = &u
	}
	dir := path.Dir(name)
	if err := a.mkdirAs(dir, 0o755, p.User); err != nil {
		return proto.WriteHandle{}, fileError("write", name, err)
	}
	tmp := path.Join(dir, "."+path.Base(name)+".space-"+randomSuffix())
	f, err := a.fs.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return proto.WriteHandle{}, fileError("write", name, err)
	}
	h := randomSuffix()
	a.writes.mu.Lock()
	a.writes.m[h] = &pendingWrite{dst: name, tmp: tmp, f: f, mode: mode, owner: owner, meta: p.Metadata, touched: time.Now()}
	a.writes.mu.Unlock()
	a.expireWrites()
	return proto.WriteHandle{Handle: h}, nil
}

func (a *Agent) pending(h string) (*pendingWrite, error) {
	a.writes.mu.Lock()
	defer a.writes.mu.Unlock()
	w, ok := a.writes.m[h]
	if !ok {
		return nil, proto.Errorf(proto.CodeNotFound, "no write in progress with handle %q", h)
	}
	return w, nil
}

func (a *Agent) writeChunk(p proto.WriteChunk, blob []byte) error {
	w, err := a.pending(p.Handle)
	if err != nil {
		return err
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if p.Offset != w.written {
		return proto.Errorf(proto.CodeFailedPrecondition, "chunk at offset %d, expected %d", p.Offset, w.written)
	}
	if _, err := w.f.Write(blob); err != nil {
		return fileError("write", w.dst, err)
	}
	w.written += int64(len(blob))
	w.touched = time.Now()
	return nil
}

func (a *Agent) writeCommit(h string) (proto.Entry, error) {
	w, err := a.pending(h)
	if err != nil {
		return proto.Entry{}, err
	}
	a.writes.mu.Lock()
	delete(a.writes.m, h)
	a.writes.mu.Unlock()
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.owner != nil {
		if err := w.f.Chown(w.owner.uid, w.owner.gid); err != nil {
			w.f.Close()
			a.fs.Remove(w.tmp)
			return proto.Entry{}, fileError("write", w.dst, err)
		}
	}
	if err := w.f.Chmod(w.mode); err != nil {
		w.f.Close()
		a.fs.Remove(w.tmp)
		return proto.Entry{}, fileError("write", w.dst, err)
	}
	if err := writeMetadata(w.f, w.meta); err != nil {
		w.f.Close()
		a.fs.Remove(w.tmp)
		if errors.Is(err, errNoXattrs) {
			return proto.Entry{}, proto.Errorf(proto.CodeFailedPrecondition, "write %s: %v", w.dst, err)
		}
		return proto.Entry{}, fileError("write", w.dst, err)
	}
	if err := w.f.Sync(); err != nil {
		w.f.Close()
		a.fs.Remove(w.tmp)
		return proto.Entry{}, fileError("write", w.dst, err)
	}
	w.f.Close()
	if err := a.fs.Rename(w.tmp, w.dst); err != nil {
		a.fs.Remove(w.tmp)
		return proto.Entry{}, fileError("write", w.dst, err)
	}
	fi, err := a.fs.Lstat(w.dst)
	if err != nil {
		return proto.Entry{}, fileError("write", w.dst, err)
	}
	return a.entry(w.dst, fi), nil
}

func (a *Agent) writeAbort(h string) {
	a.writes.mu.Lock()
	w, ok := a.writes.m[h]
	delete(a.writes.m, h)
	a.writes.mu.Unlock()
	if ok {
		w.mu.Lock()
		w.f.Close()
		a.fs.Remove(w.tmp)
		w.mu.Unlock()
	}
}

// expireWrites aborts writes nobody touched for maxIdle (a host that went
// away mid-upload).
func (a *Agent) expireWrites() {
	a.writes.mu.Lock()
	var stale []string
	for h, w := range a.writes.m {
		if w.mu.TryLock() {
			if time.Since(w.touched) > a.writes.maxIdle {
				stale = append(stale, h)
			}
			w.mu.Unlock()
		}
	}
	a.writes.mu.Unlock()
	for _, h := range stale {
		a.writeAbort(h)
	}
}

// mkdirAs makes dir and its missing parents; with user, the directories it
// made belong to that user of the sandbox.
func (a *Agent) mkdirAs(dir string, mode fs.FileMode, user string) error {
	if user == "" {
		return a.fs.MkdirAll(dir, mode)
	}
	acc, err := a.lookupUser(user)
	if err != nil {
		return err
	}
	var missing []string
	for d := dir; d != "/"; d = path.Dir(d) {
		if _, err := a.fs.Lstat(d); err == nil {
			break
		}
		missing = append(missing, d)
	}
	if err := a.fs.MkdirAll(dir, mode); err != nil {
		return err
	}
	for _, d := range missing {
		if err := a.fs.Lchown(d, acc.uid, acc.gid); err != nil {
			return err
		}
	}
	return nil
}
