package storetest

// The cases of store.Pools.

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/spacesandbox/space/internal/errdefs"
	"github.com/spacesandbox/space/internal/ids"
	"github.com/spacesandbox/space/internal/sandbox"
	"github.com/spacesandbox/space/internal/store"
)

func testWarmPoolClaims(t *testing.T, open Opener) {
	s := open()
	defer s.Close()
	ctx := context.Background()
	var pooled []string
	for i := 0; i < 3; i++ {
		sb, op := newSandbox(sandbox.Running)
		sb.Pool, sb.ActiveOperation = "k", ""
		if err := s.CreateSandbox(ctx, sb, op, nil, 0); err != nil {
			t.Fatal(err)
		}
		pooled = append(pooled, sb.ID)
	}
	if l := listAll(t, s, store.SandboxQuery{}); len(l) != 0 {
		t.Fatalf("pool sandboxes listed: %v", l)
	}
	if keys, err := s.PoolKeys(ctx); err != nil || len(keys) != 1 || keys[0] != "k" {
		t.Fatalf("pool keys = %v %v", keys, err)
	}
	if c, err := s.CountSandboxes(ctx); err != nil || len(c) != 1 || c[0] != (store.SandboxCount{State: sandbox.Running, Pooled: true, Count: 3}) {
		t.Fatalf("counts = %+v %v", c, err)
	}
	if l := listAll(t, s, store.SandboxQuery{IncludePool: true, State: sandbox.Running}); len(l) != 3 {
		t.Fatalf("IncludePool lists %d", len(l))
	}
	var mu sync.Mutex
	claimed := map[string]bool{}
	var wg sync.WaitGroup
	for i := 0; i < 10; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sb, _, err := s.ClaimPoolSandbox(ctx, "k", func(sb *sandbox.Sandbox) (*sandbox.Operation, *store.Completion, error) {
				sb.Metadata = map[string]string{"claimed": "yes"}
				return &sandbox.Operation{ID: ids.New(ids.Operation), Kind: sandbox.OpCreate, SandboxID: sb.ID, State: sandbox.OpSucceeded, CreatedAt: epoch, UpdatedAt: epoch}, nil, nil
			})
			if err != nil {
				if !errors.Is(err, errdefs.NotFound) {
					t.Error(err)
				}
				return
			}
			mu.Lock()
			if claimed[sb.ID] {
				t.Errorf("%s claimed twice", sb.ID)
			}
			claimed[sb.ID] = true
			mu.Unlock()
		}()
	}
	wg.Wait()
	if len(claimed) != 3 {
		t.Fatalf("%d claimed, want 3", len(claimed))
	}
	if l := listAll(t, s, store.SandboxQuery{}); len(l) != 3 {
		t.Fatalf("claimed sandboxes not listed: %v", l)
	}
	if left, _ := s.PoolSandboxes(ctx, "k"); len(left) != 0 {
		t.Fatalf("pool still holds %d", len(left))
	}
	if keys, err := s.PoolKeys(ctx); err != nil || len(keys) != 0 {
		t.Fatalf("pool keys of an empty pool = %v %v", keys, err)
	}
	seed, test := store.PoolRef{Project: store.DefaultProject, Template: "seed:latest"}, store.PoolRef{Project: store.DefaultProject, Template: "test:latest"}
	if err := s.SetWarmPool(ctx, seed, 4); err != nil {
		t.Fatal(err)
	}
	s.SetWarmPool(ctx, seed, 5)
	s.SetWarmPool(ctx, test, 1)
	s.SetWarmPool(ctx, test, 0)
	if m, _ := s.WarmPools(ctx); len(m) != 2 || m[seed] != 5 || m[test] != 0 {
		t.Fatalf("warm pools = %v", m)
	}
}
