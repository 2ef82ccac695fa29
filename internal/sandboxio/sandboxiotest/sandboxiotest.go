// Package sandboxiotest gives tests a real agent without a sandbox: the
// space-agent code serving in this process, confined to a temporary root,
// over a socket pair. File calls act on that directory; commands would run
// on the host, so tests use it for files and process bookkeeping only.
package sandboxiotest

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/spacesandbox/space/internal/agent"
	"github.com/spacesandbox/space/internal/agentclient"
	"github.com/spacesandbox/space/internal/sandboxio"
)

// Agent is a running in-process agent and the directory it is confined to.
type Agent struct {
	*sandboxio.Agent
	// Client is the raw protocol client (for the agent's own tests).
	Client *agentclient.Client
	// Root is the agent's "/" on the host.
	Root string
	// Stop ends the agent: later calls fail as with a sandbox whose agent
	// went away (Unavailable).
	Stop func()
}

// Start runs an agent over a fresh temporary root holding /etc/passwd with
// root's entry; it is stopped when the test ends.
func Start(t testing.TB) *Agent {
	t.Helper()
	root := t.TempDir()
	os.MkdirAll(filepath.Join(root, "etc"), 0o755)
	os.WriteFile(filepath.Join(root, "etc", "passwd"), []byte("root:x:0:0:root:/root:/bin/sh\n"), 0o644)
	return StartWith(t, agent.Config{Root: root})
}

// StartWith runs an agent configured by cfg; it is stopped when the test
// ends.
func StartWith(t testing.TB, cfg agent.Config) *Agent {
	t.Helper()
	a, err := agent.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	hostSide, agentSide := SocketPair(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { a.Serve(ctx, agentSide); close(done) }()
	c, err := agentclient.Dial(ctx, hostSide)
	if err != nil {
		t.Fatal(err)
	}
	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		c.Close()
		cancel()
		<-done
		a.Close()
	}
	t.Cleanup(stop)
	if !c.Hello().Ready {
		t.Fatal("agent not ready")
	}
	return &Agent{Agent: sandboxio.Wrap(c), Client: c, Root: cfg.Root, Stop: stop}
}

// SocketPair is a connected pair of unix stream sockets.
func SocketPair(t testing.TB) (net.Conn, net.Conn) {
	t.Helper()
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	conn := func(fd int) net.Conn {
		file := os.NewFile(uintptr(fd), "sock")
		defer file.Close()
		c, err := net.FileConn(file)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	return conn(fds[0]), conn(fds[1])
}
