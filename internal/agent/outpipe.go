package agent

import (
	"io"
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// outPipe is a pipe for a process's output: the child writes to w (an
// ordinary blocking pipe), the agent reads r with plain read(2) and waits
// with poll(2) only when the pipe is empty.
//
// An *os.File from os.Pipe would sit in Go's poller, whose epoll watch is
// woken by every write into the pipe while the agent waits for anything —
// including while pump sleeps to let output gather. Under gVisor each such
// wakeup is a context switch on the sandbox's CPU: for `head -c` (8 KiB
// writes) that cost the writing process a third of its speed (measured in
// a sandbox: 256 MiB through os.Pipe in 3.1–4.2 s, through this in
// 2.2–2.6 s; into /dev/null 1.8 s). Here nothing watches the pipe between
// reads.
//
// Close ends a Read blocked in poll (through an eventfd), as closing an
// *os.File ends a read in the poller: a background child that keeps the
// pipe open after its parent exited must not hold the output's end.
type outPipe struct {
	fd, stop int
	mu       sync.Mutex
	closed   bool
	reading  int // Reads in progress: the descriptors go when the last ends
}

// newOutPipe makes a pipe of about size bytes (best effort) and returns its
// read end and the child's write end.
func newOutPipe(size int) (*outPipe, *os.File, error) {
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		return nil, nil, err
	}
	stop, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		unix.Close(p[0])
		unix.Close(p[1])
		return nil, nil, err
	}
	// The read end alone is non-blocking (its own open file description);
	// the child's stays blocking, as a process expects its stdout.
	unix.SetNonblock(p[0], true)
	unix.FcntlInt(uintptr(p[0]), unix.F_SETPIPE_SZ, size)
	return &outPipe{fd: p[0], stop: stop}, os.NewFile(uintptr(p[1]), "|1"), nil
}

// Read reads what the pipe holds, waiting for something when it is empty;
// io.EOF once every writer closed it, os.ErrClosed once Close was called.
func (p *outPipe) Read(b []byte) (int, error) {
	if !p.enter() {
		return 0, os.ErrClosed
	}
	defer p.readDone()
	if len(b) == 0 {
		return 0, nil
	}
	for {
		n, err := unix.Read(p.fd, b)
		switch {
		case err == nil && n == 0:
			return 0, io.EOF
		case err == nil:
			return n, nil
		case err == unix.EINTR:
			continue
		case err != unix.EAGAIN:
			return 0, &os.PathError{Op: "read", Path: "|0", Err: err}
		}
		fds := []unix.PollFd{{Fd: int32(p.fd), Events: unix.POLLIN}, {Fd: int32(p.stop), Events: unix.POLLIN}}
		if _, err := unix.Poll(fds, -1); err != nil && err != unix.EINTR {
			return 0, &os.PathError{Op: "poll", Path: "|0", Err: err}
		}
		if fds[1].Revents != 0 {
			return 0, os.ErrClosed
		}
	}
}

// linger waits d for output to gather (pump), or less: it ends as soon as
// every writer closed the pipe, or Close was called, so a process's last
// output and its end are read at once. Writes into the pipe do not end it
// (nor wake anyone: poll asks only for the hang-up).
func (p *outPipe) linger(d time.Duration) {
	if !p.enter() {
		return
	}
	defer p.readDone()
	fds := []unix.PollFd{{Fd: int32(p.fd)}, {Fd: int32(p.stop), Events: unix.POLLIN}}
	deadline := time.Now().Add(d)
	for left := d; left > 0; left = time.Until(deadline) {
		if _, err := unix.Poll(fds, int((left+time.Millisecond-1)/time.Millisecond)); err != unix.EINTR {
			return
		}
	}
}

// enter counts a Read or linger in, unless the pipe is closed (false);
// readDone counts it out.
func (p *outPipe) enter() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	p.reading++
	return true
}

func (p *outPipe) readDone() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.reading--; p.reading == 0 && p.closed {
		p.release()
	}
}

// Close makes a waiting Read return, and Reads after it fail; the
// descriptors are closed once no Read runs.
func (p *outPipe) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil
	}
	p.closed = true
	if p.reading > 0 {
		var one = [8]byte{1}
		unix.Write(p.stop, one[:])
		return nil
	}
	p.release()
	return nil
}

func (p *outPipe) release() {
	unix.Close(p.fd)
	unix.Close(p.stop)
}
