// Package agentclient is the host's side of the agent protocol: it opens a
// connection with the version handshake, multiplexes concurrent calls over
// it, and offers typed methods for everything the agent serves.
package agentclient

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/spacesandbox/space/internal/agent/proto"
)

// ErrClosed reports that the connection to the agent is gone.
var ErrClosed = errors.New("agent connection closed")

// Client is one connection to an agent. Safe for concurrent use.
type Client struct {
	conn  io.ReadWriteCloser
	w     *proto.Writer
	hello proto.Hello
	nonce string // this connection's challenge

	mu      sync.Mutex // guards nextID, pending, err
	nextID  uint32
	pending map[uint32]chan proto.Frame
	err     error
	done    chan struct{}
}

// Dial performs the handshake on conn and starts reading replies. The
// client owns conn from then on.
func Dial(ctx context.Context, conn io.ReadWriteCloser) (*Client, error) {
	return DialBind(ctx, conn, nil)
}

// DialBind is Dial that challenges the agent to prove its per-boot key (see
// Client.Proves) and, with bind, hands an agent that holds no key yet that
// one (the first connection after boot).
func DialBind(ctx context.Context, conn io.ReadWriteCloser, bind []byte) (*Client, error) {
	var nb [16]byte
	rand.Read(nb[:])
	nonce := hex.EncodeToString(nb[:])
	hello := proto.Hello{Versions: []int{proto.Version}, Nonce: nonce}
	if bind != nil {
		hello.Bind = hex.EncodeToString(bind)
	}
	r, w := proto.NewReader(conn), proto.NewWriter(conn)
	// Output and file reads come in large frames: ReadOutput hands their
	// buffers back (Output.Release) for the next.
	r.Pool = true
	type result struct {
		h   proto.Hello
		err error
	}
	res := make(chan result, 1)
	go func() {
		if err := w.Write(proto.TypeHello, 0, hello, nil); err != nil {
			res <- result{err: err}
			return
		}
		f, err := r.Read()
		// Replies of an earlier session may still be on their way (a
		// channel that outlived its host, as a VM's serial port does):
		// they come before the hello and are skipped.
		// So may the hello answering an earlier host's challenge: an agent
		// echoes the nonce it answers (one from before nonces echoes none).
		for skipped := 0; err == nil && skipped < 1024 && (f.Type == proto.TypeReply || staleHello(f, nonce)); skipped++ {
			f, err = r.Read()
		}
		if err != nil {
			res <- result{err: err}
			return
		}
		var h proto.Hello
		if f.Type != proto.TypeHello || json.Unmarshal(f.Header, &h) != nil {
			res <- result{err: errors.New("agent did not answer with hello")}
			return
		}
		res <- result{h: h}
	}()
	var rr result
	select {
	case rr = <-res:
	case <-ctx.Done():
		conn.Close()
		return nil, fmt.Errorf("agent handshake: %w", ctx.Err())
	}
	if rr.err != nil {
		conn.Close()
		return nil, fmt.Errorf("agent handshake: %w", rr.err)
	}
	if rr.h.Version != proto.Version {
		conn.Close()
		return nil, fmt.Errorf("agent %q speaks no protocol version this host knows (%d)", rr.h.Agent, rr.h.Version)
	}
	c := &Client{conn: conn, w: w, hello: rr.h, nonce: nonce, pending: map[uint32]chan proto.Frame{}, done: make(chan struct{})}
	go c.readLoop(r)
	return c, nil
}

// staleHello reports whether f is an agent's hello answering another nonce.
func staleHello(f proto.Frame, nonce string) bool {
	var h proto.Hello
	return f.Type == proto.TypeHello && json.Unmarshal(f.Header, &h) == nil && h.Nonce != "" && h.Nonce != nonce
}

// Hello is what the agent said in the handshake.
func (c *Client) Hello() proto.Hello { return c.hello }

// Proves reports whether the agent proved it holds key on this connection.
func (c *Client) Proves(key []byte) bool {
	return c.hello.Proof != "" && hmac.Equal([]byte(c.hello.Proof), []byte(proto.Prove(key, c.nonce)))
}

