package agent

import (
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/creack/pty"

	"github.com/spacesandbox/space/internal/agent/proto"
)

// process is one command session: created pending, started on first
// attach, remembered after exit.
type process struct {
	spec proto.ProcessSpec
	out  *ring

	mu        sync.Mutex // guards the fields below
	state     string
	pid       int
	exitCode  *int
	signal    string
	err       *proto.Error
	createdAt time.Time
	startedAt *time.Time
	exitedAt  *time.Time
	stdin     io.WriteCloser // nil without stdin
	ptmx      *os.File       // nil without a PTY
	timedOut  bool
}

// pending reports whether the process waits for its first reader.
func (p *process) pending() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.state == proto.ProcPending
}

func (p *process) status() proto.Process {
	p.mu.Lock()
	defer p.mu.Unlock()
	return proto.Process{ID: p.spec.ID, State: p.state, Argv: p.spec.Argv, Cwd: p.spec.Cwd, PID: p.pid, PTY: p.spec.PTY != nil,
		Tag: p.spec.Tag, User: p.spec.User, ExitCode: p.exitCode, Signal: p.signal, Error: p.err, CreatedAt: p.createdAt, StartedAt: p.startedAt, ExitedAt: p.exitedAt}
}

// Exit codes for processes that could not start (as shells use them).
const (
	exitNotExecutable = 126
	exitNotFound      = 127
	exitStartFailed   = 125
)

// fail records that the process could not start.
func (p *process) fail(code int, e *proto.Error) {
	now := time.Now().UTC()
	p.mu.Lock()
	p.state, p.exitCode, p.err, p.exitedAt = proto.ProcExited, &code, e, &now
	if p.startedAt == nil {
		p.startedAt = &now
	}
	p.mu.Unlock()
	p.out.append(proto.Stderr, []byte("space-agent: "+e.Message+"\n"))
	p.out.close()
}

// start forks the process. Problems with the command itself (missing
// executable or cwd) end the process with an error; they are not errors of
// the call. Its steps: prepare (user, working directory, environment,
// executable), stdio (a terminal or pipes), the fork through the reaper,
// then watch (output pumps, timeout, exit).
func (a *Agent) start(p *process) {
	p.mu.Lock()
	if p.state != proto.ProcPending {
		p.mu.Unlock()
		return
	}
	p.state = proto.ProcRunning
	now := time.Now().UTC()
	p.startedAt = &now
	p.mu.Unlock()

	l, code, perr := a.prepare(p.spec)
	if perr != nil {
		p.fail(code, perr)
		return
	}
	cmd := exec.Command(l.path)
	cmd.Args = l.spec.Argv
	cmd.Env = l.env
	cmd.Dir = l.spec.Cwd
	readers, closeAfterStart, perr := stdio(p, cmd, l.spec)
	if perr != nil {
		p.fail(exitStartFailed, perr)
		return
	}
	if l.acc != nil && l.acc.uid != os.Getuid() {
		cmd.SysProcAttr.Credential = &syscall.Credential{Uid: uint32(l.acc.uid), Gid: uint32(l.acc.gid), Groups: l.acc.groups}
	}
	exited, err := a.reaper.start(func() (int, error) {
		if err := cmd.Start(); err != nil {
			return 0, err
		}
		return cmd.Process.Pid, nil
	})
	for _, f := range closeAfterStart {
		f.Close()
	}
	if err != nil {
		for _, f := range readers {
			f.Close()
		}
		if errors.Is(err, syscall.ENOEXEC) || errors.Is(err, syscall.EACCES) {
			p.fail(exitNotExecutable, proto.Errorf("executable_not_executable", "%s: %v", l.spec.Argv[0], err))
			return
		}
		p.fail(exitStartFailed, proto.Errorf("start_failed", "%v", err))
		return
	}
	pid := cmd.Process.Pid
	cmd.Process.Release()
	p.mu.Lock()
	p.pid = pid
	p.mu.Unlock()
	a.log.Info("process started", "process_id", l.spec.ID, "pid", pid)
	a.watch(p, pid, readers, exited)
}

// launch is a process ready to fork.
type launch struct {
	spec proto.ProcessSpec // with the user's home as Cwd when it named none
	acc  *account          // nil: the agent's own user
	env  []string
	path string // the executable
}

