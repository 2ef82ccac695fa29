package sqlstore

// This file is store.Idempotency: idempotency keys and their responses.

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/spacesandbox/space/internal/errdefs"
	"github.com/spacesandbox/space/internal/store"
)

func (s *Store) ReserveIdempotencyKey(ctx context.Context, r store.IdempotencyRecord) (*store.IdempotencyRecord, bool, error) {
	var out *store.IdempotencyRecord
	var reserved bool
	err := s.tx(ctx, func(tx *tx) error {
		existing, err := getIdem(ctx, tx, r.Key)
		if err == nil && existing.State == store.IdemDone && !existing.ExpiresAt.After(r.CreatedAt) {
			// Expired: forget it and treat the key as new.
			if _, err := tx.ExecContext(ctx, `DELETE FROM idempotency_keys WHERE key = ?`, r.Key); err != nil {
				return fmt.Errorf("delete expired idempotency key: %w", err)
			}
		} else if err == nil {
			out = existing
			return nil
		} else if !errors.Is(err, errdefs.NotFound) {
			return err
		}
		_, err = tx.ExecContext(ctx, `INSERT INTO idempotency_keys(key, fingerprint, owner, state, created_at, expires_at) VALUES (?, ?, ?, ?, ?, ?)`,
			r.Key, r.Fingerprint, r.Owner, store.IdemInFlight, r.CreatedAt.UnixNano(), r.ExpiresAt.UnixNano())
		if tx.d.IsUnique(err) {
			// Another process reserved it since this transaction began:
			// a fresh one reads its record.
			return errRetry
		}
		if err != nil {
			return fmt.Errorf("reserve idempotency key: %w", err)
		}
		rec := r
		rec.State = store.IdemInFlight
		out, reserved = &rec, true
		return nil
	})
	return out, reserved, err
}

func getIdem(ctx context.Context, q querier, key string) (*store.IdempotencyRecord, error) {
	var r store.IdempotencyRecord
	var created, expires int64
	var state string
	err := q.QueryRowContext(ctx, `SELECT key, fingerprint, owner, state, status, body, location, created_at, expires_at FROM idempotency_keys WHERE key = ?`+q.forUpdate(), key).
		Scan(&r.Key, &r.Fingerprint, &r.Owner, &state, &r.Status, &r.Body, &r.Location, &created, &expires)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, errdefs.New(errdefs.NotFound, "idempotency key not found")
	}
	if err != nil {
		return nil, fmt.Errorf("read idempotency key: %w", err)
	}
	r.State = store.IdemState(state)
	r.CreatedAt, r.ExpiresAt = time.Unix(0, created).UTC(), time.Unix(0, expires).UTC()
	return &r, nil
}

func (s *Store) GetIdempotencyKey(ctx context.Context, key string) (*store.IdempotencyRecord, error) {
	return getIdem(ctx, s.r, key)
}

func completeIdem(ctx context.Context, tx *tx, c *store.Completion) error {
	if c == nil || c.Key == "" {
		return nil
	}
	body, err := c.Body()
	if err != nil {
		return fmt.Errorf("render idempotent response: %w", err)
	}
	var res sql.Result
	if r := c.New; r != nil {
		// Reserved in memory: the record is written once, done. Under
		// the key there may only be one that expired (not pruned yet).
		res, err = tx.ExecContext(ctx, `INSERT INTO idempotency_keys(key, fingerprint, owner, state, status, body, location, created_at, expires_at)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)
			ON CONFLICT (key) DO UPDATE SET fingerprint = excluded.fingerprint, owner = excluded.owner, state = excluded.state,
				status = excluded.status, body = excluded.body, location = excluded.location,
				created_at = excluded.created_at, expires_at = excluded.expires_at
			WHERE idempotency_keys.state = ? AND idempotency_keys.expires_at <= ?`,
			c.Key, r.Fingerprint, r.Owner, store.IdemDone, c.Status, body, c.Location, r.CreatedAt.UnixNano(), r.ExpiresAt.UnixNano(),
			store.IdemDone, r.CreatedAt.UnixNano())
	} else {
		res, err = tx.ExecContext(ctx, `UPDATE idempotency_keys SET state = ?, status = ?, body = ?, location = ? WHERE key = ? AND state = ?`,
			store.IdemDone, c.Status, body, c.Location, c.Key, store.IdemInFlight)
	}
	if err != nil {
		return fmt.Errorf("complete idempotency key: %w", err)
	}
	if n, _ := res.RowsAffected(); n != 1 {
		if c.New != nil {
			return errdefs.New(errdefs.Conflict, "idempotency key is already recorded")
		}
		return errdefs.New(errdefs.Conflict, "idempotency key is not in flight")
	}
	return nil
}

func (s *Store) CompleteIdempotencyKey(ctx context.Context, c store.Completion) error {
	return s.tx(ctx, func(tx *tx) error { return completeIdem(ctx, tx, &c) })
}

func (s *Store) ReleaseIdempotencyKey(ctx context.Context, key string) error {
	_, err := s.w.ExecContext(ctx, `DELETE FROM idempotency_keys WHERE key = ? AND state = ?`, key, store.IdemInFlight)
	if err != nil {
		return fmt.Errorf("release idempotency key: %w", err)
	}
	return nil
}

func (s *Store) PruneIdempotencyKeys(ctx context.Context, now time.Time, liveOwners ...string) (int, error) {
	q, args := `DELETE FROM idempotency_keys WHERE (state = ? AND expires_at <= ?) OR (state = ?`, []any{store.IdemDone, now.UnixNano(), store.IdemInFlight}
	if len(liveOwners) > 0 {
		q += ` AND owner NOT IN (?` + strings.Repeat(`, ?`, len(liveOwners)-1) + `)`
		for _, o := range liveOwners {
			args = append(args, o)
		}
	}
	res, err := s.w.ExecContext(ctx, q+`)`, args...)
	if err != nil {
		return 0, fmt.Errorf("prune idempotency keys: %w", err)
	}
	n, _ := res.RowsAffected()
	return int(n), nil
}

func (s *Store) TakeOverIdempotencyKey(ctx context.Context, key, deadOwner, owner string) (bool, error) {
	res, err := s.w.ExecContext(ctx, `UPDATE idempotency_keys SET owner = ? WHERE key = ? AND state = ? AND owner = ?`, owner, key, store.IdemInFlight, deadOwner)
	if err != nil {
		return false, fmt.Errorf("take over idempotency key: %w", err)
	}
	n, _ := res.RowsAffected()
	return n == 1, nil
}
