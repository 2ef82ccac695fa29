package sqlstore

// This file is store.Members: the nodes and control replicas of a cluster.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/spacesandbox/space/internal/errdefs"
	"github.com/spacesandbox/space/internal/store"
)

func (s *Store) JoinMember(ctx context.Context, m *store.Member) (*store.Member, error) {
	var out store.Member
	err := s.tx(ctx, func(tx *tx) error {
		out = *m
		if out.State == "" {
			out.State = store.MemberReady
		}
		cur, err := getMember(ctx, tx, m.ID)
		switch {
		case errors.Is(err, errdefs.NotFound):
			return writeMember(ctx, tx, &out, true)
		case err != nil:
			return err
		}
		if cur.Role != m.Role {
			return errdefs.New(errdefs.Conflict, "member %s is a %s, not a %s", m.ID, cur.Role, m.Role)
		}
		if cur.State == store.MemberCordoned || cur.State == store.MemberDraining {
			out.State = cur.State // an operator's decision outlives restarts
		}
		return writeMember(ctx, tx, &out, false)
	})
	if err != nil {
		return nil, err
	}
	return &out, nil
}

func (s *Store) HeartbeatMember(ctx context.Context, id, bootID string, at time.Time) (*store.Member, error) {
	var out *store.Member
	err := s.tx(ctx, func(tx *tx) error {
		m, err := getMember(ctx, tx, id)
		if err != nil {
			return err
		}
		if m.BootID != bootID {
			return errdefs.New(errdefs.Conflict, "member %s is now run by another process (boot %s)", id, m.BootID)
		}
		m.HeartbeatAt = at
		out = m
		return writeMember(ctx, tx, m, false)
	})
	return out, err
}

func (s *Store) GetMember(ctx context.Context, id string) (*store.Member, error) {
	return getMember(ctx, s.r, id)
}

func (s *Store) ListMembers(ctx context.Context, role store.MemberRole) ([]store.Member, error) {
	rows, err := s.r.QueryContext(ctx, `SELECT doc FROM members WHERE role = ? OR ? = '' ORDER BY id`, role, role)
	if err != nil {
		return nil, fmt.Errorf("list members: %w", err)
	}
	defer rows.Close()
	var out []store.Member
	for rows.Next() {
		var doc []byte
		if err := rows.Scan(&doc); err != nil {
			return nil, fmt.Errorf("scan member: %w", err)
		}
		var m store.Member
		if err := json.Unmarshal(doc, &m); err != nil {
			return nil, fmt.Errorf("decode member: %w", err)
		}
		out = append(out, m)
	}
	return out, rows.Err()
}

func (s *Store) SetMemberState(ctx context.Context, id string, state store.MemberState) (*store.Member, error) {
	var out *store.Member
	err := s.tx(ctx, func(tx *tx) error {
		m, err := getMember(ctx, tx, id)
		if err != nil {
			return err
		}
		m.State, out = state, m
		return writeMember(ctx, tx, m, false)
	})
	return out, err
}

func (s *Store) MarkLostMembers(ctx context.Context, staleBefore time.Time) ([]store.Member, error) {
	var lost []store.Member
	err := s.tx(ctx, func(tx *tx) error {
		lost = nil
		rows, err := tx.tx.QueryContext(ctx, tx.rb.bind(`SELECT doc FROM members WHERE state != ? AND heartbeat_at < ?`+tx.forUpdate()), store.MemberLost, staleBefore.UnixNano())
		if err != nil {
			return fmt.Errorf("find silent members: %w", err)
		}
		for rows.Next() {
			var doc []byte
			var m store.Member
			if err := rows.Scan(&doc); err != nil {
				rows.Close()
				return fmt.Errorf("scan member: %w", err)
			}
			if err := json.Unmarshal(doc, &m); err != nil {
				rows.Close()
				return fmt.Errorf("decode member: %w", err)
			}
			lost = append(lost, m)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
		for i := range lost {
			lost[i].State = store.MemberLost
			if err := writeMember(ctx, tx, &lost[i], false); err != nil {
				return err
			}
		}
		return nil
	})
	return lost, err
}

func (s *Store) LeaveMember(ctx context.Context, id, bootID string) error {
	_, err := s.w.ExecContext(ctx, `DELETE FROM members WHERE id = ? AND boot_id = ? AND role = ?`, id, bootID, store.RoleControl)
	if err != nil {
		return fmt.Errorf("leave the cluster: %w", err)
	}
	return nil
}

func (s *Store) NodeLoads(ctx context.Context) (map[string]store.NodeLoad, error) {
	rows, err := s.r.QueryContext(ctx, `SELECT node, COUNT(*), COALESCE(SUM(`+s.d.JSONInt("resources", "vcpus")+`), 0), COALESCE(SUM(`+s.d.JSONInt("resources", "memory_mib")+`), 0)
		FROM sandboxes WHERE state NOT IN ('deleted', 'failed') GROUP BY node`)
	if err != nil {
		return nil, fmt.Errorf("sum node loads: %w", err)
	}
	defer rows.Close()
	out := map[string]store.NodeLoad{}
	for rows.Next() {
		var node string
		var l store.NodeLoad
		if err := rows.Scan(&node, &l.Sandboxes, &l.VCPUs, &l.MemoryMiB); err != nil {
			return nil, fmt.Errorf("scan node load: %w", err)
		}
		out[node] = l
	}
	return out, rows.Err()
}

func getMember(ctx context.Context, q querier, id string) (*store.Member, error) {
	return getDoc[store.Member](ctx, q, "members", "cluster member", id)
}

func writeMember(ctx context.Context, tx *tx, m *store.Member, insert bool) error {
	doc, err := json.Marshal(m)
	if err != nil {
		return fmt.Errorf("encode member: %w", err)
	}
	if insert {
		_, err = tx.ExecContext(ctx, `INSERT INTO members(id, role, boot_id, state, heartbeat_at, doc) VALUES (?, ?, ?, ?, ?, ?)`,
			m.ID, m.Role, m.BootID, m.State, m.HeartbeatAt.UnixNano(), doc)
		if tx.d.IsUnique(err) {
			return errRetry // another process joined it since: look again
		}
	} else {
		_, err = tx.ExecContext(ctx, `UPDATE members SET role = ?, boot_id = ?, state = ?, heartbeat_at = ?, doc = ? WHERE id = ?`,
			m.Role, m.BootID, m.State, m.HeartbeatAt.UnixNano(), doc, m.ID)
	}
	if err != nil {
		return fmt.Errorf("write member: %w", err)
	}
	return nil
}
