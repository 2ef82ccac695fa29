package sqlstore

// This file is store.Projects (projects and their quotas), the quota check
// every admission runs in its own transaction, and store.Audit.

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/spacesandbox/space/internal/errdefs"
	"github.com/spacesandbox/space/internal/sandbox"
	"github.com/spacesandbox/space/internal/store"
)

func (s *Store) CreateProject(ctx context.Context, p *store.Project) error {
	if err := store.ValidProject(p.Name); err != nil {
		return err
	}
	doc, err := json.Marshal(p)
	if err != nil {
		return fmt.Errorf("encode project: %w", err)
	}
	_, err = s.w.ExecContext(ctx, `INSERT INTO projects(name, created_at, doc) VALUES (?, ?, ?)`, p.Name, p.CreatedAt.UnixNano(), doc)
	if s.d.IsUnique(err) {
		return errdefs.New(errdefs.Conflict, "project %s already exists", p.Name)
	}
	if err != nil {
		return fmt.Errorf("insert project: %w", err)
	}
	return nil
}

func getProject(ctx context.Context, q querier, name string) (*store.Project, error) {
	var doc []byte
	err := q.QueryRowContext(ctx, `SELECT doc FROM projects WHERE name = ?`+q.forUpdate(), name).Scan(&doc)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, errdefs.New(errdefs.NotFound, "project %s not found", name)
	}
	if err != nil {
		return nil, fmt.Errorf("read project: %w", err)
	}
	var p store.Project
	if err := json.Unmarshal(doc, &p); err != nil {
		return nil, fmt.Errorf("decode project %s: %w", name, err)
	}
	return &p, nil
}

func (s *Store) GetProject(ctx context.Context, name string) (*store.Project, error) {
	return getProject(ctx, s.r, name)
}

func (s *Store) ListProjects(ctx context.Context) ([]store.Project, error) {
	rows, err := s.r.QueryContext(ctx, `SELECT doc FROM projects ORDER BY name`)
	if err != nil {
		return nil, fmt.Errorf("list projects: %w", err)
	}
	defer rows.Close()
	var out []store.Project
	for rows.Next() {
		var doc []byte
		var p store.Project
		if err := rows.Scan(&doc); err != nil {
			return nil, fmt.Errorf("scan project: %w", err)
		}
		if err := json.Unmarshal(doc, &p); err != nil {
			return nil, fmt.Errorf("decode project: %w", err)
		}
		out = append(out, p)
	}
	return out, rows.Err()
}

func (s *Store) DeleteProject(ctx context.Context, name string) error {
	if name == store.DefaultProject {
		return errdefs.New(errdefs.FailedPrecondition, "the default project cannot be removed")
	}
	return s.tx(ctx, func(tx *tx) error {
		if _, err := getProject(ctx, tx, name); err != nil {
			return err
		}
		var sandboxes, snapshots, tokens int
		err := tx.QueryRowContext(ctx, `SELECT
			(SELECT COUNT(*) FROM sandboxes WHERE project = ? AND state != 'deleted'),
			(SELECT COUNT(*) FROM snapshots WHERE project = ?),
			(SELECT COUNT(*) FROM tokens WHERE project = ? AND revoked_at IS NULL)`, name, name, name).Scan(&sandboxes, &snapshots, &tokens)
		if err != nil {
			return fmt.Errorf("count what project %s holds: %w", name, err)
		}
		if sandboxes+snapshots+tokens > 0 {
			return errdefs.New(errdefs.FailedPrecondition, "project %s still holds %d sandboxes, %d snapshots and %d tokens not revoked", name, sandboxes, snapshots, tokens).
				WithDetails(map[string]any{"sandboxes": sandboxes, "snapshots": snapshots, "tokens": tokens})
		}
		for _, q := range []string{`DELETE FROM warm_pools WHERE project = ?`, `DELETE FROM template_owners WHERE project = ?`, `DELETE FROM projects WHERE name = ?`} {
			if _, err := tx.ExecContext(ctx, q, name); err != nil {
				return fmt.Errorf("delete project %s: %w", name, err)
			}
		}
		return nil
	})
}

