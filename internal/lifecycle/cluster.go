package lifecycle

// This file is the engine in a cluster: sandboxes are placed on nodes, each
// operation runs on the node that holds its sandbox, and a node that stops
// heartbeating has its sandboxes failed (node_lost).

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/spacesandbox/space/internal/errdefs"
	"github.com/spacesandbox/space/internal/ids"
	"github.com/spacesandbox/space/internal/sandbox"
	"github.com/spacesandbox/space/internal/store"
)

// Cluster is what the engine needs when sandboxes run in other processes
// (internal/cluster). Without one (a single machine) this engine runs every
// sandbox itself.
type Cluster interface {
	// Place picks the node for a sandbox that needs res on runtime rt;
	// prefer (may be "") is kept when it fits. It returns the node and the
	// most active sandboxes that node takes (0: no cap). Unavailable when
	// no node fits.
	Place(ctx context.Context, need Need) (node string, maxActive int, err error)
	// Usable says whether node heartbeats and takes new work.
	Usable(ctx context.Context, node string) bool
	// Alive says whether node heartbeats (it may be cordoned).
	Alive(ctx context.Context, node string) bool
	// Dispatch asks node to run operation opID now. Best effort: a node also
	// finds its pending operations by itself.
	Dispatch(node, opID string)
	// Claimed tells node that one of its warm-pool sandboxes now belongs to
	// a user (apply its network policy, give it its own identity).
	Claimed(node, sandboxID string)
	// Portable says a suspended sandbox of runtime rt can be woken on
	// another node (runtime.Capabilities.Portable).
	Portable(rt string) bool
	// Runtimes lists the runtimes the cluster's nodes offer; Ready says why
	// no node can take sandboxes (nil: one can).
	Runtimes() []string
	Ready() error
}

// Need is what a sandbox asks of the node it is placed on.
type Need struct {
	Runtime   string
	Resources sandbox.Resources
	// Template is the template digest (a node that has it cached is
	// preferred).
	Template string
	Prefer   string
}

// NodeLost is the error code of a sandbox whose node stopped heartbeating.
const NodeLost = "node_lost"

// runsHere says whether this engine runs the sandboxes of node.
func (e *Engine) runsHere(node string) bool {
	return node == e.cfg.Node && len(e.runtimes) > 0
}

// place picks the node of a new sandbox and the active limit that applies.
func (e *Engine) place(ctx context.Context, need Need) (string, int, error) {
	if e.cfg.Cluster == nil {
		return e.cfg.Node, e.cfg.MaxActiveSandboxes, nil
	}
	return e.cfg.Cluster.Place(ctx, need)
}

// rehome picks another node for a sandbox whose operation cannot run where
// it is: a wake from suspended or a delete of a sandbox whose node is gone
// (or, for the wake, cordoned or full). "" keeps it where it is.
func (e *Engine) rehome(ctx context.Context, kind sandbox.OpKind, id string) string {
	c := e.cfg.Cluster
	if c == nil || (kind != sandbox.OpWake && kind != sandbox.OpDelete) {
		return ""
	}
	sb, err := e.store.GetSandbox(ctx, id)
	if err != nil || sb.ActiveOperation != "" {
		return ""
	}
	switch {
	case kind == sandbox.OpDelete && !c.Alive(ctx, sb.Node):
		// Nothing of it runs any more; any node forgets its stored state.
		node, _, err := c.Place(ctx, Need{Runtime: sb.Runtime})
		if err == nil {
			return node
		}
	case kind == sandbox.OpWake && c.Portable(sb.Runtime) && ((sb.State == sandbox.Suspended && e.archived(sb)) || e.restorable(ctx, sb)):
		// Its snapshot is in the blob store: it wakes on any node that fits,
		// its own first.
		node, _, err := c.Place(ctx, Need{Runtime: sb.Runtime, Resources: sb.Resources, Template: sb.Template.Digest, Prefer: sb.Node})
		if err == nil && node != sb.Node {
			e.log.Info("sandbox wakes on another node", "sandbox_id", id, "from_node", sb.Node, "to_node", node)
			return node
		}
	}
	return ""
}

// restorable says a sandbox failed with its node can be woken from the
// last snapshot its suspend stored in the blob store.
func (e *Engine) restorable(ctx context.Context, sb *sandbox.Sandbox) bool {
	if e.cfg.Archive == nil || e.cfg.Cluster == nil || sb.State != sandbox.Failed || sb.Error == nil || sb.Error.Code != NodeLost || !e.cfg.Cluster.Portable(sb.Runtime) {
		return false
	}
	ok, err := e.cfg.Archive.Has(ctx, sb.ID)
	return err == nil && ok
}

// dispatch runs op here when this engine runs its sandbox's node, and
// hands it to that node otherwise.
func (e *Engine) dispatch(op sandbox.Operation, node string) {
	if e.runsHere(node) || e.cfg.Cluster == nil {
		e.submit(op)
		return
	}
	e.cfg.Cluster.Dispatch(node, op.ID)
}

