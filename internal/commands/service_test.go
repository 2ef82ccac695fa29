package commands_test

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/spacesandbox/space/internal/commands"
	"github.com/spacesandbox/space/internal/errdefs"
	"github.com/spacesandbox/space/internal/ids"
	"github.com/spacesandbox/space/internal/lifecycle/enginetest"
	"github.com/spacesandbox/space/internal/sandbox"
	"github.com/spacesandbox/space/internal/sandboxio/sandboxiotest"
)

// world is a command service over the FAKE engine and a real agent serving
// in this process (its processes run on the host: only harmless commands).
type world struct {
	svc      *commands.Service
	eng      *enginetest.Engine
	agent    *sandboxiotest.Agent
	run, off *sandbox.Sandbox
}

func newWorld(t *testing.T) *world {
	e := enginetest.NewWorld(t)
	return &world{svc: e.Commands, eng: e.Engine, agent: e.IO, run: e.Engine.Add(sandbox.Running), off: e.Engine.Add(sandbox.Suspended)}
}

func TestCreateValidates(t *testing.T) {
	w := newWorld(t)
	bad := map[string]commands.CreateRequest{
		"no command":    {},
		"empty argv0":   {Command: []string{""}},
		"NUL argument":  {Command: []string{"echo", "a\x00b"}},
		"huge argv":     {Command: []string{strings.Repeat("x", 257<<10)}},
		"relative cwd":  {Command: []string{"true"}, Cwd: "tmp"},
		"bad env name":  {Command: []string{"true"}, Env: map[string]string{"1X": "y"}},
		"NUL env value": {Command: []string{"true"}, Env: map[string]string{"X": "a\x00"}},
		"bad timeout":   {Command: []string{"true"}, Timeout: "forever"},
		"long timeout":  {Command: []string{"true"}, Timeout: "25h"},
		"bad user":      {Command: []string{"true"}, User: "Root User"},
		"empty pty":     {Command: []string{"true"}, PTY: &commands.PTYRequest{}},
	}
	for name, req := range bad {
		if _, err := w.svc.Create(context.Background(), w.run.ID, req); !errors.Is(err, errdefs.InvalidArgument) {
			t.Errorf("%s: %v, want invalid_argument", name, err)
		}
	}
}

func TestCreateNeedsARunningSandboxAndAnAgent(t *testing.T) {
	w := newWorld(t)
	req := commands.CreateRequest{Command: []string{"true"}}
	if _, err := w.svc.Create(context.Background(), ids.New(ids.Sandbox), req); !errors.Is(err, errdefs.NotFound) {
		t.Fatalf("unknown sandbox: %v", err)
	}
	if _, err := w.svc.Create(context.Background(), w.off.ID, req); !errors.Is(err, errdefs.FailedPrecondition) {
		t.Fatalf("suspended sandbox: %v", err)
	}
	w.agent.Stop()
	if _, err := w.svc.Create(context.Background(), w.run.ID, req); !errors.Is(err, errdefs.Unavailable) {
		t.Fatalf("agent gone: %v", err)
	}
}

// A session is registered but not started: it is not listed or found until
// a reader attaches; its token names it and the URL is the data plane's.
func TestSessionStartsOnAttach(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	sess, err := w.svc.Create(ctx, w.run.ID, commands.CreateRequest{Command: []string{"sh", "-c", "echo out; echo err >&2; exit 3"}})
	if err != nil {
		t.Fatal(err)
	}
	if sess.Attach.URL != enginetest.DataPlaneURL+"/v1/sessions/"+sess.SessionID+"/events" {
		t.Fatalf("attach URL %q", sess.Attach.URL)
	}
	claims, err := w.svc.Signer().Verify(sess.Attach.Token, sess.SessionID)
	if err != nil || claims.Sandbox != w.run.ID {
		t.Fatalf("token: %+v %v", claims, err)
	}
	if _, err := w.svc.Get(ctx, w.run.ID, sess.ProcessID); !errors.Is(err, errdefs.NotFound) {
		t.Fatalf("get before attach: %v", err)
	}
	if err := w.svc.Signal(ctx, w.run.ID, sess.ProcessID, "SIGTERM"); !errors.Is(err, errdefs.NotFound) {
		t.Fatalf("signal before attach: %v", err)
	}
	var out, errOut bytes.Buffer
	var exited *int
	started := false
	err = w.svc.Follow(ctx, w.run.ID, sess.ProcessID, 0, time.Second, true, func(ev commands.Event) error {
		switch {
		case ev.Started != nil:
			started = true
		case ev.Exited != nil:
			exited = ev.Exited.ExitCode
		case ev.Stream == "stderr":
			errOut.Write(ev.Data)
		case ev.Data != nil:
			out.Write(ev.Data)
		}
		return nil
	})
	if err != nil || !started || exited == nil || *exited != 3 || out.String() != "out\n" || errOut.String() != "err\n" {
		t.Fatalf("follow: err %v started %v exit %v out %q err %q", err, started, exited, out.String(), errOut.String())
	}
	p, err := w.svc.Get(ctx, w.run.ID, sess.ProcessID)
	if err != nil || p.State != "exited" || p.ExitCode == nil || *p.ExitCode != 3 || strings.Join(p.Command, " ") != "sh -c echo out; echo err >&2; exit 3" {
		t.Fatalf("get after exit: %+v %v", p, err)
	}
}

func TestSignal(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	if err := w.svc.Signal(ctx, w.run.ID, ids.New(ids.Process), ""); !errors.Is(err, errdefs.InvalidArgument) {
		t.Fatalf("no signal: %v", err)
	}
	if err := w.svc.Signal(ctx, w.run.ID, ids.New(ids.Process), "SIGTERM"); !errors.Is(err, errdefs.NotFound) {
		t.Fatalf("unknown process: %v", err)
	}
	if err := w.svc.Signal(ctx, w.off.ID, ids.New(ids.Process), "SIGTERM"); !errors.Is(err, errdefs.FailedPrecondition) {
		t.Fatalf("suspended sandbox: %v", err)
	}
}

// A sandbox that stops running ends Follow with an error (the stream is
// incomplete; the client resumes after wake), never a fake exit.
func TestFollowEndsWhenTheAgentGoes(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	sess, err := w.svc.Create(ctx, w.run.ID, commands.CreateRequest{Command: []string{"sleep", "3"}})
	if err != nil {
		t.Fatal(err)
	}
	exited := false
	err = w.svc.Follow(ctx, w.run.ID, sess.ProcessID, 0, 100*time.Millisecond, true, func(ev commands.Event) error {
		if ev.Started != nil {
			// The sandbox is suspended under the reader and its agent goes.
			if _, err := w.eng.Suspend(ctx, w.run.ID, nil); err != nil {
				t.Fatal(err)
			}
			w.agent.Stop()
		}
		exited = exited || ev.Exited != nil
		return nil
	})
	if err == nil || exited {
		t.Fatalf("follow of a suspended sandbox: err %v, exited %v", err, exited)
	}
}
