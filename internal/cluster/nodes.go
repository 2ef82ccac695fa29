package cluster

import (
	"context"
	"time"

	"github.com/spacesandbox/space/internal/errdefs"
	"github.com/spacesandbox/space/internal/store"
)

// Node is a node as the API shows it: its record, whether it heartbeats,
// and what its active sandboxes reserve.
type Node struct {
	store.Member
	Alive bool           `json:"alive"`
	Load  store.NodeLoad `json:"load"`
}

// ListNodes lists every node the cluster has had (lost ones too).
func (c *Cluster) ListNodes(ctx context.Context) ([]Node, error) {
	ms, err := c.cfg.Store.ListMembers(ctx, store.RoleNode)
	if err != nil {
		return nil, err
	}
	loads, err := c.cfg.Store.NodeLoads(ctx)
	if err != nil {
		return nil, err
	}
	out := []Node{}
	for _, m := range ms {
		out = append(out, c.view(m, loads))
	}
	return out, nil
}

// GetNode returns one node.
func (c *Cluster) GetNode(ctx context.Context, id string) (*Node, error) {
	m, err := c.cfg.Store.GetMember(ctx, id)
	if err != nil {
		return nil, err
	}
	if m.Role != store.RoleNode {
		return nil, errdefs.New(errdefs.NotFound, "node %s not found", id)
	}
	loads, err := c.cfg.Store.NodeLoads(ctx)
	if err != nil {
		return nil, err
	}
	n := c.view(*m, loads)
	return &n, nil
}

func (c *Cluster) view(m store.Member, loads map[string]store.NodeLoad) Node {
	return Node{Member: m, Alive: c.alive(m), Load: loads[m.ID]}
}

// SetNodeState cordons a node (it keeps what it runs and takes nothing
// new), makes it ready again, or drains it: cordoned, and every sandbox on
// it suspended so that a wake places it on another node (a sweep goes on
// suspending those busy with another operation now). A lost node's state
// is the cluster's to change: Conflict.
func (c *Cluster) SetNodeState(ctx context.Context, id string, state store.MemberState) (*Node, error) {
	cur, err := c.GetNode(ctx, id)
	if err != nil {
		return nil, err
	}
	if cur.State == store.MemberLost {
		return nil, errdefs.New(errdefs.Conflict, "node %s is lost; it becomes ready when it heartbeats again", id).
			WithDetails(map[string]any{"state": string(cur.State)})
	}
	if _, err := c.cfg.Store.SetMemberState(ctx, id, state); err != nil {
		return nil, err
	}
	c.refresh(ctx)
	c.log.Info("node state changed", "node", id, "from", cur.State, "to", state)
	if state == store.MemberDraining && c.drain != nil {
		if n, err := c.drain(ctx, id); err != nil {
			c.log.Warn("drain node", "node", id, "err", err)
		} else {
			c.log.Info("draining node", "node", id, "suspending", n)
		}
	}
	return c.GetNode(ctx, id)
}

// drainEvery is how often draining nodes are drained again (sandboxes busy
// with another operation the first time).
const drainEvery = 5 * time.Second
