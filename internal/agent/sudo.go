package agent

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// The sudo helper. gVisor does not honour setuid bits (google/gvisor#5299),
// so a template's /usr/bin/sudo cannot raise a user to root there. The
// gVisor runtime mounts the agent binary over it; run as "sudo", the agent
// is a small client (sudo_client.go) that hands its request, working
// directory, environment and standard descriptors to the agent (PID 1,
// root) over a socket. The agent identifies the caller by the kernel's
// SO_PEERCRED — never by anything the caller says — checks the template's
// sudoers (sudoers.go), and runs the command as the target user with the
// caller's descriptors, forwarding signals until it exits.
//
// The boundary is the same one sudo draws: whoever sudoers lets run a
// command as root without a password may. A rule that needs a password is
// refused (the helper cannot ask for one), as `sudo -n` would.

// SudoSocket is where the helper listens inside a sandbox.
const SudoSocket = "/run/space/sudo.sock"

// sudoMaxRequest bounds one request (argv and environment).
const sudoMaxRequest = 192 << 10

type sudoRequest struct {
	Argv        []string `json:"argv,omitempty"` // the command; empty with Login or Shell runs the shell
	User        string   `json:"user,omitempty"` // target user, default root
	Login       bool     `json:"login,omitempty"`
	Shell       bool     `json:"shell,omitempty"`
	PreserveEnv bool     `json:"preserve_env,omitempty"`
	Keep        []string `json:"keep,omitempty"`     // --preserve-env=LIST
	Validate    bool     `json:"validate,omitempty"` // only answer whether it would run
	Env         []string `json:"env,omitempty"`
	Cwd         string   `json:"cwd,omitempty"`
}

type sudoReply struct {
	Error   string `json:"error,omitempty"` // printed by the client after "sudo: "
	Started bool   `json:"started,omitempty"`
	Done    bool   `json:"done,omitempty"`
	Exit    int    `json:"exit"`
}

type sudoSignal struct {
	Signal int `json:"signal"`
}

// ServeSudo listens on path until ctx ends.
func (a *Agent) ServeSudo(ctx context.Context, socket string) error {
	if err := os.MkdirAll(path.Dir(socket), 0o755); err != nil {
		return fmt.Errorf("sudo helper: %w", err)
	}
	os.Remove(socket)
	// A stream socket: gVisor reports the listener's own credentials as
	// SO_PEERCRED of a SOCK_SEQPACKET connection, never the caller's.
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: socket, Net: "unix"})
	if err != nil {
		return fmt.Errorf("sudo helper: %w", err)
	}
	// Anyone in the sandbox may ask; the policy decides.
	if err := os.Chmod(socket, 0o666); err != nil {
		l.Close()
		return fmt.Errorf("sudo helper: %w", err)
	}
	go func() { <-ctx.Done(); l.Close() }()
	for {
		c, err := l.AcceptUnix()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("sudo helper: accept: %w", err)
		}
		go a.sudo(c)
	}
}

