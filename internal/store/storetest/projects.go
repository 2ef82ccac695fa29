package storetest

import (
	"context"
	"testing"
	"time"

	"github.com/spacesandbox/space/internal/errdefs"
	"github.com/spacesandbox/space/internal/ids"
	"github.com/spacesandbox/space/internal/sandbox"
	"github.com/spacesandbox/space/internal/store"
)

// testProjects: projects, their quotas checked in the transactions that
// admit sandboxes, lists scoped to a project, template owners, removal.
func testProjects(t *testing.T, open Opener) {
	ctx := context.Background()
	s := open()
	defer s.Close()
	if p, err := s.GetProject(ctx, store.DefaultProject); err != nil || p.Name != store.DefaultProject {
		t.Fatalf("default project = %+v %v", p, err)
	}
	wantKind(t, s.CreateProject(ctx, &store.Project{Name: "Bad_Name", CreatedAt: epoch}), errdefs.InvalidArgument)
	if err := s.CreateProject(ctx, &store.Project{Name: "team-a", CreatedAt: epoch}); err != nil {
		t.Fatal(err)
	}
	wantKind(t, s.CreateProject(ctx, &store.Project{Name: "team-a", CreatedAt: epoch}), errdefs.Conflict)
	_, err := setQuotas(s, "team-a", store.Quotas{Sandboxes: -1})
	wantKind(t, err, errdefs.InvalidArgument)
	// Quotas under the owner's limits: the lower of each counts.
	if _, err := s.UpdateProject(ctx, "team-a", func(p *store.Project) error {
		p.Limits = store.Quotas{Sandboxes: 3, MemoryMiB: 4096}
		p.Quotas = store.Quotas{RunningSandboxes: 2, MemoryMiB: 1024}
		return nil
	}); err != nil {
		t.Fatal(err)
	}

	inA := func(state sandbox.State) (*sandbox.Sandbox, *sandbox.Operation) {
		sb, op := newSandbox(state)
		sb.Project, op.Project = "team-a", "team-a"
		return sb, op
	}
	a1, op1 := inA(sandbox.Starting)
	if err := s.CreateSandbox(ctx, a1, op1, nil, 0); err != nil {
		t.Fatal(err)
	}
	a2, op2 := inA(sandbox.Starting)
	if err := s.CreateSandbox(ctx, a2, op2, nil, 0); err != nil {
		t.Fatal(err)
	}
	// Two running of 512 MiB: running_sandboxes (2) and memory (1024) full.
	a3, op3 := inA(sandbox.Starting)
	err = s.CreateSandbox(ctx, a3, op3, nil, 0)
	wantKind(t, err, errdefs.ResourceExhausted)
	if _, _, d := errdefs.Public(err); d["quota"] != "running_sandboxes" {
		t.Fatalf("refusal names %v, want running_sandboxes", d)
	}
	if _, err := s.GetSandbox(ctx, a3.ID); errdefs.KindOf(err) != errdefs.NotFound {
		t.Fatalf("a refused create stored its sandbox: %v", err)
	}
	// The default project has no quotas.
	d1, dop := mustCreate(t, s, sandbox.Running)
	if d1.Project != store.DefaultProject || dop.Project != store.DefaultProject {
		t.Fatalf("unscoped records belong to %q/%q, want the default project", d1.Project, dop.Project)
	}

	// Suspending one frees its memory: a wake of it is admitted, a second
	// running create is not (the wake took the place back).
	finish(t, s, op1, sandbox.Running)
	sus := &sandbox.Operation{ID: ids.New(ids.Operation), Project: "team-a", Kind: sandbox.OpSuspend, SandboxID: a1.ID, State: sandbox.OpPending, CreatedAt: epoch}
	begin(t, s, sus, sandbox.Suspending)
	finish(t, s, sus, sandbox.Suspended)
	u, err := s.ProjectUsage(ctx, "team-a")
	if err != nil || u.Sandboxes != 2 || u.RunningSandboxes != 1 || u.MemoryMiB != 512 || u.DiskMiB != 4096 {
		t.Fatalf("usage = %+v %v", u, err)
	}
	a4, op4 := inA(sandbox.Starting)
	if err := s.CreateSandbox(ctx, a4, op4, nil, 0); err != nil {
		t.Fatalf("create within quota after a suspend: %v", err)
	}
	// Now 3 sandboxes (the quota), 2 running: a wake of a1 is refused.
	wake := &sandbox.Operation{ID: ids.New(ids.Operation), Project: "team-a", Kind: sandbox.OpWake, SandboxID: a1.ID, State: sandbox.OpPending, CreatedAt: epoch}
	_, err = s.BeginOperation(ctx, wake, func(sb *sandbox.Sandbox, op *sandbox.Operation) (*store.Completion, error) {
		sb.State, sb.ActiveOperation = sandbox.Restoring, op.ID
		return nil, nil
	})
	wantKind(t, err, errdefs.ResourceExhausted)
	if got, _ := s.GetSandbox(ctx, a1.ID); got.State != sandbox.Suspended {
		t.Fatalf("a refused wake changed the sandbox: %s", got.State)
	}
	// Deleting frees the quota at once.
	del := &sandbox.Operation{ID: ids.New(ids.Operation), Project: "team-a", Kind: sandbox.OpDelete, SandboxID: a4.ID, State: sandbox.OpPending, CreatedAt: epoch}
	finish(t, s, op4, sandbox.Running)
	begin(t, s, del, sandbox.Deleting)
	finish(t, s, del, sandbox.Deleted)
	if _, err := s.BeginOperation(ctx, wake, func(sb *sandbox.Sandbox, op *sandbox.Operation) (*store.Completion, error) {
		sb.State, sb.ActiveOperation = sandbox.Restoring, op.ID
		return nil, nil
	}); err != nil {
		t.Fatalf("wake after a delete freed the quota: %v", err)
	}

	// Lists are scoped.
	if l := listAll(t, s, store.SandboxQuery{Project: "team-a"}); len(l) != 2 {
		t.Fatalf("team-a lists %d sandboxes, want 2", len(l))
	}
	if l := listAll(t, s, store.SandboxQuery{Project: store.DefaultProject}); len(l) != 1 || l[0] != d1.ID {
		t.Fatalf("default lists %v", l)
	}
	ops, err := s.ListOperations(ctx, store.OperationQuery{Project: store.DefaultProject})
	if err != nil || len(ops.Items) != 1 || ops.Items[0].ID != dop.ID {
		t.Fatalf("default's operations = %+v %v", ops.Items, err)
	}
	ops, _ = s.ListOperations(ctx, store.OperationQuery{Project: store.DefaultProject, SandboxID: a1.ID})
	if len(ops.Items) != 0 {
		t.Fatalf("another project's sandbox's operations listed: %+v", ops.Items)
	}

	// Warm pools are per project and within the warm_pool quota.
	if _, err := setQuotas(s, "team-a", store.Quotas{WarmPool: 2}); err != nil {
		t.Fatal(err)
	}
	pa := store.PoolRef{Project: "team-a", Template: "seed:latest"}
	if err := s.SetWarmPool(ctx, pa, 2); err != nil {
		t.Fatal(err)
	}
	wantKind(t, s.SetWarmPool(ctx, store.PoolRef{Project: "team-a", Template: "test:latest"}, 1), errdefs.ResourceExhausted)
	if err := s.SetWarmPool(ctx, store.PoolRef{Project: store.DefaultProject, Template: "seed:latest"}, 5); err != nil {
		t.Fatal(err)
	}
	if m, _ := s.WarmPools(ctx); m[pa] != 2 || len(m) != 2 {
		t.Fatalf("warm pools = %v", m)
	}

	// Template names belong to the project that built them first.
	if err := s.ClaimTemplate(ctx, "team-a", "mytpl", epoch); err != nil {
		t.Fatal(err)
	}
	if err := s.ClaimTemplate(ctx, "team-a", "mytpl", epoch); err != nil {
		t.Fatalf("claiming its own name again: %v", err)
	}
	wantKind(t, s.ClaimTemplate(ctx, store.DefaultProject, "mytpl", epoch), errdefs.Conflict)
	if owners, err := s.TemplateOwners(ctx); err != nil || owners["mytpl"] != "team-a" {
		t.Fatalf("owners = %v %v", owners, err)
	}

	// Tokens are listed per project; a project holding anything stays.
	if err := s.CreateToken(ctx, &store.Token{ID: ids.New(ids.Token), Name: "m", Hash: "hm", Project: "team-a", Role: store.RoleMember, CreatedAt: epoch}); err != nil {
		t.Fatal(err)
	}
	if l, _ := s.ListTokens(ctx, "team-a"); len(l) != 1 || l[0].Role != store.RoleMember {
		t.Fatalf("team-a tokens = %+v", l)
	}
	wantKind(t, s.DeleteProject(ctx, "team-a"), errdefs.FailedPrecondition)
	wantKind(t, s.DeleteProject(ctx, store.DefaultProject), errdefs.FailedPrecondition)
	if err := s.CreateProject(ctx, &store.Project{Name: "empty", CreatedAt: epoch}); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteProject(ctx, "empty"); err != nil {
		t.Fatal(err)
	}
	wantKind(t, s.DeleteProject(ctx, "empty"), errdefs.NotFound)
	if l, _ := s.ListProjects(ctx); len(l) != 2 {
		t.Fatalf("projects = %+v", l)
	}
}

