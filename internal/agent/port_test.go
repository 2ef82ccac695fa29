package agent

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/spacesandbox/space/internal/agent/proto"
)

// scriptedPort is a FAKE serial port (a real virtio port cannot be made to
// drop its host on cue in a unit test): each Read takes the next step of
// the script, nil meaning "no host: end of file"; once the script is done
// every Read is end of file.
type scriptedPort struct {
	mu      sync.Mutex
	steps   [][]byte
	written bytes.Buffer
	closed  bool
	expired bool // a read deadline in the past is set
}

func (p *scriptedPort) Read(b []byte) (int, error) {
	time.Sleep(100 * time.Microsecond)
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return 0, io.ErrClosedPipe
	}
	if p.expired {
		return 0, os.ErrDeadlineExceeded
	}
	if len(p.steps) == 0 {
		return 0, io.EOF
	}
	s := p.steps[0]
	if s == nil {
		p.steps = p.steps[1:]
		return 0, io.EOF
	}
	n := copy(b, s)
	if n == len(s) {
		p.steps = p.steps[1:]
	} else {
		p.steps[0] = s[n:]
	}
	return n, nil
}

func (p *scriptedPort) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.written.Write(b)
}

func (p *scriptedPort) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	return nil
}

func (p *scriptedPort) SetReadDeadline(t time.Time) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.expired = !t.IsZero() && !t.After(time.Now())
	return nil
}

func (p *scriptedPort) hellos(t *testing.T) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	r := proto.NewReader(bytes.NewReader(p.written.Bytes()))
	n := 0
	for {
		f, err := r.Read()
		if err != nil {
			return n
		}
		if f.Type == proto.TypeHello {
			n++
		}
	}
}

func frame(t *testing.T, typ proto.Type, v any) []byte {
	var b bytes.Buffer
	if err := proto.NewWriter(&b).Write(typ, 0, v, nil); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// The port stays open while no host is there and between sessions (a
// closed virtio port discards what the host sends), and is reopened only
// after a session broke off with a protocol error.
func TestServePortKeepsThePortOpen(t *testing.T) {
	a, err := New(Config{Root: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	hello := frame(t, proto.TypeHello, proto.Hello{Versions: []int{proto.Version}})
	bad := frame(t, proto.TypeReply, proto.Reply{}) // a host never sends replies
	first := &scriptedPort{steps: [][]byte{nil, nil, nil, hello, nil, nil, hello, nil, hello, bad}}
	second := &scriptedPort{steps: [][]byte{nil, hello}}
	var mu sync.Mutex
	opens := []*scriptedPort{first, second}
	opened := 0
	open := func() (portFile, error) {
		mu.Lock()
		defer mu.Unlock()
		if opened == len(opens) {
			t.Errorf("port opened a %d. time", opened+1)
			return nil, io.ErrClosedPipe
		}
		opened++
		return opens[opened-1], nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- a.servePort(ctx, open) }()
	deadline := time.Now().Add(10 * time.Second)
	for first.hellos(t) < 3 || second.hellos(t) < 1 {
		if time.Now().After(deadline) {
			t.Fatalf("hellos answered: %d on the first opening, %d on the second", first.hellos(t), second.hellos(t))
		}
		time.Sleep(time.Millisecond)
	}
	cancel()
	if err := <-done; err != context.Canceled {
		t.Fatalf("servePort = %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if opened != 2 || !first.closed {
		t.Fatalf("opened %d times, first closed %v: want the port kept open across sessions and reopened after the protocol error", opened, first.closed)
	}
}

// Serve closes its connection from a goroutine that may run after Serve
// returned; such a late Close must not cut the next session's reads.
func TestKeepOpenIgnoresALateClose(t *testing.T) {
	p := &scriptedPort{steps: [][]byte{[]byte("x")}}
	k := &keepOpen{f: p}
	k.end()
	k.Close()
	if n, err := (&keepOpen{f: p}).Read(make([]byte, 1)); n != 1 || err != nil {
		t.Fatalf("read after a late Close = %d, %v", n, err)
	}
	k2 := &keepOpen{f: p}
	k2.Close() // while its call runs: interrupts the read
	if _, err := k2.Read(make([]byte, 1)); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read after Close during the call = %v, want a deadline error", err)
	}
}
