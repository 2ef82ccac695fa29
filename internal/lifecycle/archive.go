package lifecycle

// Suspended sandboxes' snapshots in a blob store (--blob-store): a suspend
// succeeds only once its snapshot is stored there; a wake that finds no
// local copy fetches it (verified) first; a delete removes it; at start,
// snapshots of sandboxes that are gone, and what interrupted uploads left,
// are removed. Named snapshots of a portable runtime (gVisor) are stored
// the same way under their own id: ready only once stored, fetched by a
// node that starts a sandbox from one it lacks, removed with the snapshot.

import (
	"context"
	"errors"
	"os"
	"sync"
	"time"

	"github.com/spacesandbox/space/internal/errdefs"
	"github.com/spacesandbox/space/internal/ids"
	"github.com/spacesandbox/space/internal/runtime"
	"github.com/spacesandbox/space/internal/sandbox"
)

// Archive keeps suspend snapshots off the node (internal/blobstore). A
// snapshot is a directory; key is its sandbox's id.
type Archive interface {
	// Put stores the files under dir as key's snapshot, replacing the
	// previous one only once all of it is durable; it returns the bytes
	// stored.
	Put(ctx context.Context, key, dir string) (int64, error)
	// Get fetches key's snapshot into dir (which it replaces), verifying
	// every file; a damaged snapshot is errdefs.FailedPrecondition and
	// leaves nothing at dir; none stored is errdefs.NotFound.
	Get(ctx context.Context, key, dir string) (int64, error)
	// Delete removes key's snapshot.
	Delete(ctx context.Context, key string) error
	// Prune removes what belongs to no snapshot under key (an upload cut
	// short).
	Prune(ctx context.Context, key string) error
	// Keys lists the keys that have anything stored.
	Keys(ctx context.Context) ([]string, error)
	// Has says whether key has a complete snapshot stored.
	Has(ctx context.Context, key string) (bool, error)
}

// ArchiveObserver is told of every snapshot stored in or fetched from the
// blob store (for metrics); an Observer may implement it.
type ArchiveObserver interface {
	SnapshotTransferred(direction string, bytes int64, d time.Duration, err error)
}

func (e *Engine) observeTransfer(direction string, n int64, start time.Time, err error) {
	if o, ok := e.cfg.Observer.(ArchiveObserver); ok {
		o.SnapshotTransferred(direction, n, time.Since(start), err)
	}
}

// archiveSnapshot uploads a suspended sandbox's snapshot.
func (e *Engine) archiveSnapshot(ctx context.Context, id, dir string) error {
	if e.cfg.Archive == nil {
		return nil
	}
	if err := e.putArchive(ctx, id, dir); err != nil {
		return errdefs.Wrap(errdefs.Unavailable, err, "the snapshot could not be stored in the blob store; the sandbox stays suspended on this node")
	}
	return nil
}

// archiveNamedSnapshot uploads a named snapshot's image, on a runtime whose
// images restore on any node of it (gVisor): a create from the snapshot may
// then run on any node, and the snapshot outlives the node that made it.
// Other runtimes' images stay on their node.
func (e *Engine) archiveNamedSnapshot(ctx context.Context, rt runtime.Runtime, id, dir string) error {
	if e.cfg.Archive == nil || !rt.Capabilities().Portable {
		return nil
	}
	if err := e.putArchive(ctx, id, dir); err != nil {
		return errdefs.Wrap(errdefs.Unavailable, err, "the snapshot could not be stored in the blob store")
	}
	return nil
}

// putArchive stores dir as key's in the blob store. On failure what was
// stored under key before goes too: it is not key's state any more (a
// wake that finds no local copy must not restore it).
func (e *Engine) putArchive(ctx context.Context, key, dir string) error {
	start := time.Now()
	n, err := e.cfg.Archive.Put(ctx, key, dir)
	e.observeTransfer("put", n, start, err)
	if err != nil {
		if derr := e.cfg.Archive.Delete(context.WithoutCancel(ctx), key); derr != nil {
			e.log.Warn("remove the stale snapshot from the blob store", archiveKeyAttr(key), key, "err", derr)
		}
		return err
	}
	e.log.Info("snapshot stored in the blob store", archiveKeyAttr(key), key, "bytes", n, "ms", time.Since(start).Milliseconds())
	return nil
}

// getArchive fetches key's stored snapshot into dir (verified; see
// Archive.Get).
func (e *Engine) getArchive(ctx context.Context, key, dir string) error {
	start := time.Now()
	n, err := e.cfg.Archive.Get(ctx, key, dir)
	e.observeTransfer("get", n, start, err)
	if err != nil {
		return err
	}
	e.log.Info("snapshot fetched from the blob store", archiveKeyAttr(key), key, "bytes", n, "ms", time.Since(start).Milliseconds())
	return nil
}

// archiveKeyAttr names the id a blob-store key is, for the log: a named
// snapshot's, else a suspended sandbox's.
func archiveKeyAttr(key string) string {
	if ids.Valid(ids.Snapshot, key) {
		return "snapshot_id"
	}
	return "sandbox_id"
}

// stored says the blob store holds a complete image under key.
func (e *Engine) stored(ctx context.Context, key string) bool {
	if e.cfg.Archive == nil {
		return false
	}
	ok, err := e.cfg.Archive.Has(ctx, key)
	return err == nil && ok
}