func (s *Store) UpdateProject(ctx context.Context, name string, change func(*store.Project) error) (*store.Project, error) {
	var out *store.Project
	err := s.tx(ctx, func(tx *tx) error {
		p, err := getProject(ctx, tx, name)
		if err != nil {
			return err
		}
		if err := change(p); err != nil {
			return err
		}
		p.Name = name
		if err := p.Limits.Validate(); err != nil {
			return err
		}
		if err := p.Quotas.Validate(); err != nil {
			return err
		}
		doc, err := json.Marshal(p)
		if err != nil {
			return fmt.Errorf("encode project: %w", err)
		}
		if _, err := tx.ExecContext(ctx, `UPDATE projects SET doc = ? WHERE name = ?`, doc, name); err != nil {
			return fmt.Errorf("update project: %w", err)
		}
		out = p
		return nil
	})
	return out, err
}

func (s *Store) ProjectUsage(ctx context.Context, name string) (store.Usage, error) {
	if _, err := getProject(ctx, s.r, name); err != nil {
		return store.Usage{}, err
	}
	return projectUsage(ctx, s.r, s.d, name)
}

type rowQuerier interface {
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// projectUsage sums what a project holds. Warm-pool sandboxes are not the
// users' and count only as the pool's min_ready.
func projectUsage(ctx context.Context, q rowQuerier, d *Dialect, name string) (store.Usage, error) {
	var u store.Usage
	var snapBytes int64
	held := `state NOT IN ('suspended', 'failed')`
	err := q.QueryRowContext(ctx, `SELECT COUNT(*),
		COALESCE(SUM(CASE WHEN `+held+` THEN 1 ELSE 0 END), 0),
		COALESCE(SUM(CASE WHEN `+held+` THEN `+d.JSONInt("resources", "vcpus")+` ELSE 0 END), 0),
		COALESCE(SUM(CASE WHEN `+held+` THEN `+d.JSONInt("resources", "memory_mib")+` ELSE 0 END), 0),
		COALESCE(SUM(`+d.JSONInt("resources", "disk_mib")+`), 0),
		(SELECT COALESCE(SUM(`+d.JSONInt("size_bytes")+`), 0) FROM snapshots WHERE project = ?),
		(SELECT COUNT(*) FROM template_owners WHERE project = ?),
		(SELECT COALESCE(SUM(min_ready), 0) FROM warm_pools WHERE project = ?)
		FROM sandboxes WHERE project = ? AND pool = '' AND state != 'deleted'`, name, name, name, name).
		Scan(&u.Sandboxes, &u.RunningSandboxes, &u.VCPUs, &u.MemoryMiB, &u.DiskMiB, &snapBytes, &u.Templates, &u.WarmPool)
	if err != nil {
		return u, fmt.Errorf("sum project %s's usage: %w", name, err)
	}
	u.SnapshotMiB = int((snapBytes + 1<<20 - 1) >> 20)
	return u, nil
}

// admit refuses, inside tx, adding more to project when that would pass one
// of its quotas. A project without quotas costs one read; one with quotas
// has its row locked first, so that on a database shared by several
// processes the admissions to one project take turns and each counts what
// the previous ones added.
func admit(ctx context.Context, tx *tx, project string, more store.Usage) error {
	var doc []byte
	err := tx.QueryRowContext(ctx, `SELECT doc FROM projects WHERE name = ?`, project).Scan(&doc)
	if errors.Is(err, sql.ErrNoRows) {
		return errdefs.New(errdefs.NotFound, "project %s not found", project)
	}
	if err != nil {
		return fmt.Errorf("read project %s: %w", project, err)
	}
	var p store.Project
	if err := json.Unmarshal(doc, &p); err != nil {
		return fmt.Errorf("decode project %s: %w", project, err)
	}
	if p.Effective() == (store.Quotas{}) {
		return nil
	}
	if tx.d.ForUpdate != "" {
		locked, err := getProject(ctx, tx, project)
		if err != nil {
			return err
		}
		p = *locked
	}
	u, err := projectUsage(ctx, tx, tx.d, project)
	if err != nil {
		return err
	}
	return p.Effective().Admit(u, more)
}

// sandboxUsage is what one more sandbox in state adds to its project.
func sandboxUsage(sb *sandbox.Sandbox, state sandbox.State) store.Usage {
	u := store.Usage{Sandboxes: 1, DiskMiB: sb.Resources.DiskMiB}
	if state != sandbox.Suspended && state != sandbox.Failed {
		u.RunningSandboxes, u.VCPUs, u.MemoryMiB = 1, sb.Resources.VCPUs, sb.Resources.MemoryMiB
	}
	return u
}

// wakeUsage is what waking sb adds: a sandbox at rest on disk comes back
// into memory.
func wakeUsage(sb *sandbox.Sandbox) store.Usage {
	if sb.State != sandbox.Suspended && sb.State != sandbox.Failed {
		return store.Usage{}
	}
	return store.Usage{RunningSandboxes: 1, VCPUs: sb.Resources.VCPUs, MemoryMiB: sb.Resources.MemoryMiB}
}

func (s *Store) AppendAudit(ctx context.Context, entries []store.AuditEntry) error {
	if len(entries) == 0 {
		return nil
	}
	return s.tx(ctx, func(tx *tx) error {
		for _, e := range entries {
			doc, err := json.Marshal(e)
			if err != nil {
				return fmt.Errorf("encode audit entry: %w", err)
			}
			if _, err := tx.ExecContext(ctx, `INSERT INTO audit(at, project, token_id, action, doc) VALUES (?, ?, ?, ?, ?)`,
				e.At.UnixNano(), e.Project, e.TokenID, e.Action, doc); err != nil {
				return fmt.Errorf("append audit entry: %w", err)
			}
		}
		return nil
	})
}

func (s *Store) ListAudit(ctx context.Context, q store.AuditQuery) (store.Page[store.AuditEntry], error) {
	var page store.Page[store.AuditEntry]
	after, err := store.DecodeCursor(q.Cursor)
	if err != nil {
		return page, err
	}
	limit, err := store.NormalizeLimit(q.Limit)
	if err != nil {
		return page, err
	}
	var since int64
	if !q.Since.IsZero() {
		since = q.Since.UnixNano()
	}
	// The action filter is a substring; LIKE's own wildcards in it are
	// taken literally.
	like := "%" + strings.NewReplacer(`\`, `\\`, `%`, `\%`, `_`, `\_`).Replace(q.Action) + "%"
	rows, err := s.r.QueryContext(ctx, `SELECT seq, doc FROM audit WHERE (? = '' OR project = ?) AND (? = '' OR token_id = ?)
		AND action LIKE ? ESCAPE '\' AND at >= ? AND seq > ? ORDER BY seq LIMIT ?`,
		q.Project, q.Project, q.TokenID, q.TokenID, like, since, after, limit+1)
	if err != nil {
		return page, fmt.Errorf("list audit entries: %w", err)
	}
	return docPage[store.AuditEntry](rows, limit, "audit entry", nil)
}

// ClaimTemplate records that project builds template name; Conflict when
// another project owns it. A name built before projects existed, or a
// builtin one, has no owner: only the server owner builds into it (the
// caller checks that).
func (s *Store) ClaimTemplate(ctx context.Context, project, name string, at time.Time) error {
	return s.tx(ctx, func(tx *tx) error {
		var owner string
		err := tx.QueryRowContext(ctx, `SELECT project FROM template_owners WHERE name = ?`+tx.forUpdate(), name).Scan(&owner)
		switch {
		case err == nil && owner == project:
			return nil
		case err == nil:
			return errdefs.New(errdefs.Conflict, "template name %s belongs to another project", name)
		case !errors.Is(err, sql.ErrNoRows):
			return fmt.Errorf("read template owner: %w", err)
		}
		if err := admit(ctx, tx, project, store.Usage{Templates: 1}); err != nil {
			return err
		}
		_, err = tx.ExecContext(ctx, `INSERT INTO template_owners(name, project, created_at) VALUES (?, ?, ?)`, name, project, at.UnixNano())
		if tx.d.IsUnique(err) {
			return errRetry
		}
		if err != nil {
			return fmt.Errorf("record template owner: %w", err)
		}
		return nil
	})
}

// TemplateOwners maps each template name a project built to its project
// (names missing are shared: builtin, or built before projects).
func (s *Store) TemplateOwners(ctx context.Context) (map[string]string, error) {
	rows, err := s.r.QueryContext(ctx, `SELECT name, project FROM template_owners`)
	if err != nil {
		return nil, fmt.Errorf("list template owners: %w", err)
	}
	defer rows.Close()
	out := map[string]string{}
	for rows.Next() {
		var n, p string
		if err := rows.Scan(&n, &p); err != nil {
			return nil, fmt.Errorf("scan template owner: %w", err)
		}
		out[n] = p
	}
	return out, rows.Err()
}
