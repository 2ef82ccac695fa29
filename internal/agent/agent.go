// Package agent is space-agent, the program that runs inside every sandbox
// (as PID 1 in a VM, as the container's init under gVisor). It serves the
// host over one byte stream with the framed protocol of package proto: it
// runs processes and keeps a bounded window of their output, serves file
// operations, sets the clock and hostname, reseeds the RNG and flushes
// filesystems when the host asks.
package agent

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/spacesandbox/space/internal/agent/proto"
)

// Name identifies this agent build in Hello.
const Name = "space-agent/1"

// Config tunes the agent.
type Config struct {
	// Root confines file operations to a directory; "/" inside a sandbox.
	// Tests running the agent as a host process give a temporary directory.
	Root string
	// RingBytes is each process's output window (≥ 1 MiB).
	RingBytes int
	// KeepExited is how long exited processes are remembered (≥ 15 min)
	// and MaxExited how many at most.
	KeepExited time.Duration
	MaxExited  int
	// ExitedOutputBytes bounds the output all exited processes retain
	// together (default 16 MiB, each over by at most one read): the most
	// recently exited keep a window of exitedWindow, older ones what is
	// left, and the oldest none (a reader still reading keeps what it has
	// not read). Without it every remembered process would hold its whole
	// window in the sandbox's memory.
	ExitedOutputBytes int
	// MaxPending caps command sessions created but not yet started (no
	// client attached); default 1024. Beyond it a create is refused. One
	// nobody attached to for KeepPending (default 24 h, the attachment
	// token's default life) is forgotten.
	MaxPending  int
	KeepPending time.Duration
	Logger      *slog.Logger
}

// Agent serves one sandbox.
type Agent struct {
	cfg    Config
	log    *slog.Logger
	fs     fsys
	reaper *reaper
	writes *writes
	names  names

	keyMu sync.Mutex // guards key
	key   []byte     // per-boot key the host bound this agent to (memory only)

	mu    sync.Mutex // guards procs
	procs map[string]*process

	watches watches

	cpuMu   sync.Mutex // guards cpuPrev
	cpuPrev cpuTimes   // /proc/stat at the previous metrics call

	redials atomic.Bool // served by ServeUnix: said in the hello

	trim *trimmer // returns free memory after a burst of traffic (trim.go)
}

