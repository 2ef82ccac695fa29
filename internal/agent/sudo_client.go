package agent

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

const sudoUsage = `usage: sudo [-EHinsSkKv] [-u user] [--] command [arg ...]
This sandbox's sudo is served by the SPACE agent (gVisor does not honour
setuid). It follows /etc/sudoers for rules that need no password.`

// SudoMain is the agent run as sudo (argv[0] "sudo"): it parses sudo's
// options, asks the helper listening on socket, and returns the exit code.
func SudoMain(args []string, socket string, stderr io.Writer) int {
	var req sudoRequest
	fail := func(format string, a ...any) int {
		fmt.Fprintf(stderr, "sudo: "+format+"\n", a...)
		return 1
	}
	i := 0
	for ; i < len(args); i++ {
		arg := args[i]
		if arg == "--" {
			i++
			break
		}
		if !strings.HasPrefix(arg, "-") || arg == "-" {
			break
		}
		if long, ok := strings.CutPrefix(arg, "--"); ok {
			name, val, hasVal := strings.Cut(long, "=")
			switch name {
			case "non-interactive", "stdin", "reset-timestamp", "remove-timestamp", "set-home":
			case "preserve-env":
				req.PreserveEnv = !hasVal // --preserve-env=LIST keeps the listed ones
				if hasVal {
					for _, k := range strings.Split(val, ",") {
						if v, ok := os.LookupEnv(k); ok {
							req.Env = append(req.Env, k+"="+v)
							req.Keep = append(req.Keep, k)
						}
					}
				}
			case "login":
				req.Login = true
			case "shell":
				req.Shell = true
			case "validate":
				req.Validate = true
			case "user":
				if !hasVal {
					if i+1 >= len(args) {
						return fail("option requires an argument -- 'user'")
					}
					i++
					val = args[i]
				}
				req.User = val
			case "help":
				fmt.Fprintln(os.Stdout, sudoUsage)
				return 0
			case "version":
				fmt.Fprintln(os.Stdout, "Sudo version 1.9 (compatible helper: "+Name+")")
				return 0
			default:
				return fail("option --%s is not supported in this sandbox\n%s", name, sudoUsage)
			}
			continue
		}
		for j := 1; j < len(arg); j++ {
			switch c := arg[j]; c {
			case 'n', 'S', 'k', 'K', 'H', 'A':
				if (c == 'k' || c == 'K') && len(args) == 1 {
					return 0 // no cached credentials to forget
				}
			case 'E':
				req.PreserveEnv = true
			case 'i':
				req.Login = true
			case 's':
				req.Shell = true
			case 'v':
				req.Validate = true
			case 'u':
				if j+1 < len(arg) {
					req.User = arg[j+1:]
				} else if i+1 < len(args) {
					i++
					req.User = args[i]
				} else {
					return fail("option requires an argument -- 'u'")
				}
				j = len(arg)
			case 'h':
				fmt.Fprintln(os.Stdout, sudoUsage)
				return 0
			case 'V':
				fmt.Fprintln(os.Stdout, "Sudo version 1.9 (compatible helper: "+Name+")")
				return 0
			default:
				return fail("option -%c is not supported in this sandbox\n%s", c, sudoUsage)
			}
		}
	}
	req.Argv = args[i:]
	if len(req.Argv) == 0 && !req.Login && !req.Shell && !req.Validate {
		fmt.Fprintln(stderr, sudoUsage)
		return 1
	}
	if !req.PreserveEnv {
		for _, k := range []string{"TERM", "COLORTERM", "DISPLAY", "XAUTHORITY", "LANG", "LANGUAGE", "TZ", "PATH", "SHELL", "COLUMNS", "LINES"} {
			if v, ok := os.LookupEnv(k); ok {
				req.Env = append(req.Env, k+"="+v)
			}
		}
		for _, kv := range os.Environ() {
			if strings.HasPrefix(kv, "LC_") {
				req.Env = append(req.Env, kv)
			}
		}
	} else {
		req.Env = os.Environ()
	}
	req.Cwd, _ = os.Getwd()
	if body, err := json.Marshal(req); err != nil || len(body) > sudoMaxRequest {
		return fail("the command and its environment are too large")
	}

	c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: socket, Net: "unix"})
	if err != nil {
		return fail("the sandbox's sudo helper is not reachable: %v", err)
	}
	defer c.Close()
	fds := make([]int, 3)
	for fd := 0; fd < 3; fd++ {
		fds[fd] = fd
		if _, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0); err != nil {
			null, err := os.OpenFile(os.DevNull, os.O_RDWR, 0)
			if err != nil {
				return fail("%v", err)
			}
			fds[fd] = int(null.Fd())
		}
	}
	// Signals are caught before the request so none is lost between.
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT, syscall.SIGUSR1, syscall.SIGUSR2, syscall.SIGWINCH)
	if err := writeFrame(c, req, unix.UnixRights(fds...)); err != nil {
		return fail("the sandbox's sudo helper: %v", err)
	}
	go func() {
		for s := range sigs {
			writeFrame(c, sudoSignal{Signal: int(s.(syscall.Signal))}, nil)
		}
	}()
	for {
		var r sudoReply
		if _, err := readFrame(c, &r, false); err != nil {
			return fail("the sandbox's sudo helper went away")
		}
		if r.Error != "" {
			fmt.Fprintf(stderr, "sudo: %s\n", r.Error)
		}
		if r.Done {
			return r.Exit
		}
	}
}
