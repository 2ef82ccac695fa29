package cli

import (
	"context"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/spacesandbox/space/client"
)

// snapshotCmd is `space snapshot create|list|get|rm`.
func snapshotCmd(ctx context.Context, args []string, o Options) error {
	if len(args) == 0 {
		return fmt.Errorf("%w: space snapshot create SANDBOX [--name N] [--wait] | list [--sandbox ID] | tag SNAPSHOT NAME:TAG | untag SNAPSHOT | rm SNAPSHOT", errUsage)
	}
	fs, cf := clientFlagSet("space snapshot " + args[0])
	name := fs.String("name", "", "a name for the snapshot (create)")
	wait := fs.Bool("wait", false, "wait until the snapshot is ready (create)")
	timeout := fs.Duration("timeout", 10*time.Minute, "how long --wait waits")
	sbID := fs.String("sandbox", "", "only snapshots of this sandbox (list)")
	limit := fs.Int("limit", 0, "page size (list)")
	pos, c, err := cf.parse(fs, args[1:], o)
	if err != nil {
		return err
	}
	switch args[0] {
	case "create":
		if len(pos) != 1 {
			return fmt.Errorf("%w: space snapshot create SANDBOX_ID [--name N] [--wait]", errUsage)
		}
		snap, op, err := c.CreateSnapshot(ctx, pos[0], *name, "")
		if err != nil {
			return err
		}
		if *wait {
			wctx, cancel := context.WithTimeout(ctx, *timeout)
			defer cancel()
			done, err := c.WaitOperation(wctx, op.ID)
			if err != nil {
				return fmt.Errorf("wait for %s: %w", op.ID, err)
			}
			*op = *done
			if op.State != "succeeded" {
				return fmt.Errorf("snapshot %s failed: %v", snap.ID, op.Error)
			}
			snap.State = "ready"
		}
		if cf.json {
			return printJSON(o.Stdout, map[string]any{"snapshot": snap, "operation": op})
		}
		fmt.Fprintf(o.Stdout, "snapshot %s %s (operation %s %s)\n", snap.ID, snap.State, op.ID, op.State)
		return nil
	case "list", "ls":
		var all []client.Snapshot
		cursor := ""
		for {
			page, err := c.ListSnapshots(ctx, *sbID, client.ListOptions{Limit: *limit, Cursor: cursor})
			if err != nil {
				return err
			}
			all = append(all, page.Items...)
			if page.NextCursor == nil || *limit > 0 {
				break
			}
			cursor = *page.NextCursor
		}
		if cf.json {
			return printJSON(o.Stdout, all)
		}
		tw := tabwriter.NewWriter(o.Stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "ID\tNAME\tSTATE\tTAG\tSANDBOX\tTEMPLATE\tRUNTIME\tSIZE\tCREATED")
		for _, s := range all {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%.1f MiB\t%s\n", s.ID, s.Name, s.State, s.Tag, s.SandboxID, s.Template.Ref, s.Runtime, float64(s.SizeBytes)/(1<<20), s.CreatedAt.Format(time.RFC3339))
		}
		return tw.Flush()
	case "tag", "untag":
		ref := ""
		if args[0] == "tag" {
			if len(pos) != 2 {
				return fmt.Errorf("%w: space snapshot tag SNAPSHOT_ID NAME:TAG", errUsage)
			}
			ref = pos[1]
		} else if len(pos) != 1 {
			return fmt.Errorf("%w: space snapshot untag SNAPSHOT_ID", errUsage)
		}
		return tagSnapshot(ctx, c, pos[0], ref, cf.json, o)
	case "rm", "delete":
		if len(pos) == 0 {
			return fmt.Errorf("%w: space snapshot rm SNAPSHOT_ID…", errUsage)
		}
		for _, id := range pos {
			if err := c.DeleteSnapshot(ctx, id); err != nil {
				return err
			}
			fmt.Fprintf(o.Stdout, "deleted %s\n", id)
		}
		return nil
	}
	return fmt.Errorf("%w: unknown snapshot command %q", errUsage, args[0])
}

// tagSnapshot tags a snapshot as template ref ("" untags) and says so.
func tagSnapshot(ctx context.Context, c *client.Client, id, ref string, asJSON bool, o Options) error {
	snap, err := c.TagSnapshot(ctx, id, ref)
	if err != nil {
		return err
	}
	if asJSON {
		return printJSON(o.Stdout, snap)
	}
	if ref == "" {
		fmt.Fprintf(o.Stdout, "snapshot %s is no template now\n", id)
		return nil
	}
	fmt.Fprintf(o.Stdout, "template %s starts from snapshot %s\n", snap.Tag, id)
	return nil
}
