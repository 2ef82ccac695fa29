package cli

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"text/tabwriter"
	"time"

	"github.com/spacesandbox/space/internal/auth"
	"github.com/spacesandbox/space/internal/server"
)

// tokenCmd manages tokens directly in the data directory's store, so an
// operator on the server host can always mint or revoke one.
func tokenCmd(ctx context.Context, args []string, o Options) error {
	if len(args) == 0 {
		return fmt.Errorf("%w: space token create|list|revoke", errUsage)
	}
	fs := flag.NewFlagSet("space token", flag.ContinueOnError)
	dataDir := fs.String("data-dir", envOr("SPACE_DATA_DIR", "/var/lib/space"), "data directory (env SPACE_DATA_DIR)")
	storeURL := fs.String("store", os.Getenv("SPACE_STORE"), "the server's --store: empty for SQLite in the data directory, or a postgres:// URL (env SPACE_STORE)")
	name := fs.String("name", "", "token name (create)")
	asJSON := fs.Bool("json", false, "print JSON")
	e2bKey := fs.Bool("e2b", false, "create: shape the token like an E2B API key (e2b_ and 40 hex digits), for SDKs that check")
	pos, err := parse(fs, args[1:])
	if err != nil {
		return err
	}
	st, err := server.OpenStore(ctx, *storeURL, *dataDir)
	if err != nil {
		return err
	}
	defer st.Close()
	tokens := auth.New(st)
	switch args[0] {
	case "create":
		if *name == "" {
			return fmt.Errorf("%w: space token create --name NAME", errUsage)
		}
		create := tokens.Create
		if *e2bKey {
			create = tokens.CreateE2BKey
		}
		tok, value, err := create(ctx, *name)
		if err != nil {
			return err
		}
		if *asJSON {
			return json.NewEncoder(o.Stdout).Encode(map[string]string{"id": tok.ID, "name": tok.Name, "token": value})
		}
		fmt.Fprintf(o.Stderr, "created token %s (%s); it is shown once:\n", tok.ID, tok.Name)
		fmt.Fprintln(o.Stdout, value)
		return nil
	case "list":
		list, err := tokens.List(ctx)
		if err != nil {
			return err
		}
		if *asJSON {
			type row struct {
				ID        string     `json:"id"`
				Name      string     `json:"name"`
				CreatedAt time.Time  `json:"created_at"`
				RevokedAt *time.Time `json:"revoked_at"`
			}
			rows := []row{}
			for _, t := range list {
				rows = append(rows, row{t.ID, t.Name, t.CreatedAt, t.RevokedAt})
			}
			return json.NewEncoder(o.Stdout).Encode(rows)
		}
		tw := tabwriter.NewWriter(o.Stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "ID\tNAME\tCREATED\tREVOKED")
		for _, t := range list {
			rev := "-"
			if t.RevokedAt != nil {
				rev = t.RevokedAt.Format(time.RFC3339)
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", t.ID, t.Name, t.CreatedAt.Format(time.RFC3339), rev)
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
