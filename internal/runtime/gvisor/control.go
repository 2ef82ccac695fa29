//go:build linux

package gvisor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/spacesandbox/space/internal/runtime"
)

// control calls method (no argument, no result) on the sandbox's runsc
// control server, as the runsc CLI does but without starting a runsc
// process (5-10 ms each here): the server's protocol (gVisor's urpc) is one
// JSON object each way over a unix stream socket that runsc creates as
// runsc-<id>.sock in its root directory.
func (r *Runtime) control(ctx context.Context, id, method string) error {
	return r.call(ctx, id, method, nil)
}

// signalArgs is the argument of containerManager.Signal (gVisor's
// boot.SignalArgs; Mode 0 delivers to the one process).
type signalArgs struct {
	CID   string
	Signo int32
	PID   int32
	Mode  int
}

// signal sends sig to the sandbox's init process (its agent), as `runsc
// kill` does, through the control server.
func (r *Runtime) signal(ctx context.Context, id string, sig syscall.Signal) error {
	return r.call(ctx, id, "containerManager.Signal", signalArgs{CID: id, Signo: int32(sig)})
}

// call calls method with arg (nil: none; no result) on the sandbox's runsc
// control server.
func (r *Runtime) call(ctx context.Context, id, method string, arg any) error {
	path := filepath.Join(r.cfg.Dir, "runsc", "runsc-"+id+".sock")
	addr := path
	if len(path) >= 108 { // past sun_path: reach it through a descriptor, as runsc does
		fd, err := syscall.Open(path, unix.O_PATH|syscall.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("control socket of %s: %w", id, err)
		}
		defer syscall.Close(fd)
		addr = fmt.Sprintf("/proc/self/fd/%d", fd)
	}
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", addr)
	if err != nil {
		return fmt.Errorf("control socket of %s: %w", id, err)
	}
	defer conn.Close()
	deadline := time.Now().Add(10 * time.Second)
	if dl, ok := ctx.Deadline(); ok && dl.Before(deadline) {
		deadline = dl
	}
	conn.SetDeadline(deadline)
	if err := json.NewEncoder(conn).Encode(struct {
		Method string `json:"method"`
		Arg    any    `json:"arg"`
	}{Method: method, Arg: arg}); err != nil {
		return fmt.Errorf("%s %s: %w", method, id, err)
	}
	var res struct {
		Success bool   `json:"success"`
		Err     string `json:"err"`
	}
	if err := json.NewDecoder(conn).Decode(&res); err != nil {
		return fmt.Errorf("%s %s: %w", method, id, err)
	}
	if !res.Success {
		return fmt.Errorf("%s %s: %s", method, id, res.Err)
	}
	return nil
}

// How a sandbox is paused. SPACE pauses and resumes through the control
// server (containerManager.Pause and Resume), not `runsc pause`: the same
// call into the sentry without a runsc process around it. runsc's own record
// of the container then still says "running", so SPACE keeps its own, the
// pause mark in the sandbox directory, written before each call:
//
//	pausing  a pause is being asked
//	paused   the sandbox is paused (by SPACE)
//	resuming a resume is being asked
//	(empty)  an earlier release paused it with `runsc pause`: runsc knows
//	(none)   running
//
// Releases before the mark existed paused with `runsc pause` and left none;
// runsc's state says so, and frozen writes the empty mark for them.
// The sentry counts pauses and panics on a resume of a kernel not paused,
// so the count is kept at 0 or 1. A server that dies during a call leaves
// "pausing" or "resuming": the next one asks the agent, which answers only
// if the sandbox runs (frozen).
const (
	markPausing  = "pausing"
	markPaused   = "paused"
	markResuming = "resuming"
	markLegacy   = "legacy"
)

// mark reads the pause mark ("" for none).
func (r *Runtime) mark(id string) string {
	b, err := os.ReadFile(r.pausedMark(id))
	switch {
	case errors.Is(err, os.ErrNotExist):
		return ""
	case err != nil:
		return markPausing // unreadable: find out
	case len(b) == 0:
		return markLegacy
	}
	return strings.TrimSpace(string(b))
}

