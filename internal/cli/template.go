package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spacesandbox/space/internal/blobstore"
	"github.com/spacesandbox/space/internal/config"
	"github.com/spacesandbox/space/internal/server"
	"github.com/spacesandbox/space/internal/templates"
)

// templateCmd manages the data directory's template store directly, like
// `space token`: space template build|list|inspect|tag|rm|gc.
func templateCmd(ctx context.Context, args []string, o Options) error {
	if len(args) == 0 {
		return fmt.Errorf("%w: space template build test|seed | list [--remote] | inspect [--remote] NAME:TAG | tag NAME:TAG NEW:TAG | tag --from-snapshot SNAPSHOT NEW:TAG | rm NAME:TAG | gc", errUsage)
	}
	if args[0] == "tag" && slices.ContainsFunc(args[1:], func(a string) bool {
		return strings.HasPrefix(a, "--from-snapshot") || strings.HasPrefix(a, "-from-snapshot")
	}) {
		return tagFromSnapshot(ctx, args[1:], o)
	}
	if (args[0] == "list" || args[0] == "ls" || args[0] == "inspect") && slices.ContainsFunc(args[1:], func(a string) bool {
		return a == "--remote" || a == "-remote" || a == "--remote=true" || a == "-remote=true"
	}) {
		return remoteTemplates(ctx, args, o)
	}
	fs := flag.NewFlagSet("space template", flag.ContinueOnError)
	dataDir := fs.String("data-dir", envOr("SPACE_DATA_DIR", "/var/lib/space"), "data directory (env SPACE_DATA_DIR)")
	storeURL := new(string)
	config.SecretVar(fs, storeURL, "store", "SPACE_STORE", "gc: the server's --store: empty for SQLite in the data directory, or a postgres:// `URL`")
	blobURL := fs.String("blob-store", os.Getenv("SPACE_BLOB_STORE"), "the server's --blob-store: builds, tags, rm and gc act on its templates there too (env SPACE_BLOB_STORE)")
	asJSON := fs.Bool("json", false, "print JSON")
	pos, err := parse(fs, args[1:], o.Stderr)
	if err != nil {
		return err
	}
	if err := server.MakeDataDir(*dataDir); err != nil {
		return err
	}
	// One owner per data directory. While a server (or another build) owns
	// it, reading, tagging and gc go ahead without disturbing its work (its
	// unfinished builds are kept); a build waits for it to stop — or goes
	// through its API (POST /v1/templates).
	open := templates.Open
	lock, err := server.LockDataDir(ctx, *dataDir)
	switch {
	case errors.Is(err, server.ErrDataDirInUse):
		switch args[0] {
		case "list", "ls", "inspect", "tag", "rm", "gc":
			open = templates.OpenShared
		default:
			return fmt.Errorf("space template %s: %w; stop the server first, or build and import through its API (POST /v1/templates)", args[0], err)
		}
	case err != nil:
		return err
	default:
		defer lock.Release()
	}
	store, err := open(filepath.Join(*dataDir, "templates"))
	if err != nil {
		return err
	}
	if *blobURL != "" {
		bs, err := blobstore.Open(ctx, *blobURL)
		if err != nil {
			return err
		}
		store.SetRemote(&templates.Remote{Mirror: bs})
	}
	switch args[0] {
	case "build":
		if len(pos) != 1 {
			return fmt.Errorf("%w: space template build test|seed", errUsage)
		}
		start := time.Now()
		t, err := store.Build(ctx, pos[0], o.Stderr)
		if err != nil {
			return err
		}
		if *asJSON {
			return printJSON(o.Stdout, t)
		}
		fmt.Fprintf(o.Stdout, "%s %s (%d MiB, built in %s)\n", t.Ref(), t.Digest, t.SizeBytes>>20, time.Since(start).Round(time.Millisecond))
		return nil
	case "list", "ls":
		list, err := store.List(ctx)
		if err != nil {
			return err
		}
		if *asJSON {
			return printJSON(o.Stdout, list)
		}
		rows := make([]templateRow, len(list))
		for i, t := range list {
			rows[i] = templateRow{t.Ref(), t.Digest, t.SizeBytes, t.CreatedAt}
		}
		return printTemplates(o.Stdout, rows)
	case "inspect":
		if len(pos) != 1 {
			return fmt.Errorf("%w: space template inspect NAME:TAG", errUsage)
		}
		t, err := store.Get(pos[0])
		if err != nil {
			return err
		}
		return printJSON(o.Stdout, t)
	case "tag":
		if len(pos) != 2 {
			return fmt.Errorf("%w: space template tag NAME:TAG NEWNAME:NEWTAG", errUsage)
		}
		t, err := store.Get(pos[0])
		if err != nil {
			return err
		}
		name, tag, err := templates.ParseRef(pos[1])
		if err != nil {
			return err
		}
		return store.Tag(ctx, name, tag, t.Digest)
	case "rm":
		if len(pos) != 1 {
			return fmt.Errorf("%w: space template rm NAME:TAG", errUsage)
		}
		return store.Untag(ctx, pos[0])
	case "gc":
		// Content a sandbox still uses (in any state but deleted, warm
		// pools included) is kept, whatever its tags. A create racing
		// with gc may still lose its template: run it while the server is
		// stopped or quiet. Runtimes drop what they derived from removed
		// content (the vm runtime's ext4 images and template snapshots)
		// when they next start.
		inUse, err := templatesInUse(ctx, *storeURL, *dataDir)
		if err != nil {
			return err
		}
		removed, err := store.GC(ctx, inUse)
		for _, d := range removed {
			fmt.Fprintln(o.Stdout, "removed", d)
		}
		return err
	}
	return fmt.Errorf("%w: unknown template command %q", errUsage, args[0])
}