// Done is closed when the connection fails or is closed.
func (c *Client) Done() <-chan struct{} { return c.done }

// Close closes the connection; calls in flight fail with ErrClosed.
func (c *Client) Close() error {
	err := c.conn.Close()
	<-c.done
	return err
}

func (c *Client) readLoop(r *proto.Reader) {
	var err error
	for {
		var f proto.Frame
		f, err = r.Read()
		if err != nil {
			break
		}
		if f.Type != proto.TypeReply {
			err = fmt.Errorf("unexpected frame type %d from agent", f.Type)
			break
		}
		c.mu.Lock()
		ch, ok := c.pending[f.ID]
		delete(c.pending, f.ID)
		c.mu.Unlock()
		if ok {
			ch <- f
		} else {
			f.Release()
		}
	}
	c.conn.Close()
	c.mu.Lock()
	c.err = fmt.Errorf("%w: %v", ErrClosed, err)
	for id, ch := range c.pending {
		close(ch)
		delete(c.pending, id)
	}
	c.mu.Unlock()
	close(c.done)
}

// Call sends one call and waits for its reply. Agent errors are returned as
// *proto.Error.
func (c *Client) Call(ctx context.Context, method string, params any, blob []byte) (json.RawMessage, []byte, error) {
	raw, f, err := c.callFrame(ctx, method, params, blob)
	return raw, f.Blob, err
}

// callFrame is Call, returning the reply's frame (its Blob is the reply's
// blob; Release hands its buffer back).
func (c *Client) callFrame(ctx context.Context, method string, params any, blob []byte) (json.RawMessage, proto.Frame, error) {
	raw, err := json.Marshal(params)
	if err != nil {
		return nil, proto.Frame{}, fmt.Errorf("encode %s params: %w", method, err)
	}
	ch := make(chan proto.Frame, 1)
	c.mu.Lock()
	if c.err != nil {
		err := c.err
		c.mu.Unlock()
		return nil, proto.Frame{}, err
	}
	c.nextID++
	id := c.nextID
	c.pending[id] = ch
	c.mu.Unlock()
	if err := c.w.Write(proto.TypeCall, id, proto.Call{Method: method, Params: raw}, blob); err != nil {
		c.forget(id)
		c.conn.Close()
		return nil, proto.Frame{}, fmt.Errorf("%w: send %s: %v", ErrClosed, method, err)
	}
	select {
	case f, ok := <-ch:
		if !ok {
			c.mu.Lock()
			err := c.err
			c.mu.Unlock()
			return nil, proto.Frame{}, err
		}
		var rep proto.Reply
		if err := json.Unmarshal(f.Header, &rep); err != nil {
			f.Release()
			return nil, proto.Frame{}, fmt.Errorf("decode %s reply: %w", method, err)
		}
		if rep.Error != nil {
			f.Release()
			return nil, proto.Frame{}, rep.Error
		}
		return rep.Result, f, nil
	case <-ctx.Done():
		c.forget(id)
		return nil, proto.Frame{}, ctx.Err()
	}
}

func (c *Client) forget(id uint32) {
	c.mu.Lock()
	delete(c.pending, id)
	c.mu.Unlock()
}

func call[T any](ctx context.Context, c *Client, method string, params any, blob []byte) (T, []byte, error) {
	out, f, err := callReply[T](ctx, c, method, params, blob)
	return out, f.Blob, err
}

// callReply is call, returning the reply's frame (its Blob is the reply's
// blob; Release hands its buffer back).
func callReply[T any](ctx context.Context, c *Client, method string, params any, blob []byte) (T, proto.Frame, error) {
	var out T
	raw, f, err := c.callFrame(ctx, method, params, blob)
	if err != nil {
		return out, proto.Frame{}, err
	}
	if len(raw) > 0 {
		if err := json.Unmarshal(raw, &out); err != nil {
			f.Release()
			return out, proto.Frame{}, fmt.Errorf("decode %s result: %w", method, err)
		}
	}
	return out, f, nil
}

// Info asks the agent about itself.
func (c *Client) Info(ctx context.Context) (proto.Info, error) {
	i, _, err := call[proto.Info](ctx, c, proto.MethodInfo, proto.Empty{}, nil)
	return i, err
}