// prepare resolves what a process runs as and where: the user, the working
// directory, the environment and the executable. A failure is the exit code
// and error the process ends with.
func (a *Agent) prepare(spec proto.ProcessSpec) (launch, int, *proto.Error) {
	var acc *account
	if spec.User != "" {
		u, err := a.lookupUser(spec.User)
		if err != nil {
			return launch{}, exitStartFailed, proto.Errorf("user_not_found", "user %s does not exist in the sandbox", spec.User)
		}
		acc = &u
		if spec.Cwd == "" {
			spec.Cwd = u.home
			if fi, err := os.Stat(u.home); err != nil || !fi.IsDir() {
				spec.Cwd = "/"
			}
		}
	}
	env := a.environ(spec, acc)
	if spec.Cwd != "" {
		if fi, err := os.Stat(spec.Cwd); err != nil || !fi.IsDir() {
			return launch{}, exitStartFailed, proto.Errorf("cwd_not_found", "working directory %s does not exist", spec.Cwd)
		}
	}
	path, err := lookPath(spec.Argv[0], env)
	if err != nil {
		code, ecode := exitNotFound, "executable_not_found"
		if errors.Is(err, os.ErrPermission) {
			code, ecode = exitNotExecutable, "executable_not_executable"
		}
		return launch{}, code, proto.Errorf(ecode, "%s: %v", spec.Argv[0], err)
	}
	return launch{spec: spec, acc: acc, env: env, path: path}, 0, nil
}

// stdio gives cmd a terminal (one reader, which stdin writes to) or pipes
// (stdout and stderr readers, and a stdin pipe when asked), and sets its
// session or process group. The child's ends are closed after the fork.
func stdio(p *process, cmd *exec.Cmd, spec proto.ProcessSpec) (readers []io.ReadCloser, closeAfterStart []*os.File, _ *proto.Error) {
	closeAll := func(fs []*os.File) {
		for _, f := range fs {
			f.Close()
		}
	}
	closeReaders := func() {
		for _, r := range readers {
			r.Close()
		}
	}
	if spec.PTY != nil {
		ptmx, tty, err := pty.Open()
		if err != nil {
			return nil, nil, proto.Errorf("start_failed", "open pty: %v", err)
		}
		pty.Setsize(ptmx, &pty.Winsize{Cols: spec.PTY.Cols, Rows: spec.PTY.Rows})
		cmd.Stdin, cmd.Stdout, cmd.Stderr = tty, tty, tty
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
		p.mu.Lock()
		p.ptmx = ptmx
		if spec.Stdin {
			p.stdin = ptmx
		}
		p.mu.Unlock()
		return []io.ReadCloser{ptmx}, []*os.File{tty}, nil
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	for _, dst := range []*io.Writer{&cmd.Stdout, &cmd.Stderr} {
		// A larger pipe lets a fast writer run ahead between reads (best
		// effort: the default 64 KiB stays where refused); outpipe.go says
		// why it is not an os.Pipe.
		r, w, err := newOutPipe(pipeSize)
		if err != nil {
			closeReaders()
			closeAll(closeAfterStart)
			return nil, nil, proto.Errorf("start_failed", "pipe: %v", err)
		}
		*dst = w
		readers = append(readers, r)
		closeAfterStart = append(closeAfterStart, w)
	}
	if spec.Stdin {
		r, w, err := os.Pipe()
		if err != nil {
			closeReaders()
			closeAll(closeAfterStart)
			return nil, nil, proto.Errorf("start_failed", "pipe: %v", err)
		}
		cmd.Stdin = r
		closeAfterStart = append(closeAfterStart, r)
		p.mu.Lock()
		p.stdin = w
		p.mu.Unlock()
	}
	return readers, closeAfterStart, nil
}

// watch pumps a started process's output into its window, kills it at its
// timeout, and records its exit once the output is drained.
func (a *Agent) watch(p *process, pid int, readers []io.ReadCloser, exited <-chan syscall.WaitStatus) {
	spec := p.spec
	var wg sync.WaitGroup
	streams := []string{proto.Stdout, proto.Stderr}
	for i, f := range readers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			pump(f, streams[i], p.out)
		}()
	}
	var timer *time.Timer
	if spec.Timeout > 0 {
		timer = time.AfterFunc(spec.Timeout, func() {
			p.mu.Lock()
			p.timedOut = true
			p.mu.Unlock()
			syscall.Kill(-pid, syscall.SIGKILL)
		})
	}
	go func() {
		st := <-exited
		if timer != nil {
			timer.Stop()
		}
		// Let the readers drain what the process wrote; a background child
		// that keeps the pipe open gets a short grace, then loses it.
		drained := make(chan struct{})
		go func() { wg.Wait(); close(drained) }()
		if !awaitDrained(drained, p.out, drainGrace) {
			for _, f := range readers {
				f.Close()
			}
			<-drained
		}
		for _, f := range readers {
			f.Close()
		}
		now := time.Now().UTC()
		code := st.ExitStatus()
		p.mu.Lock()
		if st.Signaled() {
			code = 128 + int(st.Signal())
			p.signal = signalName(st.Signal())
		}
		if p.timedOut {
			p.err = proto.Errorf("timeout", "process exceeded its timeout of %s and was killed", spec.Timeout)
		}
		p.state, p.exitCode, p.exitedAt = proto.ProcExited, &code, &now
		if p.stdin != nil {
			p.stdin.Close()
		}
		p.mu.Unlock()
		p.out.close()
		a.log.Info("process exited", "process_id", spec.ID, "pid", pid, "exit_code", code)
		a.forgetOld()
	}()
}

