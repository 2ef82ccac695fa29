package auth

import (
	"context"
	"errors"
	"fmt"
	"github.com/spacesandbox/space/internal/errdefs"
	"github.com/spacesandbox/space/internal/store"
	"os"
	"path/filepath"
)

// TokenFile is the name, under the data directory, of the file holding the
// first admin token.
const TokenFile = "api-token"

// Bootstrap makes the first admin token when the store has none and writes
// its value once to <dataDir>/api-token with mode 0600. It returns the path
// written ("" when tokens already existed). The value is never logged.
func (t *Tokens) Bootstrap(ctx context.Context, dataDir string) (string, error) {
	existing, err := t.List(ctx, "")
	if err != nil {
		return "", err
	}
	if len(existing) > 0 {
		return "", nil
	}
	path := filepath.Join(dataDir, TokenFile)
	// Create the file first (exclusively) so a token is never stored
	// without the operator being able to read it.
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if errors.Is(err, os.ErrExist) {
		if err := os.Remove(path); err != nil {
			return "", fmt.Errorf("replace stale %s: %w", path, err)
		}
		f, err = os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	}
	if err != nil {
		return "", fmt.Errorf("create %s: %w", path, err)
	}
	_, value, err := t.Create(ctx, "admin")
	if err != nil {
		f.Close()
		os.Remove(path)
		return "", err
	}
	if _, err := f.WriteString(value + "\n"); err != nil {
		f.Close()
		return "", fmt.Errorf("write %s: %w", path, err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return "", fmt.Errorf("sync %s: %w", path, err)
	}
	return path, f.Close()
}

// AdminTokenEnv names the environment variable that may hold an admin token
// chosen by the operator (a Kubernetes Secret, for replicas whose data
// directories come and go). Only its hash is stored.
const AdminTokenEnv = "SPACE_ADMIN_TOKEN"

// EnsureToken makes value a valid token named name unless a token with
// that value is recorded already (a revoked one stays revoked). It reports
// whether it stored one.
func (t *Tokens) EnsureToken(ctx context.Context, name, value string) (bool, error) {
	if len(value) < 32 {
		return false, errdefs.New(errdefs.InvalidArgument, "%s must be at least 32 characters", AdminTokenEnv)
	}
	if _, err := t.store.TokenByHash(ctx, Hash(value)); err == nil {
		return false, nil
	} else if !errors.Is(err, errdefs.NotFound) {
		return false, err
	}
	if _, _, err := t.create(ctx, Spec{Name: name, Role: store.RoleOwner}, value); err != nil {
		if _, again := t.store.TokenByHash(ctx, Hash(value)); again == nil {
			return false, nil // another replica stored it meanwhile
		}
		return false, err
	}
	return true, nil
}