// namedSnapshotImage makes sure this node has named snapshot id's image at
// dir, fetching it from the blob store when it does not. Creates from one
// snapshot on one node fetch it once.
func (e *Engine) namedSnapshotImage(ctx context.Context, id, dir string) error {
	if exists(dir) {
		return nil
	}
	if e.cfg.Archive == nil {
		return errdefs.New(errdefs.FailedPrecondition, "snapshot %s is gone", id)
	}
	mu, _ := e.fetching.LoadOrStore(id, &sync.Mutex{})
	mu.(*sync.Mutex).Lock()
	defer mu.(*sync.Mutex).Unlock()
	if exists(dir) { // (Get puts a whole image in place at once)
		return nil
	}
	err := e.getArchive(ctx, id, dir)
	switch {
	case errors.Is(err, errdefs.NotFound):
		return errdefs.New(errdefs.FailedPrecondition, "snapshot %s is neither on this node nor in the blob store", id)
	case err != nil && errdefs.KindOf(err) == nil:
		return errdefs.Wrap(errdefs.Unavailable, err, "snapshot %s could not be fetched from the blob store", id)
	}
	return err
}

// canStartFrom says this node can start sandboxes from snap: it has the
// image, or can fetch it from the blob store and restore it.
func (e *Engine) canStartFrom(ctx context.Context, snap *sandbox.Snapshot) bool {
	if exists(e.snapshotPath(snap.ID)) {
		return true
	}
	rt, ok := e.runtimes[snap.Runtime]
	return ok && rt.Capabilities().Portable && e.stored(ctx, snap.ID)
}

// portableSnapshot says a create from snap may run on any node: its image
// is in the blob store and some node can restore its runtime's images.
func (e *Engine) portableSnapshot(ctx context.Context, snap *sandbox.Snapshot) bool {
	return e.cfg.Cluster != nil && e.cfg.Cluster.Portable(snap.Runtime) && e.stored(ctx, snap.ID)
}

// fetchSnapshot brings a suspended sandbox's snapshot back from the blob
// store when the node has no copy of it.
func (e *Engine) fetchSnapshot(ctx context.Context, id, dir string) error {
	if e.cfg.Archive == nil || hasFiles(dir) {
		return nil
	}
	err := e.getArchive(ctx, id, dir)
	if err != nil && errdefs.KindOf(err) == nil {
		return errdefs.Wrap(errdefs.Unavailable, err, "the snapshot could not be fetched from the blob store; the sandbox stays suspended")
	}
	return err
}

// forgetSnapshot removes a deleted sandbox's stored snapshot; one left
// behind is removed at the next start.
func (e *Engine) forgetSnapshot(ctx context.Context, id string) {
	if e.cfg.Archive == nil {
		return
	}
	if err := e.cfg.Archive.Delete(ctx, id); err != nil {
		e.log.Warn("remove the sandbox's snapshot from the blob store", "sandbox_id", id, "err", err)
	}
}

// archived says a suspended sandbox the node has no copy of still has its
// snapshot in the blob store (a restart must not take it for lost).
func (e *Engine) archived(sb *sandbox.Sandbox) bool {
	return e.cfg.Archive != nil && sb.State == sandbox.Suspended
}

// sweepArchive removes stored snapshots of sandboxes that are gone and
// what interrupted uploads left beside the others.
func (e *Engine) sweepArchive(ctx context.Context) {
	if e.cfg.Archive == nil {
		return
	}
	keys, err := e.cfg.Archive.Keys(ctx)
	if err != nil {
		e.log.Warn("list the blob store's snapshots", "err", err)
		return
	}
	for _, k := range keys {
		if ids.Valid(ids.Snapshot, k) {
			// A named snapshot's image.
			snap, err := e.store.GetSnapshot(ctx, k)
			switch {
			case errors.Is(err, errdefs.NotFound) || (err == nil && snap.State == sandbox.SnapshotFailed):
				err = e.cfg.Archive.Delete(ctx, k)
			case err == nil && snap.State == sandbox.SnapshotReady:
				err = e.cfg.Archive.Prune(ctx, k)
			}
			if err != nil {
				e.log.Warn("sweep the blob store", "snapshot_id", k, "err", err)
			}
			continue
		}
		sb, err := e.store.GetSandbox(ctx, k)
		switch {
		case errors.Is(err, errdefs.NotFound) || (err == nil && sb.State == sandbox.Deleted):
			err = e.cfg.Archive.Delete(ctx, k)
		case err == nil && sb.ActiveOperation == "":
			// (An operation in flight may be uploading: it prunes when done.)
			err = e.cfg.Archive.Prune(ctx, k)
		}
		if err != nil {
			e.log.Warn("sweep the blob store", "sandbox_id", k, "err", err)
		}
	}
}

// fetchTemplate makes sure the node has a template's files before a
// runtime starts a sandbox from them (a template store with a blob store
// fetches what the node lacks).
func (e *Engine) fetchTemplate(ctx context.Context, digest string) error {
	f, ok := e.cfg.Templates.(interface {
		Fetch(ctx context.Context, digest string) error
	})
	if !ok || digest == "" {
		return nil
	}
	return f.Fetch(ctx, digest)
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// hasFiles says dir exists and holds something.
func hasFiles(dir string) bool {
	f, err := os.Open(dir)
	if err != nil {
		return false
	}
	defer f.Close()
	names, _ := f.Readdirnames(1)
	return len(names) > 0
}
