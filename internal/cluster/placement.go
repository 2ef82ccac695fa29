package cluster

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/spacesandbox/space/internal/errdefs"
	"github.com/spacesandbox/space/internal/lifecycle"
	"github.com/spacesandbox/space/internal/store"
)

// Place picks a node for a sandbox (lifecycle.Cluster): a ready, live node
// that offers the runtime and has room — below its sandbox cap, and with
// the memory the sandbox reserves; need.Prefer when it is one of them, else
// the least loaded, a node with the template cached counting as a little
// less loaded. Ties are broken at random, so creates arriving together
// spread.
func (c *Cluster) Place(ctx context.Context, need lifecycle.Need) (string, int, error) {
	loads, err := c.loads(ctx)
	if err != nil {
		return "", 0, fmt.Errorf("read node loads: %w", err)
	}
	var live []store.Member
	for _, n := range c.nodes() {
		if c.alive(n) {
			live = append(live, n)
		}
	}
	c.loadMu.Lock()
	node, err := place(live, loads, need)
	if err == nil {
		// Counted at once, so the creates placed before the next read
		// spread too. (The node's cap is enforced where the sandbox is
		// recorded; these figures only steer.)
		l := loads[node]
		l.Sandboxes++
		l.VCPUs += need.Resources.VCPUs
		l.MemoryMiB += need.Resources.MemoryMiB
		loads[node] = l
	}
	c.loadMu.Unlock()
	if err != nil {
		return "", 0, err
	}
	m, _ := c.member(node)
	return node, m.Capacity.MaxSandboxes, nil
}

// loadsFor is how long summed node loads are used before they are read
// again: placing a sandbox must not cost a scan of every sandbox.
const loadsFor = 250 * time.Millisecond

// loads returns the node loads, read again when older than loadsFor.
func (c *Cluster) loads(ctx context.Context) (map[string]store.NodeLoad, error) {
	c.loadMu.Lock()
	defer c.loadMu.Unlock()
	if c.loadMap != nil && time.Since(c.loadAt) < loadsFor {
		return c.loadMap, nil
	}
	l, err := c.cfg.Store.NodeLoads(ctx)
	if err != nil {
		return nil, err
	}
	c.loadMap, c.loadAt = l, time.Now()
	return l, nil
}

// place is the decision, over the live nodes and their loads.
func place(nodes []store.Member, loads map[string]store.NodeLoad, need lifecycle.Need) (string, error) {
	best, bestScore := []string{}, 0.0
	offered, room := false, false
	for _, n := range nodes {
		if n.State != store.MemberReady || !slices.Contains(n.Capacity.Runtimes, need.Runtime) {
			continue
		}
		offered = true
		l, capa := loads[n.ID], n.Capacity
		if capa.MaxSandboxes > 0 && l.Sandboxes+1 > capa.MaxSandboxes {
			continue
		}
		if capa.MemoryMiB > 0 && l.MemoryMiB+need.Resources.MemoryMiB > capa.MemoryMiB {
			continue
		}
		room = true
		if n.ID == need.Prefer {
			return n.ID, nil
		}
		score := load(l, capa)
		if need.Template != "" && slices.Contains(n.Templates, need.Template) {
			score -= 0.05
		}
		switch {
		case len(best) == 0 || score < bestScore-1e-9:
			best, bestScore = []string{n.ID}, score
		case score <= bestScore+1e-9:
			best = append(best, n.ID)
		}
	}
	switch {
	case !offered:
		return "", errdefs.New(errdefs.Unavailable, "no ready node of the cluster runs the %s runtime", need.Runtime).
			WithDetails(map[string]any{"runtime": need.Runtime})
	case !room:
		return "", errdefs.New(errdefs.ResourceExhausted, "every node that runs %s is full; delete sandboxes or add a node", need.Runtime)
	}
	return best[rand.IntN(len(best))], nil
}

// load is how full a node is, from 0 (empty) up: the larger of the
// fractions of its sandbox cap and memory in use, or a count of sandboxes
// scaled small when it states neither.
func load(l store.NodeLoad, c store.Capacity) float64 {
	f := 0.0
	if c.MaxSandboxes > 0 {
		f = max(f, float64(l.Sandboxes)/float64(c.MaxSandboxes))
	}
	if c.MemoryMiB > 0 {
		f = max(f, float64(l.MemoryMiB)/float64(c.MemoryMiB))
	}
	if c.MaxSandboxes == 0 && c.MemoryMiB == 0 {
		f = float64(l.Sandboxes) / 1000
	}
	return f
}