// setMark writes the pause mark ("": none; markLegacy: the empty mark).
func (r *Runtime) setMark(id, m string) error {
	if m == "" {
		if err := os.Remove(r.pausedMark(id)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("pause mark of %s: %w", id, err)
		}
		return nil
	}
	content := []byte(m)
	if m == markLegacy {
		content = nil
	}
	if err := os.WriteFile(r.pausedMark(id), content, 0o600); err != nil {
		return fmt.Errorf("pause mark of %s: %w", id, err)
	}
	return nil
}

// frozen settles the pause mark and says how the sandbox is paused: ""
// (it is not), markPaused (by SPACE) or markLegacy (by `runsc pause`, of
// an earlier release). A mark a call in flight left (pausing, resuming) is
// replaced with what is true: whether the sentry took the call shows in
// whether the agent answers, which a paused sandbox's never does. known is
// runsc's state when the caller has just asked for it (nil: not asked);
// runsc is asked here only about a legacy mark it was not asked about.
func (r *Runtime) frozen(ctx context.Context, spec runtime.Spec, known *containerState) (string, error) {
	id := spec.SandboxID
	m := r.mark(id)
	if known != nil && known.Status == "paused" && m != markLegacy {
		// Paused with `runsc pause` by a release from before the mark.
		return markLegacy, r.setMark(id, markLegacy)
	}
	switch m {
	case "", markPaused:
		return m, nil
	case markLegacy:
		st := known
		if st == nil {
			var err error
			if st, err = r.state(ctx, spec); err != nil {
				return "", err
			}
		}
		if st != nil && st.Status == "paused" {
			return markLegacy, nil
		}
		return "", r.setMark(id, "")
	}
	if _, err := r.endpoint(id); err != nil {
		return "", err
	}
	if r.agentAnswers(ctx, id) {
		return "", r.setMark(id, "")
	}
	return markPaused, r.setMark(id, markPaused)
}

// pauseSandbox pauses a running sandbox (a paused one is left as it is).
func (r *Runtime) pauseSandbox(ctx context.Context, spec runtime.Spec) error {
	id := spec.SandboxID
	how, err := r.frozen(ctx, spec, nil)
	if err != nil || how != "" {
		return err
	}
	if err := r.setMark(id, markPausing); err != nil {
		return err
	}
	if err := r.control(ctx, id, "containerManager.Pause"); err != nil {
		return r.controlFailed(ctx, spec, err)
	}
	return r.setMark(id, markPaused)
}

// resumeSandbox resumes a paused sandbox (a running one is left as it is).
func (r *Runtime) resumeSandbox(ctx context.Context, spec runtime.Spec) error {
	id := spec.SandboxID
	how, err := r.frozen(ctx, spec, nil)
	switch {
	case err != nil || how == "":
		return err
	case how == markLegacy:
		if _, err := r.runsc(ctx, spec, "resume", id); err != nil {
			return err
		}
		return r.setMark(id, "")
	}
	if err := r.setMark(id, markResuming); err != nil {
		return err
	}
	if err := r.control(ctx, id, "containerManager.Resume"); err != nil {
		return r.controlFailed(ctx, spec, err)
	}
	return r.setMark(id, "")
}

// controlFailed makes sense of a failed pause or resume call: a sandbox
// that is gone is NotFound (its mark goes); one whose call was never
// sent (no control socket to reach) keeps its state and loses the mark
// of the call; otherwise the mark stays for frozen to settle.
func (r *Runtime) controlFailed(ctx context.Context, spec runtime.Spec, err error) error {
	id := spec.SandboxID
	var dial *net.OpError
	notSent := errors.As(err, &dial) && dial.Op == "dial" || errors.Is(err, os.ErrNotExist)
	if notSent {
		prev := ""
		if r.mark(id) == markResuming {
			prev = markPaused
		}
		r.setMark(id, prev)
	}
	if st, serr := r.state(ctx, spec); serr == nil && st == nil {
		r.setMark(id, "")
		return fmt.Errorf("%w: %w", runtime.ErrNotFound, err)
	}
	return err
}

// agentAnswers reports whether the sandbox's agent answers within two
// seconds: a paused sandbox's never does (nor can it dial a new server).
func (r *Runtime) agentAnswers(ctx context.Context, id string) bool {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	c, err := r.endpoints.Client(ctx, id)
	if err == nil {
		_, err = c.Info(ctx)
	}
	return err == nil
}