// sudo serves one request.
func (a *Agent) sudo(c *net.UnixConn) {
	defer c.Close()
	reply := func(r sudoReply) { writeFrame(c, r, nil) }
	refuse := func(format string, args ...any) {
		reply(sudoReply{Error: fmt.Sprintf(format, args...), Done: true, Exit: 1})
	}
	cred, err := peerCred(c)
	if err != nil {
		a.log.Warn("sudo helper: peer credentials", "err", err)
		return
	}
	var req sudoRequest
	fds, err := readFrame(c, &req, true)
	defer func() {
		for _, f := range fds {
			f.Close()
		}
	}()
	if err != nil || len(fds) != 3 {
		refuse("malformed request to the sandbox's sudo helper")
		return
	}
	l, err := a.sudoLaunch(req, int(cred.Uid), int(cred.Gid))
	if err != nil {
		refuse("%v", err)
		return
	}
	a.log.Info("sudo", "caller_uid", cred.Uid, "user", l.acc.name, "command", l.path)
	if req.Validate {
		reply(sudoReply{Done: true})
		return
	}
	cmd := exec.Command(l.path)
	cmd.Args = l.argv
	cmd.Env = l.env
	cmd.Dir = l.cwd
	cmd.Stdin, cmd.Stdout, cmd.Stderr = fds[0], fds[1], fds[2]
	// Its own session: the caller's terminal is not its controlling one,
	// so it reads and writes it without job-control stops, and the caller's
	// signals reach it through the client.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if l.acc.uid != os.Getuid() {
		cmd.SysProcAttr.Credential = &syscall.Credential{Uid: uint32(l.acc.uid), Gid: uint32(l.acc.gid), Groups: l.acc.groups}
	}
	exited, err := a.reaper.start(func() (int, error) {
		if err := cmd.Start(); err != nil {
			return 0, err
		}
		return cmd.Process.Pid, nil
	})
	if err != nil {
		refuse("unable to execute %s: %v", l.path, err)
		return
	}
	pid := cmd.Process.Pid
	cmd.Process.Release()
	for _, f := range fds {
		f.Close()
	}
	fds = nil
	reply(sudoReply{Started: true})

	// Signals from the client reach the command; a client that goes away
	// (killed with the command session it ran in) takes the command's whole
	// session with it.
	var mu sync.Mutex
	done := false
	go func() {
		for {
			var s sudoSignal
			_, err := readFrame(c, &s, false)
			mu.Lock()
			if done {
				mu.Unlock()
				return
			}
			if err != nil {
				unix.Kill(-pid, unix.SIGKILL)
				mu.Unlock()
				return
			}
			if s.Signal > 0 && s.Signal < 65 {
				unix.Kill(pid, syscall.Signal(s.Signal))
			}
			mu.Unlock()
		}
	}()
	st := <-exited
	mu.Lock()
	done = true
	mu.Unlock()
	code := st.ExitStatus()
	if st.Signaled() {
		code = 128 + int(st.Signal())
	}
	reply(sudoReply{Done: true, Exit: code})
}

// sudoRun is a command the policy allowed.
type sudoRun struct {
	argv []string
	cwd  string
	acc  account // the target user
	env  []string
	path string // the executable
}

// sudoLaunch decides a request and resolves what it runs: an error is the
// refusal the client prints.
func (a *Agent) sudoLaunch(req sudoRequest, uid, gid int) (sudoRun, error) {
	caller, err := a.lookupUser(strconv.Itoa(uid))
	if err != nil {
		return sudoRun{}, err
	}
	caller.gid = gid
	targetName := req.User
	if targetName == "" {
		targetName = "root"
	}
	if strings.HasPrefix(targetName, "#") {
		targetName = targetName[1:]
	}
	target, err := a.lookupUser(targetName)
	if err != nil {
		return sudoRun{}, fmt.Errorf("unknown user %s", req.User)
	}
	pol := a.sudoPolicy()
	env := sudoEnv(req, caller, target, pol.securePath)

	argv := req.Argv
	cwd := req.Cwd
	shell := target.shell
	if req.Shell {
		if s := envValue(req.Env, "SHELL"); s != "" {
			shell = s
		}
	}
	switch {
	case req.Login || req.Shell:
		if len(argv) > 0 {
			argv = []string{shell, "-c", shellJoin(argv)}
		} else {
			argv = []string{shell}
		}
		if req.Login {
			argv = append([]string{argv[0], "-l"}, argv[1:]...)
			cwd = target.home
		}
	case len(argv) == 0 && req.Validate:
		// sudo -v: is the caller in sudoers at all (and with no password)?
		switch pol.decide(caller, a.groupNames(caller), target.name, "") {
		case sudoDenied:
			return sudoRun{}, fmt.Errorf("%s is not in the sudoers file", caller.name)
		case sudoNeedsPass:
			return sudoRun{}, errors.New("a password is required")
		}
		return sudoRun{acc: target}, nil
	case len(argv) == 0:
		return sudoRun{}, errors.New("no command given")
	}
	exe, err := lookPath(argv[0], env)
	if err != nil {
		return sudoRun{}, fmt.Errorf("%s: command not found", argv[0])
	}
	groups := a.groupNames(caller)
	if (req.PreserveEnv || len(req.Keep) > 0) && !pol.allowsAll(caller, groups, target.name) {
		return sudoRun{}, errors.New("sorry, you are not allowed to preserve the environment")
	}
	switch pol.decide(caller, groups, target.name, exe) {
	case sudoDenied:
		return sudoRun{}, fmt.Errorf("%s is not in the sudoers file", caller.name)
	case sudoNotAllowed:
		return sudoRun{}, fmt.Errorf("user %s is not allowed to execute '%s' as %s", caller.name, shellJoin(argv), target.name)
	case sudoNeedsPass:
		return sudoRun{}, errors.New("a password is required")
	}
	if fi, err := os.Stat(cwd); err != nil || !fi.IsDir() {
		cwd = target.home
		if fi, err := os.Stat(cwd); err != nil || !fi.IsDir() {
			cwd = "/"
		}
	}
	return sudoRun{argv: argv, cwd: cwd, acc: target, env: env, path: exe}, nil
}

