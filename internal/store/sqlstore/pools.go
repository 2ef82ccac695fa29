package sqlstore

// This file is store.Pools: warm-pool settings and claims.

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/spacesandbox/space/internal/errdefs"
	"github.com/spacesandbox/space/internal/sandbox"
	"github.com/spacesandbox/space/internal/store"
)

func (s *Store) ClaimPoolSandbox(ctx context.Context, pool string, claim func(*sandbox.Sandbox) (*sandbox.Operation, *store.Completion, error)) (*sandbox.Sandbox, *sandbox.Operation, error) {
	var sb *sandbox.Sandbox
	var op *sandbox.Operation
	err := s.tx(ctx, func(tx *tx) error {
		var id string
		err := tx.QueryRowContext(ctx, `SELECT id FROM sandboxes WHERE pool = ? AND state = 'running' AND active_op = '' ORDER BY seq LIMIT 1`+tx.d.SkipLocked, pool).Scan(&id)
		if errors.Is(err, sql.ErrNoRows) {
			return errdefs.New(errdefs.NotFound, "warm pool %s has no ready sandbox", pool)
		}
		if err != nil {
			return fmt.Errorf("find pool sandbox: %w", err)
		}
		if sb, err = getSandbox(ctx, tx, id); err != nil {
			return err
		}
		if err := admit(ctx, tx, sb.Project, sandboxUsage(sb, sandbox.Running)); err != nil {
			return err
		}
		var idem *store.Completion
		if op, idem, err = claim(sb); err != nil {
			return err
		}
		sb.Pool = ""
		if err := updateSandbox(ctx, tx, sb); err != nil {
			return err
		}
		if err := insertOperation(ctx, tx, op); err != nil {
			return err
		}
		return completeIdem(ctx, tx, idem)
	})
	if err != nil {
		return nil, nil, err
	}
	return sb, op, nil
}

func (s *Store) PoolKeys(ctx context.Context) ([]string, error) {
	rows, err := s.r.QueryContext(ctx, `SELECT DISTINCT pool FROM sandboxes WHERE pool != '' AND state != 'deleted' ORDER BY pool`)
	if err != nil {
		return nil, fmt.Errorf("list pools: %w", err)
	}
	defer rows.Close()
	var keys []string
	for rows.Next() {
		var k string
		if err := rows.Scan(&k); err != nil {
			return nil, err
		}
		keys = append(keys, k)
	}
	return keys, rows.Err()
}

func (s *Store) PoolSandboxes(ctx context.Context, pool string) ([]sandbox.Sandbox, error) {
	rows, err := s.r.QueryContext(ctx, `SELECT id FROM sandboxes WHERE pool = ? AND state != 'deleted' ORDER BY seq`, pool)
	if err != nil {
		return nil, fmt.Errorf("list pool: %w", err)
	}
	var idsList []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			rows.Close()
			return nil, err
		}
		idsList = append(idsList, id)
	}
	rows.Close()
	var out []sandbox.Sandbox
	for _, id := range idsList {
		sb, err := getSandbox(ctx, s.r, id)
		if err != nil {
			return nil, err
		}
		out = append(out, *sb)
	}
	return out, nil
}

func (s *Store) SetWarmPool(ctx context.Context, pool store.PoolRef, minReady int) error {
	minReady = max(minReady, 0)
	return s.tx(ctx, func(tx *tx) error {
		var was int
		err := tx.QueryRowContext(ctx, `SELECT min_ready FROM warm_pools WHERE project = ? AND template = ?`, pool.Project, pool.Template).Scan(&was)
		if err != nil && !errors.Is(err, sql.ErrNoRows) {
			return fmt.Errorf("read warm pool: %w", err)
		}
		if minReady > was {
			if err := admit(ctx, tx, pool.Project, store.Usage{WarmPool: minReady - was}); err != nil {
				return err
			}
		}
		// A pool set to 0 is kept (at 0) so its sandboxes are drained.
		_, err = tx.ExecContext(ctx, `INSERT INTO warm_pools(project, template, min_ready, updated_at) VALUES (?, ?, ?, ?)
			ON CONFLICT(project, template) DO UPDATE SET min_ready = excluded.min_ready, updated_at = excluded.updated_at`,
			pool.Project, pool.Template, minReady, time.Now().UnixNano())
		if err != nil {
			return fmt.Errorf("set warm pool: %w", err)
		}
		return nil
	})
}

func (s *Store) WarmPools(ctx context.Context) (map[store.PoolRef]int, error) {
	rows, err := s.r.QueryContext(ctx, `SELECT project, template, min_ready FROM warm_pools`)
	if err != nil {
		return nil, fmt.Errorf("list warm pools: %w", err)
	}
	defer rows.Close()
	out := map[store.PoolRef]int{}
	for rows.Next() {
		var p store.PoolRef
		var n int
		if err := rows.Scan(&p.Project, &p.Template, &n); err != nil {
			return nil, err
		}
		out[p] = n
	}
	return out, rows.Err()
}