// Run runs an operation of a sandbox on this node (a control replica asked
// for it); a finished one or one of another node's sandbox is ignored.
func (e *Engine) Run(ctx context.Context, opID string) error {
	op, err := e.store.GetOperation(ctx, opID)
	if err != nil {
		return err
	}
	if op.State.Terminal() || op.SandboxID == "" {
		return nil
	}
	sb, err := e.store.GetSandbox(ctx, op.SandboxID)
	if err != nil {
		return err
	}
	if !e.runsHere(sb.Node) {
		return errdefs.New(errdefs.FailedPrecondition, "sandbox %s runs on node %q, not here", sb.ID, sb.Node)
	}
	e.submit(*op)
	return nil
}

// runInbox finds the operations recorded for this node's sandboxes that
// no control replica handed over (it died first) and runs them; now and
// then it also removes snapshot images whose record is gone.
func (e *Engine) runInbox(every time.Duration) {
	defer e.loops.Done()
	t := time.NewTicker(every)
	defer t.Stop()
	for n := 0; ; n++ {
		select {
		case <-e.life.Done():
			return
		case <-t.C:
		}
		ops, err := e.store.UnfinishedOperations(e.life, e.cfg.Node)
		if err != nil {
			continue
		}
		for _, op := range ops {
			e.submit(op)
		}
		if n%60 == 0 {
			e.pruneSnapshotImages(e.life)
		}
	}
}

// ReleaseLost is releaseLost for a node that learns, while it runs, that
// the cluster took it for lost; it runs in the background.
func (e *Engine) ReleaseLost() {
	e.loops.Add(1)
	go func() {
		defer e.loops.Done()
		e.releaseLost(e.life)
		e.pruneNetworks(e.life)
	}()
}

// releaseLost removes from this node what is left of its sandboxes that the
// cluster failed as node_lost while the node was gone (their processes may
// have outlived the node's server), and the local copies of suspended
// sandboxes that woke on another node since. Deletes are idempotent.
func (e *Engine) releaseLost(ctx context.Context) {
	var lost []sandbox.Sandbox
	store.EachSandboxOn(ctx, e.store, &e.cfg.Node, sandbox.Failed, func(sb *sandbox.Sandbox) {
		if sb.Error != nil && sb.Error.Code == NodeLost {
			lost = append(lost, *sb)
		}
	})
	for _, sb := range lost {
		rt, ok := e.runtimes[sb.Runtime]
		if !ok {
			continue
		}
		dctx, cancel := context.WithTimeout(ctx, time.Minute)
		if err := rt.Delete(dctx, e.spec(&sb)); err != nil {
			e.log.Warn("remove a sandbox failed while this node was lost", "sandbox_id", sb.ID, "err", err)
		}
		cancel()
	}
	entries, err := os.ReadDir(e.cfg.SnapshotRoot)
	if err != nil {
		return
	}
	for _, d := range entries {
		id := d.Name()
		if !ids.Valid(ids.Sandbox, id) {
			continue
		}
		if sb, err := e.store.GetSandbox(ctx, id); err == nil && sb.Node != e.cfg.Node {
			e.log.Info("remove the local snapshot of a sandbox that moved to another node", "sandbox_id", id, "node", sb.Node)
			os.RemoveAll(filepath.Join(e.cfg.SnapshotRoot, id))
		}
	}
}

// pruneSnapshotImages removes the images of snapshots deleted through
// another process (the record went; the image is on this node's disk), and
// what fetches of images a crash cut short left.
func (e *Engine) pruneSnapshotImages(ctx context.Context) {
	entries, err := os.ReadDir(e.cfg.SnapshotRoot)
	if err != nil {
		return
	}
	for _, d := range entries {
		id := d.Name()
		if scratch, ok := strings.CutSuffix(id, ".fetch"); ok && ids.Valid(ids.Snapshot, scratch) {
			// A fetch from the blob store a crash cut short (one in
			// progress holds the lock).
			mu, _ := e.fetching.LoadOrStore(scratch, &sync.Mutex{})
			if mu.(*sync.Mutex).TryLock() {
				os.RemoveAll(filepath.Join(e.cfg.SnapshotRoot, id))
				mu.(*sync.Mutex).Unlock()
			}
			continue
		}
		if !strings.HasPrefix(id, "snap_") || !ids.Valid(ids.Snapshot, id) {
			continue
		}
		if _, err := e.store.GetSnapshot(ctx, id); errors.Is(err, errdefs.NotFound) {
			e.log.Info("remove the image of a deleted snapshot", "snapshot_id", id)
			os.RemoveAll(filepath.Join(e.cfg.SnapshotRoot, id))
		}
	}
}

// Claimed readies a warm-pool sandbox of this node that a create claimed
// through another process: its user's network policy and its own identity.
func (e *Engine) Claimed(ctx context.Context, id string) error {
	sb, err := e.store.GetSandbox(ctx, id)
	if err != nil {
		return err
	}
	if !e.runsHere(sb.Node) {
		return errdefs.New(errdefs.FailedPrecondition, "sandbox %s runs on node %q, not here", sb.ID, sb.Node)
	}
	e.readyClaimed(ctx, sb)
	return nil
}

