package server

import (
	"context"
	"fmt"
	"path/filepath"

	"github.com/spacesandbox/space/internal/store"
	"github.com/spacesandbox/space/internal/store/postgres"
	"github.com/spacesandbox/space/internal/store/sqlite"
)

// OpenStore opens the database spec names: empty for SQLite in dataDir
// (DBFile), or a postgres:// URL. The CLI's offline commands (token,
// template gc) open the server's database with it too.
func OpenStore(ctx context.Context, spec, dataDir string) (store.Store, error) {
	if spec == "" {
		st, err := sqlite.Open(ctx, filepath.Join(dataDir, DBFile))
		if err != nil {
			return nil, fmt.Errorf("open store in %s: %w", dataDir, err)
		}
		return st, nil
	}
	if !postgres.IsURL(spec) {
		return nil, fmt.Errorf("--store must be empty (SQLite in the data directory) or a postgres:// URL")
	}
	st, err := postgres.Open(ctx, spec)
	if err != nil {
		return nil, fmt.Errorf("open store: %w", err)
	}
	return st, nil
}

// storeKind names the database a --store spec picks, for logs (a URL may
// carry a password: it is never logged).
func storeKind(spec string) string {
	if spec == "" {
		return "sqlite"
	}
	return "postgres"
}
