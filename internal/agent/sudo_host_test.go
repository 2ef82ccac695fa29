package agent_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/spacesandbox/space/internal/agent"
)

// The test binary doubles as the sudo helper's two sides, each in its own
// process, so each side's children are its own (the agent reaps all of its
// children as PID 1 would).
func TestMain(m *testing.M) {
	if sock := os.Getenv("SPACE_TEST_SUDO_CLIENT"); sock != "" {
		os.Exit(agent.SudoMain(os.Args[1:], sock, os.Stderr))
	}
	if sock := os.Getenv("SPACE_TEST_SUDO_SERVER"); sock != "" {
		a, err := agent.New(agent.Config{Root: os.Getenv("SPACE_TEST_SUDO_ROOT")})
		if err != nil {
			panic(err)
		}
		if err := a.ServeSudo(context.Background(), sock); err != nil {
			panic(err)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

type sudoHost struct {
	bin, sock string
}

// startSudoHelper runs the helper as root over a sandbox root whose
// passwd, group and sudoers the test writes; clients run as other users.
func startSudoHelper(t *testing.T) sudoHost {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: runs the sudo client as other users against a root helper")
	}
	// A directory other users can reach, holding a copy of this binary.
	dir, err := os.MkdirTemp("", "space-sudo-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(self)
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "sudo")
	if err := os.WriteFile(bin, b, 0o755); err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	files := map[string]string{
		"etc/passwd": "root:x:0:0:root:/root:/bin/sh\nuser:x:61000:61000::/home/user:/bin/sh\nops:x:61001:61001::/:/bin/sh\neve:x:61002:61002::/:/bin/sh\nsvc:x:61003:61003::/srv:/bin/sh\n",
		"etc/group":  "root:x:0:\nuser:x:61000:\nops:x:61001:\neve:x:61002:\nwheel:x:61010:ops\nsvc:x:61003:\n",
		"etc/sudoers": "Defaults\tsecure_path=\"/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\"\n" +
			"root ALL=(ALL:ALL) ALL\n%wheel ALL=(root) NOPASSWD: /usr/bin/id\n%sudo ALL=(ALL:ALL) ALL\n@includedir /etc/sudoers.d\n",
		"etc/sudoers.d/user":       "user ALL=(ALL:ALL) NOPASSWD: ALL\n",
		"etc/sudoers.d/eve.dpkg~":  "eve ALL=(ALL:ALL) NOPASSWD: ALL\n", // skipped, as sudo skips it
		"etc/sudoers.d/README.txt": "eve ALL=(ALL:ALL) NOPASSWD: ALL\n",
	}
	for name, text := range files {
		p := filepath.Join(root, name)
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	sock := filepath.Join(dir, "run", "sudo.sock")
	srv := exec.Command(bin)
	srv.Env = append(os.Environ(), "SPACE_TEST_SUDO_SERVER="+sock, "SPACE_TEST_SUDO_ROOT="+root)
	srv.Stderr = os.Stderr
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Process.Kill(); srv.Wait() })
	for i := 0; ; i++ {
		if _, err := os.Stat(sock); err == nil {
			break
		}
		if i > 500 {
			t.Fatal("sudo helper did not listen")
		}
		time.Sleep(10 * time.Millisecond)
	}
	return sudoHost{bin: bin, sock: sock}
}

// sudo runs the client as uid with args; it returns stdout, stderr and the
// exit code.
func (h sudoHost) sudo(t *testing.T, uid int, stdin string, env []string, args ...string) (string, string, int) {
	t.Helper()
	cmd := h.command(uid, env, args...)
	cmd.Stdin = strings.NewReader(stdin)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		return out.String(), errb.String(), ee.ExitCode()
	case err != nil:
		t.Fatal(err)
	}
	return out.String(), errb.String(), 0
}

func (h sudoHost) command(uid int, env []string, args ...string) *exec.Cmd {
	cmd := exec.Command(h.bin, args...)
	cmd.Dir = "/"
	cmd.Env = append([]string{"SPACE_TEST_SUDO_CLIENT=" + h.sock, "PATH=/usr/bin:/bin"}, env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(uid)}}
	return cmd
}