// testAudit: entries are appended and read back in order, filtered.
func testAudit(t *testing.T, open Opener) {
	ctx := context.Background()
	s := open()
	defer s.Close()
	var entries []store.AuditEntry
	for i := range 5 {
		p := store.DefaultProject
		if i%2 == 1 {
			p = "other"
		}
		entries = append(entries, store.AuditEntry{At: epoch.Add(time.Duration(i) * time.Second), Project: p, TokenID: "tok_x",
			Action: "POST /v1/sandboxes/{id}:pause", Status: 202, Outcome: "ok"})
	}
	entries[4].Action = "DELETE /v1/sandboxes/{id}"
	if err := s.AppendAudit(ctx, entries); err != nil {
		t.Fatal(err)
	}
	page, err := s.ListAudit(ctx, store.AuditQuery{Project: store.DefaultProject, Limit: 2})
	if err != nil || len(page.Items) != 2 || page.Next == "" || !page.Items[1].At.Equal(epoch.Add(2*time.Second)) {
		t.Fatalf("first page = %+v %v", page, err)
	}
	page, err = s.ListAudit(ctx, store.AuditQuery{Project: store.DefaultProject, Cursor: page.Next})
	if err != nil || len(page.Items) != 1 || page.Items[0].Action != "DELETE /v1/sandboxes/{id}" {
		t.Fatalf("second page = %+v %v", page, err)
	}
	if page, _ := s.ListAudit(ctx, store.AuditQuery{Action: "DELETE"}); len(page.Items) != 1 {
		t.Fatalf("by action = %+v", page.Items)
	}
	if page, _ := s.ListAudit(ctx, store.AuditQuery{Action: "%"}); len(page.Items) != 0 {
		t.Fatalf("a %% in the filter matched %d entries", len(page.Items))
	}
	if page, _ := s.ListAudit(ctx, store.AuditQuery{Since: epoch.Add(3 * time.Second)}); len(page.Items) != 2 {
		t.Fatalf("since = %+v", page.Items)
	}
}

func begin(t *testing.T, s store.Store, op *sandbox.Operation, to sandbox.State) {
	t.Helper()
	if _, err := s.BeginOperation(context.Background(), op, func(sb *sandbox.Sandbox, op *sandbox.Operation) (*store.Completion, error) {
		sb.State, sb.ActiveOperation = to, op.ID
		return nil, nil
	}); err != nil {
		t.Fatal(err)
	}
}

func finish(t *testing.T, s store.Store, op *sandbox.Operation, to sandbox.State) {
	t.Helper()
	if err := s.FinishOperation(context.Background(), store.Finish{OperationID: op.ID, State: sandbox.OpSucceeded, SandboxState: to, At: epoch}); err != nil {
		t.Fatal(err)
	}
}

func setQuotas(s store.Store, name string, q store.Quotas) (*store.Project, error) {
	return s.UpdateProject(context.Background(), name, func(p *store.Project) error {
		p.Quotas, p.Limits = q, store.Quotas{}
		return nil
	})
}