// New returns an agent.
func New(cfg Config) (*Agent, error) {
	if cfg.Root == "" {
		cfg.Root = "/"
	}
	if cfg.RingBytes < 1<<20 {
		cfg.RingBytes = 2 << 20
	}
	if cfg.KeepExited < 15*time.Minute {
		cfg.KeepExited = 15 * time.Minute
	}
	if cfg.MaxPending <= 0 {
		cfg.MaxPending = 1024
	}
	if cfg.KeepPending <= 0 {
		cfg.KeepPending = 24 * time.Hour
	}
	if cfg.MaxExited <= 0 {
		cfg.MaxExited = 1024
	}
	if cfg.ExitedOutputBytes <= 0 {
		cfg.ExitedOutputBytes = 16 << 20
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	fs, err := newFS(cfg.Root)
	if err != nil {
		return nil, err
	}
	return &Agent{cfg: cfg, log: cfg.Logger, fs: fs, reaper: newReaper(), writes: newWrites(), procs: map[string]*process{}, trim: newTrimmer()}, nil
}

// Close stops the agent's background work (tests).
func (a *Agent) Close() { a.reaper.close() }

// ErrNoHost is Serve's answer when the channel ended before the host said
// hello: nobody is on the other end yet.
var ErrNoHost = errors.New("no host on the channel")

// bindKey takes the key the host hands over on its first connection after
// boot and returns the agent's key. Once bound, a different key is never
// taken: only the first host (before any other process existed) binds.
func (a *Agent) bindKey(bind string) []byte {
	a.keyMu.Lock()
	defer a.keyMu.Unlock()
	if a.key == nil && bind != "" {
		if k, err := hex.DecodeString(bind); err == nil && len(k) >= 16 {
			a.key = k
		}
	}
	return a.key
}

// Serve speaks the protocol on one connection until it fails or ctx ends.
// Calls run concurrently; a call's context ends with the connection.

func (a *Agent) Serve(ctx context.Context, conn io.ReadWriteCloser) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() { <-ctx.Done(); conn.Close() }()
	r, w := proto.NewReader(conn), proto.NewWriter(conn)
	f, err := r.Read()
	if errors.Is(err, io.EOF) {
		return ErrNoHost
	}
	if err != nil {
		return fmt.Errorf("read hello: %w", err)
	}
	handshake := func(f proto.Frame) error {
		var hello proto.Hello
		if f.Type != proto.TypeHello || json.Unmarshal(f.Header, &hello) != nil {
			return errors.New("first frame is not hello")
		}
		ver := 0
		for _, v := range hello.Versions {
			if v == proto.Version {
				ver = v
			}
		}
		// The nonce is echoed: on a channel that outlives its host (a VM's
		// serial port) the host tells this answer from a stale one.
		reply := proto.Hello{Version: ver, Agent: Name, Ready: ver != 0, Nonce: hello.Nonce, Redials: a.redials.Load()}
		if key := a.bindKey(hello.Bind); key != nil && hello.Nonce != "" {
			reply.Proof = proto.Prove(key, hello.Nonce)
		}
		if err := w.Write(proto.TypeHello, 0, reply, nil); err != nil {
			return fmt.Errorf("write hello: %w", err)
		}
		if ver == 0 {
			return fmt.Errorf("no protocol version in common with the host (host speaks %v)", hello.Versions)
		}
		return nil
	}
	if err := handshake(f); err != nil {
		return err
	}
	// Calls run under the session's context. A hello in the middle of a
	// session means a new host is on the other end of a channel that never
	// closed (a microVM's serial port after a restore): the calls of the
	// old session are cancelled and a new session starts.
	cancelCalls := func() {}
	session := func() context.Context {
		cancelCalls()
		c, cancel := context.WithCancel(ctx)
		cancelCalls = cancel
		return c
	}
	callCtx := session()
	// When the channel ends, the calls still running (long polls for
	// output or watch events) are cancelled first and then waited for: a
	// host that hung up must not wait out the longest poll before the
	// agent dials again.
	var wg sync.WaitGroup
	defer func() {
		cancelCalls()
		wg.Wait()
	}()
	for {
		f, err := r.Read()
		if err != nil {
			if errors.Is(err, io.EOF) || ctx.Err() != nil {
				return nil
			}
			return err
		}
		if f.Type == proto.TypeHello {
			callCtx = session()
			if err := handshake(f); err != nil {
				return err
			}
			continue
		}
		if f.Type != proto.TypeCall {
			return fmt.Errorf("unexpected frame type %d", f.Type)
		}
		var c proto.Call
		if err := json.Unmarshal(f.Header, &c); err != nil {
			w.Write(proto.TypeReply, f.ID, proto.Reply{Error: proto.Errorf(proto.CodeInvalidArgument, "malformed call")}, nil)
			continue
		}
		wg.Add(1)
		go func(ctx context.Context, id uint32, c proto.Call, blob []byte) {
			defer wg.Done()
			res, out, err := a.dispatch(ctx, c, blob)
			rep := proto.Reply{}
			if err != nil {
				var pe *proto.Error
				if !errors.As(err, &pe) {
					pe = proto.Errorf(proto.CodeInternal, "%v", err)
				}
				rep.Error, out = pe, nil
			} else if rep.Result, err = json.Marshal(res); err != nil {
				rep.Error, out = proto.Errorf(proto.CodeInternal, "encode result: %v", err), nil
			}
			if err := w.Write(proto.TypeReply, id, rep, out); err != nil {
				cancel()
			}
		}(callCtx, f.ID, c, f.Blob)
	}
}

func decode[T any](raw json.RawMessage) (T, error) {
	var v T
	if len(raw) == 0 {
		return v, nil
	}
	if err := json.Unmarshal(raw, &v); err != nil {
		return v, proto.Errorf(proto.CodeInvalidArgument, "params: %v", err)
	}
	return v, nil
}

// startFor starts a registered process with a reader already holding its
// place in the output window (so nothing is evicted before it is read).
func (a *Agent) startFor(p proto.StartRequest) (proto.Process, error) {
	proc, err := a.lookup(p.ID)
	if err != nil {
		return proto.Process{}, err
	}
	if p.Subscriber != "" {
		proc.out.hold(p.Subscriber, p.After)
	}
	a.start(proc)
	return proc.status(), nil
}

// hold keeps a reader's place in a process's output window.
func (a *Agent) hold(h proto.HoldRequest) error {
	if h.Subscriber == "" {
		return proto.Errorf(proto.CodeInvalidArgument, "hold needs a subscriber")
	}
	p, err := a.lookup(h.ID)
	if err != nil {
		return err
	}
	p.out.hold(h.Subscriber, h.After)
	return nil
}

func (a *Agent) info() proto.Info {
	h, _ := os.Hostname()
	return proto.Info{Agent: Name, Version: proto.Version, Hostname: h, PID: os.Getpid(), Init: os.Getpid() == 1, Now: time.Now().UTC()}
}

