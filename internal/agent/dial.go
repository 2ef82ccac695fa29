package agent

import (
	"context"
	"errors"
	"net"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"
)

// ServeUnix dials the host's listener at path and serves each connection,
// dialling again whenever one ends, until ctx ends.
//
// On SIGCONT it looks at the connection it serves and drops it when the host
// side is gone. A gVisor sandbox saved with `runsc checkpoint
// --leave-running` (the source of a fork or a snapshot) runs on with its
// host connections closed under it and no wakeup for anyone blocked on
// them: without a look the agent would wait on a dead connection forever.
// The host sends SIGCONT once the save is done (a signal every process
// tolerates: an agent from before this ignores it) and hears the agent
// dial again. A SIGCONT with the connection alive changes nothing.
func (a *Agent) ServeUnix(ctx context.Context, path string) error {
	var (
		mu  sync.Mutex
		cur *net.UnixConn
	)
	conts := make(chan os.Signal, 1)
	signal.Notify(conts, syscall.SIGCONT)
	defer signal.Stop(conts)
	a.redials.Store(true)
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-conts:
			}
			mu.Lock()
			if c := cur; c != nil && connGone(c) {
				a.log.Info("host connection found gone; dialling again")
				c.Close()
			}
			mu.Unlock()
		}
	}()

	// Redial quickly: after a restore the host is usually listening
	// already, and a long backoff saved into the snapshot would delay every
	// wake. A failed unix connect costs microseconds.
	b := newBackoff(2*time.Millisecond, 50*time.Millisecond)
	for {
		c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: path, Net: "unix"})
		if err != nil {
			if err := b.wait(ctx); err != nil {
				return err
			}
			continue
		}
		mu.Lock()
		cur = c
		mu.Unlock()
		err = a.Serve(ctx, c)
		mu.Lock()
		cur = nil
		mu.Unlock()
		c.Close()
		if errors.Is(err, ErrNoHost) {
			if err := b.wait(ctx); err != nil { // accepted and closed at once
				return err
			}
			continue
		}
		b.reset()
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if err != nil {
			a.log.Warn("host connection ended", "err", err)
		}
	}
}

// connGone reports whether c's peer is gone: a look without taking or
// waiting for anything (a peek that finds the end of the stream, or an
// error other than "nothing to read yet").
func connGone(c *net.UnixConn) bool {
	rc, err := c.SyscallConn()
	if err != nil {
		return true
	}
	gone := false
	if err := rc.Control(func(fd uintptr) {
		var b [1]byte
		n, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		gone = (n == 0 && err == nil) || (err != nil && err != syscall.EAGAIN && err != syscall.EINTR)
	}); err != nil {
		return true
	}
	return gone
}

// backoff is a wait that doubles from first up to most each time, until
// reset.
type backoff struct{ first, most, next time.Duration }

func newBackoff(first, most time.Duration) *backoff {
	return &backoff{first: first, most: most, next: first}
}

// wait sleeps for the current wait (ctx's error if it ends first) and
// doubles the next.
func (b *backoff) wait(ctx context.Context) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(b.next):
	}
	b.next = min(2*b.next, b.most)
	return nil
}

func (b *backoff) reset() { b.next = b.first }
