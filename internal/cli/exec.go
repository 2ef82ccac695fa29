package cli

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/spacesandbox/space/client"
)

// execCmd runs a command in a sandbox, streams its output live and exits
// with its exit code: `space exec SANDBOX [flags] -- ARGV…`.
func execCmd(ctx context.Context, args []string, o Options) error {
	var cf clientFlags
	fs := flag.NewFlagSet("space exec", flag.ContinueOnError)
	cf.register(fs)
	cwd := fs.String("cwd", "", "working directory inside the sandbox")
	timeout := fs.String("timeout", "", "kill the command after this long, like 30s")
	env := kvFlag{}
	fs.Var(env, "env", "environment variable KEY=VALUE (repeatable)")
	stdin := fs.Bool("stdin", false, "send this process's stdin to the command")
	tty := fs.Bool("tty", false, "run the command in a terminal")
	pos, err := parse(fs, args, o.Stderr)
	if err != nil {
		return err
	}
	if len(pos) < 2 {
		return fmt.Errorf("%w: space exec SANDBOX_ID [flags] -- COMMAND [ARG…]", errUsage)
	}
	c, err := cf.client()
	if err != nil {
		return err
	}
	req := client.CommandRequest{Command: pos[1:], Cwd: *cwd, Timeout: *timeout, Stdin: *stdin}
	if len(env) > 0 {
		req.Env = env
	}
	if *tty {
		req.PTY = &client.PTY{Cols: 80, Rows: 24}
	}
	sess, err := c.CreateCommand(ctx, pos[0], req, "")
	if err != nil {
		return err
	}
	if *stdin {
		go func() {
			// The first attach starts the process; give it a moment to begin.
			time.Sleep(50 * time.Millisecond)
			buf := make([]byte, 1<<20)
			for {
				n, err := o.Stdin.Read(buf)
				if n > 0 {
					if c.SendStdin(ctx, sess, buf[:n]) != nil {
						return
					}
				}
				if err != nil {
					c.CloseStdin(ctx, sess)
					return
				}
			}
		}()
	}
	term, err := c.Attach(ctx, sess, "", 5, func(ev client.Event) error {
		switch ev.Name {
		case "output":
			w := o.Stdout
			if ev.Stream == "stderr" {
				w = o.Stderr
			}
			_, err := w.Write(ev.Data)
			return err
		case "resync_required":
			fmt.Fprintln(o.Stderr, "space: some output was no longer retained and is missing")
		}
		return nil
	})
	if err != nil {
		return err
	}
	if term.Name == "error" {
		code := 1
		switch term.Code {
		case "timeout":
			code = 124
		case "executable_not_found":
			code = 127
		case "executable_not_executable":
			code = 126
		}
		return &exitError{code: code, err: fmt.Errorf("%s: %s", term.Code, term.Message)}
	}
	if term.ExitCode != nil && *term.ExitCode != 0 {
		return &exitError{code: *term.ExitCode}
	}
	return nil
}

const filesUsage = "space files get SANDBOX PATH [LOCAL] | put SANDBOX LOCAL PATH | ls SANDBOX PATH | stat SANDBOX PATH | mkdir SANDBOX PATH | mv SANDBOX FROM TO | rm [-r] SANDBOX PATH"

// filesCmd moves files: space files get|put|ls|stat|mkdir|mv|rm.
func filesCmd(ctx context.Context, args []string, o Options) error {
	if len(args) == 0 {
		return fmt.Errorf("%w: %s", errUsage, filesUsage)
	}
	fs, cf := clientFlagSet("space files " + args[0])
	mode := fs.String("mode", "", "file mode for put and mkdir, octal like 0644")
	depth := fs.Int("depth", 1, "listing depth for ls")
	recursive := fs.Bool("r", false, "rm: a directory and everything in it")
	pos, c, err := cf.parse(fs, args[1:], o)
	if err != nil {
		return err
	}
	switch args[0] {
	case "get":
		if len(pos) < 2 || len(pos) > 3 {
			return fmt.Errorf("%w: space files get SANDBOX PATH [LOCAL|-]", errUsage)
		}
		var w io.Writer = o.Stdout
		if len(pos) == 3 && pos[2] != "-" {
			f, err := os.Create(pos[2])
			if err != nil {
				return err
			}
			defer f.Close()
			w = f
		}
		_, err := c.ReadFile(ctx, pos[0], pos[1], w)
		return err
	case "put":
		if len(pos) != 3 {
			return fmt.Errorf("%w: space files put SANDBOX LOCAL|- PATH", errUsage)
		}
		var r io.Reader = o.Stdin
		if pos[1] != "-" {
			f, err := os.Open(pos[1])
			if err != nil {
				return err
			}
			defer f.Close()
			r = f
		}
		e, err := c.WriteFile(ctx, pos[0], pos[2], *mode, r)
		if err != nil {
			return err
		}
		if cf.json {
			return printJSON(o.Stdout, e)
		}
		fmt.Fprintf(o.Stdout, "%s %s %d bytes\n", e.Path, e.Mode, e.Size)
		return nil
	case "ls":
		if len(pos) != 2 {
			return fmt.Errorf("%w: space files ls SANDBOX PATH", errUsage)
		}
		items, err := c.ListFiles(ctx, pos[0], pos[1], *depth)
		if err != nil {
			return err
		}
		if cf.json {
			return printJSON(o.Stdout, items)
		}
		for _, e := range items {
			printEntry(o.Stdout, e)
		}
		return nil
	case "stat", "mkdir", "mv":
		want := map[string]int{"stat": 2, "mkdir": 2, "mv": 3}[args[0]]
		if len(pos) != want {
			return fmt.Errorf("%w: %s", errUsage, filesUsage)
		}
		var e *client.Entry
		switch args[0] {
		case "stat":
			e, err = c.StatFile(ctx, pos[0], pos[1])
		case "mkdir":
			e, err = c.MakeDir(ctx, pos[0], pos[1], *mode)
		default:
			e, err = c.MoveFile(ctx, pos[0], pos[1], pos[2])
		}
		if err != nil {
			return err
		}
		if cf.json {
			return printJSON(o.Stdout, e)
		}
		printEntry(o.Stdout, *e)
		return nil
	case "rm":
		if len(pos) != 2 {
			return fmt.Errorf("%w: space files rm [-r] SANDBOX PATH", errUsage)
		}
		return c.RemoveFile(ctx, pos[0], pos[1], *recursive)
	}
	return fmt.Errorf("%w: unknown files command %q", errUsage, args[0])
}

// printEntry writes one line of `ls -l`'s kind: mode, type, size, time,
// path (and a symlink's target).
func printEntry(w io.Writer, e client.Entry) {
	line := fmt.Sprintf("%s %-7s %10d %s %s", e.Mode, e.Type, e.Size, e.ModTime.Format(time.RFC3339), e.Path)
	if e.Target != "" {
		line += " -> " + e.Target
	}
	fmt.Fprintln(w, line)
}
