package sqlstore

// This file is store.Sandboxes: sandboxes and their operations.

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/spacesandbox/space/internal/errdefs"
	"github.com/spacesandbox/space/internal/sandbox"
	"github.com/spacesandbox/space/internal/store"
)

func (s *Store) CreateSandbox(ctx context.Context, sb *sandbox.Sandbox, op *sandbox.Operation, idem *store.Completion, maxActive int) error {
	return s.tx(ctx, func(tx *tx) error {
		if err := checkActive(ctx, tx, sb.Node, maxActive, 1); err != nil {
			return err
		}
		if sb.Pool == "" {
			if err := admit(ctx, tx, store.ProjectOr(sb.Project), sandboxUsage(sb, sandbox.Starting)); err != nil {
				return err
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

func (s *Store) BeginFork(ctx context.Context, op *sandbox.Operation, forks []*sandbox.Sandbox, maxActive int, decide func(*sandbox.Sandbox, *sandbox.Operation) (*store.Completion, error)) (*sandbox.Sandbox, error) {
	return s.begin(ctx, op, decide, func(tx *tx) error {
		node := ""
		if len(forks) > 0 {
			node = forks[0].Node
		}
		if err := checkActive(ctx, tx, node, maxActive, len(forks)); err != nil {
			return err
		}
		var more store.Usage
		for _, f := range forks {
			u := sandboxUsage(f, sandbox.Starting)
			more.Sandboxes, more.RunningSandboxes, more.VCPUs = more.Sandboxes+u.Sandboxes, more.RunningSandboxes+u.RunningSandboxes, more.VCPUs+u.VCPUs
			more.MemoryMiB, more.DiskMiB = more.MemoryMiB+u.MemoryMiB, more.DiskMiB+u.DiskMiB
		}
		if len(forks) > 0 {
			if err := admit(ctx, tx, store.ProjectOr(forks[0].Project), more); err != nil {
				return err
			}
		}
		for _, f := range forks {
			if err := insertSandbox(ctx, tx, f); err != nil {
				return err
			}
		}
		return nil
	})
}

// checkActive refuses adding more sandboxes to node when that would take it
// past maxActive active ones (0: no limit).
func checkActive(ctx context.Context, tx *tx, node string, maxActive, more int) error {
	if maxActive <= 0 {
		return nil
	}
	if tx.d.LimitLock != "" {
		// Admissions to a node against its limit one at a time: the count
		// below then sees every sandbox admitted there before this one.
		if _, err := tx.ExecContext(ctx, tx.d.LimitLock, node); err != nil {
			return fmt.Errorf("lock the active-sandbox count: %w", err)
		}
	}
	var n int
	if err := tx.QueryRowContext(ctx, `SELECT COUNT(*) FROM sandboxes WHERE node = ? AND state NOT IN ('deleted', 'failed')`, node).Scan(&n); err != nil {
		return fmt.Errorf("count active sandboxes: %w", err)
	}
	if n+more > maxActive {
		where := "this server holds"
		if node != "" {
			where = "node " + node + " holds"
		}
		return errdefs.New(errdefs.ResourceExhausted, "%s at most %d active sandboxes; delete or wait for one to go", where, maxActive).
			WithDetails(map[string]any{"max_active_sandboxes": maxActive})
	}
	return nil
}

func (s *Store) CreateOperation(ctx context.Context, op *sandbox.Operation, idem *store.Completion) error {
	return s.tx(ctx, func(tx *tx) error {
		if err := insertOperation(ctx, tx, op); err != nil {
			return err
		}
		return completeIdem(ctx, tx, idem)
	})
}

func insertSandbox(ctx context.Context, tx *tx, sb *sandbox.Sandbox) error {
	if sb.Project == "" {
		sb.Project = store.DefaultProject
	}
	doc, err := json.Marshal(sb)
	if err != nil {
		return fmt.Errorf("encode sandbox: %w", err)
	}
	_, err = tx.ExecContext(ctx, `INSERT INTO sandboxes(id, state, active_op, pool, node, project, doc) VALUES (?, ?, ?, ?, ?, ?, ?)`, sb.ID, sb.State, sb.ActiveOperation, sb.Pool, sb.Node, sb.Project, doc)
	if err != nil {
		if tx.d.IsUnique(err) {
			return errdefs.Wrap(errdefs.Conflict, err, "sandbox %s already exists", sb.ID)
		}
		return fmt.Errorf("insert sandbox: %w", err)
	}
	return nil
}

func insertOperation(ctx context.Context, tx *tx, op *sandbox.Operation) error {
	if op.Project == "" {
		op.Project = store.DefaultProject
	}
	doc, err := json.Marshal(op)
	if err != nil {
		return fmt.Errorf("encode operation: %w", err)
	}
	_, err = tx.ExecContext(ctx, `INSERT INTO operations(id, sandbox_id, state, from_state, project, doc) VALUES (?, ?, ?, ?, ?, ?)`, op.ID, op.SandboxID, op.State, op.From, op.Project, doc)
	if err != nil {
		if tx.d.IsUnique(err) {
			return errdefs.Wrap(errdefs.Conflict, err, "operation %s already exists", op.ID)
		}
		return fmt.Errorf("insert operation: %w", err)
	}
	return nil
}

func updateSandbox(ctx context.Context, tx *tx, sb *sandbox.Sandbox) error {
	doc, err := json.Marshal(sb)
	if err != nil {
		return fmt.Errorf("encode sandbox: %w", err)
	}
	_, err = tx.ExecContext(ctx, `UPDATE sandboxes SET state = ?, active_op = ?, pool = ?, node = ?, doc = ? WHERE id = ?`, sb.State, sb.ActiveOperation, sb.Pool, sb.Node, doc, sb.ID)
	if err != nil {
		return fmt.Errorf("update sandbox: %w", err)
	}
	return nil
}

func updateOperation(ctx context.Context, tx *tx, op *sandbox.Operation) error {
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
	// forUpdate is the clause that locks the rows a read returns until the
	// transaction ends ("" outside one, and where one writer needs none).
	forUpdate() string
}

func getSandbox(ctx context.Context, q querier, id string) (*sandbox.Sandbox, error) {
	return getSandboxVia(ctx, q, id, nil)
}

// getSandboxVia reads a sandbox's row and decodes it, through docs when
// not nil.
func getSandboxVia(ctx context.Context, q querier, id string, docs *docCache) (*sandbox.Sandbox, error) {
	var doc []byte
	var active, pool string
	err := q.QueryRowContext(ctx, `SELECT doc, active_op, pool FROM sandboxes WHERE id = ?`+q.forUpdate(), id).Scan(&doc, &active, &pool)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, errdefs.New(errdefs.NotFound, "sandbox %s not found", id)
	}
	if err != nil {
		return nil, fmt.Errorf("read sandbox: %w", err)
	}
	sb := docs.get(id, doc)
	if sb == nil {
		sb = new(sandbox.Sandbox)
		if err := json.Unmarshal(doc, sb); err != nil {
			return nil, fmt.Errorf("decode sandbox %s: %w", id, err)
		}
		docs.put(id, doc, sb)
	}
	sb.ActiveOperation, sb.Pool = active, pool
	sb.Project = store.ProjectOr(sb.Project)
	return sb, nil
}

// docCache keeps the last decode of each sandbox row read through
// GetSandbox, by the row's bytes: a read whose row is byte for byte the one
// decoded before gets a copy of that decode instead of parsing the JSON
// again (a tenth of a sandbox read's CPU). The row itself is read every
// time, so the answer is always the row's, whoever wrote it. A nil cache
// decodes every time.
type docCache struct {
	m sync.Map // sandbox id → cachedDoc
	n atomic.Int64
}

type cachedDoc struct {
	doc []byte
	sb  *sandbox.Sandbox // never handed out: callers get clones
}

// maxCachedDocs bounds the cache; past it, it starts again empty.
const maxCachedDocs = 4096

func (c *docCache) get(id string, doc []byte) *sandbox.Sandbox {
	if c == nil {
		return nil
	}
	if v, ok := c.m.Load(id); ok && bytes.Equal(v.(cachedDoc).doc, doc) {
		return v.(cachedDoc).sb.Clone()
	}
	return nil
}

func (c *docCache) put(id string, doc []byte, sb *sandbox.Sandbox) {
	if c == nil {
		return
	}
	if c.n.Add(1) > maxCachedDocs {
		c.m.Clear()
		c.n.Store(1)
	}
	c.m.Store(id, cachedDoc{doc: doc, sb: sb.Clone()})
}

func getOperation(ctx context.Context, q querier, id string) (*sandbox.Operation, error) {
	var doc []byte
	var from string
	err := q.QueryRowContext(ctx, `SELECT doc, from_state FROM operations WHERE id = ?`+q.forUpdate(), id).Scan(&doc, &from)
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
	op.Project = store.ProjectOr(op.Project)
	return &op, nil
}

func (s *Store) GetSandbox(ctx context.Context, id string) (*sandbox.Sandbox, error) {
	return getSandboxVia(ctx, s.r, id, &s.docs)
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
	where, args := `state != 'deleted'`, []any{}
	if q.State != "" {
		where, args = `state = ?`, append(args, q.State)
	}
	if q.Node != nil {
		where, args = where+` AND node = ?`, append(args, *q.Node)
	}
	if q.Project != "" {
		where, args = where+` AND project = ?`, append(args, q.Project)
	}
	args = append(args, q.IncludePool, after, limit+1)
	rows, err := s.r.QueryContext(ctx, `SELECT seq, doc, active_op, pool FROM sandboxes WHERE `+where+` AND (pool = '' OR ?) AND seq > ? ORDER BY seq LIMIT ?`, args...)
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
		sb.Project = store.ProjectOr(sb.Project)
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
	switch {
	case q.SandboxID != "":
		rows, err = s.r.QueryContext(ctx, `SELECT seq, doc, from_state FROM operations WHERE sandbox_id = ? AND (? = '' OR project = ?) AND seq > ? ORDER BY seq LIMIT ?`, q.SandboxID, q.Project, q.Project, after, limit+1)
	case q.Project != "":
		rows, err = s.r.QueryContext(ctx, `SELECT seq, doc, from_state FROM operations WHERE project = ? AND seq > ? ORDER BY seq LIMIT ?`, q.Project, after, limit+1)
	default:
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
		op.Project = store.ProjectOr(op.Project)
		page.Items = append(page.Items, op)
		lastSeq = seq
	}
	return page, rows.Err()
}

func (s *Store) UnfinishedOperations(ctx context.Context, node string) ([]sandbox.Operation, error) {
	// Operations of no sandbox (builds) are the single machine's (""). A
	// node's come from the few unfinished operations joined to their
	// sandboxes by id (a node asks every second).
	q := `SELECT o.doc, o.from_state FROM operations o JOIN sandboxes s ON s.id = o.sandbox_id
		WHERE o.state IN ('pending', 'running') AND s.node = ? ORDER BY o.seq`
	if node == "" {
		q = `SELECT o.doc, o.from_state FROM operations o LEFT JOIN sandboxes s ON s.id = o.sandbox_id
		WHERE o.state IN ('pending', 'running') AND COALESCE(s.node, '') = ? ORDER BY o.seq`
	}
	rows, err := s.r.QueryContext(ctx, q, node)
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
		op.Project = store.ProjectOr(op.Project)
		ops = append(ops, op)
	}
	return ops, rows.Err()
}

func (s *Store) BeginOperation(ctx context.Context, op *sandbox.Operation, decide func(*sandbox.Sandbox, *sandbox.Operation) (*store.Completion, error)) (*sandbox.Sandbox, error) {
	return s.begin(ctx, op, decide, nil)
}

// begin is BeginOperation with more writes (also) in the same transaction.
func (s *Store) begin(ctx context.Context, op *sandbox.Operation, decide func(*sandbox.Sandbox, *sandbox.Operation) (*store.Completion, error), also func(*tx) error) (*sandbox.Sandbox, error) {
	var out *sandbox.Sandbox
	orig := *op // a transaction run again decides afresh
	err := s.tx(ctx, func(tx *tx) error {
		*op = orig
		if also != nil {
			if err := also(tx); err != nil {
				return err
			}
		}
		sb, err := getSandbox(ctx, tx, op.SandboxID)
		if err != nil {
			return err
		}
		op.Project = sb.Project // an operation is its sandbox's project's
		// A wake brings a sandbox at rest back into memory: its project's
		// quotas admit it here, with the state it wakes from.
		wake := store.Usage{}
		if op.Kind == sandbox.OpWake {
			wake = wakeUsage(sb)
		}
		idem, err := decide(sb, op)
		if err != nil {
			return err
		}
		if wake != (store.Usage{}) {
			if err := admit(ctx, tx, sb.Project, wake); err != nil {
				return err
			}
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
	return s.tx(ctx, func(tx *tx) error {
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
	return s.tx(ctx, func(tx *tx) error {
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
		if f.Snapshot != nil {
			if err := finishSnapshot(ctx, tx, f.Snapshot, at); err != nil {
				return err
			}
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
		if err := updateSandbox(ctx, tx, sb); err != nil {
			return err
		}
		for _, o := range f.Others {
			other, err := getSandbox(ctx, tx, o.SandboxID)
			if err != nil {
				return err
			}
			if other.ActiveOperation == op.ID {
				other.ActiveOperation = ""
			}
			other.SetState(o.State, at)
			other.Error = o.Error
			if err := updateSandbox(ctx, tx, other); err != nil {
				return err
			}
		}
		return nil
	})
}

func (s *Store) UpdateSandbox(ctx context.Context, id string, mutate func(*sandbox.Sandbox) error) (*sandbox.Sandbox, error) {
	var out *sandbox.Sandbox
	err := s.tx(ctx, func(tx *tx) error {
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
	return s.tx(ctx, func(tx *tx) error {
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

// TemplatesInUse reads the digest out of each live sandbox's document.
func (s *Store) TemplatesInUse(ctx context.Context) (map[string]bool, error) {
	digest := s.d.DigestExpr
	rows, err := s.r.QueryContext(ctx, `SELECT DISTINCT `+digest+` FROM sandboxes WHERE state != ?
		UNION SELECT DISTINCT `+digest+` FROM snapshots`, sandbox.Deleted)
	if err != nil {
		return nil, fmt.Errorf("list template references: %w", err)
	}
	defer rows.Close()
	used := map[string]bool{}
	for rows.Next() {
		var d sql.NullString
		if err := rows.Scan(&d); err != nil {
			return nil, fmt.Errorf("list template references: %w", err)
		}
		if d.Valid && d.String != "" {
			used[d.String] = true
		}
	}
	return used, rows.Err()
}
