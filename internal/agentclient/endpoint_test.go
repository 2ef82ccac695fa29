package agentclient_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"path/filepath"
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
