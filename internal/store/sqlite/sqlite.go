// Package sqlite is the embedded Store: SQLite through a pure-Go driver (no
// cgo), in WAL mode, one writer connection and a pool of read-only readers.
package sqlite

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"os"
	"time"

	_ "modernc.org/sqlite" // registers the "sqlite" driver

	"github.com/spacesandbox/space/internal/errdefs"
	"github.com/spacesandbox/space/internal/sandbox"
	"github.com/spacesandbox/space/internal/store"
)

// Store is a store.Store on a SQLite file.
type Store struct {
	w *sql.DB // the single writer; transactions begin IMMEDIATE
	r *sql.DB // read-only pool
}

var _ store.Store = (*Store)(nil)

// Open opens (creating if needed) the database at path and migrates it.
func Open(ctx context.Context, path string) (*Store, error) {
	dsn := func(readOnly bool) string {
		q := url.Values{}
		q.Add("_pragma", "busy_timeout(10000)")
		q.Add("_pragma", "journal_mode(WAL)")
		q.Add("_pragma", "synchronous(FULL)")
		q.Add("_pragma", "foreign_keys(1)")
		q.Set("_txlock", "immediate")
		if readOnly {
			q.Add("_pragma", "query_only(1)")
		}
		return "file:" + path + "?" + q.Encode()
	}
	// The database holds sandbox env values: it (and the -wal and -shm
	// files, which SQLite makes with the database's mode) is 0600.
	if f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600); err == nil {
		f.Close()
	}
	for _, p := range []string{path, path + "-wal", path + "-shm"} {
		if err := os.Chmod(p, 0o600); err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("make %s private: %w", p, err)
		}
	}
	w, err := sql.Open("sqlite", dsn(false))
	if err != nil {
		return nil, fmt.Errorf("open sqlite writer: %w", err)
	}
	w.SetMaxOpenConns(1)
	w.SetConnMaxIdleTime(0)
	s := &Store{w: w}
	if err := s.migrate(ctx); err != nil {
		w.Close()
		return nil, err
	}
	r, err := sql.Open("sqlite", dsn(true))
	if err != nil {
		w.Close()
		return nil, fmt.Errorf("open sqlite readers: %w", err)
	}
	r.SetMaxOpenConns(8)
	r.SetMaxIdleConns(8)
	s.r = r
	return s, nil
}

// Close closes the database.
func (s *Store) Close() error {
	return errors.Join(s.r.Close(), s.w.Close())
}