// sudoPolicy reads /etc/sudoers and what it includes (depth ≤ 8, each file
// ≤ 1 MiB) from the sandbox's file system.
func (a *Agent) sudoPolicy() *sudoPolicy {
	p := &sudoPolicy{}
	var read func(name string, depth int)
	read = func(name string, depth int) {
		if depth > 8 {
			return
		}
		f, err := a.fs.OpenFile(name, os.O_RDONLY, 0)
		if err != nil {
			return
		}
		b := make([]byte, 1<<20)
		n, _ := f.Read(b)
		f.Close()
		files, dirs := p.parse(string(b[:n]))
		rel := func(p string) string {
			if path.IsAbs(p) {
				return p
			}
			return path.Join(path.Dir(name), p)
		}
		for _, inc := range files {
			read(rel(inc), depth+1)
		}
		for _, dir := range dirs {
			dir = rel(dir)
			d, err := a.fs.OpenFile(dir, os.O_RDONLY, 0)
			if err != nil {
				continue
			}
			ents, _ := d.ReadDir(4096)
			d.Close()
			var names []string
			for _, e := range ents {
				// sudo skips names with a dot or ending in "~" (editor backups, package leftovers).
				if n := e.Name(); !strings.Contains(n, ".") && !strings.HasSuffix(n, "~") && e.Type().IsRegular() {
					names = append(names, n)
				}
			}
			sort.Strings(names)
			for _, n := range names {
				read(path.Join(dir, n), depth+1)
			}
		}
	}
	read("/etc/sudoers", 0)
	return p
}

// groupNames are the names of acc's primary and supplementary groups.
func (a *Agent) groupNames(acc account) []string {
	var out []string
	a.readDB("/etc/group", func(f []string) {
		if len(f) < 4 {
			return
		}
		g, err := strconv.Atoi(f[2])
		if err != nil {
			return
		}
		if g == acc.gid || contains(strings.Split(f[3], ","), acc.name) {
			out = append(out, f[0])
		}
	})
	return out
}

