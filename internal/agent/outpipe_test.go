package agent

import (
	"errors"
	"io"
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func TestOutPipeReadsUntilEveryWriterClosed(t *testing.T) {
	r, w, err := newOutPipe(1 << 20)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	go func() {
		for i := 0; i < 64; i++ {
			w.Write(make([]byte, 8<<10))
			if i%8 == 0 {
				time.Sleep(time.Millisecond) // the reader finds the pipe empty and waits
			}
		}
		w.Close()
	}()
	n, err := io.Copy(io.Discard, r)
	if err != nil || n != 64*8<<10 {
		t.Fatalf("read %d bytes, err %v; want %d, nil (io.EOF at the end)", n, err, 64*8<<10)
	}
}

func TestOutPipeCloseEndsAWaitingReadAndLetsGoOfItsDescriptors(t *testing.T) {
	r, w, err := newOutPipe(1 << 16)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close() // a background child still holding the write end
	got := make(chan error, 1)
	go func() {
		_, err := r.Read(make([]byte, 16))
		got <- err
	}()
	time.Sleep(20 * time.Millisecond) // the Read waits in poll
	r.Close()
	select {
	case err := <-got:
		if !errors.Is(err, os.ErrClosed) {
			t.Fatalf("Read after Close: %v, want os.ErrClosed", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not end the waiting Read")
	}
	if _, err := unix.FcntlInt(uintptr(r.fd), unix.F_GETFD, 0); err != unix.EBADF {
		t.Fatalf("read end still open after Close and the Read ended (fcntl: %v)", err)
	}
	if _, err := r.Read(make([]byte, 1)); !errors.Is(err, os.ErrClosed) {
		t.Fatalf("Read after Close: %v, want os.ErrClosed", err)
	}
	if err := r.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}

func TestOutPipeGivesTheChildABlockingWriteEnd(t *testing.T) {
	r, w, err := newOutPipe(1 << 16)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	rc, err := w.SyscallConn() // not Fd: Fd itself makes it blocking
	if err != nil {
		t.Fatal(err)
	}
	var fl int
	rc.Control(func(fd uintptr) { fl, err = unix.FcntlInt(fd, unix.F_GETFL, 0) })
	if err != nil || fl&unix.O_NONBLOCK != 0 {
		t.Fatalf("write end flags %#x (err %v): want blocking", fl, err)
	}
}

func TestOutPipeLingerWaitsThroughWritesButNotPastTheWritersEnd(t *testing.T) {
	r, w, err := newOutPipe(1 << 20)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	go func() {
		for i := 0; i < 20; i++ {
			w.Write([]byte("x"))
			time.Sleep(time.Millisecond)
		}
	}()
	start := time.Now()
	r.linger(200 * time.Millisecond)
	if d := time.Since(start); d < 150*time.Millisecond {
		t.Fatalf("linger ended after %v with writes arriving; want it to wait them out (200 ms)", d)
	}
	start = time.Now()
	go func() { time.Sleep(20 * time.Millisecond); w.Close() }()
	r.linger(5 * time.Second)
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("linger ran %v past the writers' end", d)
	}
}