func (s *Store) migrate(ctx context.Context) error {
	if _, err := s.w.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY, applied_at INTEGER NOT NULL)`); err != nil {
		return fmt.Errorf("create schema_migrations: %w", err)
	}
	for i, m := range migrations {
		version := i + 1
		err := s.tx(ctx, func(tx *sql.Tx) error {
			var n int
			if err := tx.QueryRowContext(ctx, `SELECT COUNT(*) FROM schema_migrations WHERE version = ?`, version).Scan(&n); err != nil {
				return err
			}
			if n > 0 {
				return nil
			}
			if _, err := tx.ExecContext(ctx, m); err != nil {
				return err
			}
			_, err := tx.ExecContext(ctx, `INSERT INTO schema_migrations(version, applied_at) VALUES (?, ?)`, version, time.Now().Unix())
			return err
		})
		if err != nil {
			return fmt.Errorf("apply migration %d: %w", version, err)
		}
	}
	var max int
	if err := s.w.QueryRowContext(ctx, `SELECT COALESCE(MAX(version), 0) FROM schema_migrations`).Scan(&max); err != nil {
		return fmt.Errorf("read schema version: %w", err)
	}
	if max > len(migrations) {
		return fmt.Errorf("database schema version %d is newer than this binary (%d)", max, len(migrations))
	}
	return nil
}

// tx runs fn in a write transaction and commits it when fn returns nil.
func (s *Store) tx(ctx context.Context, fn func(*sql.Tx) error) error {
	tx, err := s.w.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("begin transaction: %w", err)
	}
	if err := fn(tx); err != nil {
		tx.Rollback()
		return storageError(err)
	}
	if err := tx.Commit(); err != nil {
		return storageError(fmt.Errorf("commit: %w", err))
	}
	return nil
}

// storageError gives SQLite's "disk full" and "read-only / I/O error" the
// kinds a full or failing data directory has (507, 503), not 500.
func storageError(err error) error {
	var e interface{ Code() int }
	if !errors.As(err, &e) {
		return err
	}
	switch e.Code() & 0xff {
	case 13: // SQLITE_FULL
		return errdefs.Wrap(errdefs.InsufficientStorage, err, "the server's storage is full")
	case 8, 10: // SQLITE_READONLY, SQLITE_IOERR
		return errdefs.Wrap(errdefs.Unavailable, err, "the server's storage cannot take writes")
	}
	return err
}

// --- sandboxes and operations ---

func (s *Store) CreateSandbox(ctx context.Context, sb *sandbox.Sandbox, op *sandbox.Operation, idem *store.Completion, maxActive int) error {
	return s.tx(ctx, func(tx *sql.Tx) error {
		if maxActive > 0 {
			var n int
			if err := tx.QueryRowContext(ctx, `SELECT COUNT(*) FROM sandboxes WHERE state NOT IN ('deleted', 'failed')`).Scan(&n); err != nil {
				return fmt.Errorf("count active sandboxes: %w", err)
			}
			if n >= maxActive {
				return errdefs.New(errdefs.ResourceExhausted, "this server holds at most %d active sandboxes; delete or wait for one to go", maxActive).
					WithDetails(map[string]any{"max_active_sandboxes": maxActive})
			}
		}
		if err := insertSandbox(ctx, tx, sb); err != nil {
			return err
		}
		if err := insertOperation(ctx, tx, op); err != nil {
			return err
		}
		return completeIdem(ctx, tx, idem)
	})
}

func (s *Store) CreateOperation(ctx context.Context, op *sandbox.Operation, idem *store.Completion) error {
	return s.tx(ctx, func(tx *sql.Tx) error {
		if err := insertOperation(ctx, tx, op); err != nil {
			return err
		}
		return completeIdem(ctx, tx, idem)
	})
}

func insertSandbox(ctx context.Context, tx *sql.Tx, sb *sandbox.Sandbox) error {
	doc, err := json.Marshal(sb)
	if err != nil {
		return fmt.Errorf("encode sandbox: %w", err)
	}
	_, err = tx.ExecContext(ctx, `INSERT INTO sandboxes(id, state, active_op, pool, doc) VALUES (?, ?, ?, ?, ?)`, sb.ID, sb.State, sb.ActiveOperation, sb.Pool, doc)
	if err != nil {
		if isUnique(err) {
			return errdefs.Wrap(errdefs.Conflict, err, "sandbox %s already exists", sb.ID)
		}
		return fmt.Errorf("insert sandbox: %w", err)
	}
	return nil
}

func insertOperation(ctx context.Context, tx *sql.Tx, op *sandbox.Operation) error {
	doc, err := json.Marshal(op)
	if err != nil {
		return fmt.Errorf("encode operation: %w", err)
	}
	_, err = tx.ExecContext(ctx, `INSERT INTO operations(id, sandbox_id, state, from_state, doc) VALUES (?, ?, ?, ?, ?)`, op.ID, op.SandboxID, op.State, op.From, doc)
	if err != nil {
		if isUnique(err) {
			return errdefs.Wrap(errdefs.Conflict, err, "operation %s already exists", op.ID)
		}
		return fmt.Errorf("insert operation: %w", err)
	}
	return nil
}

func updateSandbox(ctx context.Context, tx *sql.Tx, sb *sandbox.Sandbox) error {
	doc, err := json.Marshal(sb)
	if err != nil {
		return fmt.Errorf("encode sandbox: %w", err)
	}
	_, err = tx.ExecContext(ctx, `UPDATE sandboxes SET state = ?, active_op = ?, pool = ?, doc = ? WHERE id = ?`, sb.State, sb.ActiveOperation, sb.Pool, doc, sb.ID)
	if err != nil {
		return fmt.Errorf("update sandbox: %w", err)
	}
	return nil
}

func updateOperation(ctx context.Context, tx *sql.Tx, op *sandbox.Operation) error {
	doc, err := json.Marshal(op)
	if err != nil {
		return fmt.Errorf("encode operation: %w", err)
	}
	_, err = tx.ExecContext(ctx, `UPDATE operations SET state = ?, doc = ? WHERE id = ?`, op.State, doc, op.ID)
	if err != nil {
		return fmt.Errorf("update operation: %w", err)
	}
	return nil
}

type querier interface {
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

func getSandbox(ctx context.Context, q querier, id string) (*sandbox.Sandbox, error) {
	var doc []byte
	var active, pool string
	err := q.QueryRowContext(ctx, `SELECT doc, active_op, pool FROM sandboxes WHERE id = ?`, id).Scan(&doc, &active, &pool)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, errdefs.New(errdefs.NotFound, "sandbox %s not found", id)
	}
	if err != nil {
		return nil, fmt.Errorf("read sandbox: %w", err)
	}
	var sb sandbox.Sandbox
	if err := json.Unmarshal(doc, &sb); err != nil {
		return nil, fmt.Errorf("decode sandbox %s: %w", id, err)
	}
	sb.ActiveOperation, sb.Pool = active, pool
	return &sb, nil
}

func getOperation(ctx context.Context, q querier, id string) (*sandbox.Operation, error) {
	var doc []byte
	var from string
	err := q.QueryRowContext(ctx, `SELECT doc, from_state FROM operations WHERE id = ?`, id).Scan(&doc, &from)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, errdefs.New(errdefs.NotFound, "operation %s not found", id)
	}
	if err != nil {
		return nil, fmt.Errorf("read operation: %w", err)
	}
	var op sandbox.Operation
	if err := json.Unmarshal(doc, &op); err != nil {
		return nil, fmt.Errorf("decode operation %s: %w", id, err)
	}
	op.From = sandbox.State(from)
	return &op, nil
}

func (s *Store) GetSandbox(ctx context.Context, id string) (*sandbox.Sandbox, error) {
	return getSandbox(ctx, s.r, id)
}

func (s *Store) GetOperation(ctx context.Context, id string) (*sandbox.Operation, error) {
	return getOperation(ctx, s.r, id)
}

func (s *Store) ListSandboxes(ctx context.Context, q store.SandboxQuery) (store.Page[sandbox.Sandbox], error) {
	var page store.Page[sandbox.Sandbox]
	after, err := store.DecodeCursor(q.Cursor)
	if err != nil {
		return page, err
	}
	limit, err := store.NormalizeLimit(q.Limit)
	if err != nil {
		return page, err
	}
	var rows *sql.Rows
	if q.State != "" {
		rows, err = s.r.QueryContext(ctx, `SELECT seq, doc, active_op, pool FROM sandboxes WHERE state = ? AND (pool = '' OR ?) AND seq > ? ORDER BY seq LIMIT ?`, q.State, q.IncludePool, after, limit+1)
	} else {
		rows, err = s.r.QueryContext(ctx, `SELECT seq, doc, active_op, pool FROM sandboxes WHERE state != 'deleted' AND (pool = '' OR ?) AND seq > ? ORDER BY seq LIMIT ?`, q.IncludePool, after, limit+1)
	}
	if err != nil {
		return page, fmt.Errorf("list sandboxes: %w", err)
	}
	defer rows.Close()
	var lastSeq int64
	for rows.Next() {
		var seq int64
		var doc []byte
		var sb sandbox.Sandbox
		var active, pool string
		if err := rows.Scan(&seq, &doc, &active, &pool); err != nil {
			return page, fmt.Errorf("scan sandbox: %w", err)
		}
		if len(page.Items) == limit {
			page.Next = store.EncodeCursor(lastSeq)
			break
		}
		if err := json.Unmarshal(doc, &sb); err != nil {
			return page, fmt.Errorf("decode sandbox: %w", err)
		}
		sb.ActiveOperation, sb.Pool = active, pool
		page.Items = append(page.Items, sb)
		lastSeq = seq
	}
	return page, rows.Err()
}

func (s *Store) ListOperations(ctx context.Context, q store.OperationQuery) (store.Page[sandbox.Operation], error) {
	var page store.Page[sandbox.Operation]
	after, err := store.DecodeCursor(q.Cursor)
	if err != nil {
		return page, err
	}
	limit, err := store.NormalizeLimit(q.Limit)
	if err != nil {
		return page, err
	}
	var rows *sql.Rows
	if q.SandboxID != "" {
		rows, err = s.r.QueryContext(ctx, `SELECT seq, doc, from_state FROM operations WHERE sandbox_id = ? AND seq > ? ORDER BY seq LIMIT ?`, q.SandboxID, after, limit+1)
	} else {
		rows, err = s.r.QueryContext(ctx, `SELECT seq, doc, from_state FROM operations WHERE seq > ? ORDER BY seq LIMIT ?`, after, limit+1)
	}
	if err != nil {
		return page, fmt.Errorf("list operations: %w", err)
	}
	defer rows.Close()
	var lastSeq int64
	for rows.Next() {
		var seq int64
		var doc []byte
		var from string
		if err := rows.Scan(&seq, &doc, &from); err != nil {
			return page, fmt.Errorf("scan operation: %w", err)
		}
		if len(page.Items) == limit {
			page.Next = store.EncodeCursor(lastSeq)
			break
		}
		var op sandbox.Operation
		if err := json.Unmarshal(doc, &op); err != nil {
			return page, fmt.Errorf("decode operation: %w", err)
		}
		op.From = sandbox.State(from)
		page.Items = append(page.Items, op)
		lastSeq = seq
	}
	return page, rows.Err()
}

func (s *Store) UnfinishedOperations(ctx context.Context) ([]sandbox.Operation, error) {
	rows, err := s.r.QueryContext(ctx, `SELECT doc, from_state FROM operations WHERE state IN ('pending', 'running') ORDER BY seq`)
	if err != nil {
		return nil, fmt.Errorf("list unfinished operations: %w", err)
	}
	defer rows.Close()
	var ops []sandbox.Operation
	for rows.Next() {
		var doc []byte
		var from string
		if err := rows.Scan(&doc, &from); err != nil {
			return nil, fmt.Errorf("scan operation: %w", err)
		}
		var op sandbox.Operation
		if err := json.Unmarshal(doc, &op); err != nil {
			return nil, fmt.Errorf("decode operation: %w", err)
		}
		op.From = sandbox.State(from)
		ops = append(ops, op)
	}
	return ops, rows.Err()
}

func (s *Store) BeginOperation(ctx context.Context, op *sandbox.Operation, decide func(*sandbox.Sandbox, *sandbox.Operation) (*store.Completion, error)) (*sandbox.Sandbox, error) {
	var out *sandbox.Sandbox
	err := s.tx(ctx, func(tx *sql.Tx) error {
		sb, err := getSandbox(ctx, tx, op.SandboxID)
		if err != nil {
			return err
		}
		idem, err := decide(sb, op)
		if err != nil {
			return err
		}
		if err := updateSandbox(ctx, tx, sb); err != nil {
			return err
		}
		if err := insertOperation(ctx, tx, op); err != nil {
			return err
		}
		out = sb
		return completeIdem(ctx, tx, idem)
	})
	return out, err
}

func (s *Store) UpdateOperationState(ctx context.Context, opID string, state sandbox.OpState, at time.Time) error {
	return s.tx(ctx, func(tx *sql.Tx) error {
		op, err := getOperation(ctx, tx, opID)
		if err != nil {
			return err
		}
		if op.State.Terminal() {
			return errdefs.New(errdefs.Conflict, "operation %s is already %s", opID, op.State)
		}
		op.State = state
		op.UpdatedAt = at
		return updateOperation(ctx, tx, op)
	})
}

func (s *Store) FinishOperation(ctx context.Context, f store.Finish) error {
	return s.tx(ctx, func(tx *sql.Tx) error {
		op, err := getOperation(ctx, tx, f.OperationID)
		if err != nil {
			return err
		}
		if op.State.Terminal() {
			return errdefs.New(errdefs.Conflict, "operation %s is already %s", op.ID, op.State)
		}
		at := f.At
		op.State, op.Error, op.UpdatedAt, op.CompletedAt = f.State, f.Error, at, &at
		if err := updateOperation(ctx, tx, op); err != nil {
			return err
		}
		if op.SandboxID == "" {
			return nil
		}
		sb, err := getSandbox(ctx, tx, op.SandboxID)
		if err != nil {
			return err
		}
		if sb.ActiveOperation == op.ID {
			sb.ActiveOperation = ""
		}
		sb.SetState(f.SandboxState, at)
		sb.Error = f.SandboxError
		return updateSandbox(ctx, tx, sb)
	})
}

func (s *Store) UpdateSandbox(ctx context.Context, id string, mutate func(*sandbox.Sandbox) error) (*sandbox.Sandbox, error) {
	var out *sandbox.Sandbox
	err := s.tx(ctx, func(tx *sql.Tx) error {
		sb, err := getSandbox(ctx, tx, id)
		if err != nil {
			return err
		}
		if err := mutate(sb); err != nil {
			return err
		}
		sb.ID = id
		out = sb
		return updateSandbox(ctx, tx, sb)
	})
	return out, err
}

func (s *Store) ClaimPoolSandbox(ctx context.Context, pool string, claim func(*sandbox.Sandbox) (*sandbox.Operation, *store.Completion, error)) (*sandbox.Sandbox, *sandbox.Operation, error) {
	var sb *sandbox.Sandbox
	var op *sandbox.Operation
	err := s.tx(ctx, func(tx *sql.Tx) error {
		var id string
		err := tx.QueryRowContext(ctx, `SELECT id FROM sandboxes WHERE pool = ? AND state = 'running' AND active_op = '' ORDER BY seq LIMIT 1`, pool).Scan(&id)
		if errors.Is(err, sql.ErrNoRows) {
			return errdefs.New(errdefs.NotFound, "warm pool %s has no ready sandbox", pool)
		}
		if err != nil {
			return fmt.Errorf("find pool sandbox: %w", err)
		}
		if sb, err = getSandbox(ctx, tx, id); err != nil {
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

func (s *Store) SetWarmPool(ctx context.Context, template string, minReady int) error {
	// A pool set to 0 is kept (at 0) so its sandboxes are drained.
	_, err := s.w.ExecContext(ctx, `INSERT INTO warm_pools(template, min_ready, updated_at) VALUES (?, ?, ?) ON CONFLICT(template) DO UPDATE SET min_ready = excluded.min_ready, updated_at = excluded.updated_at`,
		template, max(minReady, 0), time.Now().UnixNano())
	if err != nil {
		return fmt.Errorf("set warm pool: %w", err)
	}
	return nil
}

func (s *Store) WarmPools(ctx context.Context) (map[string]int, error) {
	rows, err := s.r.QueryContext(ctx, `SELECT template, min_ready FROM warm_pools`)
	if err != nil {
		return nil, fmt.Errorf("list warm pools: %w", err)
	}
	defer rows.Close()
	out := map[string]int{}
	for rows.Next() {
		var t string
		var n int
		if err := rows.Scan(&t, &n); err != nil {
			return nil, err
		}
		out[t] = n
	}
	return out, rows.Err()
}

func (s *Store) CountSandboxes(ctx context.Context) ([]store.SandboxCount, error) {
	rows, err := s.r.QueryContext(ctx, `SELECT state, pool != '', COUNT(*) FROM sandboxes WHERE state != 'deleted' GROUP BY 1, 2 ORDER BY 1, 2`)
	if err != nil {
		return nil, fmt.Errorf("count sandboxes: %w", err)
	}
	defer rows.Close()
	var out []store.SandboxCount
	for rows.Next() {
		var c store.SandboxCount
		if err := rows.Scan(&c.State, &c.Pooled, &c.Count); err != nil {
			return nil, err
		}
		out = append(out, c)
	}
	return out, rows.Err()
}

func (s *Store) TouchSandbox(ctx context.Context, id string, at time.Time) error {
	return s.tx(ctx, func(tx *sql.Tx) error {
		sb, err := getSandbox(ctx, tx, id)
		if err != nil {
			return err
		}
		if at.After(sb.LastActiveAt) {
			sb.LastActiveAt = at
		}
		return updateSandbox(ctx, tx, sb)
	})
}

// --- idempotency ---

func (s *Store) ReserveIdempotencyKey(ctx context.Context, r store.IdempotencyRecord) (*store.IdempotencyRecord, bool, error) {
	var out *store.IdempotencyRecord
	var reserved bool
	err := s.tx(ctx, func(tx *sql.Tx) error {
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
	err := q.QueryRowContext(ctx, `SELECT key, fingerprint, owner, state, status, body, location, created_at, expires_at FROM idempotency_keys WHERE key = ?`, key).
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

func completeIdem(ctx context.Context, tx *sql.Tx, c *store.Completion) error {
	if c == nil || c.Key == "" {
		return nil
	}
	body, err := c.Body()
	if err != nil {
		return fmt.Errorf("render idempotent response: %w", err)
	}
	res, err := tx.ExecContext(ctx, `UPDATE idempotency_keys SET state = ?, status = ?, body = ?, location = ? WHERE key = ? AND state = ?`,
		store.IdemDone, c.Status, body, c.Location, c.Key, store.IdemInFlight)
	if err != nil {
		return fmt.Errorf("complete idempotency key: %w", err)
	}
	if n, _ := res.RowsAffected(); n != 1 {
		return errdefs.New(errdefs.Conflict, "idempotency key is not in flight")
	}
	return nil
}

func (s *Store) CompleteIdempotencyKey(ctx context.Context, c store.Completion) error {
	return s.tx(ctx, func(tx *sql.Tx) error { return completeIdem(ctx, tx, &c) })
}

func (s *Store) ReleaseIdempotencyKey(ctx context.Context, key string) error {
	_, err := s.w.ExecContext(ctx, `DELETE FROM idempotency_keys WHERE key = ? AND state = ?`, key, store.IdemInFlight)
	if err != nil {
		return fmt.Errorf("release idempotency key: %w", err)
	}
	return nil
}

func (s *Store) PruneIdempotencyKeys(ctx context.Context, now time.Time, liveOwner string) (int, error) {
	res, err := s.w.ExecContext(ctx, `DELETE FROM idempotency_keys WHERE (state = ? AND expires_at <= ?) OR (state = ? AND owner != ?)`,
		store.IdemDone, now.UnixNano(), store.IdemInFlight, liveOwner)
	if err != nil {
		return 0, fmt.Errorf("prune idempotency keys: %w", err)
	}
	n, _ := res.RowsAffected()
	return int(n), nil
}

// --- tokens ---

func (s *Store) CreateToken(ctx context.Context, t *store.Token) error {
	_, err := s.w.ExecContext(ctx, `INSERT INTO tokens(id, name, hash, created_at) VALUES (?, ?, ?, ?)`, t.ID, t.Name, t.Hash, t.CreatedAt.UnixNano())
	if err != nil {
		if isUnique(err) {
			return errdefs.Wrap(errdefs.Conflict, err, "token already exists")
		}
		return fmt.Errorf("insert token: %w", err)
	}
	return nil
}

func scanToken(scan func(...any) error) (*store.Token, error) {
	var t store.Token
	var created int64
	var revoked sql.NullInt64
	if err := scan(&t.ID, &t.Name, &t.Hash, &created, &revoked); err != nil {
		return nil, err
	}
	t.CreatedAt = time.Unix(0, created).UTC()
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
	t, err := scanToken(s.r.QueryRowContext(ctx, `SELECT id, name, hash, created_at, revoked_at FROM tokens WHERE `+column+` = ?`, v).Scan)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, errdefs.New(errdefs.NotFound, "token not found")
	}
	if err != nil {
		return nil, fmt.Errorf("read token: %w", err)
	}
	return t, nil
}

func (s *Store) ListTokens(ctx context.Context) ([]store.Token, error) {
	rows, err := s.r.QueryContext(ctx, `SELECT id, name, hash, created_at, revoked_at FROM tokens ORDER BY created_at, id`)
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

func isUnique(err error) bool {
	// modernc reports constraint violations in the error text; the code
	// (SQLITE_CONSTRAINT_UNIQUE / PRIMARYKEY) is in the message as well.
	var e interface{ Code() int }
	if errors.As(err, &e) {
		c := e.Code()
		return c == 2067 || c == 1555 // SQLITE_CONSTRAINT_UNIQUE, SQLITE_CONSTRAINT_PRIMARYKEY
	}
	return false
}
