package cli

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spacesandbox/space/client"
)

// kvFlag collects repeated K=V flags.
type kvFlag map[string]string

func (k kvFlag) String() string { return "" }
func (k kvFlag) Set(s string) error {
	key, val, ok := strings.Cut(s, "=")
	if !ok || key == "" {
		return fmt.Errorf("want KEY=VALUE, got %q", s)
	}
	k[key] = val
	return nil
}

// listFlag collects a repeated flag, each value also split at commas.
type listFlag []string

func (l *listFlag) String() string { return "" }
func (l *listFlag) Set(s string) error {
	for _, v := range strings.Split(s, ",") {
		if v = strings.TrimSpace(v); v != "" {
			*l = append(*l, v)
		}
	}
	return nil
}

// networkFlags are a network policy's flags (create and network).
type networkFlags struct {
	egress      string
	allow, deny listFlag
	public      bool
}

func (n *networkFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&n.egress, "egress", "", "where no rule decides: public or none (default: the server's --default-egress)")
	fs.Var(&n.allow, "allow", "allow a CIDR, address or domain name (pypi.org, *.github.com); repeatable or comma-separated")
	fs.Var(&n.deny, "deny", "deny a CIDR, address or domain name; repeatable or comma-separated")
	fs.BoolVar(&n.public, "public-ingress", false, "let anyone reach the sandbox's ports without its ingress token")
}

// policy is the policy the flags name, nil if none was given.
func (n *networkFlags) policy() *client.Network {
	if n.egress == "" && len(n.allow) == 0 && len(n.deny) == 0 && !n.public {
		return nil
	}
	return &client.Network{Egress: n.egress, Allow: n.allow, Deny: n.deny, PublicIngress: n.public}
}

// describeNetwork is a network policy in one line.
func describeNetwork(n *client.Network) string {
	if n == nil {
		return "none (no sandbox networking on this server)"
	}
	s := "egress " + n.Egress
	if len(n.Allow) > 0 {
		s += ", allow " + strings.Join(n.Allow, " ")
	}
	if len(n.Deny) > 0 {
		s += ", deny " + strings.Join(n.Deny, " ")
	}
	if n.PublicIngress {
		s += ", ports public"
	}
	return s
}

