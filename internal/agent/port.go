package agent

import (
	"context"
	"errors"
	"io"
	"os"
	"sync"
	"time"
)

// portFile is an open serial port: *os.File in a VM.
type portFile interface {
	io.ReadWriteCloser
	SetReadDeadline(time.Time) error
}

// ServePort serves the host on a VM's virtio-serial port (path) until ctx
// ends. The port stays open between sessions and while no host is
// connected: a closed port makes the guest's driver discard what arrives,
// and a hello the host sends in that moment would be lost (the host would
// wait out its handshake timeout and dial again). It is reopened only after
// a session broke off with a protocol error, to start from a clean stream.
func (a *Agent) ServePort(ctx context.Context, path string) error {
	return a.servePort(ctx, func() (portFile, error) { return os.OpenFile(path, os.O_RDWR, 0) })
}

// Waits between reads of a port with no host: the wait ends when the host
// connects, which after a restore is at once, so it stays short.
const (
	portFirstWait = time.Millisecond
	portMostWait  = 5 * time.Millisecond
)

func (a *Agent) servePort(ctx context.Context, open func() (portFile, error)) error {
	var f portFile
	defer func() {
		if f != nil {
			f.Close()
		}
	}()
	b := newBackoff(portFirstWait, portMostWait)
	for {
		if f == nil {
			var err error
			if f, err = open(); err != nil {
				f = nil
				if err := b.wait(ctx); err != nil {
					return err
				}
				continue
			}
		}
		f.SetReadDeadline(time.Time{})
		k := &keepOpen{f: f}
		err := a.Serve(ctx, k)
		k.end()
		switch {
		case ctx.Err() != nil:
			return ctx.Err()
		case errors.Is(err, ErrNoHost):
			// A port whose host side is not connected reads as end of
			// file at once: wait for the host, quietly, port open.
			if err := b.wait(ctx); err != nil {
				return err
			}
			continue
		case err != nil:
			a.log.Warn("host connection ended", "err", err)
			f.Close()
			f = nil
		}
		b.reset()
	}
}

// keepOpen hands a port to one Serve call without letting it close it:
// Close only interrupts that call's pending read. Serve closes its
// connection from a goroutine that may run after Serve returned; once the
// call has ended (end), Close does nothing, so a late Close can never cut
// the reads of the next session.
type keepOpen struct {
	f     portFile
	mu    sync.Mutex // guards ended
	ended bool
}

func (k *keepOpen) Read(b []byte) (int, error)  { return k.f.Read(b) }
func (k *keepOpen) Write(b []byte) (int, error) { return k.f.Write(b) }

func (k *keepOpen) Close() error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if !k.ended {
		k.f.SetReadDeadline(time.Now())
	}
	return nil
}

func (k *keepOpen) end() {
	k.mu.Lock()
	k.ended = true
	k.mu.Unlock()
}