func TestSudoHelperFollowsSudoers(t *testing.T) {
	h := startSudoHelper(t)
	cases := []struct {
		name     string
		uid      int
		args     []string
		out, err string
		code     int
	}{
		{"user may run anything as root", 61000, []string{"-n", "id", "-u"}, "0\n", "", 0},
		{"and as another user", 61000, []string{"-u", "svc", "id", "-u"}, "61003\n", "", 0},
		{"and by uid", 61000, []string{"-u#61001", "id", "-u"}, "61001\n", "", 0},
		{"exit status passes through", 61000, []string{"sh", "-c", "echo out; echo err >&2; exit 7"}, "out\n", "err\n", 7},
		{"group rule for one command", 61001, []string{"id", "-u"}, "0\n", "", 0},
		{"not for another", 61001, []string{"true"}, "", "sudo: user ops is not allowed to execute 'true' as root\n", 1},
		{"not as another user", 61001, []string{"-u", "svc", "id"}, "", "sudo: user ops is not allowed to execute 'id' as svc\n", 1},
		{"a stranger is refused", 61002, []string{"-n", "true"}, "", "sudo: eve is not in the sudoers file\n", 1},
		{"root needs no rule", 0, []string{"-u", "user", "id", "-u"}, "61000\n", "", 0},
		{"unknown command", 61000, []string{"no-such-command"}, "", "sudo: no-such-command: command not found\n", 1},
		{"unknown user", 61000, []string{"-u", "nobody-here", "true"}, "", "sudo: unknown user nobody-here\n", 1},
		{"validate", 61000, []string{"-v"}, "", "", 0},
		{"validate refused", 61002, []string{"-v"}, "", "sudo: eve is not in the sudoers file\n", 1},
		{"login shell in the target's home", 61000, []string{"-i", "pwd"}, "/root\n", "", 0},
		{"shell runs a command line", 61000, []string{"-s", "echo", "a b"}, "a b\n", "", 0},
		{"unsupported option", 61000, []string{"-b", "true"}, "", "", 1},
		{"-E needs a rule for every command", 61001, []string{"-E", "id", "-u"}, "", "sudo: sorry, you are not allowed to preserve the environment\n", 1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			out, errs, code := h.sudo(t, c.uid, "", nil, c.args...)
			if code != c.code || out != c.out || (c.err != "" && errs != c.err) {
				t.Fatalf("sudo %q as %d: exit %d, stdout %q, stderr %q; want %d, %q, %q", c.args, c.uid, code, out, errs, c.code, c.out, c.err)
			}
		})
	}
}

func TestSudoHelperStdinAndEnvironment(t *testing.T) {
	h := startSudoHelper(t)
	out, _, code := h.sudo(t, 61000, "piped in\n", nil, "cat")
	if code != 0 || out != "piped in\n" {
		t.Fatalf("sudo cat: %d %q", code, out)
	}
	env := []string{"FOO=bar", "TERM=xterm", "HOME=/home/user", "PATH=/tmp/evil:/usr/bin:/bin", "LD_PRELOAD=/tmp/evil.so"}
	out, _, _ = h.sudo(t, 61000, "", env, "env")
	vars := map[string]string{}
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		k, v, _ := strings.Cut(l, "=")
		vars[k] = v
	}
	want := map[string]string{"HOME": "/root", "USER": "root", "SUDO_USER": "user", "SUDO_UID": "61000", "TERM": "xterm",
		"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "SUDO_COMMAND": "env"}
	for k, v := range want {
		if vars[k] != v {
			t.Errorf("sudo env: %s=%q, want %q (all: %v)", k, vars[k], v, vars)
		}
	}
	if _, ok := vars["FOO"]; ok {
		t.Errorf("sudo env kept FOO without -E")
	}
	out, _, _ = h.sudo(t, 61000, "", env, "-E", "env")
	if !strings.Contains(out, "FOO=bar\n") || !strings.Contains(out, "HOME=/home/user\n") || strings.Contains(out, "/tmp/evil") || strings.Contains(out, "LD_PRELOAD") {
		t.Errorf("sudo -E env: %s", out)
	}
	out, _, _ = h.sudo(t, 61000, "", env, "--preserve-env=FOO", "env")
	if !strings.Contains(out, "FOO=bar\n") || !strings.Contains(out, "HOME=/root\n") {
		t.Errorf("sudo --preserve-env=FOO env: %s", out)
	}
}

func TestSudoHelperSignalsReachTheCommand(t *testing.T) {
	h := startSudoHelper(t)
	for _, tc := range []struct {
		sig  syscall.Signal
		code int // the client's exit code
	}{{syscall.SIGTERM, 128 + 15}, {syscall.SIGKILL, -1}} {
		cmd := h.command(61000, nil, "sh", "-c", "echo $$; exec sleep 60")
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		line, err := bufio.NewReader(stdout).ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		pid, _ := strconv.Atoi(strings.TrimSpace(line))
		if st, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status"); err != nil || !bytes.Contains(st, []byte("Uid:\t0\t0")) {
			t.Fatalf("command %d is not running as root: %v %s", pid, err, st)
		}
		cmd.Process.Signal(tc.sig)
		err = cmd.Wait()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != tc.code {
			t.Fatalf("%v: client ended with %v, want exit %d", tc.sig, err, tc.code)
		}
		// Forwarded (TERM) or taken with the client (KILL): the command is gone.
		deadline := time.Now().Add(10 * time.Second)
		for {
			st, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
			if err != nil || bytes.Contains(st, []byte(") Z ")) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%v: command %d outlived its sudo", tc.sig, pid)
			}
			time.Sleep(20 * time.Millisecond)
		}
		io.Copy(io.Discard, stdout)
	}
}
