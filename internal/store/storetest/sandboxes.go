package storetest

// The cases of store.Sandboxes.

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/spacesandbox/space/internal/errdefs"
	"github.com/spacesandbox/space/internal/ids"
	"github.com/spacesandbox/space/internal/sandbox"
	"github.com/spacesandbox/space/internal/store"
)

// Every read is the row as it is now, and the reader's own: changing what
// one read returned changes no later read, and a change another store
// (another process) writes is seen at once — however reads are decoded.
func testSandboxReadsAreTheirOwn(t *testing.T, open Opener) {
	s, other := open(), open()
	defer s.Close()
	defer other.Close()
	ctx := context.Background()
	sb, _ := mustCreate(t, s, sandbox.Running)
	first, err := s.GetSandbox(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	first.State, first.Env["A"], first.Metadata["k"] = sandbox.Failed, "changed", "changed"
	first.Error = &sandbox.ErrorInfo{Code: "x"}
	for range 2 {
		got, err := s.GetSandbox(ctx, sb.ID)
		if err != nil || got.State != sandbox.Running || got.Env["A"] != "b" || got.Metadata["k"] != "v" || got.Error != nil {
			t.Fatalf("a read changed by what an earlier read's caller did: %+v %v", got, err)
		}
	}
	if _, err := other.UpdateSandbox(ctx, sb.ID, func(sb *sandbox.Sandbox) error {
		sb.Env["A"] = "from the other store"
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if got, err := s.GetSandbox(ctx, sb.ID); err != nil || got.Env["A"] != "from the other store" {
		t.Fatalf("another store's write not seen: %+v %v", got, err)
	}
}

func testSandboxRoundTrip(t *testing.T, open Opener) {
	s := open()
	defer s.Close()
	ctx := context.Background()
	sb, op := mustCreate(t, s, sandbox.Starting)
	got, err := s.GetSandbox(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.ID != sb.ID || got.State != sandbox.Starting || got.Template != sb.Template || got.Env["A"] != "b" ||
		got.Metadata["k"] != "v" || !got.CreatedAt.Equal(epoch) || got.ActiveOperation != op.ID || got.Resources != sb.Resources {
		t.Fatalf("round trip mismatch: %+v", got)
	}
	gop, err := s.GetOperation(ctx, op.ID)
	if err != nil {
		t.Fatal(err)
	}
	if gop.Kind != sandbox.OpCreate || gop.SandboxID != sb.ID || gop.State != sandbox.OpPending || gop.CompletedAt != nil {
		t.Fatalf("operation mismatch: %+v", gop)
	}
	_, err = s.GetSandbox(ctx, ids.New(ids.Sandbox))
	wantKind(t, err, errdefs.NotFound)
	_, err = s.GetOperation(ctx, ids.New(ids.Operation))
	wantKind(t, err, errdefs.NotFound)

	later := epoch.Add(time.Hour)
	if err := s.TouchSandbox(ctx, sb.ID, later); err != nil {
		t.Fatal(err)
	}
	if err := s.TouchSandbox(ctx, sb.ID, epoch); err != nil { // never goes back
		t.Fatal(err)
	}
	got, _ = s.GetSandbox(ctx, sb.ID)
	if !got.LastActiveAt.Equal(later) {
		t.Fatalf("last_active_at = %v, want %v", got.LastActiveAt, later)
	}
	wantKind(t, s.TouchSandbox(ctx, ids.New(ids.Sandbox), later), errdefs.NotFound)

	refuse := errdefs.New(errdefs.Conflict, "no")
	_, err = s.UpdateSandbox(ctx, sb.ID, func(sb *sandbox.Sandbox) error { sb.State = sandbox.Failed; return refuse })
	if !errors.Is(err, refuse) {
		t.Fatalf("UpdateSandbox refused = %v", err)
	}
	if got, _ = s.GetSandbox(ctx, sb.ID); got.State != sandbox.Starting {
		t.Fatalf("refused update applied: %s", got.State)
	}
	up, err := s.UpdateSandbox(ctx, sb.ID, func(sb *sandbox.Sandbox) error { sb.State = sandbox.Failed; return nil })
	if err != nil || up.State != sandbox.Failed {
		t.Fatalf("UpdateSandbox = %+v, %v", up, err)
	}
	if got, _ = s.GetSandbox(ctx, sb.ID); got.State != sandbox.Failed {
		t.Fatalf("update not stored: %s", got.State)
	}
	if list := listAll(t, s, store.SandboxQuery{State: sandbox.Failed}); len(list) != 1 {
		t.Fatalf("state index not updated: %v", list)
	}
	_, err = s.UpdateSandbox(ctx, ids.New(ids.Sandbox), func(*sandbox.Sandbox) error { return nil })
	wantKind(t, err, errdefs.NotFound)
}

func testDuplicateIDs(t *testing.T, open Opener) {
	s := open()
	defer s.Close()
	sb, op := mustCreate(t, s, sandbox.Starting)
	op2 := *op
	op2.ID = ids.New(ids.Operation)
	wantKind(t, s.CreateSandbox(context.Background(), sb, &op2, nil, 0), errdefs.Conflict)
	sb2, _ := newSandbox(sandbox.Starting)
	wantKind(t, s.CreateSandbox(context.Background(), sb2, op, nil, 0), errdefs.Conflict)
	// The failed transaction left nothing behind.
	if _, err := s.GetSandbox(context.Background(), sb2.ID); !errors.Is(err, errdefs.NotFound) {
		t.Fatalf("sandbox of failed create exists: %v", err)
	}
}

func listAll(t *testing.T, s store.Store, q store.SandboxQuery) []string {
	t.Helper()
	var out []string
	for i := 0; ; i++ {
		p, err := s.ListSandboxes(context.Background(), q)
		if err != nil {
			t.Fatal(err)
		}
		for _, sb := range p.Items {
			out = append(out, sb.ID)
		}
		if p.Next == "" {
			return out
		}
		if len(p.Items) != q.Limit && q.Limit != 0 {
			t.Fatalf("short page (%d) with a next cursor", len(p.Items))
		}
		q.Cursor = p.Next
		if i > 10000 {
			t.Fatal("pagination does not end")
		}
	}
}

func testListPagination(t *testing.T, open Opener) {
	s := open()
	defer s.Close()
	var want []string
	for i := 0; i < 120; i++ {
		sb, _ := mustCreate(t, s, sandbox.Running)
		want = append(want, sb.ID)
	}
	for _, limit := range []int{1, 7, 50, 120, 500} {
		got := listAll(t, s, store.SandboxQuery{Limit: limit})
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("limit %d: got %d items, want %d in insertion order", limit, len(got), len(want))
		}
	}
	p, err := s.ListSandboxes(context.Background(), store.SandboxQuery{})
	if err != nil || len(p.Items) != store.DefaultLimit || p.Next == "" {
		t.Fatalf("default page: %d items, next %q, err %v", len(p.Items), p.Next, err)
	}
	// An exactly full last page has no next cursor.
	p, err = s.ListSandboxes(context.Background(), store.SandboxQuery{Limit: 120})
	if err != nil || len(p.Items) != 120 || p.Next != "" {
		t.Fatalf("full page: %d items, next %q, err %v", len(p.Items), p.Next, err)
	}
}

func testListUnderConcurrentInserts(t *testing.T, open Opener) {
	s := open()
	defer s.Close()
	initial := map[string]bool{}
	for i := 0; i < 60; i++ {
		sb, _ := mustCreate(t, s, sandbox.Running)
		initial[sb.ID] = true
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			sb, op := newSandbox(sandbox.Running)
			if err := s.CreateSandbox(context.Background(), sb, op, nil, 0); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	seen := map[string]bool{}
	q := store.SandboxQuery{Limit: 5}
	for {
		p, err := s.ListSandboxes(context.Background(), q)
		if err != nil {
			t.Fatal(err)
		}
		for _, sb := range p.Items {
			if seen[sb.ID] {
				t.Fatalf("%s listed twice", sb.ID)
			}
			seen[sb.ID] = true
		}
		if p.Next == "" || len(seen) > 400 {
			break
		}
		q.Cursor = p.Next
	}
	close(stop)
	wg.Wait()
	for id := range initial {
		if !seen[id] {
			t.Fatalf("%s missed", id)
		}
	}
}

func testListFilters(t *testing.T, open Opener) {
	s := open()
	defer s.Close()
	ctx := context.Background()
	run, _ := mustCreate(t, s, sandbox.Running)
	paused, _ := mustCreate(t, s, sandbox.Paused)
	gone, op := mustCreate(t, s, sandbox.Deleting)
	if err := s.FinishOperation(ctx, store.Finish{OperationID: op.ID, State: sandbox.OpSucceeded, SandboxState: sandbox.Deleted, At: epoch}); err != nil {
		t.Fatal(err)
	}
	if got := listAll(t, s, store.SandboxQuery{}); fmt.Sprint(got) != fmt.Sprint([]string{run.ID, paused.ID}) {
		t.Fatalf("default list = %v (deleted must be hidden)", got)
	}
	if got := listAll(t, s, store.SandboxQuery{State: sandbox.Paused}); fmt.Sprint(got) != fmt.Sprint([]string{paused.ID}) {
		t.Fatalf("paused list = %v", got)
	}
	if got := listAll(t, s, store.SandboxQuery{State: sandbox.Deleted}); fmt.Sprint(got) != fmt.Sprint([]string{gone.ID}) {
		t.Fatalf("deleted list = %v", got)
	}
	// Operations by sandbox.
	ops, err := s.ListOperations(ctx, store.OperationQuery{SandboxID: gone.ID})
	if err != nil || len(ops.Items) != 1 || ops.Items[0].ID != op.ID {
		t.Fatalf("operations of %s = %+v, %v", gone.ID, ops, err)
	}
	all, err := s.ListOperations(ctx, store.OperationQuery{Limit: 2})
	if err != nil || len(all.Items) != 2 || all.Next == "" {
		t.Fatalf("operations page = %+v, %v", all, err)
	}
	rest, err := s.ListOperations(ctx, store.OperationQuery{Limit: 2, Cursor: all.Next})
	if err != nil || len(rest.Items) != 1 || rest.Next != "" {
		t.Fatalf("operations second page = %+v, %v", rest, err)
	}
}

func testBadCursorAndLimit(t *testing.T, open Opener) {
	s := open()
	defer s.Close()
	ctx := context.Background()
	for _, c := range []string{"!!", "c3g", "eHl6", "cy0x", "cys1", "cw"} {
		_, err := s.ListSandboxes(ctx, store.SandboxQuery{Cursor: c})
		wantKind(t, err, errdefs.InvalidArgument)
		_, err = s.ListOperations(ctx, store.OperationQuery{Cursor: c})
		wantKind(t, err, errdefs.InvalidArgument)
	}
	for _, l := range []int{-1, store.MaxLimit + 1} {
		_, err := s.ListSandboxes(ctx, store.SandboxQuery{Limit: l})
		wantKind(t, err, errdefs.InvalidArgument)
	}
}

func testBeginOperationAtomic(t *testing.T, open Opener) {
	s := open()
	defer s.Close()
	ctx := context.Background()
	sb, _ := mustCreate(t, s, sandbox.Running)
	sb.ActiveOperation = ""
	pause := &sandbox.Operation{ID: ids.New(ids.Operation), Kind: sandbox.OpPause, SandboxID: sb.ID, State: sandbox.OpPending, CreatedAt: epoch, UpdatedAt: epoch}
	refuse := errdefs.New(errdefs.FailedPrecondition, "no")
	_, err := s.BeginOperation(ctx, pause, func(sb *sandbox.Sandbox, op *sandbox.Operation) (*store.Completion, error) {
		sb.State = sandbox.Pausing // must not stick
		return nil, refuse
	})
	if !errors.Is(err, refuse) {
		t.Fatalf("err = %v", err)
	}
	got, _ := s.GetSandbox(ctx, sb.ID)
	if got.State != sandbox.Running {
		t.Fatalf("refused operation changed state to %s", got.State)
	}
	if _, err := s.GetOperation(ctx, pause.ID); !errors.Is(err, errdefs.NotFound) {
		t.Fatalf("refused operation was stored: %v", err)
	}
	s.ReserveIdempotencyKey(ctx, store.IdempotencyRecord{Key: "p", Fingerprint: "f", Owner: "o", CreatedAt: epoch, ExpiresAt: epoch.Add(time.Hour)})
	out, err := s.BeginOperation(ctx, pause, func(sb *sandbox.Sandbox, op *sandbox.Operation) (*store.Completion, error) {
		op.From = sb.State
		sb.State, sb.ActiveOperation = sandbox.Pausing, op.ID
		state := string(sb.State) // rendered after the change is applied
		return &store.Completion{Key: "p", Status: 202, Body: func() ([]byte, error) { return []byte(state), nil }}, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if out.State != sandbox.Pausing || out.ActiveOperation != pause.ID {
		t.Fatalf("returned sandbox %+v", out)
	}
	gop, _ := s.GetOperation(ctx, pause.ID)
	if gop.From != sandbox.Running {
		t.Fatalf("operation from = %q", gop.From)
	}
	if rec, _ := s.GetIdempotencyKey(ctx, "p"); rec == nil || rec.State != store.IdemDone || string(rec.Body) != "pausing" {
		t.Fatalf("idempotency record = %+v", rec)
	}
	missing := &sandbox.Operation{ID: ids.New(ids.Operation), Kind: sandbox.OpPause, SandboxID: ids.New(ids.Sandbox)}
	_, err = s.BeginOperation(ctx, missing, func(*sandbox.Sandbox, *sandbox.Operation) (*store.Completion, error) { return nil, nil })
	wantKind(t, err, errdefs.NotFound)
}

func testFinishOperation(t *testing.T, open Opener) {
	s := open()
	defer s.Close()
	ctx := context.Background()
	sb, op := mustCreate(t, s, sandbox.Starting)
	if err := s.UpdateOperationState(ctx, op.ID, sandbox.OpRunning, epoch.Add(time.Second)); err != nil {
		t.Fatal(err)
	}
	fin := epoch.Add(2 * time.Second)
	e := &sandbox.ErrorInfo{Code: "internal", Message: "boom"}
	if err := s.FinishOperation(ctx, store.Finish{OperationID: op.ID, State: sandbox.OpFailed, Error: e, SandboxState: sandbox.Failed, SandboxError: e, At: fin}); err != nil {
		t.Fatal(err)
	}
	gop, _ := s.GetOperation(ctx, op.ID)
	if gop.State != sandbox.OpFailed || gop.Error == nil || gop.Error.Message != "boom" || gop.CompletedAt == nil || !gop.CompletedAt.Equal(fin) {
		t.Fatalf("finished op = %+v", gop)
	}
	got, _ := s.GetSandbox(ctx, sb.ID)
	if got.State != sandbox.Failed || got.ActiveOperation != "" || got.Error == nil || !got.UpdatedAt.Equal(fin) {
		t.Fatalf("sandbox after finish = %+v", got)
	}
	wantKind(t, s.FinishOperation(ctx, store.Finish{OperationID: op.ID, State: sandbox.OpSucceeded, SandboxState: sandbox.Running, At: fin}), errdefs.Conflict)
	wantKind(t, s.UpdateOperationState(ctx, op.ID, sandbox.OpRunning, fin), errdefs.Conflict)
	wantKind(t, s.FinishOperation(ctx, store.Finish{OperationID: ids.New(ids.Operation), State: sandbox.OpSucceeded, At: fin}), errdefs.NotFound)
}

func testUnfinishedOperations(t *testing.T, open Opener) {
	s := open()
	defer s.Close()
	ctx := context.Background()
	_, a := mustCreate(t, s, sandbox.Starting)
	_, b := mustCreate(t, s, sandbox.Starting)
	_, c := mustCreate(t, s, sandbox.Starting)
	s.UpdateOperationState(ctx, b.ID, sandbox.OpRunning, epoch)
	s.FinishOperation(ctx, store.Finish{OperationID: c.ID, State: sandbox.OpSucceeded, SandboxState: sandbox.Running, At: epoch})
	ops, err := s.UnfinishedOperations(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	if len(ops) != 2 || ops[0].ID != a.ID || ops[1].ID != b.ID || ops[1].State != sandbox.OpRunning {
		t.Fatalf("unfinished = %+v", ops)
	}
}

func testActiveLimit(t *testing.T, open Opener) {
	s := open()
	defer s.Close()
	ctx := context.Background()
	mustCreate(t, s, sandbox.Running)
	_, failedOp := mustCreate(t, s, sandbox.Starting)
	s.FinishOperation(ctx, store.Finish{OperationID: failedOp.ID, State: sandbox.OpFailed, SandboxState: sandbox.Failed, At: epoch})
	sb, op := newSandbox(sandbox.Starting)
	if err := s.CreateSandbox(ctx, sb, op, nil, 2); err != nil {
		t.Fatalf("second active sandbox refused (failed ones must not count): %v", err)
	}
	sb, op = newSandbox(sandbox.Starting)
	wantKind(t, s.CreateSandbox(ctx, sb, op, nil, 2), errdefs.ResourceExhausted)
	if _, err := s.GetSandbox(ctx, sb.ID); !errors.Is(err, errdefs.NotFound) {
		t.Fatal("refused sandbox was stored")
	}
}

func testOperationWithoutSandbox(t *testing.T, open Opener) {
	s := open()
	defer s.Close()
	ctx := context.Background()
	s.ReserveIdempotencyKey(ctx, store.IdempotencyRecord{Key: "b", Fingerprint: "f", Owner: "o", CreatedAt: epoch, ExpiresAt: epoch.Add(time.Hour)})
	op := &sandbox.Operation{ID: ids.New(ids.Operation), Kind: sandbox.OpBuild, Template: "mine:v1", State: sandbox.OpPending, CreatedAt: epoch, UpdatedAt: epoch}
	if err := s.CreateOperation(ctx, op, &store.Completion{Key: "b", Status: 202, Body: func() ([]byte, error) { return []byte("x"), nil }}); err != nil {
		t.Fatal(err)
	}
	if rec, _ := s.GetIdempotencyKey(ctx, "b"); rec == nil || rec.State != store.IdemDone {
		t.Fatal("idempotency key not completed with the operation")
	}
	wantKind(t, s.CreateOperation(ctx, op, nil), errdefs.Conflict)
	if ops, _ := s.UnfinishedOperations(ctx, ""); len(ops) != 1 || ops[0].Template != "mine:v1" {
		t.Fatalf("unfinished = %+v", ops)
	}
	if err := s.FinishOperation(ctx, store.Finish{OperationID: op.ID, State: sandbox.OpSucceeded, At: epoch}); err != nil {
		t.Fatal(err)
	}
	got, _ := s.GetOperation(ctx, op.ID)
	if got.State != sandbox.OpSucceeded || got.SandboxID != "" || got.Template != "mine:v1" {
		t.Fatalf("build op = %+v", got)
	}
}

func testTemplatesInUse(t *testing.T, open Opener) {
	s := open()
	defer s.Close()
	ctx := context.Background()
	used, err := s.TemplatesInUse(ctx)
	if err != nil || len(used) != 0 {
		t.Fatalf("empty store: %v %v", used, err)
	}
	a, _ := newSandbox(sandbox.Running)
	a.Template.Digest = "sha256:live"
	b, _ := newSandbox(sandbox.Failed)
	b.Template.Digest = "sha256:failed"
	c, _ := newSandbox(sandbox.Deleted)
	c.Template.Digest = "sha256:gone"
	d, _ := newSandbox(sandbox.Running)
	d.Template.Digest = "sha256:pool"
	d.Pool = "seed:latest"
	for _, sb := range []*sandbox.Sandbox{a, b, c, d} {
		op := &sandbox.Operation{ID: ids.New(ids.Operation), Kind: sandbox.OpCreate, SandboxID: sb.ID, State: sandbox.OpSucceeded, CreatedAt: epoch, UpdatedAt: epoch}
		sb.ActiveOperation = ""
		if err := s.CreateSandbox(ctx, sb, op, nil, 0); err != nil {
			t.Fatal(err)
		}
	}
	used, err = s.TemplatesInUse(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !used["sha256:live"] || !used["sha256:failed"] || !used["sha256:pool"] || used["sha256:gone"] || len(used) != 3 {
		t.Fatalf("templates in use = %v", used)
	}
}

// A fork records its operation on the source and its new sandboxes in one
// transaction, refuses all of them past the active limit or when decide
// refuses, and finishes the source and every fork together.
func testForkAtomic(t *testing.T, open Opener) {
	s := open()
	defer s.Close()
	ctx := context.Background()
	src, srcOp := mustCreate(t, s, sandbox.Starting)
	if err := s.FinishOperation(ctx, store.Finish{OperationID: srcOp.ID, State: sandbox.OpSucceeded, SandboxState: sandbox.Running, At: epoch}); err != nil {
		t.Fatal(err)
	}
	newFork := func() (*sandbox.Operation, []*sandbox.Sandbox) {
		op := &sandbox.Operation{ID: ids.New(ids.Operation), Kind: sandbox.OpFork, SandboxID: src.ID, State: sandbox.OpPending, CreatedAt: epoch, UpdatedAt: epoch}
		var forks []*sandbox.Sandbox
		for range 2 {
			f, _ := newSandbox(sandbox.Starting)
			f.ForkOf, f.ActiveOperation = src.ID, op.ID
			forks = append(forks, f)
			op.Sandboxes = append(op.Sandboxes, f.ID)
		}
		return op, forks
	}
	hold := func(sb *sandbox.Sandbox, op *sandbox.Operation) (*store.Completion, error) {
		op.From = sb.State
		sb.ActiveOperation = op.ID
		return nil, nil
	}
	// Past the limit (1 active + 2 > 2): nothing is stored.
	op, forks := newFork()
	_, err := s.BeginFork(ctx, op, forks, 2, hold)
	wantKind(t, err, errdefs.ResourceExhausted)
	// decide refuses: nothing is stored either.
	_, err = s.BeginFork(ctx, op, forks, 0, func(*sandbox.Sandbox, *sandbox.Operation) (*store.Completion, error) {
		return nil, errdefs.New(errdefs.Conflict, "busy")
	})
	wantKind(t, err, errdefs.Conflict)
	for _, f := range forks {
		if _, err := s.GetSandbox(ctx, f.ID); !errors.Is(err, errdefs.NotFound) {
			t.Fatalf("a refused fork stored sandbox %s", f.ID)
		}
	}
	if got, _ := s.GetSandbox(ctx, src.ID); got.ActiveOperation != "" {
		t.Fatal("a refused fork left the source busy")
	}
	got, err := s.BeginFork(ctx, op, forks, 3, hold)
	if err != nil || got.ActiveOperation != op.ID {
		t.Fatalf("BeginFork = %+v, %v", got, err)
	}
	gop, err := s.GetOperation(ctx, op.ID)
	if err != nil || len(gop.Sandboxes) != 2 || gop.From != sandbox.Running {
		t.Fatalf("fork operation = %+v, %v", gop, err)
	}
	for _, f := range forks {
		g, err := s.GetSandbox(ctx, f.ID)
		if err != nil || g.ForkOf != src.ID || g.ActiveOperation != op.ID || g.State != sandbox.Starting {
			t.Fatalf("fork record = %+v, %v", g, err)
		}
	}
	fin := epoch.Add(time.Minute)
	bad := &sandbox.ErrorInfo{Code: "internal", Message: "no"}
	err = s.FinishOperation(ctx, store.Finish{OperationID: op.ID, State: sandbox.OpSucceeded, SandboxState: sandbox.Running, At: fin,
		Others: []store.Outcome{{SandboxID: forks[0].ID, State: sandbox.Running}, {SandboxID: forks[1].ID, State: sandbox.Failed, Error: bad}}})
	if err != nil {
		t.Fatal(err)
	}
	if g, _ := s.GetSandbox(ctx, src.ID); g.State != sandbox.Running || g.ActiveOperation != "" {
		t.Fatalf("source after the fork = %+v", g)
	}
	if g, _ := s.GetSandbox(ctx, forks[0].ID); g.State != sandbox.Running || g.ActiveOperation != "" || !g.UpdatedAt.Equal(fin) {
		t.Fatalf("fork 0 after the fork = %+v", g)
	}
	if g, _ := s.GetSandbox(ctx, forks[1].ID); g.State != sandbox.Failed || g.Error == nil || g.ActiveOperation != "" {
		t.Fatalf("fork 1 after the fork = %+v", g)
	}
}

// A snapshot is recorded with its operation, finished with it, listed by
// source, keeps its template in use, and is deleted only when check agrees.
func testSnapshots(t *testing.T, open Opener) {
	s := open()
	defer s.Close()
	ctx := context.Background()
	src, srcOp := mustCreate(t, s, sandbox.Starting)
	s.FinishOperation(ctx, store.Finish{OperationID: srcOp.ID, State: sandbox.OpSucceeded, SandboxState: sandbox.Running, At: epoch})
	snap := &sandbox.Snapshot{ID: ids.New(ids.Snapshot), Name: "warm", SandboxID: src.ID, State: sandbox.SnapshotCreating,
		Template: sandbox.TemplateRef{Ref: "snapped:latest", Digest: "sha256:snapped"}, Runtime: "fake", Resources: src.Resources, CreatedAt: epoch, UpdatedAt: epoch}
	op := &sandbox.Operation{ID: ids.New(ids.Operation), Kind: sandbox.OpSnapshot, SandboxID: src.ID, Snapshot: snap.ID, State: sandbox.OpPending, CreatedAt: epoch, UpdatedAt: epoch}
	snap.OperationID = op.ID
	hold := func(sb *sandbox.Sandbox, o *sandbox.Operation) (*store.Completion, error) {
		o.From, sb.ActiveOperation = sb.State, o.ID
		return nil, nil
	}
	if _, err := s.BeginSnapshot(ctx, op, snap, func(*sandbox.Sandbox, *sandbox.Operation) (*store.Completion, error) {
		return nil, errdefs.New(errdefs.Conflict, "busy")
	}); !errors.Is(err, errdefs.Conflict) {
		t.Fatalf("refused BeginSnapshot: %v", err)
	}
	if _, err := s.GetSnapshot(ctx, snap.ID); !errors.Is(err, errdefs.NotFound) {
		t.Fatal("a refused snapshot was stored")
	}
	if _, err := s.BeginSnapshot(ctx, op, snap, hold); err != nil {
		t.Fatal(err)
	}
	wantKind(t, s.DeleteSnapshot(ctx, snap.ID, func(*sandbox.Snapshot) error { return errdefs.New(errdefs.Conflict, "creating") }), errdefs.Conflict)
	fin := epoch.Add(time.Minute)
	if err := s.FinishOperation(ctx, store.Finish{OperationID: op.ID, State: sandbox.OpSucceeded, SandboxState: sandbox.Running, At: fin,
		Snapshot: &store.SnapshotOutcome{SnapshotID: snap.ID, State: sandbox.SnapshotReady, SizeBytes: 1234}}); err != nil {
		t.Fatal(err)
	}
	got, err := s.GetSnapshot(ctx, snap.ID)
	if err != nil || got.State != sandbox.SnapshotReady || got.SizeBytes != 1234 || !got.UpdatedAt.Equal(fin) || got.Name != "warm" {
		t.Fatalf("snapshot after finish = %+v, %v", got, err)
	}
	if sb, _ := s.GetSandbox(ctx, src.ID); sb.ActiveOperation != "" || sb.State != sandbox.Running {
		t.Fatalf("source after the snapshot = %+v", sb)
	}
	used, err := s.TemplatesInUse(ctx)
	if err != nil || !used["sha256:snapped"] {
		t.Fatalf("a snapshot's template is not in use: %v %v", used, err)
	}
	for _, q := range []store.SnapshotQuery{{SandboxID: src.ID}, {Name: "warm"}, {}} {
		page, err := s.ListSnapshots(ctx, q)
		if err != nil || len(page.Items) != 1 || page.Items[0].ID != snap.ID {
			t.Fatalf("list %+v = %+v, %v", q, page, err)
		}
	}
	if page, _ := s.ListSnapshots(ctx, store.SnapshotQuery{SandboxID: ids.New(ids.Sandbox)}); len(page.Items) != 0 {
		t.Fatalf("list of another sandbox's snapshots = %+v", page)
	}
	testSnapshotTags(t, s, snap.ID)
	if err := s.DeleteSnapshot(ctx, snap.ID, nil); err != nil {
		t.Fatal(err)
	}
	wantKind(t, s.DeleteSnapshot(ctx, snap.ID, nil), errdefs.NotFound)
	_, err = s.SnapshotByTag(ctx, "warm:v1")
	wantKind(t, err, errdefs.NotFound)
}

// testSnapshotTags: a tag names one snapshot; tagging another moves it;
// a refused tag changes nothing; an empty tag removes it. id: a ready
// snapshot.
func testSnapshotTags(t *testing.T, s store.Store, id string) {
	ctx := context.Background()
	_, err := s.SnapshotByTag(ctx, "warm:v1")
	wantKind(t, err, errdefs.NotFound)
	_, err = s.TagSnapshot(ctx, ids.New(ids.Snapshot), "warm:v1", nil)
	wantKind(t, err, errdefs.NotFound)
	if got, err := s.TagSnapshot(ctx, id, "warm:v1", nil); err != nil || got.Tag != "warm:v1" {
		t.Fatalf("tag = %+v, %v", got, err)
	}
	if got, err := s.SnapshotByTag(ctx, "warm:v1"); err != nil || got.ID != id || got.Tag != "warm:v1" {
		t.Fatalf("by tag = %+v, %v", got, err)
	}
	// Another snapshot takes the tag over.
	src, _ := mustCreate(t, s, sandbox.Running)
	other := &sandbox.Snapshot{ID: ids.New(ids.Snapshot), SandboxID: src.ID, State: sandbox.SnapshotReady}
	op := &sandbox.Operation{ID: ids.New(ids.Operation), Kind: sandbox.OpSnapshot, SandboxID: src.ID, Snapshot: other.ID, State: sandbox.OpPending}
	if _, err := s.BeginSnapshot(ctx, op, other, func(*sandbox.Sandbox, *sandbox.Operation) (*store.Completion, error) { return nil, nil }); err != nil {
		t.Fatal(err)
	}
	_, err = s.TagSnapshot(ctx, other.ID, "warm:v1", func(*sandbox.Snapshot) error { return errdefs.New(errdefs.FailedPrecondition, "no") })
	wantKind(t, err, errdefs.FailedPrecondition)
	if got, _ := s.SnapshotByTag(ctx, "warm:v1"); got == nil || got.ID != id {
		t.Fatalf("a refused tag moved: %+v", got)
	}
	if _, err := s.TagSnapshot(ctx, other.ID, "warm:v1", nil); err != nil {
		t.Fatal(err)
	}
	if got, _ := s.GetSnapshot(ctx, id); got.Tag != "" {
		t.Fatalf("the tag stayed on the first snapshot too: %+v", got)
	}
	if got, _ := s.SnapshotByTag(ctx, "warm:v1"); got == nil || got.ID != other.ID {
		t.Fatalf("by tag after the move = %+v", got)
	}
	// A new tag replaces a snapshot's own; an empty one removes it.
	if _, err := s.TagSnapshot(ctx, other.ID, "warm:v2", nil); err != nil {
		t.Fatal(err)
	}
	_, err = s.SnapshotByTag(ctx, "warm:v1")
	wantKind(t, err, errdefs.NotFound)
	if got, err := s.TagSnapshot(ctx, other.ID, "", nil); err != nil || got.Tag != "" {
		t.Fatalf("untag = %+v, %v", got, err)
	}
	_, err = s.SnapshotByTag(ctx, "warm:v2")
	wantKind(t, err, errdefs.NotFound)
	if _, err := s.TagSnapshot(ctx, id, "warm:v1", nil); err != nil {
		t.Fatal(err)
	}
}