// Configure sets hostname and clock and mixes entropy into the guest RNG.
func (c *Client) Configure(ctx context.Context, cfg proto.Configure, entropy []byte) (proto.Info, error) {
	i, _, err := call[proto.Info](ctx, c, proto.MethodConfigure, cfg, entropy)
	return i, err
}

// CreateProcess registers a process without starting it.
func (c *Client) CreateProcess(ctx context.Context, spec proto.ProcessSpec) (proto.Process, error) {
	p, _, err := call[proto.Process](ctx, c, proto.MethodProcCreate, spec, nil)
	return p, err
}

// StartProcess starts a pending process (no-op if already started).
func (c *Client) StartProcess(ctx context.Context, id string) (proto.Process, error) {
	return c.StartProcessFor(ctx, proto.StartRequest{ID: id})
}

// StartProcessFor starts a process with its first reader registered.
func (c *Client) StartProcessFor(ctx context.Context, req proto.StartRequest) (proto.Process, error) {
	p, _, err := call[proto.Process](ctx, c, proto.MethodProcStart, req, nil)
	return p, err
}

// GetProcess returns a process's status.
func (c *Client) GetProcess(ctx context.Context, id string) (proto.Process, error) {
	p, _, err := call[proto.Process](ctx, c, proto.MethodProcGet, proto.ProcessRef{ID: id}, nil)
	return p, err
}

// ListProcesses returns the running processes.
func (c *Client) ListProcesses(ctx context.Context) ([]proto.Process, error) {
	l, _, err := call[proto.ProcessList](ctx, c, proto.MethodProcList, proto.Empty{}, nil)
	return l.Items, err
}

// Output is one read of a process's output.
type Output struct {
	proto.ReadResult
	Data []byte // the chunks' bytes, in order

	frame proto.Frame
}

// Release hands Data's buffer back for a later read: Data must not be used
// after. Optional (an output never released is collected), at most once.
func (o *Output) Release() { o.frame.Release() }

// ReadOutput reads output after chunk `after`, waiting up to wait.
func (c *Client) ReadOutput(ctx context.Context, id string, after uint64, maxBytes int, wait time.Duration, subscriber string) (Output, error) {
	r, f, err := callReply[proto.ReadResult](ctx, c, proto.MethodProcRead, proto.ReadRequest{ID: id, After: after, MaxBytes: maxBytes, Wait: wait, Subscriber: subscriber}, nil)
	if err != nil {
		return Output{}, err
	}
	if err := checkChunks(r.Chunks, len(f.Blob)); err != nil {
		f.Release()
		return Output{}, err
	}
	return Output{ReadResult: r, Data: f.Blob, frame: f}, nil
}

// checkChunks checks that chunks account for exactly the n bytes of a
// read's blob.
func checkChunks(chunks []proto.Chunk, n int) error {
	total := 0
	for _, ch := range chunks {
		if ch.Len < 0 {
			return errors.New("agent sent a negative chunk length")
		}
		total += ch.Len
	}
	if total != n {
		return fmt.Errorf("agent sent %d bytes for chunks totalling %d", n, total)
	}
	return nil
}

// Hold keeps subscriber's place in a process's output window (it has read
// up to after) while it reads nothing.
func (c *Client) Hold(ctx context.Context, id, subscriber string, after uint64) error {
	_, _, err := c.Call(ctx, proto.MethodProcHold, proto.HoldRequest{ID: id, Subscriber: subscriber, After: after}, nil)
	return err
}

// Signal signals a process's group.
func (c *Client) Signal(ctx context.Context, id, sig string) error {
	_, _, err := c.Call(ctx, proto.MethodProcSignal, proto.SignalRequest{ID: id, Signal: sig}, nil)
	return err
}

// Stdin writes to a process's stdin.
func (c *Client) Stdin(ctx context.Context, id string, data []byte) error {
	_, _, err := c.Call(ctx, proto.MethodProcStdin, proto.ProcessRef{ID: id}, data)
	return err
}

