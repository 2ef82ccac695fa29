package agentclient

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"
)

// Endpoint is the host's listening end of one sandbox's agent channel: a
// unix socket the agent dials. The host stays the listener, so after the
// sandbox is restored (or the server restarts) the agent simply dials again
// and Client returns the new connection.
type Endpoint struct {
	path string
	// keyPath is the host-only file holding the key the sandbox's agent
	// was bound to ("": no authentication, as for a template's VM whose
	// memory becomes many sandboxes).
	keyPath string
	ln      net.Listener
	log     *slog.Logger

	mu      sync.Mutex // guards cur, changed, closed
	cur     *Client
	changed chan struct{} // closed when cur changes
	closed  bool
	done    chan struct{}
}

// Listen creates the socket at path (replacing a stale one) and accepts
// agent connections in the background. A path starting with "@" names an
// abstract socket (no file).
func Listen(path string, log *slog.Logger) (*Endpoint, error) {
	return ListenBound(path, "", log)
}

// ListenBound is Listen with agent authentication: the first agent to
// connect after boot is handed a fresh key (kept at keyPath, on the host
// only); every later connection must prove it holds that key, so a process
// inside the sandbox that dials the socket cannot take the agent's place.
// An agent from before keys (it proves nothing on its binding connection)
// is accepted unbound.
func ListenBound(path, keyPath string, log *slog.Logger) (*Endpoint, error) {
	abstract := strings.HasPrefix(path, "@")
	if !abstract {
		os.Remove(path)
	}
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("listen for agent on %s: %w", path, err)
	}
	if !abstract {
		if err := os.Chmod(path, 0o600); err != nil {
			ln.Close()
			return nil, err
		}
	}
	e := &Endpoint{path: path, keyPath: keyPath, ln: ln, log: log, changed: make(chan struct{}), done: make(chan struct{})}
	go e.accept()
	return e, nil
}