func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func sandboxCmd(ctx context.Context, args []string, o Options) error {
	if len(args) == 0 {
		return fmt.Errorf("%w: space sandbox create|list|get|metrics|network|pause|suspend|wake|fork|delete", errUsage)
	}
	fs, cf := clientFlagSet("space sandbox " + args[0])
	wait := fs.Bool("wait", false, "wait for the operation to finish (lifecycle verbs, create)")
	timeout := fs.Duration("timeout", 10*time.Minute, "how long --wait waits")
	key := fs.String("idempotency-key", "", "Idempotency-Key to send (default: a new random key)")
	count := fs.Int("count", 1, "how many copies (fork, 1–16)")
	var req client.CreateSandboxRequest
	env, meta := kvFlag{}, kvFlag{}
	var res client.Resources
	var al client.AutoLifecycle
	var nf networkFlags
	state := ""
	limit := 0
	all := false
	var since time.Duration
	switch args[0] {
	case "create":
		fs.StringVar(&req.Template, "template", "", "template (default seed:latest)")
		fs.StringVar(&req.Snapshot, "snapshot", "", "start from this snapshot (snap_…) instead of a template: its memory, processes and files")
		fs.StringVar(&req.Runtime, "runtime", "", "runtime: vm or gvisor (default: the server's)")
		fs.IntVar(&res.VCPUs, "vcpus", 0, "vCPUs")
		fs.IntVar(&res.MemoryMiB, "memory", 0, "memory in MiB")
		fs.IntVar(&res.DiskMiB, "disk", 0, "disk in MiB")
		fs.Var(env, "env", "environment variable KEY=VALUE (repeatable)")
		fs.Var(meta, "metadata", "metadata KEY=VALUE (repeatable)")
		fs.StringVar(&al.IdleTimeout, "idle-timeout", "", "idle timeout, like 10m")
		fs.StringVar(&al.IdleAction, "idle-action", "", "idle action: pause, suspend or none")
		fs.StringVar(&al.Timeout, "run-timeout", "", "longest stretch of running time, like 1h (auto_lifecycle.timeout)")
		fs.StringVar(&al.TimeoutAction, "timeout-action", "", "what --run-timeout does: delete or suspend")
		nf.register(fs)
	case "network":
		nf.register(fs)
	case "metrics":
		fs.DurationVar(&since, "since", 0, "only samples of this last stretch, like 10m (default: all the server keeps)")
	case "list":
		fs.StringVar(&state, "state", "", "only sandboxes in this state")
		fs.IntVar(&limit, "limit", 0, "page size")
		fs.BoolVar(&all, "all", false, "follow next_cursor to the end")
	}
	pos, c, err := cf.parse(fs, args[1:], o)
	if err != nil {
		return err
	}
	waitFor := func(op *client.Operation) error {
		if !*wait {
			return nil
		}
		wctx, cancel := context.WithTimeout(ctx, *timeout)
		defer cancel()
		done, err := c.WaitOperation(wctx, op.ID)
		if err != nil {
			return fmt.Errorf("wait for %s: %w", op.ID, err)
		}
		*op = *done
		if op.State != "succeeded" {
			msg := "failed"
			if op.Error != nil {
				msg = op.Error.Code + ": " + op.Error.Message
			}
			return &exitError{code: 1, err: fmt.Errorf("operation %s %s", op.ID, msg)}
		}
		return nil
	}
	switch args[0] {
	case "create":
		if len(pos) != 0 {
			return fmt.Errorf("%w: create takes flags only", errUsage)
		}
		if res != (client.Resources{}) {
			req.Resources = &res
		}
		if al != (client.AutoLifecycle{}) {
			req.AutoLifecycle = &al
		}
		if len(env) > 0 {
			req.Env = env
		}
		if len(meta) > 0 {
			req.Metadata = meta
		}
		req.Network = nf.policy()
		out, _, err := c.CreateSandbox(ctx, req, *key)
		if err != nil {
			return err
		}
		werr := waitFor(&out.Operation)
		if werr == nil && *wait {
			if sb, err := c.GetSandbox(ctx, out.Sandbox.ID); err == nil {
				out.Sandbox = *sb
			}
		}
		if cf.json {
			if err := printJSON(o.Stdout, out); err != nil {
				return err
			}
		} else {
			fmt.Fprintf(o.Stdout, "sandbox %s %s (operation %s %s)\n", out.Sandbox.ID, out.Sandbox.State, out.Operation.ID, out.Operation.State)
		}
		return werr
	case "list":
		var items []client.Sandbox
		opts := client.ListOptions{Limit: limit}
		var next *string
		for {
			page, err := c.ListSandboxes(ctx, state, opts)
			if err != nil {
				return err
			}
			items = append(items, page.Items...)
			next = page.NextCursor
			if !all || next == nil {
				break
			}
			opts.Cursor = *next
		}
		if cf.json {
			return printJSON(o.Stdout, client.List[client.Sandbox]{Items: items, NextCursor: next})
		}
		tw := tabwriter.NewWriter(o.Stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "ID\tSTATE\tRUNTIME\tTEMPLATE\tCREATED")
		for _, sb := range items {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", sb.ID, sb.State, sb.Runtime, sb.Template.Ref, sb.CreatedAt.Format(time.RFC3339))
		}
		if next != nil {
			fmt.Fprintf(tw, "(more: --all, or --json for next_cursor)\n")
		}
		return tw.Flush()
	case "get":
		if len(pos) != 1 {
			return fmt.Errorf("%w: space sandbox get SANDBOX_ID", errUsage)
		}
		sb, err := c.GetSandbox(ctx, pos[0])
		if err != nil {
			return err
		}
		if cf.json {
			return printJSON(o.Stdout, sb)
		}
		tw := tabwriter.NewWriter(o.Stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintf(tw, "ID\t%s\nSTATE\t%s\nRUNTIME\t%s\nTEMPLATE\t%s (%s)\n", sb.ID, sb.State, sb.Runtime, sb.Template.Ref, sb.Template.Digest)
		fmt.Fprintf(tw, "RESOURCES\t%d vCPU, %d MiB memory, %d MiB disk\n", sb.Resources.VCPUs, sb.Resources.MemoryMiB, sb.Resources.DiskMiB)
		fmt.Fprintf(tw, "IDLE\t%s after %s\n", sb.AutoLifecycle.IdleAction, sb.AutoLifecycle.IdleTimeout)
		if al := sb.AutoLifecycle; al.Timeout != "" && al.Timeout != "0s" {
			fmt.Fprintf(tw, "TIMEOUT\t%s after %s running\n", al.TimeoutAction, al.Timeout)
		}
		fmt.Fprintf(tw, "CREATED\t%s\nUPDATED\t%s\n", sb.CreatedAt.Format(time.RFC3339), sb.UpdatedAt.Format(time.RFC3339))
		fmt.Fprintf(tw, "NETWORK\t%s\n", describeNetwork(sb.Network))
		if sb.Network != nil && sb.Network.IngressToken != "" {
			fmt.Fprintf(tw, "INGRESS TOKEN\t%s\n", sb.Network.IngressToken)
		}
		if sb.ExpiresAt != nil {
			fmt.Fprintf(tw, "EXPIRES\t%s\n", sb.ExpiresAt.Format(time.RFC3339))
		}
		if sb.Error != nil {
			fmt.Fprintf(tw, "ERROR\t%s: %s\n", sb.Error.Code, sb.Error.Message)
		}
		return tw.Flush()
	case "metrics":
		if len(pos) != 1 {
			return fmt.Errorf("%w: space sandbox metrics SANDBOX_ID [--since 10m]", errUsage)
		}
		var start time.Time
		if since > 0 {
			start = time.Now().Add(-since)
		}
		items, err := c.SandboxMetrics(ctx, pos[0], start, time.Time{})
		if err != nil {
			return err
		}
		if cf.json {
			return printJSON(o.Stdout, items)
		}
		tw := tabwriter.NewWriter(o.Stdout, 0, 4, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "TIME	CPU %	MEMORY MiB	OF MiB	DISK MiB	OF MiB	")
		for _, m := range items {
			fmt.Fprintf(tw, "%s	%.1f	%d	%d	%d	%d	\n", m.At.Local().Format(time.TimeOnly), m.CPUUsedPct, m.MemUsed>>20, m.MemTotal>>20, m.DiskUsed>>20, m.DiskTotal>>20)
		}
		return tw.Flush()
	case "network":
		// The policy is replaced whole, as PUT …/network does: flags not
		// given take their defaults.
		if len(pos) != 1 {
			return fmt.Errorf("%w: space sandbox network SANDBOX_ID [--egress public|none] [--allow X]… [--deny X]… [--public-ingress]", errUsage)
		}
		n := nf.policy()
		if n == nil {
			n = &client.Network{}
		}
		sb, err := c.SetNetwork(ctx, pos[0], *n, *key)
		if err != nil {
			return err
		}
		if cf.json {
			return printJSON(o.Stdout, sb)
		}
		fmt.Fprintf(o.Stdout, "sandbox %s network: %s\n", sb.ID, describeNetwork(sb.Network))
		return nil
	case "fork":
		if len(pos) != 1 {
			return fmt.Errorf("%w: space sandbox fork SANDBOX_ID [--count N]", errUsage)
		}
		op, forks, _, err := c.Fork(ctx, pos[0], *count, *key)
		if err != nil {
			return err
		}
		werr := waitFor(op)
		if cf.json {
			if err := printJSON(o.Stdout, map[string]any{"operation": op, "sandboxes": forks}); err != nil {
				return err
			}
		} else {
			fmt.Fprintf(o.Stdout, "operation %s %s %s\n", op.ID, op.Kind, op.State)
			for _, f := range forks {
				fmt.Fprintln(o.Stdout, f.ID)
			}
		}
		return werr
	case "pause", "suspend", "wake", "delete":
		if len(pos) != 1 {
			return fmt.Errorf("%w: space sandbox %s SANDBOX_ID", errUsage, args[0])
		}
		op, _, err := c.Lifecycle(ctx, args[0], pos[0], *key)
		if err != nil {
			return err
		}
		werr := waitFor(op)
		if cf.json {
			if err := printJSON(o.Stdout, map[string]any{"operation": op}); err != nil {
				return err
			}
		} else {
			fmt.Fprintf(o.Stdout, "operation %s %s %s\n", op.ID, op.Kind, op.State)
		}
		return werr
	}
	return fmt.Errorf("%w: unknown sandbox command %q", errUsage, args[0])
}

func operationCmd(ctx context.Context, args []string, o Options) error {
	if len(args) == 0 {
		return fmt.Errorf("%w: space operation get|wait|list", errUsage)
	}
	fs, cf := clientFlagSet("space operation " + args[0])
	timeout := fs.Duration("timeout", 10*time.Minute, "how long wait waits")
	sbID := fs.String("sandbox", "", "only operations of this sandbox (list)")
	limit := fs.Int("limit", 0, "page size (list)")
	pos, c, err := cf.parse(fs, args[1:], o)
	if err != nil {
		return err
	}
	show := func(op *client.Operation) error {
		if cf.json {
			return printJSON(o.Stdout, op)
		}
		msg := ""
		if op.Error != nil {
			msg = " " + op.Error.Code + ": " + op.Error.Message
		}
		fmt.Fprintf(o.Stdout, "operation %s %s %s sandbox %s%s\n", op.ID, op.Kind, op.State, op.SandboxID, msg)
		return nil
	}
	switch args[0] {
	case "get", "wait":
		if len(pos) != 1 {
			return fmt.Errorf("%w: space operation %s OPERATION_ID", errUsage, args[0])
		}
		var op *client.Operation
		if args[0] == "get" {
			op, err = c.GetOperation(ctx, pos[0])
		} else {
			wctx, cancel := context.WithTimeout(ctx, *timeout)
			defer cancel()
			op, err = c.WaitOperation(wctx, pos[0])
		}
		if err != nil {
			return err
		}
		if err := show(op); err != nil {
			return err
		}
		if args[0] == "wait" && op.State != "succeeded" {
			return &exitError{code: 1}
		}
		return nil
	case "list":
		page, err := c.ListOperations(ctx, *sbID, client.ListOptions{Limit: *limit})
		if err != nil {
			return err
		}
		if cf.json {
			return printJSON(o.Stdout, page)
		}
		tw := tabwriter.NewWriter(o.Stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "ID\tKIND\tSTATE\tSANDBOX\tCREATED")
		for _, op := range page.Items {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", op.ID, op.Kind, op.State, op.SandboxID, op.CreatedAt.Format(time.RFC3339))
		}
		return tw.Flush()
	}
	return fmt.Errorf("%w: unknown operation command %q", errUsage, args[0])
}