// CloseStdin closes a process's stdin.
func (c *Client) CloseStdin(ctx context.Context, id string) error {
	_, _, err := c.Call(ctx, proto.MethodProcClose, proto.ProcessRef{ID: id}, nil)
	return err
}

// Resize changes a process's terminal size.
func (c *Client) Resize(ctx context.Context, id string, cols, rows uint16) error {
	_, _, err := c.Call(ctx, proto.MethodProcResize, proto.ResizeRequest{ID: id, Cols: cols, Rows: rows}, nil)
	return err
}

// Stat returns one entry (symlinks are not followed).
func (c *Client) Stat(ctx context.Context, path string) (proto.Entry, error) {
	e, _, err := call[proto.Entry](ctx, c, proto.MethodFileStat, proto.PathRequest{Path: path}, nil)
	return e, err
}

// List lists a directory to depth.
func (c *Client) List(ctx context.Context, path string, depth int) (proto.EntryList, error) {
	l, _, err := call[proto.EntryList](ctx, c, proto.MethodFileList, proto.ListRequest{Path: path, Depth: depth}, nil)
	return l, err
}

// ReadFile reads up to length bytes at offset.
func (c *Client) ReadFile(ctx context.Context, path string, offset int64, length int) (proto.ReadFileResult, []byte, error) {
	return call[proto.ReadFileResult](ctx, c, proto.MethodFileRead, proto.ReadFileRequest{Path: path, Offset: offset, Length: length}, nil)
}

// WriteFile streams r into path in chunks of at most chunk bytes; the file
// appears atomically, with mode, once everything arrived. It never holds
// more than one chunk in memory.
func (c *Client) WriteFile(ctx context.Context, path string, mode uint32, r io.Reader, chunk int) (proto.Entry, error) {
	return c.WriteFileAs(ctx, proto.WriteBegin{Path: path, Mode: mode}, r, chunk)
}

// WriteFileAs is WriteFile with every option of the write (its owner).
func (c *Client) WriteFileAs(ctx context.Context, begin proto.WriteBegin, r io.Reader, chunk int) (proto.Entry, error) {
	if chunk <= 0 || chunk > proto.MaxBlob {
		chunk = 1 << 20
	}
	h, _, err := call[proto.WriteHandle](ctx, c, proto.MethodFileWriteBegin, begin, nil)
	if err != nil {
		return proto.Entry{}, err
	}
	abort := func() {
		actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		c.Call(actx, proto.MethodFileWriteAbort, h, nil)
	}
	buf := make([]byte, chunk)
	var off int64
	for {
		n, rerr := fill(r, buf)
		if n > 0 {
			if _, _, err := c.Call(ctx, proto.MethodFileWriteChunk, proto.WriteChunk{Handle: h.Handle, Offset: off}, buf[:n]); err != nil {
				abort()
				return proto.Entry{}, err
			}
			off += int64(n)
		}
		if errors.Is(rerr, io.EOF) {
			break
		}
		if rerr != nil {
			abort()
			return proto.Entry{}, rerr
		}
	}
	e, _, err := call[proto.Entry](ctx, c, proto.MethodFileWriteCommit, h, nil)
	return e, err
}

// Remove removes a path (recursively if asked).
func (c *Client) Remove(ctx context.Context, path string, recursive bool) error {
	_, _, err := c.Call(ctx, proto.MethodFileRemove, proto.RemoveRequest{Path: path, Recursive: recursive}, nil)
	return err
}

// Mkdir makes a directory and its parents.
func (c *Client) Mkdir(ctx context.Context, path string, mode uint32) (proto.Entry, error) {
	return c.MkdirAs(ctx, proto.MkdirRequest{Path: path, Mode: mode})
}

// MkdirAs is Mkdir with every option (the owner of what it makes).
func (c *Client) MkdirAs(ctx context.Context, req proto.MkdirRequest) (proto.Entry, error) {
	e, _, err := call[proto.Entry](ctx, c, proto.MethodFileMkdir, req, nil)
	return e, err
}

// Move renames a path.
func (c *Client) Move(ctx context.Context, from, to string) (proto.Entry, error) {
	e, _, err := call[proto.Entry](ctx, c, proto.MethodFileMove, proto.MoveRequest{From: from, To: to}, nil)
	return e, err
}