func (e *Endpoint) accept() {
	defer close(e.done)
	for {
		conn, err := e.ln.Accept()
		if err != nil {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		key, bind := e.key(), []byte(nil)
		if key == nil && e.keyPath != "" {
			bind = make([]byte, 32)
			rand.Read(bind)
		}
		c, err := DialBind(ctx, conn, bind)
		cancel()
		if err != nil {
			e.log.Warn("agent handshake failed", "socket", e.path, "err", err)
			continue
		}
		switch {
		case key != nil && !c.Proves(key):
			e.log.Warn("refused an agent connection that cannot prove the agent's key (a process in the sandbox dialled its socket?)", "socket", e.path)
			c.Close()
			continue
		case bind != nil && c.Proves(bind):
			if err := writeKey(e.keyPath, bind); err != nil {
				e.log.Warn("keep agent key", "err", err)
			}
		}
		e.mu.Lock()
		if e.closed {
			e.mu.Unlock()
			c.Close()
			return
		}
		old := e.cur
		e.cur = c
		close(e.changed)
		e.changed = make(chan struct{})
		e.mu.Unlock()
		if old != nil {
			old.Close()
		}
	}
}

// key is the key the sandbox's agent was bound to (nil: not bound).
func (e *Endpoint) key() []byte {
	if e.keyPath == "" {
		return nil
	}
	k, err := os.ReadFile(e.keyPath)
	if err != nil || len(k) < 16 {
		return nil
	}
	return k
}

func writeKey(path string, key []byte) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, key, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// Client returns the current live connection, waiting for the agent to dial
// in until ctx ends.
func (e *Endpoint) Client(ctx context.Context) (*Client, error) {
	for {
		e.mu.Lock()
		if e.closed {
			e.mu.Unlock()
			return nil, ErrClosed
		}
		c, ch := e.cur, e.changed
		e.mu.Unlock()
		if c != nil {
			select {
			case <-c.Done():
			default:
				return c, nil
			}
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return nil, fmt.Errorf("wait for the agent to connect: %w", ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Close stops listening and closes the current connection.
func (e *Endpoint) Close() error {
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return nil
	}
	e.closed = true
	c := e.cur
	e.mu.Unlock()
	err := e.ln.Close()
	<-e.done
	if c != nil {
		c.Close()
	}
	if !strings.HasPrefix(e.path, "@") {
		os.Remove(e.path)
	}
	return err
}

// Endpoints is a runtime's set of per-sandbox endpoints, each listening at
// the path socket(id) gives. Safe for concurrent use.
type Endpoints struct {
	socket func(id string) string
	// KeyFile, when set, names the host-only file of a sandbox's agent key
	// ("" for a sandbox whose agent is not bound): see ListenBound.
	KeyFile func(id string) string
	log     *slog.Logger

	mu   sync.Mutex // guards m, held
	m    map[string]*Endpoint
	held map[string]chan struct{} // closed when the hold ends
}

// NewEndpoints returns an empty set.
func NewEndpoints(socket func(id string) string, log *slog.Logger) *Endpoints {
	return &Endpoints{socket: socket, log: log, m: map[string]*Endpoint{}, held: map[string]chan struct{}{}}
}

// Get returns a sandbox's endpoint, listening first if needed; it ends a
// Hold.
func (s *Endpoints) Get(id string) (*Endpoint, error) {
	ep, _, err := s.get(id, true)
	return ep, err
}

// get is Get; unless release, a held endpoint is not listened on: get
// returns the channel that closes when the hold ends instead.
func (s *Endpoints) get(id string, release bool) (*Endpoint, <-chan struct{}, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if release {
		s.release(id)
	} else if ch, held := s.held[id]; held {
		return nil, ch, nil
	}
	if ep, ok := s.m[id]; ok {
		return ep, nil, nil
	}
	path := s.socket(id)
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, nil, err
	}
	keyPath := ""
	if s.KeyFile != nil {
		keyPath = s.KeyFile(id)
	}
	ep, err := ListenBound(path, keyPath, s.log.With("sandbox_id", id))
	if err != nil {
		return nil, nil, err
	}
	s.m[id] = ep
	return ep, nil, nil
}

// Close stops listening for a sandbox's agent and drops its connection;
// it ends a Hold.
func (s *Endpoints) Close(id string) {
	s.close(id, false)
}

// Hold is Close that keeps the endpoint closed until the next Get: Client
// waits meanwhile instead of listening again. A runtime saving a sandbox
// holds its endpoint, so no caller lets the agent dial in (and start a
// session the save would catch half-way) before the save is done.
func (s *Endpoints) Hold(id string) {
	s.close(id, true)
}

func (s *Endpoints) close(id string, hold bool) {
	s.mu.Lock()
	ep := s.m[id]
	delete(s.m, id)
	s.release(id)
	if hold {
		s.held[id] = make(chan struct{})
	}
	s.mu.Unlock()
	if ep != nil {
		ep.Close()
	}
}

// release ends a hold of id. Precondition: s.mu held.
func (s *Endpoints) release(id string) {
	if ch, ok := s.held[id]; ok {
		close(ch)
		delete(s.held, id)
	}
}

// CloseAll closes every endpoint.
func (s *Endpoints) CloseAll() {
	s.mu.Lock()
	ids := make([]string, 0, len(s.m))
	for id := range s.m {
		ids = append(ids, id)
	}
	s.mu.Unlock()
	for _, id := range ids {
		s.Close(id)
	}
}

// Client returns a sandbox's live agent connection, waiting until ctx ends
// (and while the endpoint is held).
func (s *Endpoints) Client(ctx context.Context, id string) (*Client, error) {
	for {
		ep, held, err := s.get(id, false)
		if err != nil {
			return nil, err
		}
		if ep != nil {
			return ep.Client(ctx)
		}
		select {
		case <-held:
		case <-ctx.Done():
			return nil, fmt.Errorf("wait for the agent to connect: %w", ctx.Err())
		}
	}
}

// AnswerTimeout bounds how long Wait lets a connected agent take to answer
// a trivial call before it treats the connection as dead.
var AnswerTimeout = 10 * time.Second

// Wait waits until a sandbox's agent answers a call. A connection that
// finished its handshake but does not answer (the agent dropped that
// session) is hung up, so the agent dials again (a VM's QEMU reconnects),
// instead of waiting on it until ctx ends.
func (s *Endpoints) Wait(ctx context.Context, id string) error {
	for {
		c, err := s.Client(ctx, id)
		if err != nil {
			return err
		}
		actx, cancel := context.WithTimeout(ctx, AnswerTimeout)
		_, err = c.Info(actx)
		cancel()
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return fmt.Errorf("agent of %s: %w", id, err)
		}
		s.log.Warn("agent connected but does not answer; hanging up so it reconnects", "sandbox_id", id, "err", err)
		c.Close()
	}
}

// ErrHostEnded: the sandbox's host process (gVisor's sandbox process, the
// VM's QEMU) ended while its agent was waited for.
var ErrHostEnded = errors.New("the sandbox's process ended before its agent answered")

// WaitAlive is Wait that gives up as soon as alive says the sandbox's host
// process has ended (asked every 50 ms): a sandbox that dies while it
// starts or wakes was otherwise waited for until ctx ended — an operation's
// timeout, ten minutes by default.
func (s *Endpoints) WaitAlive(ctx context.Context, id string, alive func() bool) error {
	if !alive() {
		return fmt.Errorf("%s: %w", id, ErrHostEnded)
	}
	wctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	go func() {
		t := time.NewTicker(50 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-wctx.Done():
				return
			case <-t.C:
			}
			if !alive() {
				cancel(fmt.Errorf("%s: %w", id, ErrHostEnded))
				return
			}
		}
	}()
	err := s.Wait(wctx, id)
	if cause := context.Cause(wctx); err != nil && ctx.Err() == nil && errors.Is(cause, ErrHostEnded) {
		return cause
	}
	return err
}
