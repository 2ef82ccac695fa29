package cli

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"text/tabwriter"
	"time"
)

// nodeCmd is `space node list|cordon|uncordon|drain`.
func nodeCmd(ctx context.Context, args []string, o Options) error {
	if len(args) == 0 {
		return fmt.Errorf("%w: space node list | cordon NODE | uncordon NODE | drain NODE", errUsage)
	}
	fs, cf := clientFlagSet("space node " + args[0])
	pos, c, err := cf.parse(fs, args[1:], o)
	if err != nil {
		return err
	}
	switch args[0] {
	case "list", "ls":
		nodes, err := c.ListNodes(ctx)
		if err != nil {
			return err
		}
		if cf.json {
			return printJSON(o.Stdout, nodes)
		}
		tw := tabwriter.NewWriter(o.Stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "ID\tNAME\tSTATE\tALIVE\tSANDBOXES\tMEMORY\tRUNTIMES\tLABELS\tHEARTBEAT")
		for _, n := range nodes {
			max := "-"
			if n.Capacity.MaxSandboxes > 0 {
				max = fmt.Sprint(n.Capacity.MaxSandboxes)
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%v\t%d/%s\t%d/%d MiB\t%s\t%s\t%s ago\n", n.ID, n.Name, n.State, n.Alive, n.Load.Sandboxes, max,
				n.Load.MemoryMiB, n.Capacity.MemoryMiB, strings.Join(n.Capacity.Runtimes, ","), labels(n.Labels), time.Since(n.HeartbeatAt).Round(time.Second))
		}
		return tw.Flush()
	case "cordon", "uncordon", "drain":
		if len(pos) == 0 {
			return fmt.Errorf("%w: space node %s NODE_ID…", errUsage, args[0])
		}
		for _, id := range pos {
			n, err := c.SetNodeState(ctx, id, args[0])
			if err != nil {
				return err
			}
			if cf.json {
				if err := printJSON(o.Stdout, n); err != nil {
					return err
				}
				continue
			}
			fmt.Fprintf(o.Stdout, "node %s (%s) is %s\n", n.ID, n.Name, n.State)
		}
		return nil
	}
	return fmt.Errorf("%w: unknown node command %q", errUsage, args[0])
}

func labels(m map[string]string) string {
	var out []string
	for k, v := range m {
		out = append(out, k+"="+v)
	}
	sort.Strings(out)
	return strings.Join(out, ",")
}