// sudoEnv is the command's environment: like sudo's env_reset, the caller's
// terminal and locale settings and the target's identity; with -E the
// caller's whole environment. secure_path, when set, is always the PATH.
func sudoEnv(req sudoRequest, caller, target account, securePath string) []string {
	m := map[string]string{}
	for _, kv := range req.Env {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			continue
		}
		if strings.HasPrefix(k, "LD_") {
			continue // never, as sudo: a preload runs as the target
		}
		if req.PreserveEnv || sudoKeepEnv(k) || contains(req.Keep, k) {
			m[k] = v
		}
	}
	if !req.PreserveEnv {
		m["HOME"] = target.home
	}
	m["SHELL"] = target.shell
	m["USER"], m["LOGNAME"], m["USERNAME"] = target.name, target.name, target.name
	m["MAIL"] = "/var/mail/" + target.name
	m["SUDO_USER"] = caller.name
	m["SUDO_UID"] = strconv.Itoa(caller.uid)
	m["SUDO_GID"] = strconv.Itoa(caller.gid)
	m["SUDO_COMMAND"] = shellJoin(req.Argv)
	switch {
	case securePath != "":
		m["PATH"] = securePath
	case m["PATH"] == "":
		m["PATH"] = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	}
	out := make([]string, 0, len(m))
	for k, v := range m {
		out = append(out, k+"="+v)
	}
	sort.Strings(out)
	return out
}

func sudoKeepEnv(k string) bool {
	switch k {
	case "TERM", "COLORTERM", "DISPLAY", "XAUTHORITY", "LANG", "LANGUAGE", "TZ", "PATH", "COLUMNS", "LINES":
		return true
	}
	return strings.HasPrefix(k, "LC_")
}

func envValue(env []string, key string) string {
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, key+"="); ok {
			return v
		}
	}
	return ""
}

// shellJoin quotes argv for sh -c and for messages.
func shellJoin(argv []string) string {
	q := make([]string, len(argv))
	for i, s := range argv {
		if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_./=:,+@%") == "" {
			q[i] = s
			continue
		}
		q[i] = "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
	}
	return strings.Join(q, " ")
}

// writeFrame sends v as one frame: a 4-byte big-endian length, then JSON;
// oob (descriptors) goes with its first byte.
func writeFrame(c *net.UnixConn, v any, oob []byte) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	if len(b) > sudoMaxRequest {
		return errors.New("frame too large")
	}
	msg := binary.BigEndian.AppendUint32(make([]byte, 0, 4+len(b)), uint32(len(b)))
	msg = append(msg, b...)
	if oob == nil {
		_, err = c.Write(msg)
		return err
	}
	n, _, err := c.WriteMsgUnix(msg, oob, nil)
	if err == nil && n < len(msg) {
		_, err = c.Write(msg[n:])
	}
	return err
}

// readFrame reads one frame into v; with wantFDs, the descriptors that came
// with it (they arrive with its first byte).
func readFrame(c *net.UnixConn, v any, wantFDs bool) ([]*os.File, error) {
	hdr := make([]byte, 4)
	var fds []*os.File
	got := 0
	if wantFDs {
		oob := make([]byte, unix.CmsgSpace(3*4))
		n, oobn, flags, _, err := c.ReadMsgUnix(hdr, oob)
		fds = receivedFDs(oob[:oobn])
		if err != nil || flags&unix.MSG_CTRUNC != 0 {
			return fds, fmt.Errorf("read frame: %v (flags %#x)", err, flags)
		}
		got = n
	}
	if _, err := io.ReadFull(c, hdr[got:]); err != nil {
		return fds, err
	}
	size := binary.BigEndian.Uint32(hdr)
	if size > sudoMaxRequest {
		return fds, errors.New("frame too large")
	}
	body := make([]byte, size)
	if _, err := io.ReadFull(c, body); err != nil {
		return fds, err
	}
	return fds, json.Unmarshal(body, v)
}

// peerCred is the connecting process's credentials, from the kernel.
func peerCred(c *net.UnixConn) (*unix.Ucred, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return nil, err
	}
	var cred *unix.Ucred
	var cerr error
	if err := raw.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return nil, err
	}
	return cred, cerr
}

// receivedFDs are the descriptors passed with a message.
func receivedFDs(oob []byte) []*os.File {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil
	}
	var out []*os.File
	for _, m := range msgs {
		fds, err := unix.ParseUnixRights(&m)
		if err != nil {
			continue
		}
		for _, fd := range fds {
			out = append(out, os.NewFile(uintptr(fd), "sudo-fd"))
		}
	}
	return out
}
