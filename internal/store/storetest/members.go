package storetest

import (
	"context"
	"testing"
	"time"

	"github.com/spacesandbox/space/internal/errdefs"
	"github.com/spacesandbox/space/internal/sandbox"
	"github.com/spacesandbox/space/internal/store"
)

func testMembers(t *testing.T, open Opener) {
	s := open()
	ctx := context.Background()
	node := &store.Member{ID: "node_a", Role: store.RoleNode, Name: "a", BootID: "boot-1", URL: "http://127.0.0.1:1",
		Capacity: store.Capacity{VCPUs: 8, MemoryMiB: 16384, MaxSandboxes: 10, Runtimes: []string{"gvisor"}},
		Labels:   map[string]string{"pool": "x"}, StartedAt: epoch, HeartbeatAt: epoch}
	got, err := s.JoinMember(ctx, node)
	if err != nil || got.State != store.MemberReady {
		t.Fatalf("join = %+v, %v", got, err)
	}
	ctl := &store.Member{ID: "boot-c", Role: store.RoleControl, BootID: "boot-c", StartedAt: epoch, HeartbeatAt: epoch}
	if _, err := s.JoinMember(ctx, ctl); err != nil {
		t.Fatal(err)
	}
	nodes, err := s.ListMembers(ctx, store.RoleNode)
	if err != nil || len(nodes) != 1 || nodes[0].Capacity.VCPUs != 8 || nodes[0].Labels["pool"] != "x" {
		t.Fatalf("list nodes = %+v, %v", nodes, err)
	}
	if all, _ := s.ListMembers(ctx, ""); len(all) != 2 {
		t.Fatalf("list all = %d members", len(all))
	}

	// Heartbeats from the process that joined; another boot id is refused.
	if m, err := s.HeartbeatMember(ctx, "node_a", "boot-1", epoch.Add(time.Second)); err != nil || !m.HeartbeatAt.Equal(epoch.Add(time.Second)) {
		t.Fatalf("heartbeat = %+v, %v", m, err)
	}
	_, err = s.HeartbeatMember(ctx, "node_a", "boot-other", epoch.Add(time.Second))
	wantKind(t, err, errdefs.Conflict)
	_, err = s.HeartbeatMember(ctx, "node_none", "boot-1", epoch)
	wantKind(t, err, errdefs.NotFound)

	// A cordon outlives a restart; a lost node that joins again is ready.
	if m, err := s.SetMemberState(ctx, "node_a", store.MemberCordoned); err != nil || m.State != store.MemberCordoned {
		t.Fatalf("cordon = %+v, %v", m, err)
	}
	node.BootID, node.HeartbeatAt = "boot-2", epoch.Add(time.Second)
	if got, err := s.JoinMember(ctx, node); err != nil || got.State != store.MemberCordoned || got.BootID != "boot-2" {
		t.Fatalf("rejoin of a cordoned node = %+v, %v", got, err)
	}
	s.SetMemberState(ctx, "node_a", store.MemberReady)

	// Only members silent since before the cut-off are lost, once.
	lost, err := s.MarkLostMembers(ctx, epoch.Add(500*time.Millisecond))
	if err != nil || len(lost) != 1 || lost[0].ID != "boot-c" || lost[0].State != store.MemberLost {
		t.Fatalf("mark lost = %+v, %v", lost, err)
	}
	if lost, _ := s.MarkLostMembers(ctx, epoch.Add(500*time.Millisecond)); len(lost) != 0 {
		t.Fatalf("marked lost twice: %+v", lost)
	}
	node.HeartbeatAt = epoch.Add(time.Minute)
	s.MarkLostMembers(ctx, epoch.Add(2*time.Second))
	if m, _ := s.GetMember(ctx, "node_a"); m.State != store.MemberLost {
		t.Fatalf("silent node is %s", m.State)
	}
	if got, err := s.JoinMember(ctx, node); err != nil || got.State != store.MemberReady {
		t.Fatalf("rejoin of a lost node = %+v, %v", got, err)
	}

	// A control replica leaves; a node cannot be removed that way.
	if err := s.LeaveMember(ctx, "boot-c", "boot-c"); err != nil {
		t.Fatal(err)
	}
	_, err = s.GetMember(ctx, "boot-c")
	wantKind(t, err, errdefs.NotFound)
	s.LeaveMember(ctx, "node_a", "boot-2")
	if _, err := s.GetMember(ctx, "node_a"); err != nil {
		t.Fatalf("a node left the records: %v", err)
	}
	// One id, one role.
	_, err = s.JoinMember(ctx, &store.Member{ID: "node_a", Role: store.RoleControl, BootID: "x"})
	wantKind(t, err, errdefs.Conflict)
}

