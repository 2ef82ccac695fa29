// Package httpguard keeps slow and numerous clients from holding a
// listener: a cap on open connections (an authenticated stream gives its
// place back), and a request body that stops arriving ends its request.
// Header deadlines and idle timeouts are http.Server's own.
package httpguard

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// Listener caps the connections open at once on ln at max (0: no cap). A
// connection beyond it is closed as soon as it is accepted: the client sees
// its connection end instead of waiting in a queue it cannot see.
func Listener(ln net.Listener, max int) *Limited {
	return &Limited{Listener: ln, max: int64(max)}
}

// Limited is a listener with a connection cap.
type Limited struct {
	net.Listener
	max     int64
	open    atomic.Int64
	refused atomic.Int64
}

// Open is the number of connections that count against the cap.
func (l *Limited) Open() int64 { return l.open.Load() }

// Refused is the number of connections closed at once for the cap.
func (l *Limited) Refused() int64 { return l.refused.Load() }

func (l *Limited) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if n := l.open.Add(1); l.max > 0 && n > l.max {
			l.open.Add(-1)
			l.refused.Add(1)
			c.Close()
			continue
		}
		return &conn{Conn: c, l: l}, nil
	}
}

type conn struct {
	net.Conn
	l      *Limited
	once   sync.Once
	exempt atomic.Bool
}

// release gives the connection's place back (once).
func (c *conn) release() { c.once.Do(func() { c.l.open.Add(-1) }) }

func (c *conn) Close() error {
	c.release()
	return c.Conn.Close()
}

type connKey struct{}

// ConnContext is http.Server.ConnContext: it lets Exempt find a request's
// connection.
func ConnContext(ctx context.Context, c net.Conn) context.Context {
	if tc, ok := c.(*tls.Conn); ok {
		c = tc.NetConn()
	}
	return context.WithValue(ctx, connKey{}, c)
}

// Exempt takes an authenticated, long-lived request's connection (an event
// stream, a proxied WebSocket, a client stream) out of the cap and off the
// body deadline: many attached readers must not lock everyone else out,
// and a quiet stdin is not a slow client. ctx is the request's.
func Exempt(ctx context.Context) {
	if c, ok := ctx.Value(connKey{}).(*conn); ok {
		c.exempt.Store(true)
		c.release()
		c.Conn.SetReadDeadline(time.Time{})
	}
}

// BodyIdle ends a request whose body stops arriving for idle (0: never):
// each read that brings bytes moves the connection's read deadline on; the
// end of the body clears it.
func BodyIdle(h http.Handler, idle time.Duration) http.Handler {
	if idle <= 0 {
		return h
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Body != nil && r.Body != http.NoBody && r.ContentLength != 0 {
			rc := http.NewResponseController(w)
			c, _ := r.Context().Value(connKey{}).(*conn)
			if rc.SetReadDeadline(time.Now().Add(idle)) == nil {
				r.Body = &progressBody{ReadCloser: r.Body, rc: rc, idle: idle, c: c}
			}
		}
		h.ServeHTTP(w, r)
	})
}

type progressBody struct {
	io.ReadCloser
	rc   *http.ResponseController
	idle time.Duration
	c    *conn // nil when not a guarded listener's
	done bool
}

func (b *progressBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	switch {
	case b.c != nil && b.c.exempt.Load():
	case errors.Is(err, io.EOF) && !b.done:
		// All of it came: the connection's next request has its own
		// deadlines. (After a timeout the deadline stays passed, so the
		// server's drain of the rest fails at once and the connection
		// closes.)
		b.done = true
		b.rc.SetReadDeadline(time.Time{})
	case n > 0 && err == nil:
		b.rc.SetReadDeadline(time.Now().Add(b.idle))
	}
	return n, err
}