type templateRow struct {
	ref, digest string
	size        int64
	created     time.Time
}

func printTemplates(w io.Writer, rows []templateRow) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TEMPLATE\tDIGEST\tSIZE\tCREATED")
	for _, t := range rows {
		fmt.Fprintf(tw, "%s\t%s\t%d MiB\t%s\n", t.ref, t.digest[:min(19, len(t.digest))], t.size>>20, t.created.Format(time.RFC3339))
	}
	return tw.Flush()
}

// remoteTemplates is `space template list|inspect --remote`: the templates
// the server's API offers the token's project, for a client that is not on
// the server's host.
func remoteTemplates(ctx context.Context, args []string, o Options) error {
	fs, cf := clientFlagSet("space template " + args[0])
	fs.Bool("remote", true, "through the server's API (--api-url, --token) instead of the data directory")
	pos, c, err := cf.parse(fs, args[1:], o)
	if err != nil {
		return err
	}
	if args[0] == "inspect" {
		if len(pos) != 1 {
			return fmt.Errorf("%w: space template inspect --remote NAME:TAG", errUsage)
		}
		t, err := c.GetTemplate(ctx, pos[0])
		if err != nil {
			return err
		}
		return printJSON(o.Stdout, t)
	}
	list, err := c.ListTemplates(ctx)
	if err != nil {
		return err
	}
	if cf.json {
		return printJSON(o.Stdout, list)
	}
	rows := make([]templateRow, len(list))
	for i, t := range list {
		rows[i] = templateRow{t.Ref(), t.Digest, t.SizeBytes, t.CreatedAt}
	}
	return printTemplates(o.Stdout, rows)
}

// templatesInUse reports the template digests the server's sandboxes and
// snapshots were made from.
func templatesInUse(ctx context.Context, storeURL, dataDir string) (func(string) bool, error) {
	if storeURL == "" {
		if _, err := os.Stat(filepath.Join(dataDir, server.DBFile)); errors.Is(err, fs.ErrNotExist) {
			return func(string) bool { return false }, nil // no server ran here
		}
	}
	st, err := server.OpenStore(ctx, storeURL, dataDir)
	if err != nil {
		return nil, err
	}
	defer st.Close()
	used, err := st.TemplatesInUse(ctx)
	if err != nil {
		return nil, err
	}
	return func(d string) bool { return used[d] }, nil
}

// tagFromSnapshot is `space template tag --from-snapshot SNAPSHOT NAME:TAG`:
// through the server's API (snapshots live in its store), the template
// NAME:TAG starts from the snapshot.
func tagFromSnapshot(ctx context.Context, args []string, o Options) error {
	var cf clientFlags
	fs := flag.NewFlagSet("space template tag", flag.ContinueOnError)
	cf.register(fs)
	from := fs.String("from-snapshot", "", "the snapshot (snap_…) the template starts from")
	pos, err := parse(fs, args, o.Stderr)
	if err != nil {
		return err
	}
	if *from == "" || len(pos) != 1 {
		return fmt.Errorf("%w: space template tag --from-snapshot SNAPSHOT_ID NAME:TAG", errUsage)
	}
	c, err := cf.client()
	if err != nil {
		return err
	}
	return tagSnapshot(ctx, c, *from, pos[0], cf.json, o)
}
