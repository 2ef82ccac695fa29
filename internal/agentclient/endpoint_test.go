package agentclient_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/spacesandbox/space/internal/agent"
	"github.com/spacesandbox/space/internal/agent/proto"
	"github.com/spacesandbox/space/internal/agentclient"
)

// muteAgent is a FAULT-INJECTION stand-in for an agent that dropped its
// session after the handshake: it answers the hello, then never replies.
// It reports when the host hangs up.
func muteAgent(t *testing.T, path string, hungUp chan<- struct{}) {
	conn, err := net.Dial("unix", path)
	if err != nil {
		t.Error(err)
		return
	}
	defer conn.Close()
	r, w := proto.NewReader(conn), proto.NewWriter(conn)
	if _, err := r.Read(); err != nil {
		t.Error(err)
		return
	}
	if err := w.Write(proto.TypeHello, 0, proto.Hello{Version: proto.Version, Agent: "mute", Ready: true}, nil); err != nil {
		t.Error(err)
		return
	}
	for {
		if _, err := r.Read(); err != nil {
			if errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) {
				close(hungUp)
			}
			return
		}
	}
}

// Wait hangs up on an agent connection that finished its handshake but
// does not answer, and succeeds once the agent has dialled again.
func TestWaitHangsUpOnAMuteConnection(t *testing.T) {
	defer func(d time.Duration) { agentclient.AnswerTimeout = d }(agentclient.AnswerTimeout)
	agentclient.AnswerTimeout = 200 * time.Millisecond
	dir := t.TempDir()
	eps := agentclient.NewEndpoints(func(id string) string { return filepath.Join(dir, id+".sock") }, slog.New(slog.DiscardHandler))
	defer eps.CloseAll()
	if _, err := eps.Get("sbx"); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "sbx.sock")
	hungUp := make(chan struct{})
	go muteAgent(t, path, hungUp)
	a, err := agent.New(agent.Config{Root: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	go func() {
		<-hungUp // the real agent dials once the mute one was hung up on
		conn, err := net.Dial("unix", path)
		if err != nil {
			t.Error(err)
			return
		}
		a.Serve(ctx, conn)
	}()
	if err := eps.Wait(ctx, "sbx"); err != nil {
		t.Fatalf("Wait = %v", err)
	}
	select {
	case <-hungUp:
	default:
		t.Fatal("the mute connection was not hung up")
	}
}

// The first agent to connect after boot is bound to a key kept on the host;
// later, a process that dials the socket without that key is refused (#14
// item 15), while the agent itself — reconnecting, or after the host's
// restart (a new endpoint reading the kept key) — is accepted.
func TestAgentKeyRefusesAnImpostor(t *testing.T) {
	dir := t.TempDir()
	sock, keyPath := filepath.Join(dir, "sbx.sock"), filepath.Join(dir, "agent.key")
	log := slog.New(slog.DiscardHandler)
	a, err := agent.New(agent.Config{Root: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	connect := func() context.CancelFunc { // the genuine agent dials
		sctx, stop := context.WithCancel(ctx)
		conn, err := net.Dial("unix", sock)
		if err != nil {
			t.Fatal(err)
		}
		go a.Serve(sctx, conn)
		return stop
	}
	ep, err := agentclient.ListenBound(sock, keyPath, log)
	if err != nil {
		t.Fatal(err)
	}
	stop := connect()
	c, err := ep.Client(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Info(ctx); err != nil {
		t.Fatal(err)
	}
	if k, err := os.ReadFile(keyPath); err != nil || len(k) != 32 {
		t.Fatalf("agent key not kept: %v", err)
	}
	// An impostor: another agent (a process in the sandbox running its own
	// copy) with no key dials in; the genuine connection stays current.
	impostor, _ := agent.New(agent.Config{Root: t.TempDir()})
	defer impostor.Close()
	iconn, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan struct{})
	go func() { impostor.Serve(ctx, iconn); close(served) }()
	select {
	case <-served: // the host hung up on it
	case <-time.After(10 * time.Second):
		t.Fatal("the host kept an impostor's connection")
	}
	if cur, err := ep.Client(ctx); err != nil || cur != c {
		t.Fatalf("the impostor took the agent's place: %v", err)
	}
	// The host restarts: a new endpoint with the kept key accepts the
	// genuine agent's new connection.
	stop()
	ep.Close()
	ep2, err := agentclient.ListenBound(sock, keyPath, log)
	if err != nil {
		t.Fatal(err)
	}
	defer ep2.Close()
	defer connect()()
	c2, err := ep2.Client(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c2.Info(ctx); err != nil {
		t.Fatalf("the genuine agent after a host restart: %v", err)
	}
}

// WaitAlive gives up as soon as the sandbox's host process is said to have
// ended (a FAULT-INJECTION liveness that turns false), where Wait would
// wait for the agent until the context ends; with the host alive and the
// agent connecting, it succeeds as Wait does.
func TestWaitAliveGivesUpWhenTheHostEnds(t *testing.T) {
	dir := t.TempDir()
	eps := agentclient.NewEndpoints(func(id string) string { return filepath.Join(dir, id+".sock") }, slog.New(slog.DiscardHandler))
	defer eps.CloseAll()
	if _, err := eps.Get("sbx"); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var ended atomic.Bool
	time.AfterFunc(100*time.Millisecond, func() { ended.Store(true) })
	err := eps.WaitAlive(ctx, "sbx", func() bool { return !ended.Load() })
	if !errors.Is(err, agentclient.ErrHostEnded) || ctx.Err() != nil {
		t.Fatalf("WaitAlive with the host gone = %v (context: %v)", err, ctx.Err())
	}

	a, err := agent.New(agent.Config{Root: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	go func() {
		conn, err := net.Dial("unix", filepath.Join(dir, "sbx.sock"))
		if err != nil {
			t.Error(err)
			return
		}
		a.Serve(ctx, conn)
	}()
	if err := eps.WaitAlive(ctx, "sbx", func() bool { return true }); err != nil {
		t.Fatalf("WaitAlive with the host alive = %v", err)
	}
}
