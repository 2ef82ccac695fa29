package cli

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/spacesandbox/space/internal/store"
)

// projectCmd manages projects directly in the server's store, as the
// server's owner on its host: create, list, rm, quota (the limits the owner
// sets; a project's admins set quotas within them through the API) and
// usage.
func projectCmd(ctx context.Context, args []string, o Options) error {
	if len(args) == 0 {
		return fmt.Errorf("%w: space project create|list|rm|quota|usage", errUsage)
	}
	fs := flag.NewFlagSet("space project", flag.ContinueOnError)
	openStore := storeFlags(fs)
	asJSON := fs.Bool("json", false, "print JSON")
	var q store.Quotas
	fs.IntVar(&q.Sandboxes, "sandboxes", 0, "quota: sandboxes not deleted (0: no limit)")
	fs.IntVar(&q.RunningSandboxes, "running", 0, "quota: sandboxes in memory (not suspended or failed)")
	fs.IntVar(&q.VCPUs, "vcpus", 0, "quota: vCPUs of the sandboxes in memory")
	fs.IntVar(&q.MemoryMiB, "memory-mib", 0, "quota: memory (MiB) of the sandboxes in memory")
	fs.IntVar(&q.DiskMiB, "disk-mib", 0, "quota: disk (MiB) of every sandbox not deleted")
	fs.IntVar(&q.SnapshotMiB, "snapshot-mib", 0, "quota: size (MiB) of the project's snapshots")
	fs.IntVar(&q.Templates, "templates", 0, "quota: template names the project builds")
	fs.IntVar(&q.WarmPool, "warm-pool", 0, "quota: min_ready summed over the project's warm pools")
	pos, err := parse(fs, args[1:], o.Stderr)
	if err != nil {
		return err
	}
	st, err := openStore(ctx)
	if err != nil {
		return err
	}
	defer st.Close()
	one := func(verb string) (string, error) {
		if len(pos) != 1 {
			return "", fmt.Errorf("%w: space project %s NAME", errUsage, verb)
		}
		return pos[0], nil
	}
	show := func(v any, text string) error {
		if *asJSON {
			return json.NewEncoder(o.Stdout).Encode(v)
		}
		fmt.Fprintln(o.Stdout, text)
		return nil
	}
	switch args[0] {
	case "create":
		name, err := one("create")
		if err != nil {
			return err
		}
		p := &store.Project{Name: name, Limits: q, CreatedAt: time.Now().UTC()}
		if err := q.Validate(); err != nil {
			return err
		}
		if err := st.CreateProject(ctx, p); err != nil {
			return err
		}
		return show(p, "created project "+name+"; make its first token with: space token create --project "+name+" --role admin --name NAME")
	case "list":
		list, err := st.ListProjects(ctx)
		if err != nil {
			return err
		}
		if *asJSON {
			return json.NewEncoder(o.Stdout).Encode(list)
		}
		tw := tabwriter.NewWriter(o.Stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "NAME\tSANDBOXES\tRUNNING\tVCPUS\tMEMORY_MIB\tCREATED")
		for _, p := range list {
			e := p.Effective()
			lim := func(n int) string {
				if n == 0 {
					return "-"
				}
				return fmt.Sprint(n)
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", p.Name, lim(e.Sandboxes), lim(e.RunningSandboxes), lim(e.VCPUs), lim(e.MemoryMiB), p.CreatedAt.Format(time.RFC3339))
		}
		return tw.Flush()
	case "rm":
		name, err := one("rm")
		if err != nil {
			return err
		}
		if err := st.DeleteProject(ctx, name); err != nil {
			return err
		}
		return show(map[string]string{"deleted": name}, "removed project "+name)
	case "quota":
		name, err := one("quota --sandboxes N … ")
		if err != nil {
			return err
		}
		p, err := st.UpdateProject(ctx, name, func(p *store.Project) error {
			p.Limits = q
			return nil
		})
		if err != nil {
			return err
		}
		b, _ := json.Marshal(p.Effective())
		return show(p, "project "+name+" now holds at most "+string(b)+" (0: no limit)")
	case "usage":
		name, err := one("usage")
		if err != nil {
			return err
		}
		u, err := st.ProjectUsage(ctx, name)
		if err != nil {
			return err
		}
		b, _ := json.Marshal(u)
		return show(u, string(b))
	}
	return fmt.Errorf("%w: unknown project command %q", errUsage, args[0])
}
