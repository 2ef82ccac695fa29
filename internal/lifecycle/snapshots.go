package lifecycle

import (
	"context"
	"errors"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"time"

	"github.com/spacesandbox/space/internal/errdefs"
	"github.com/spacesandbox/space/internal/ids"
	"github.com/spacesandbox/space/internal/runtime"
	"github.com/spacesandbox/space/internal/sandbox"
	"github.com/spacesandbox/space/internal/store"
	"github.com/spacesandbox/space/internal/templates"
)

// SnapshotRender makes the idempotent response of a snapshot request from
// its records as they will be committed (nil: no idempotency key).
type SnapshotRender func(op *sandbox.Operation, snap *sandbox.Snapshot) *store.Completion

var snapshotNameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.\-]{0,62}$`)

// snapshotPath is where a snapshot's image lives.
func (e *Engine) snapshotPath(id string) string { return filepath.Join(e.cfg.SnapshotRoot, id) }

// CreateSnapshot records a snapshot of a running or paused sandbox and the
// operation that saves it. The source goes on where it was (held still
// only for the save: Snapshotter); the snapshot is ready when the operation succeeds,
// and from then on independent of the source.
func (e *Engine) CreateSnapshot(ctx context.Context, id, name string, render SnapshotRender) (*sandbox.Operation, *sandbox.Snapshot, error) {
	if name != "" && !snapshotNameRE.MatchString(name) {
		return nil, nil, errdefs.New(errdefs.InvalidArgument, "name: 1 to 63 letters, digits, '.', '_' or '-', starting with a letter or digit").WithDetails(map[string]any{"field": "name"})
	}
	src, err := e.copySource(ctx, id, "snapshot")
	if err != nil {
		return nil, nil, err
	}
	now := e.now()
	snap := &sandbox.Snapshot{
		ID: ids.New(ids.Snapshot), Name: name, SandboxID: id, State: sandbox.SnapshotCreating,
		Template: src.Template, Runtime: src.Runtime, Resources: src.Resources, Env: maps.Clone(src.Env),
		CreatedAt: now, UpdatedAt: now, Node: src.Node, Project: src.Project,
	}
	op := &sandbox.Operation{ID: ids.New(ids.Operation), Kind: sandbox.OpSnapshot, SandboxID: id, Snapshot: snap.ID, State: sandbox.OpPending, CreatedAt: now, UpdatedAt: now}
	snap.OperationID = op.ID
	_, err = e.store.BeginSnapshot(ctx, op, snap, func(sb *sandbox.Sandbox, o *sandbox.Operation) (*store.Completion, error) {
		if err := holdSource(sb, o); err != nil {
			return nil, err
		}
		if render == nil {
			return nil, nil
		}
		return render(o, snap), nil
	})
	if err != nil {
		return nil, nil, err
	}
	e.log.Info("sandbox snapshot accepted", "sandbox_id", id, "operation_id", op.ID, "snapshot_id", snap.ID)
	e.dispatch(*op, src.Node)
	return op, snap, nil
}

// holdSource checks a sandbox may be copied (fork, snapshot) and makes op
// its operation in flight.
func holdSource(sb *sandbox.Sandbox, op *sandbox.Operation) error {
	if sb.State == sandbox.Deleted {
		return errdefs.New(errdefs.NotFound, "sandbox %s is deleted", sb.ID)
	}
	if sb.ActiveOperation != "" {
		return errdefs.New(errdefs.Conflict, "sandbox %s has operation %s in flight", sb.ID, sb.ActiveOperation).
			WithDetails(map[string]any{"operation_id": sb.ActiveOperation, "state": string(sb.State)})
	}
	if _, err := sandbox.Plan(op.Kind, sb.State); err != nil {
		return errdefs.New(errdefs.FailedPrecondition, "%v", err).WithDetails(map[string]any{"state": string(sb.State)})
	}
	op.From = sb.State
	sb.ActiveOperation = op.ID
	return nil
}

// executeSnapshot saves the source into the snapshot's directory. A save
// that completed before a crash is kept.
func (e *Engine) executeSnapshot(ctx context.Context, log interface {
	Error(string, ...any)
	Warn(string, ...any)
}, op sandbox.Operation, src *sandbox.Sandbox, rt runtime.Runtime, start time.Time) {
	bk := context.WithoutCancel(e.life)
	dir := e.snapshotPath(op.Snapshot)
	fail := func(cause error) {
		if e.life.Err() != nil {
			return // shutting down: the next start resumes it
		}
		opErr := operationError(op, cause)
		os.RemoveAll(dir)
		from, srcErr := e.sourceAfterFailure(bk, rt, src, op)
		e.finishWith(log, op, start, store.Finish{OperationID: op.ID, State: sandbox.OpFailed, Error: opErr, SandboxState: from, SandboxError: srcErr,
			Snapshot: &store.SnapshotOutcome{SnapshotID: op.Snapshot, State: sandbox.SnapshotFailed, Error: opErr}})
	}
	if err := e.saveSource(ctx, rt, src, op.ID, dir, nil); err != nil {
		log.Error("snapshot: save the source", "err", err)
		fail(err)
		return
	}
	if err := e.archiveNamedSnapshot(ctx, rt, op.Snapshot, dir); err != nil {
		log.Error("snapshot: store it in the blob store", "err", err)
		fail(err)
		return
	}
	size := dirSize(dir)
	e.log.Info("sandbox snapshot saved", "sandbox_id", op.SandboxID, "snapshot_id", op.Snapshot, "bytes", size, "duration", time.Since(start))
	// The snapshot is complete whatever became of its source since.
	srcState, srcErr := op.From, (*sandbox.ErrorInfo)(nil)
	if err := e.lookAgain(ctx, rt, op, e.spec(src), op.From); err != nil {
		log.Error("snapshot: its source is gone", "err", err)
		srcState, srcErr = sandbox.Failed, lostDuring(op.Kind)
	}
	e.finishWith(log, op, start, store.Finish{OperationID: op.ID, State: sandbox.OpSucceeded, SandboxState: srcState, SandboxError: srcErr,
		Snapshot: &store.SnapshotOutcome{SnapshotID: op.Snapshot, State: sandbox.SnapshotReady, SizeBytes: size}})
}

// dirSize is the disk a directory's files take: their allocated blocks
// (a RAM file is mostly holes), or their length where the file system
// does not say.
func dirSize(dir string) int64 {
	var n int64
	filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if fi, err := d.Info(); err == nil {
				if st, ok := fi.Sys().(*syscall.Stat_t); ok {
					n += st.Blocks * 512
				} else {
					n += fi.Size()
				}
			}
		}
		return nil
	})
	return n
}

// GetSnapshot returns a snapshot.
func (e *Engine) GetSnapshot(ctx context.Context, id string) (*sandbox.Snapshot, error) {
	return e.store.GetSnapshot(ctx, id)
}

// ListSnapshots returns a page of snapshots.
func (e *Engine) ListSnapshots(ctx context.Context, q store.SnapshotQuery) (store.Page[sandbox.Snapshot], error) {
	return e.store.ListSnapshots(ctx, q)
}

// DeleteSnapshot removes a snapshot and its image. One still being made, or
// that sandboxes are still starting from, is a Conflict. Sandboxes created
// from it are not affected: each read the whole image when it started.
func (e *Engine) DeleteSnapshot(ctx context.Context, id string) error {
	var starting []string
	err := store.EachSandbox(ctx, e.store, sandbox.Starting, func(sb *sandbox.Sandbox) {
		if sb.Snapshot == id {
			starting = append(starting, sb.ID)
		}
	})
	if err != nil {
		return err
	}
	if len(starting) > 0 {
		return errdefs.New(errdefs.Conflict, "sandboxes are starting from snapshot %s (%s); delete it once they run", id, strings.Join(starting, ", ")).
			WithDetails(map[string]any{"sandboxes": starting})
	}
	err = e.store.DeleteSnapshot(ctx, id, func(s *sandbox.Snapshot) error {
		if s.State == sandbox.SnapshotCreating {
			return errdefs.New(errdefs.Conflict, "snapshot %s is still being created (operation %s)", id, s.OperationID).
				WithDetails(map[string]any{"operation_id": s.OperationID})
		}
		if s.Tag != "" {
			return errdefs.New(errdefs.Conflict, "snapshot %s is template %s; untag it first (POST /v1/snapshots/%s:untag)", id, s.Tag, id).
				WithDetails(map[string]any{"tag": s.Tag})
		}
		return nil
	})
	if err != nil {
		return err
	}
	if err := os.RemoveAll(e.snapshotPath(id)); err != nil {
		e.log.Warn("remove snapshot image", "snapshot_id", id, "err", err)
	}
	if e.cfg.Archive != nil {
		// (One left behind is removed at the next start: sweepArchive.)
		if err := e.cfg.Archive.Delete(context.WithoutCancel(ctx), id); err != nil {
			e.log.Warn("remove the snapshot's image from the blob store", "snapshot_id", id, "err", err)
		}
	}
	e.log.Info("snapshot deleted", "snapshot_id", id)
	return nil
}

// TagSnapshot makes template reference ref (name[:tag]) start sandboxes
// from ready snapshot id: creates of that template and its warm pool start
// from the snapshot. The tag moves from any other snapshot; a template of
// the template store by that name is a Conflict. An empty ref removes the
// snapshot's tag.
func (e *Engine) TagSnapshot(ctx context.Context, id, ref string) (*sandbox.Snapshot, error) {
	if !ids.Valid(ids.Snapshot, id) {
		return nil, errdefs.New(errdefs.NotFound, "snapshot %s not found", id)
	}
	if ref != "" {
		name, tag, err := templates.ParseRef(ref)
		if err != nil {
			return nil, errdefs.Wrap(errdefs.InvalidArgument, err, "template: %v", err).WithDetails(map[string]any{"field": "template"})
		}
		ref = name + ":" + tag
		if e.cfg.Templates != nil {
			if _, err := e.cfg.Templates.Resolve(ctx, ref); err == nil {
				return nil, errdefs.New(errdefs.Conflict, "template %s exists in the template store; tag the snapshot under another name", ref).
					WithDetails(map[string]any{"template": ref})
			}
		}
	}
	snap, err := e.store.TagSnapshot(ctx, id, ref, func(s *sandbox.Snapshot) error {
		if ref != "" && s.State != sandbox.SnapshotReady {
			return errdefs.New(errdefs.FailedPrecondition, "snapshot %s is %s; only a ready snapshot can be a template", id, s.State).
				WithDetails(map[string]any{"state": string(s.State)})
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	e.log.Info("snapshot tagged", "snapshot_id", id, "tag", ref)
	e.kickPools()
	return snap, nil
}

// taggedSnapshot returns the snapshot tagged as template reference ref,
// nil when none is (or ref is no valid reference).
func (e *Engine) taggedSnapshot(ctx context.Context, ref string) (*sandbox.Snapshot, error) {
	name, tag, err := templates.ParseRef(ref)
	if err != nil {
		return nil, nil
	}
	snap, err := e.store.SnapshotByTag(ctx, name+":"+tag)
	if errors.Is(err, errdefs.NotFound) {
		return nil, nil
	}
	return snap, err
}

// fromSnapshot fills a create request from the snapshot it names: the
// sandbox gets the snapshot's template (by digest), runtime, resources and
// environment; asking for others is refused.
func (e *Engine) fromSnapshot(ctx context.Context, req *CreateRequest) (*sandbox.Snapshot, error) {
	bad := func(field, format string, args ...any) error {
		return errdefs.New(errdefs.InvalidArgument, field+": "+format, args...).WithDetails(map[string]any{"field": field})
	}
	if !ids.Valid(ids.Snapshot, req.Snapshot) {
		return nil, bad("snapshot", "malformed snapshot id")
	}
	snap, err := e.store.GetSnapshot(ctx, req.Snapshot)
	if err != nil {
		return nil, err
	}
	// Another project's snapshot is one that does not exist.
	if snap.Project != store.ProjectOr(req.Project) {
		return nil, errdefs.New(errdefs.NotFound, "snapshot %s not found", req.Snapshot).WithDetails(map[string]any{"field": "snapshot"})
	}
	if snap.State != sandbox.SnapshotReady {
		return nil, errdefs.New(errdefs.FailedPrecondition, "snapshot %s is %s", snap.ID, snap.State).WithDetails(map[string]any{"state": string(snap.State)})
	}
	switch {
	case req.Template != "" && req.Template != snap.Template.Ref && req.Template != snap.Template.Digest:
		return nil, bad("template", "a sandbox from a snapshot runs the snapshot's template (%s)", snap.Template.Ref)
	case req.Runtime != "" && req.Runtime != snap.Runtime:
		return nil, bad("runtime", "a sandbox from a snapshot runs on the snapshot's runtime (%s)", snap.Runtime)
	case len(req.Env) > 0:
		return nil, bad("env", "a sandbox from a snapshot keeps the snapshot's environment")
	}
	if req.Resources != nil {
		r := *req.Resources
		if (r.VCPUs != 0 && r.VCPUs != snap.Resources.VCPUs) || (r.MemoryMiB != 0 && r.MemoryMiB != snap.Resources.MemoryMiB) || (r.DiskMiB != 0 && r.DiskMiB != snap.Resources.DiskMiB) {
			return nil, bad("resources", "must match the snapshot's (%d vCPU, %d MiB memory, %d MiB disk)", snap.Resources.VCPUs, snap.Resources.MemoryMiB, snap.Resources.DiskMiB)
		}
	}
	res := snap.Resources
	req.Resources, req.Runtime, req.Template = &res, snap.Runtime, snap.Template.Ref
	return snap, nil
}

// createFromSnapshot starts a recorded sandbox from its snapshot's image.
func (e *Engine) createFromSnapshot(ctx context.Context, rt runtime.Runtime, spec runtime.Spec, snapID string) error {
	snap, ok := rt.(runtime.Snapshotter)
	if !ok {
		return errdefs.New(errdefs.FailedPrecondition, "the %s runtime cannot start sandboxes from snapshots", rt.Name())
	}
	dir := e.snapshotPath(snapID)
	if err := e.namedSnapshotImage(ctx, snapID, dir); err != nil {
		return err
	}
	if err := snap.CreateFrom(ctx, spec, dir); err != nil {
		return err
	}
	e.identify(ctx, rt, spec, copied)
	return nil
}