// drainGrace is how long the output pumps of an exited process may run on
// (a background child holding its pipe open) before the pipes are closed.
const drainGrace = time.Second

// awaitDrained waits until drained is closed (true), or until the pumps
// have had grace of their own time since the call (false). Time the window
// held them back, waiting for a slow reader to make room, does not count:
// what the process wrote before it exited may still be in its pipe, and
// closing the pipe then would lose it with no resync to tell the reader.
func awaitDrained(drained <-chan struct{}, out *ring, grace time.Duration) bool {
	start, held := time.Now(), out.heldBack()
	for {
		left := grace - (time.Since(start) - (out.heldBack() - held))
		if left <= 0 {
			return false
		}
		select {
		case <-drained:
			return true
		case <-time.After(left):
		}
	}
}

const (
	// pumpBuf is the most one read of a process's output takes; the first
	// takes pumpFirst, and each read that fills its buffer makes the next
	// buffer four times larger, up to pumpBuf: a short command's few bytes
	// cost a small buffer, a stream soon moves a megabyte per read.
	pumpBuf   = 1 << 20
	pumpFirst = 64 << 10
	// pipeSize is the capacity asked for output pipes.
	pipeSize = 1 << 20
	// Output streams in small writes when reads keep finding data
	// waiting (a read returns within coalesceAfter); from the
	// streakToCoalesce-th such read on, each first waits for output to
	// gather (coalesceWait), unless that wait would be under
	// lingerAtLeast.
	coalesceAfter    = 2 * time.Millisecond
	coalesceFor      = 10 * time.Millisecond
	coalesceFill     = pipeSize / 2
	coalesceFull     = pipeSize * 3 / 4
	lingerAtLeast    = time.Millisecond
	streakToCoalesce = 2
)

// coalesceWait is how long to let output gather before the next read,
// given that the last read took n bytes that came in over gap, after a
// wait of prev: as long as the pipe takes to fill to coalesceFill at that
// rate, at most coalesceFor — and, when the read found the pipe nearly
// full (coalesceFull: the writer may have waited for room), under half of
// prev too, since sleeps overrun here and a writer of large blocks (or
// output held back by a slow reader) fills the pipe faster than any wait
// pays for. A fixed 10 ms let `head -c` (8 KiB writes, about 110 MiB/s
// into a host pipe) fill the 1 MiB pipe 2–3 ms before each read and wait
// there: 78 MiB/s in every run.
func coalesceWait(n int, gap, prev time.Duration) time.Duration {
	w := coalesceFor
	if n > 0 && gap < coalesceFor*time.Duration(n)/coalesceFill {
		w = gap * coalesceFill / time.Duration(n)
	}
	if n >= coalesceFull {
		w = min(w, prev/2)
	}
	return w
}

