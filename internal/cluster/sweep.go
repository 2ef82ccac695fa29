package cluster

import (
	"context"
	"time"

	"github.com/spacesandbox/space/internal/store"
)

// Locker takes a named lock that one process of the cluster holds at a
// time (postgres: a session advisory lock), without waiting.
type Locker interface {
	TryLock(ctx context.Context, name string) (release func(), ok bool, err error)
}

// Sweeper is what the lost-node sweep needs besides the members.
type Sweeper struct {
	Lock Locker
	// FailNode fails what a lost node held (lifecycle.Engine.FailLostNode).
	FailNode func(ctx context.Context, node string) (int, error)
	// DrainNode suspends the sandboxes of a draining node
	// (lifecycle.Engine.DrainNode).
	DrainNode func(ctx context.Context, node string) (int, error)
	// Idempotency is pruned of the reservations of processes that are gone.
	Idempotency store.Idempotency
	// FailOrphanBuilds fails template builds whose replica is gone
	// (lifecycle.Engine.FailOrphanBuilds).
	FailOrphanBuilds func(ctx context.Context) (int, error)
}

// RunSweeps runs the cluster's sweeps until Close, each only while this
// process holds its lock: members silent for LostAfter are marked lost,
// a lost node's sandboxes are failed, a lost control replica's record and
// idempotency reservations are removed.
func (c *Cluster) RunSweeps(s Sweeper) {
	c.drain = s.DrainNode
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		t := time.NewTicker(c.cfg.Heartbeat)
		defer t.Stop()
		first := true
		for n := 0; ; n++ {
			select {
			case <-c.stop:
				return
			case <-t.C:
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			if c.sweepOnce(ctx, s, first, n%30 == 0, n%max(1, int(drainEvery/c.cfg.Heartbeat)) == 0) {
				first = false
			}
			cancel()
		}
	}()
}

// sweepOnce runs one sweep if it gets the lock; all (once per process that
// leads) also goes over nodes lost before, in case a sweep stopped halfway.
func (c *Cluster) sweepOnce(ctx context.Context, s Sweeper, all, prune, drain bool) bool {
	release, ok, err := s.Lock.TryLock(ctx, "space-cluster-sweep")
	if err != nil {
		c.log.Warn("take the sweep lock", "err", err)
		return false
	}
	if !ok {
		return false
	}
	defer release()
	lost, err := c.cfg.Liveness.MarkLostMembers(ctx, c.now().Add(-c.cfg.LostAfter))
	if err != nil {
		c.log.Warn("mark silent members lost", "err", err)
		return false
	}
	var failNodes []string
	for _, m := range lost {
		switch m.Role {
		case store.RoleNode:
			c.log.Warn("node lost: it stopped heartbeating", "event", "node_lost", "node", m.ID, "name", m.Name, "last_heartbeat", m.HeartbeatAt)
			failNodes = append(failNodes, m.ID)
		case store.RoleControl:
			c.log.Info("control replica gone", "member_id", m.ID)
			c.cfg.Store.LeaveMember(ctx, m.ID, m.BootID)
		}
	}
	if all {
		ms, err := c.cfg.Store.ListMembers(ctx, store.RoleNode)
		if err != nil {
			return false
		}
		for _, m := range ms {
			if m.State == store.MemberLost {
				failNodes = append(failNodes, m.ID)
			}
		}
	}
	for _, node := range failNodes {
		n, err := s.FailNode(ctx, node)
		if err != nil {
			c.log.Warn("fail a lost node's sandboxes", "node", node, "err", err)
			return false
		}
		if n > 0 {
			c.log.Warn("a lost node's sandboxes failed", "node", node, "sandboxes", n)
		}
	}
	if len(lost) > 0 {
		c.refresh(ctx)
	}
	if drain && s.DrainNode != nil {
		for _, n := range c.nodes() {
			if n.State == store.MemberDraining && c.alive(n) {
				if _, err := s.DrainNode(ctx, n.ID); err != nil {
					c.log.Warn("drain node", "node", n.ID, "err", err)
				}
			}
		}
	}
	if prune && s.FailOrphanBuilds != nil {
		if n, err := s.FailOrphanBuilds(ctx); err == nil && n > 0 {
			c.log.Warn("failed template builds whose control replica is gone", "count", n)
		}
	}
	if prune && s.Idempotency != nil {
		if n, err := s.Idempotency.PruneIdempotencyKeys(ctx, c.now(), c.LiveOwners()...); err == nil && n > 0 {
			c.log.Info("dropped expired or abandoned idempotency records", "count", n)
		}
	}
	return true
}
