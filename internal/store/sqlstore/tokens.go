package sqlstore

// This file is store.Tokens: API tokens.

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/spacesandbox/space/internal/errdefs"
	"github.com/spacesandbox/space/internal/store"
)

func (s *Store) CreateToken(ctx context.Context, t *store.Token) error {
	if t.Project == "" {
		t.Project = store.DefaultProject
	}
	if t.Role == "" {
		t.Role = store.RoleOwner
	}
	var expires any // NULL: never
	if t.ExpiresAt != nil {
		expires = t.ExpiresAt.UnixNano()
	}
	_, err := s.w.ExecContext(ctx, `INSERT INTO tokens(id, name, hash, created_at, project, role, expires_at, rate_per_sec, burst) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)`,
		t.ID, t.Name, t.Hash, t.CreatedAt.UnixNano(), t.Project, t.Role, expires, t.RatePerSec, t.Burst)
	if err != nil {
		if s.d.IsUnique(err) {
			return errdefs.Wrap(errdefs.Conflict, err, "token already exists")
		}
		return fmt.Errorf("insert token: %w", err)
	}
	return nil
}

const tokenColumns = `id, name, hash, created_at, revoked_at, project, role, expires_at, rate_per_sec, burst`

func scanToken(scan func(...any) error) (*store.Token, error) {
	var t store.Token
	var created int64
	var revoked, expires sql.NullInt64
	if err := scan(&t.ID, &t.Name, &t.Hash, &created, &revoked, &t.Project, &t.Role, &expires, &t.RatePerSec, &t.Burst); err != nil {
		return nil, err
	}
	t.CreatedAt = time.Unix(0, created).UTC()
	if expires.Valid {
		e := time.Unix(0, expires.Int64).UTC()
		t.ExpiresAt = &e
	}
	if revoked.Valid {
		r := time.Unix(0, revoked.Int64).UTC()
		t.RevokedAt = &r
	}
	return &t, nil
}

func (s *Store) TokenByHash(ctx context.Context, h string) (*store.Token, error) {
	return s.tokenWhere(ctx, "hash", h)
}

func (s *Store) TokenByID(ctx context.Context, id string) (*store.Token, error) {
	return s.tokenWhere(ctx, "id", id)
}

// tokenWhere reads the token whose column (hash or id: never user input)
// equals v.
func (s *Store) tokenWhere(ctx context.Context, column, v string) (*store.Token, error) {
	t, err := scanToken(s.r.QueryRowContext(ctx, `SELECT `+tokenColumns+` FROM tokens WHERE `+column+` = ?`, v).Scan)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, errdefs.New(errdefs.NotFound, "token not found")
	}
	if err != nil {
		return nil, fmt.Errorf("read token: %w", err)
	}
	return t, nil
}

func (s *Store) ListTokens(ctx context.Context, project string) ([]store.Token, error) {
	rows, err := s.r.QueryContext(ctx, `SELECT `+tokenColumns+` FROM tokens WHERE ? = '' OR project = ? ORDER BY created_at, id`, project, project)
	if err != nil {
		return nil, fmt.Errorf("list tokens: %w", err)
	}
	defer rows.Close()
	var out []store.Token
	for rows.Next() {
		t, err := scanToken(rows.Scan)
		if err != nil {
			return nil, fmt.Errorf("scan token: %w", err)
		}
		out = append(out, *t)
	}
	return out, rows.Err()
}

func (s *Store) RevokeToken(ctx context.Context, id string, at time.Time) error {
	res, err := s.w.ExecContext(ctx, `UPDATE tokens SET revoked_at = COALESCE(revoked_at, ?) WHERE id = ?`, at.UnixNano(), id)
	if err != nil {
		return fmt.Errorf("revoke token: %w", err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return errdefs.New(errdefs.NotFound, "token %s not found", id)
	}
	return nil
}
