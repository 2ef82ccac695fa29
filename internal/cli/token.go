package cli

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/spacesandbox/space/internal/api"
	"github.com/spacesandbox/space/internal/auth"
	"github.com/spacesandbox/space/internal/config"
	"github.com/spacesandbox/space/internal/server"
	"github.com/spacesandbox/space/internal/store"
)

// storeFlags adds the flags that find the server's store (--data-dir,
// --store) to fs and returns what opens it once they are parsed.
func storeFlags(fs *flag.FlagSet) func(ctx context.Context) (store.Store, error) {
	dataDir := fs.String("data-dir", envOr("SPACE_DATA_DIR", "/var/lib/space"), "data directory (env SPACE_DATA_DIR)")
	storeURL := new(string)
	config.SecretVar(fs, storeURL, "store", "SPACE_STORE", "the server's --store: empty for SQLite in the data directory, or a postgres:// `URL`")
	return func(ctx context.Context) (store.Store, error) { return server.OpenStore(ctx, *storeURL, *dataDir) }
}

// tokenCmd manages tokens directly in the data directory's store, so an
// operator on the server host can always mint or revoke one.
func tokenCmd(ctx context.Context, args []string, o Options) error {
	if len(args) == 0 {
		return fmt.Errorf("%w: space token create|list|revoke", errUsage)
	}
	fs := flag.NewFlagSet("space token", flag.ContinueOnError)
	openStore := storeFlags(fs)
	name := fs.String("name", "", "token name (create)")
	asJSON := fs.Bool("json", false, "print JSON")
	e2bKey := fs.Bool("e2b", false, "create: shape the token like an E2B API key (e2b_ and 40 hex digits), for SDKs that check")
	project := fs.String("project", "", "create: the token's project (default: default); list: only this project's")
	role := fs.String("role", "", "create: owner, admin, member or read-only (default: owner in the default project when --project is not given, else member)")
	expires := fs.String("expires", "", "create: lifetime, as days (30d) or a duration (12h); default: never")
	rate := fs.Float64("rate", 0, "create: requests per second the token may make (0: no limit)")
	burst := fs.Int("burst", 0, "create: requests the token may make at once above its rate (default: 2 × rate)")
	pos, err := parse(fs, args[1:], o.Stderr)
	if err != nil {
		return err
	}
	st, err := openStore(ctx)
	if err != nil {
		return err
	}
	defer st.Close()
	tokens := auth.New(st, st)
	switch args[0] {
	case "create":
		if *name == "" {
			return fmt.Errorf("%w: space token create --name NAME [--project P --role R --expires 30d]", errUsage)
		}
		r := store.Role(*role)
		if r == "" {
			r = store.RoleMember
			if *project == "" {
				r = store.RoleOwner
			}
		}
		ttl, err := api.ParseTTL(*expires)
		if err != nil {
			return err
		}
		tok, value, err := tokens.CreateSpec(ctx, auth.Spec{Name: *name, Project: *project, Role: r, TTL: ttl, RatePerSec: *rate, Burst: *burst, E2BFormat: *e2bKey})
		if err != nil {
			return err
		}
		if *asJSON {
			return json.NewEncoder(o.Stdout).Encode(map[string]string{"id": tok.ID, "name": tok.Name, "project": tok.Project, "role": string(tok.Role), "token": value})
		}
		fmt.Fprintf(o.Stderr, "created token %s (%s, %s of project %s); it is shown once:\n", tok.ID, tok.Name, tok.Role, tok.Project)
		fmt.Fprintln(o.Stdout, value)
		return nil
	case "list":
		list, err := tokens.List(ctx, *project)
		if err != nil {
			return err
		}
		if *asJSON {
			rows := []api.TokenView{}
			for _, t := range list {
				rows = append(rows, api.TokenOut(t))
			}
			return json.NewEncoder(o.Stdout).Encode(rows)
		}
		tw := tabwriter.NewWriter(o.Stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "ID\tNAME\tPROJECT\tROLE\tCREATED\tEXPIRES\tREVOKED")
		stamp := func(t *time.Time) string {
			if t == nil {
				return "-"
			}
			return t.Format(time.RFC3339)
		}
		for _, t := range list {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", t.ID, t.Name, t.Project, t.Role, t.CreatedAt.Format(time.RFC3339), stamp(t.ExpiresAt), stamp(t.RevokedAt))
		}
		return tw.Flush()
	case "revoke":
		if len(pos) != 1 {
			return fmt.Errorf("%w: space token revoke TOKEN_ID", errUsage)
		}
		if err := tokens.Revoke(ctx, pos[0]); err != nil {
			return err
		}
		fmt.Fprintf(o.Stderr, "revoked %s\n", pos[0])
		return nil
	}
	return fmt.Errorf("%w: unknown token command %q", errUsage, args[0])
}
