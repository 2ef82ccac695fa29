// Package storetest is the conformance suite every store.Store implementation
// must pass. An implementation's test calls Run with a function that opens a
// fresh, empty database and returns a way to reopen that same database.
package storetest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/spacesandbox/space/internal/errdefs"
	"github.com/spacesandbox/space/internal/ids"
	"github.com/spacesandbox/space/internal/sandbox"
	"github.com/spacesandbox/space/internal/store"
)

// Opener opens the database under test; each call opens the same database.
type Opener func() store.Store

// Factory makes a new empty database for one test.
type Factory func(t *testing.T) Opener

// Run runs the conformance suite.
func Run(t *testing.T, newDB Factory) {
	tests := []struct {
		name string
		fn   func(*testing.T, Opener)
	}{
		{"SandboxRoundTrip", testSandboxRoundTrip},
		{"SandboxReadsAreTheirOwn", testSandboxReadsAreTheirOwn},
		{"DuplicateIDs", testDuplicateIDs},
		{"ListPagination", testListPagination},
		{"ListUnderConcurrentInserts", testListUnderConcurrentInserts},
		{"ListFilters", testListFilters},
		{"BadCursorAndLimit", testBadCursorAndLimit},
		{"BeginOperationAtomic", testBeginOperationAtomic},
		{"ForkAtomic", testForkAtomic},
		{"Snapshots", testSnapshots},
		{"FinishOperation", testFinishOperation},
		{"UnfinishedOperations", testUnfinishedOperations},
		{"Idempotency", testIdempotency},
		{"IdempotencyAtomicWithChange", testIdempotencyAtomicWithChange},
		{"IdempotencyReservedInMemory", testIdempotencyReservedInMemory},
		{"Tokens", testTokens},
		{"ActiveSandboxLimit", testActiveLimit},
		{"OperationWithoutSandbox", testOperationWithoutSandbox},
		{"WarmPoolClaims", testWarmPoolClaims},
		{"SurvivesReopen", testSurvivesReopen},
		{"Ping", testPing},
		{"TemplatesInUse", testTemplatesInUse},
		{"Members", testMembers},
		{"SandboxesByNode", testSandboxesByNode},
		{"IdempotencyTakeOver", testIdempotencyTakeOver},
		{"Projects", testProjects},
		{"Audit", testAudit},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			open := newDB(t)
			tc.fn(t, open)
		})
	}
}

var epoch = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

func newSandbox(state sandbox.State) (*sandbox.Sandbox, *sandbox.Operation) {
	sb := &sandbox.Sandbox{
		ID: ids.New(ids.Sandbox), State: state,
		Template:  sandbox.TemplateRef{Ref: "seed:latest", Digest: "sha256:abc"},
		Runtime:   "fake",
		Resources: sandbox.Resources{VCPUs: 1, MemoryMiB: 512, DiskMiB: 2048},
		Env:       map[string]string{"A": "b"}, Metadata: map[string]string{"k": "v"},
		CreatedAt: epoch, UpdatedAt: epoch, LastActiveAt: epoch,
	}
	op := &sandbox.Operation{ID: ids.New(ids.Operation), Kind: sandbox.OpCreate, SandboxID: sb.ID, State: sandbox.OpPending, CreatedAt: epoch, UpdatedAt: epoch}
	sb.ActiveOperation = op.ID
	return sb, op
}

func mustCreate(t *testing.T, s store.Store, state sandbox.State) (*sandbox.Sandbox, *sandbox.Operation) {
	t.Helper()
	sb, op := newSandbox(state)
	if err := s.CreateSandbox(context.Background(), sb, op, nil, 0); err != nil {
		t.Fatalf("CreateSandbox: %v", err)
	}
	return sb, op
}

func wantKind(t *testing.T, err error, k *errdefs.Kind) {
	t.Helper()
	if !errors.Is(err, k) {
		t.Fatalf("error = %v, want kind %s", err, k.Code)
	}
}

func testSurvivesReopen(t *testing.T, open Opener) {
	s := open()
	ctx := context.Background()
	sb, op := mustCreate(t, s, sandbox.Starting)
	s.ReserveIdempotencyKey(ctx, store.IdempotencyRecord{Key: "k", Fingerprint: "f", Owner: "o", CreatedAt: epoch, ExpiresAt: epoch.Add(time.Hour)})
	s.CompleteIdempotencyKey(ctx, store.Completion{Key: "k", Status: 201, Body: func() ([]byte, error) { return []byte("b"), nil }})
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = open()
	defer s.Close()
	if _, err := s.GetSandbox(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := s.GetOperation(ctx, op.ID); err != nil {
		t.Fatal(err)
	}
	rec, err := s.GetIdempotencyKey(ctx, "k")
	if err != nil || rec.Status != 201 || string(rec.Body) != "b" {
		t.Fatalf("idempotency record after reopen = %+v %v", rec, err)
	}
}

func testPing(t *testing.T, open Opener) {
	s := open()
	if err := s.Ping(context.Background()); err != nil {
		t.Fatalf("ping an open store: %v", err)
	}
	s.Close()
	if err := s.Ping(context.Background()); err == nil {
		t.Fatal("ping a closed store: want an error")
	}
}
