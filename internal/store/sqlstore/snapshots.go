package sqlstore

// This file is store.Snapshots: saved sandboxes.

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/spacesandbox/space/internal/errdefs"
	"github.com/spacesandbox/space/internal/sandbox"
	"github.com/spacesandbox/space/internal/store"
)

func (s *Store) BeginSnapshot(ctx context.Context, op *sandbox.Operation, snap *sandbox.Snapshot, decide func(*sandbox.Sandbox, *sandbox.Operation) (*store.Completion, error)) (*sandbox.Sandbox, error) {
	return s.begin(ctx, op, decide, func(tx *tx) error {
		// A snapshot's size is known only once it is saved: a project at
		// its snapshot quota takes no new one.
		if err := admit(ctx, tx, store.ProjectOr(snap.Project), store.Usage{SnapshotMiB: 1}); err != nil {
			return err
		}
		return writeSnapshot(ctx, tx, snap, true)
	})
}

func writeSnapshot(ctx context.Context, tx *tx, snap *sandbox.Snapshot, insert bool) error {
	snap.Project = store.ProjectOr(snap.Project)
	doc, err := json.Marshal(snap)
	if err != nil {
		return fmt.Errorf("encode snapshot: %w", err)
	}
	var tag any // NULL: untagged
	if snap.Tag != "" {
		tag = snap.Tag
	}
	if insert {
		_, err = tx.ExecContext(ctx, `INSERT INTO snapshots(id, sandbox_id, name, state, tag, project, doc) VALUES (?, ?, ?, ?, ?, ?, ?)`, snap.ID, snap.SandboxID, snap.Name, snap.State, tag, snap.Project, doc)
		if tx.d.IsUnique(err) {
			return errdefs.Wrap(errdefs.Conflict, err, "snapshot %s already exists", snap.ID)
		}
	} else {
		_, err = tx.ExecContext(ctx, `UPDATE snapshots SET state = ?, tag = ?, doc = ? WHERE id = ?`, snap.State, tag, doc, snap.ID)
	}
	if err != nil {
		return fmt.Errorf("write snapshot: %w", err)
	}
	return nil
}

func getSnapshot(ctx context.Context, q querier, id string) (*sandbox.Snapshot, error) {
	snap, err := getDoc[sandbox.Snapshot](ctx, q, "snapshots", "snapshot", id)
	if err == nil {
		snap.Project = store.ProjectOr(snap.Project)
	}
	return snap, err
}

// getDoc reads the JSON document of row id of table (a constant of this
// package), locked in a write transaction; what names it in errors.
func getDoc[T any](ctx context.Context, q querier, table, what, id string) (*T, error) {
	var doc []byte
	err := q.QueryRowContext(ctx, `SELECT doc FROM `+table+` WHERE id = ?`+q.forUpdate(), id).Scan(&doc)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, errdefs.New(errdefs.NotFound, "%s %s not found", what, id)
	}
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", what, err)
	}
	var v T
	if err := json.Unmarshal(doc, &v); err != nil {
		return nil, fmt.Errorf("decode %s %s: %w", what, id, err)
	}
	return &v, nil
}

func (s *Store) GetSnapshot(ctx context.Context, id string) (*sandbox.Snapshot, error) {
	return getSnapshot(ctx, s.r, id)
}

func (s *Store) ListSnapshots(ctx context.Context, q store.SnapshotQuery) (store.Page[sandbox.Snapshot], error) {
	var page store.Page[sandbox.Snapshot]
	after, err := store.DecodeCursor(q.Cursor)
	if err != nil {
		return page, err
	}
	limit, err := store.NormalizeLimit(q.Limit)
	if err != nil {
		return page, err
	}
	rows, err := s.r.QueryContext(ctx, `SELECT seq, doc FROM snapshots WHERE (? = '' OR sandbox_id = ?) AND (? = '' OR name = ?) AND (? = '' OR project = ?) AND seq > ? ORDER BY seq LIMIT ?`,
		q.SandboxID, q.SandboxID, q.Name, q.Name, q.Project, q.Project, after, limit+1)
	if err != nil {
		return page, fmt.Errorf("list snapshots: %w", err)
	}
	return docPage(rows, limit, "snapshot", func(snap *sandbox.Snapshot) { snap.Project = store.ProjectOr(snap.Project) })
}