// FailLostNode fails what a lost node held: its running and paused
// sandboxes become failed (node_lost), and operations in flight there end
// failed. A suspended sandbox whose snapshot is in the blob store is
// unaffected (a wake places it elsewhere), and so is one being woken from
// there. It is idempotent: a sweep interrupted halfway is run again.
func (e *Engine) FailLostNode(ctx context.Context, node string) (int, error) {
	lost := &sandbox.ErrorInfo{Code: NodeLost, Message: "the node that ran this sandbox (" + node + ") stopped answering"}
	// One that was suspended before keeps that snapshot in the blob store:
	// a wake restores it (on another node), losing what it did since.
	restorable := &sandbox.ErrorInfo{Code: NodeLost, Message: lost.Message + "; its last suspend snapshot is kept: wake it to restore that state (what it did since is lost)"}
	n := 0
	var sbs []sandbox.Sandbox
	err := store.EachSandboxOn(ctx, e.store, &node, "", func(sb *sandbox.Sandbox) {
		if sb.State != sandbox.Failed && (sb.State != sandbox.Suspended || sb.ActiveOperation != "") {
			sbs = append(sbs, *sb)
		}
	})
	if err != nil {
		return 0, err
	}
	for _, sb := range sbs {
		if sb.ActiveOperation != "" {
			op, err := e.store.GetOperation(ctx, sb.ActiveOperation)
			if err != nil {
				continue
			}
			to, sbErr := sandbox.Failed, lost
			switch {
			case op.Kind == sandbox.OpWake && op.From == sandbox.Suspended && e.archived(&sb):
				to, sbErr = sandbox.Suspended, nil // still in the blob store
			case op.Kind == sandbox.OpDelete:
				to, sbErr = sandbox.Deleted, nil
			}
			f := store.Finish{OperationID: op.ID, State: sandbox.OpFailed, Error: lost, SandboxState: to, SandboxError: sbErr, At: e.now()}
			if op.Kind == sandbox.OpDelete {
				f.State, f.Error = sandbox.OpSucceeded, nil
			}
			for _, other := range op.Sandboxes {
				f.Others = append(f.Others, store.Outcome{SandboxID: other, State: sandbox.Failed, Error: lost})
			}
			if op.Kind == sandbox.OpSnapshot {
				f.Snapshot = &store.SnapshotOutcome{SnapshotID: op.Snapshot, State: sandbox.SnapshotFailed, Error: lost}
			}
			if err := e.store.FinishOperation(ctx, f); err == nil {
				n++
				e.observe(*op, 0)
			}
			continue
		}
		if sb.State == sandbox.Suspended {
			continue
		}
		_, err := e.store.UpdateSandbox(ctx, sb.ID, func(cur *sandbox.Sandbox) error {
			if cur.Node != node || cur.ActiveOperation != "" || cur.State == sandbox.Failed || cur.State == sandbox.Deleted || cur.State == sandbox.Suspended {
				return errdefs.New(errdefs.Conflict, "sandbox changed meanwhile")
			}
			cur.State, cur.Error, cur.UpdatedAt = sandbox.Failed, lost, e.now()
			if e.cfg.Archive != nil && e.cfg.Cluster != nil && e.cfg.Cluster.Portable(cur.Runtime) {
				if ok, err := e.cfg.Archive.Has(ctx, cur.ID); err == nil && ok {
					cur.Error = restorable
				}
			}
			return nil
		})
		if err == nil {
			n++
			e.log.Warn("sandbox failed", "event", "sandbox_failed", "sandbox_id", sb.ID, "reason", NodeLost, "node", node)
			if fo, ok := e.cfg.Observer.(FailureObserver); ok {
				fo.SandboxFailed(sb.Runtime, NodeLost)
			}
		}
	}
	if n > 0 {
		e.notifyFinished()
	}
	return n, nil
}

// DrainNode suspends every running or paused sandbox of node that has no
// operation in flight (a wake then places it on another node) and deletes
// its idle warm-pool sandboxes. It returns how many operations it began;
// a sweep calls it again for those that were busy.
func (e *Engine) DrainNode(ctx context.Context, node string) (int, error) {
	var todo []sandbox.Sandbox
	err := store.EachSandboxOn(ctx, e.store, &node, "", func(sb *sandbox.Sandbox) {
		if sb.ActiveOperation == "" && (sb.State == sandbox.Running || sb.State == sandbox.Paused) {
			todo = append(todo, *sb)
		}
	})
	if err != nil {
		return 0, err
	}
	n := 0
	for _, sb := range todo {
		var err error
		if sb.Pool != "" {
			_, err = e.Delete(ctx, sb.ID, nil)
		} else {
			_, err = e.Suspend(ctx, sb.ID, nil)
		}
		if err == nil {
			n++
		}
	}
	return n, nil
}