func testSandboxesByNode(t *testing.T, open Opener) {
	s := open()
	ctx := context.Background()
	on := func(node string, state sandbox.State) *sandbox.Sandbox {
		sb, op := newSandbox(state)
		sb.Node = node
		if err := s.CreateSandbox(ctx, sb, op, nil, 2); err != nil {
			t.Fatalf("create on %q: %v", node, err)
		}
		return sb
	}
	a1, _ := on("node_a", sandbox.Starting), on("node_a", sandbox.Starting)
	b1 := on("node_b", sandbox.Starting)
	on("", sandbox.Starting)
	// The active limit counts the sandbox's own node only.
	extra, op := newSandbox(sandbox.Starting)
	extra.Node = "node_a"
	wantKind(t, s.CreateSandbox(ctx, extra, op, nil, 2), errdefs.ResourceExhausted)
	on("node_b", sandbox.Starting)

	a := "node_a"
	page, err := s.ListSandboxes(ctx, store.SandboxQuery{Node: &a, IncludePool: true})
	if err != nil || len(page.Items) != 2 || page.Items[0].ID != a1.ID || page.Items[0].Node != "node_a" {
		t.Fatalf("list on node_a = %+v, %v", page.Items, err)
	}
	ops, err := s.UnfinishedOperations(ctx, "node_b")
	if err != nil || len(ops) != 2 || ops[0].SandboxID != b1.ID {
		t.Fatalf("unfinished on node_b = %+v, %v", ops, err)
	}
	if ops, _ := s.UnfinishedOperations(ctx, ""); len(ops) != 1 {
		t.Fatalf("unfinished on the single machine = %d, want 1", len(ops))
	}
	// Moving a sandbox moves it between the lists.
	if _, err := s.UpdateSandbox(ctx, b1.ID, func(sb *sandbox.Sandbox) error { sb.Node = "node_a"; return nil }); err != nil {
		t.Fatal(err)
	}
	if ops, _ := s.UnfinishedOperations(ctx, "node_a"); len(ops) != 3 {
		t.Fatalf("after the move node_a has %d unfinished operations, want 3", len(ops))
	}
	loads, err := s.NodeLoads(ctx)
	if err != nil || loads["node_a"] != (store.NodeLoad{Sandboxes: 3, VCPUs: 3, MemoryMiB: 3 * 512}) || loads["node_b"].Sandboxes != 1 {
		t.Fatalf("loads = %+v, %v", loads, err)
	}
}

func testIdempotencyTakeOver(t *testing.T, open Opener) {
	s := open()
	ctx := context.Background()
	s.ReserveIdempotencyKey(ctx, store.IdempotencyRecord{Key: "k", Fingerprint: "f", Owner: "dead", CreatedAt: epoch, ExpiresAt: epoch.Add(time.Hour)})
	if ok, err := s.TakeOverIdempotencyKey(ctx, "k", "someone", "me"); err != nil || ok {
		t.Fatalf("take over from the wrong owner = %v, %v", ok, err)
	}
	if ok, err := s.TakeOverIdempotencyKey(ctx, "k", "dead", "me"); err != nil || !ok {
		t.Fatalf("take over = %v, %v", ok, err)
	}
	if rec, _ := s.GetIdempotencyKey(ctx, "k"); rec.Owner != "me" {
		t.Fatalf("owner = %s", rec.Owner)
	}
	if ok, _ := s.TakeOverIdempotencyKey(ctx, "k", "dead", "other"); ok {
		t.Fatal("a key was taken over twice")
	}
	// Prune keeps the reservations of every live owner.
	s.ReserveIdempotencyKey(ctx, store.IdempotencyRecord{Key: "k2", Fingerprint: "f", Owner: "you", CreatedAt: epoch, ExpiresAt: epoch.Add(time.Hour)})
	s.ReserveIdempotencyKey(ctx, store.IdempotencyRecord{Key: "k3", Fingerprint: "f", Owner: "gone", CreatedAt: epoch, ExpiresAt: epoch.Add(time.Hour)})
	if n, err := s.PruneIdempotencyKeys(ctx, epoch, "me", "you"); err != nil || n != 1 {
		t.Fatalf("prune = %d, %v", n, err)
	}
}