// pump copies a stream into the ring, one chunk per read. A chunk owns
// memory of its own size: a large read hands its buffer over, a small one
// is copied out, so a window of many small chunks (interactive output)
// holds what it counts rather than a read buffer per chunk.
func pump(f io.Reader, stream string, out *ring) {
	buf := make([]byte, pumpFirst)
	streak := 0
	wait, last := coalesceFor, time.Now()
	for {
		// While output streams in small writes (each read finds data
		// waiting), let it gather before reading again: one read per many
		// writes. Under gVisor every read and every frame sent costs the
		// sandbox CPU its process would use to write. A read that had to
		// wait (interactive output, a command's few lines) ends the
		// streak, so output with gaps is read at once.
		if streak >= streakToCoalesce && wait >= lingerAtLeast {
			if l, ok := f.(interface{ linger(time.Duration) }); ok {
				l.linger(wait) // ends early at the writers' end
			} else {
				time.Sleep(wait)
			}
		}
		t := time.Now()
		n, err := f.Read(buf)
		now := time.Now()
		if now.Sub(t) < coalesceAfter {
			streak++
		} else {
			streak = 0
		}
		wait, last = coalesceWait(n, now.Sub(last), wait), now
		if n > 0 {
			var data []byte
			if n >= len(buf)/2 {
				size := len(buf)
				if n == size {
					size = min(4*size, pumpBuf)
				}
				data, buf = buf[:n:n], make([]byte, size)
			} else {
				data = make([]byte, n)
				copy(data, buf)
			}
			out.append(stream, data)
		}
		if err != nil {
			return // EOF, or EIO from a PTY whose last slave closed
		}
	}
}

func (a *Agent) environ(spec proto.ProcessSpec, acc *account) []string {
	m := map[string]string{"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root", "LANG": "C.UTF-8"}
	for _, kv := range os.Environ() {
		if k, v, ok := strings.Cut(kv, "="); ok {
			m[k] = v
		}
	}
	if acc != nil {
		m["HOME"], m["USER"], m["LOGNAME"] = acc.home, acc.name, acc.name
	}
	if spec.PTY != nil {
		m["TERM"] = "xterm-256color"
	}
	for k, v := range spec.Env {
		m[k] = v
	}
	out := make([]string, 0, len(m))
	for k, v := range m {
		out = append(out, k+"="+v)
	}
	return out
}

// lookPath resolves an executable like a shell, with the process's PATH.
func lookPath(name string, env []string) (string, error) {
	if strings.Contains(name, "/") {
		fi, err := os.Stat(name)
		if err != nil {
			return "", errors.New("no such file")
		}
		if fi.IsDir() || fi.Mode()&0o111 == 0 {
			return "", os.ErrPermission
		}
		return name, nil
	}
	path := ""
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "PATH="); ok {
			path = v
		}
	}
	for _, dir := range strings.Split(path, ":") {
		if dir == "" {
			dir = "."
		}
		cand := dir + "/" + name
		if fi, err := os.Stat(cand); err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0 {
			return cand, nil
		}
	}
	return "", errors.New("executable file not found in PATH")
}

var signals = map[string]syscall.Signal{
	"SIGHUP": syscall.SIGHUP, "SIGINT": syscall.SIGINT, "SIGQUIT": syscall.SIGQUIT, "SIGKILL": syscall.SIGKILL,
	"SIGUSR1": syscall.SIGUSR1, "SIGUSR2": syscall.SIGUSR2, "SIGTERM": syscall.SIGTERM, "SIGCONT": syscall.SIGCONT,
	"SIGSTOP": syscall.SIGSTOP, "SIGTSTP": syscall.SIGTSTP, "SIGWINCH": syscall.SIGWINCH, "SIGALRM": syscall.SIGALRM,
}

// ParseSignal maps "SIGTERM" or "TERM" to the signal.
func ParseSignal(s string) (syscall.Signal, bool) {
	s = strings.ToUpper(s)
	if !strings.HasPrefix(s, "SIG") {
		s = "SIG" + s
	}
	sig, ok := signals[s]
	return sig, ok
}

func signalName(sig syscall.Signal) string {
	for n, s := range signals {
		if s == sig {
			return n
		}
	}
	return sig.String()
}

func (a *Agent) signalProcess(ctx context.Context, id, name string) error {
	p, err := a.lookup(id)
	if err != nil {
		return err
	}
	sig, ok := ParseSignal(name)
	if !ok {
		return proto.Errorf(proto.CodeInvalidArgument, "unknown signal %q", name)
	}
	p.mu.Lock()
	state, pid := p.state, p.pid
	p.mu.Unlock()
	if state != proto.ProcRunning {
		return proto.Errorf(proto.CodeFailedPrecondition, "process %s is %s", id, state)
	}
	if err := syscall.Kill(-pid, sig); err != nil && !errors.Is(err, syscall.ESRCH) {
		return proto.Errorf(proto.CodeInternal, "signal: %v", err)
	}
	return nil
}