// fill reads into buf until it is full or r ends. Unlike io.ReadFull it
// keeps a clean end (io.EOF, whatever was read before it) apart from a
// failure: an HTTP body cut short fails with io.ErrUnexpectedEOF, and a
// write must not commit it as a complete, shorter file.
func fill(r io.Reader, buf []byte) (int, error) {
	n := 0
	for n < len(buf) {
		m, err := r.Read(buf[n:])
		n += m
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// FileReader streams a sandbox file in chunks. A file with a size yields
// exactly Size bytes (the size when it was opened), even if the file changes
// meanwhile, and fails rather than end short. A file whose size is not known
// up front (/proc/self/mounts: stat says 0) has Size -1 and is read until
// its end.
type FileReader struct {
	Size  int64
	c     *Client
	ctx   context.Context
	path  string
	buf   []byte
	sent  int64
	eof   bool
	chunk int
}

// OpenFile reads a file's first chunk and returns a reader for all of it.
func (c *Client) OpenFile(ctx context.Context, path string, chunk int) (*FileReader, error) {
	res, data, err := c.ReadFile(ctx, path, 0, chunk)
	if err != nil {
		return nil, err
	}
	size := res.Size
	switch {
	case res.Size > 0 && int64(len(data)) > res.Size:
		data = data[:res.Size] // it grew since it was opened
	case res.EOF && int64(len(data)) < res.Size && res.Size <= int64(chunk):
		size = int64(len(data)) // a page-sized /sys file with less in it
	case res.EOF && res.Size == 0:
		size = int64(len(data)) // all of a size-less file in one chunk
	case res.Size == 0:
		size = -1 // size-less, longer than a chunk: read to its end
	}
	return &FileReader{Size: size, c: c, ctx: ctx, path: path, buf: data, eof: res.EOF, chunk: chunk}, nil
}

func (f *FileReader) Read(p []byte) (int, error) {
	if f.Size >= 0 && f.sent >= f.Size {
		return 0, io.EOF
	}
	if len(f.buf) == 0 {
		if f.eof {
			if f.Size < 0 {
				return 0, io.EOF
			}
			return 0, fmt.Errorf("read %s: the file shrank while it was read", f.path)
		}
		res, data, err := f.c.ReadFile(f.ctx, f.path, f.sent, f.chunk)
		if err != nil {
			return 0, err
		}
		if len(data) == 0 && (f.Size >= 0 || !res.EOF) {
			return 0, fmt.Errorf("read %s: the file shrank while it was read", f.path)
		}
		f.buf, f.eof = data, res.EOF
		if len(data) == 0 {
			return 0, io.EOF
		}
	}
	if rest := f.Size - f.sent; f.Size >= 0 && int64(len(f.buf)) > rest {
		f.buf = f.buf[:rest]
	}
	n := copy(p, f.buf)
	f.buf = f.buf[n:]
	f.sent += int64(n)
	return n, nil
}

// Metrics reads the sandbox's use of CPU, memory and disk.
func (c *Client) Metrics(ctx context.Context) (proto.Metrics, error) {
	m, _, err := call[proto.Metrics](ctx, c, proto.MethodMetrics, proto.Empty{}, nil)
	return m, err
}

// WatchStart watches a directory for changes.
func (c *Client) WatchStart(ctx context.Context, req proto.WatchRequest) (proto.WatchHandle, error) {
	h, _, err := call[proto.WatchHandle](ctx, c, proto.MethodWatchStart, req, nil)
	return h, err
}

// WatchRead reads a watch's events after a sequence number, waiting up to
// req.Wait for one.
func (c *Client) WatchRead(ctx context.Context, req proto.WatchRead) (proto.WatchEvents, error) {
	e, _, err := call[proto.WatchEvents](ctx, c, proto.MethodWatchRead, req, nil)
	return e, err
}

// WatchStop ends a watch.
func (c *Client) WatchStop(ctx context.Context, id string) error {
	_, _, err := c.Call(ctx, proto.MethodWatchStop, proto.WatchHandle{ID: id}, nil)
	return err
}