// docPage reads a page of (seq, doc) rows asked for with limit+1: at most
// limit items (each given to fix, when set), and the next page's cursor
// when the extra row came.
func docPage[T any](rows *sql.Rows, limit int, what string, fix func(*T)) (store.Page[T], error) {
	defer rows.Close()
	var page store.Page[T]
	var lastSeq int64
	for rows.Next() {
		var seq int64
		var doc []byte
		if err := rows.Scan(&seq, &doc); err != nil {
			return page, fmt.Errorf("scan %s: %w", what, err)
		}
		if len(page.Items) == limit {
			page.Next = store.EncodeCursor(lastSeq)
			break
		}
		var v T
		if err := json.Unmarshal(doc, &v); err != nil {
			return page, fmt.Errorf("decode %s: %w", what, err)
		}
		if fix != nil {
			fix(&v)
		}
		page.Items = append(page.Items, v)
		lastSeq = seq
	}
	return page, rows.Err()
}

func (s *Store) DeleteSnapshot(ctx context.Context, id string, check func(*sandbox.Snapshot) error) error {
	return s.tx(ctx, func(tx *tx) error {
		if _, err := checkedSnapshot(ctx, tx, id, check); err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, `DELETE FROM snapshots WHERE id = ?`, id); err != nil {
			return fmt.Errorf("delete snapshot: %w", err)
		}
		return nil
	})
}

// checkedSnapshot reads a snapshot in tx and lets check (if any) refuse it.
func checkedSnapshot(ctx context.Context, tx *tx, id string, check func(*sandbox.Snapshot) error) (*sandbox.Snapshot, error) {
	snap, err := getSnapshot(ctx, tx, id)
	if err != nil {
		return nil, err
	}
	if check != nil {
		if err := check(snap); err != nil {
			return nil, err
		}
	}
	return snap, nil
}

func (s *Store) TagSnapshot(ctx context.Context, id, ref string, check func(*sandbox.Snapshot) error) (*sandbox.Snapshot, error) {
	var out *sandbox.Snapshot
	err := s.tx(ctx, func(tx *tx) error {
		snap, err := checkedSnapshot(ctx, tx, id, check)
		if err != nil {
			return err
		}
		if ref != "" {
			if other, err := snapshotByTag(ctx, tx, ref); err == nil && other.ID != id {
				other.Tag = ""
				if err := writeSnapshot(ctx, tx, other, false); err != nil {
					return err
				}
			} else if err != nil && !errors.Is(err, errdefs.NotFound) {
				return err
			}
		}
		snap.Tag = ref
		out = snap
		err = writeSnapshot(ctx, tx, snap, false)
		if tx.d.IsUnique(err) {
			return errRetry // another process tagged a snapshot ref meanwhile
		}
		return err
	})
	return out, err
}

func snapshotByTag(ctx context.Context, q querier, ref string) (*sandbox.Snapshot, error) {
	var id string
	err := q.QueryRowContext(ctx, `SELECT id FROM snapshots WHERE tag = ?`+q.forUpdate(), ref).Scan(&id)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, errdefs.New(errdefs.NotFound, "no snapshot is tagged %s", ref)
	}
	if err != nil {
		return nil, fmt.Errorf("find tagged snapshot: %w", err)
	}
	return getSnapshot(ctx, q, id)
}

func (s *Store) SnapshotByTag(ctx context.Context, ref string) (*sandbox.Snapshot, error) {
	return snapshotByTag(ctx, s.r, ref)
}

// finishSnapshot records a snapshot operation's outcome on its snapshot.
func finishSnapshot(ctx context.Context, tx *tx, o *store.SnapshotOutcome, at time.Time) error {
	snap, err := getSnapshot(ctx, tx, o.SnapshotID)
	if err != nil {
		return err
	}
	snap.State, snap.SizeBytes, snap.Error, snap.UpdatedAt = o.State, o.SizeBytes, o.Error, at
	return writeSnapshot(ctx, tx, snap, false)
}
