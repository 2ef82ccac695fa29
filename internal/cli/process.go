package cli

import (
	"context"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spacesandbox/space/client"
)

const processUsage = "space process list SANDBOX | get SANDBOX PROCESS | signal SANDBOX PROCESS [--signal SIGTERM]"

// processCmd is `space process list|get|signal`: a sandbox's command
// sessions' processes.
func processCmd(ctx context.Context, args []string, o Options) error {
	if len(args) == 0 {
		return fmt.Errorf("%w: %s", errUsage, processUsage)
	}
	fs, cf := clientFlagSet("space process " + args[0])
	signal := fs.String("signal", "SIGTERM", "signal: the signal to send (SIGTERM, SIGKILL, SIGINT, SIGHUP, …)")
	pos, c, err := cf.parse(fs, args[1:], o)
	if err != nil {
		return err
	}
	switch args[0] {
	case "list", "ls":
		if len(pos) != 1 {
			return fmt.Errorf("%w: space process list SANDBOX", errUsage)
		}
		ps, err := c.ListProcesses(ctx, pos[0])
		if err != nil {
			return err
		}
		if cf.json {
			return printJSON(o.Stdout, ps)
		}
		tw := tabwriter.NewWriter(o.Stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "ID\tPID\tSTATE\tEXIT\tSTARTED\tCOMMAND")
		for _, p := range ps {
			started := ""
			if p.StartedAt != nil {
				started = p.StartedAt.Format(time.RFC3339)
			}
			fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\n", p.ID, p.PID, p.State, exitOf(p), started, strings.Join(p.Command, " "))
		}
		return tw.Flush()
	case "get":
		if len(pos) != 2 {
			return fmt.Errorf("%w: space process get SANDBOX PROCESS", errUsage)
		}
		p, err := c.GetProcess(ctx, pos[0], pos[1])
		if err != nil {
			return err
		}
		if cf.json {
			return printJSON(o.Stdout, p)
		}
		tw := tabwriter.NewWriter(o.Stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintf(tw, "ID\t%s\nPID\t%d\nSTATE\t%s\nCOMMAND\t%s\n", p.ID, p.PID, p.State, strings.Join(p.Command, " "))
		if p.User != "" {
			fmt.Fprintf(tw, "USER\t%s\n", p.User)
		}
		if p.Cwd != "" {
			fmt.Fprintf(tw, "CWD\t%s\n", p.Cwd)
		}
		if e := exitOf(*p); e != "" {
			fmt.Fprintf(tw, "EXIT\t%s\n", e)
		}
		return tw.Flush()
	case "signal", "kill":
		if len(pos) != 2 {
			return fmt.Errorf("%w: space process signal SANDBOX PROCESS [--signal SIGTERM]", errUsage)
		}
		if err := c.SignalProcess(ctx, pos[0], pos[1], *signal); err != nil {
			return err
		}
		if cf.json {
			return printJSON(o.Stdout, map[string]string{"process_id": pos[1], "signal": *signal})
		}
		fmt.Fprintf(o.Stdout, "sent %s to %s\n", *signal, pos[1])
		return nil
	}
	return fmt.Errorf("%w: unknown process command %q", errUsage, args[0])
}

// exitOf is how a process ended: its exit code, the signal that killed
// it, or why it could not run; "" while it runs.
func exitOf(p client.Process) string {
	switch {
	case p.ExitCode != nil && p.Signal != nil:
		return fmt.Sprintf("%d (%s)", *p.ExitCode, *p.Signal)
	case p.ExitCode != nil:
		return fmt.Sprint(*p.ExitCode)
	case p.Signal != nil:
		return *p.Signal
	case p.Error != nil:
		return p.Error.Code
	}
	return ""
}

const poolUsage = "space pool get NAME:TAG | set NAME:TAG MIN_READY"

// poolCmd is `space pool get|set`: the project's warm pool of a template.
func poolCmd(ctx context.Context, args []string, o Options) error {
	if len(args) == 0 {
		return fmt.Errorf("%w: %s", errUsage, poolUsage)
	}
	fs, cf := clientFlagSet("space pool " + args[0])
	pos, c, err := cf.parse(fs, args[1:], o)
	if err != nil {
		return err
	}
	var wp *client.WarmPool
	switch args[0] {
	case "get":
		if len(pos) != 1 {
			return fmt.Errorf("%w: space pool get NAME:TAG", errUsage)
		}
		wp, err = c.GetWarmPool(ctx, pos[0])
	case "set":
		var n int
		if len(pos) != 2 {
			return fmt.Errorf("%w: space pool set NAME:TAG MIN_READY", errUsage)
		}
		if _, perr := fmt.Sscan(pos[1], &n); perr != nil || fmt.Sprint(n) != pos[1] {
			return fmt.Errorf("%w: MIN_READY must be a whole number, not %q", errUsage, pos[1])
		}
		wp, err = c.SetWarmPool(ctx, pos[0], n)
	default:
		return fmt.Errorf("%w: unknown pool command %q", errUsage, args[0])
	}
	if err != nil {
		return err
	}
	if cf.json {
		return printJSON(o.Stdout, wp)
	}
	fmt.Fprintf(o.Stdout, "%s: min_ready %d, ready %d, starting %d\n", wp.Template, wp.MinReady, wp.Ready, wp.Starting)
	return nil
}