func (a *Agent) create(spec proto.ProcessSpec) (proto.Process, error) {
	if spec.ID == "" || len(spec.ID) > 64 {
		return proto.Process{}, proto.Errorf(proto.CodeInvalidArgument, "process id must be 1 to 64 characters")
	}
	if len(spec.Argv) == 0 || spec.Argv[0] == "" {
		return proto.Process{}, proto.Errorf(proto.CodeInvalidArgument, "argv must name an executable")
	}
	if spec.Cwd != "" && spec.Cwd[0] != '/' {
		return proto.Process{}, proto.Errorf(proto.CodeInvalidArgument, "cwd must be absolute")
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if p, ok := a.procs[spec.ID]; ok {
		// Creating the same session again (a host retry) is harmless.
		return p.status(), nil
	}
	pending, now := 0, time.Now()
	for id, q := range a.procs {
		if q.pending() {
			if now.Sub(q.createdAt) > a.cfg.KeepPending {
				delete(a.procs, id) // never attached to: abandoned
				continue
			}
			pending++
		}
	}
	if pending >= a.cfg.MaxPending {
		return proto.Process{}, proto.Errorf(proto.CodeResourceExhausted, "%d command sessions are waiting for a client to attach; attach to them (or let them go) before creating more", pending)
	}
	p := &process{spec: spec, out: newRing(a.cfg.RingBytes, 5*time.Second), state: proto.ProcPending, createdAt: time.Now().UTC()}
	a.procs[spec.ID] = p
	return p.status(), nil
}

func (a *Agent) lookup(id string) (*process, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	p, ok := a.procs[id]
	if !ok {
		return nil, proto.Errorf(proto.CodeNotFound, "process %s not found", id)
	}
	return p, nil
}

func (a *Agent) list() proto.ProcessList {
	a.mu.Lock()
	ps := make([]*process, 0, len(a.procs))
	for _, p := range a.procs {
		ps = append(ps, p)
	}
	a.mu.Unlock()
	out := proto.ProcessList{Items: []proto.Process{}}
	for _, p := range ps {
		if st := p.status(); st.State == proto.ProcRunning {
			out.Items = append(out.Items, st)
		}
	}
	sort.Slice(out.Items, func(i, j int) bool { return out.Items[i].CreatedAt.Before(out.Items[j].CreatedAt) })
	return out
}

// exitedWindow is the output an exited process retains while the budget
// allows (the window's documented floor).
const exitedWindow = 1 << 20

// forgetOld drops exited processes older than KeepExited, and the oldest
// exited ones beyond MaxExited, and fits the output exited processes retain
// into ExitedOutputBytes.
func (a *Agent) forgetOld() {
	a.mu.Lock()
	defer a.mu.Unlock()
	type ex struct {
		id string
		at time.Time
	}
	var exited []ex
	now := time.Now()
	for id, p := range a.procs {
		st := p.status()
		if st.State == proto.ProcPending && now.Sub(st.CreatedAt) > a.cfg.KeepPending {
			delete(a.procs, id) // never attached to: abandoned
			continue
		}
		if st.State != proto.ProcExited || st.ExitedAt == nil {
			continue
		}
		if now.Sub(*st.ExitedAt) > a.cfg.KeepExited {
			delete(a.procs, id)
			continue
		}
		exited = append(exited, ex{id, *st.ExitedAt})
	}
	sort.Slice(exited, func(i, j int) bool { return exited[i].at.Before(exited[j].at) })
	if len(exited) > a.cfg.MaxExited {
		for _, e := range exited[:len(exited)-a.cfg.MaxExited] {
			delete(a.procs, e.id)
		}
		exited = exited[len(exited)-a.cfg.MaxExited:]
	}
	budget := a.cfg.ExitedOutputBytes
	for i := len(exited) - 1; i >= 0; i-- { // the most recently exited first
		budget -= a.procs[exited[i].id].out.shrink(max(0, min(exitedWindow, budget)))
	}
}

func (a *Agent) read(ctx context.Context, req proto.ReadRequest) (any, []byte, error) {
	p, err := a.lookup(req.ID)
	if err != nil {
		return nil, nil, err
	}
	if req.MaxBytes <= 0 || req.MaxBytes > proto.MaxBlob {
		req.MaxBytes = proto.MaxBlob
	}
	if req.Wait > 30*time.Second {
		req.Wait = 30 * time.Second
	}
	resync, cs, exhausted := p.out.read(ctx, req.After, req.MaxBytes, req.Wait, req.Subscriber)
	res, blob := toResult(resync, cs)
	if exhausted {
		st := p.status()
		res.Exited = &st
	}
	return res, blob, nil
}

func (a *Agent) stdin(id string, data []byte, closeIt bool) error {
	p, err := a.lookup(id)
	if err != nil {
		return err
	}
	p.mu.Lock()
	w, state := p.stdin, p.state
	p.mu.Unlock()
	if !p.spec.Stdin {
		return proto.Errorf(proto.CodeFailedPrecondition, "process %s was created without stdin", id)
	}
	if state != proto.ProcRunning || w == nil {
		return proto.Errorf(proto.CodeFailedPrecondition, "process %s is %s", id, state)
	}
	if len(data) > 0 {
		if _, err := w.Write(data); err != nil {
			return proto.Errorf(proto.CodeFailedPrecondition, "stdin: %v", err)
		}
	}
	if closeIt {
		if p.spec.PTY != nil {
			// A terminal has no separate stdin to close: send end-of-file.
			_, err = w.Write([]byte{4})
			return err
		}
		w.Close()
	}
	return nil
}
