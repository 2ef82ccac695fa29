package storetest

// The cases of store.Tokens.

import (
	"context"
	"testing"
	"time"

	"github.com/spacesandbox/space/internal/errdefs"
	"github.com/spacesandbox/space/internal/ids"
	"github.com/spacesandbox/space/internal/store"
)

func testTokens(t *testing.T, open Opener) {
	s := open()
	defer s.Close()
	ctx := context.Background()
	tok := &store.Token{ID: ids.New(ids.Token), Name: "admin", Hash: "h1", CreatedAt: epoch}
	if err := s.CreateToken(ctx, tok); err != nil {
		t.Fatal(err)
	}
	wantKind(t, s.CreateToken(ctx, &store.Token{ID: ids.New(ids.Token), Name: "dup", Hash: "h1", CreatedAt: epoch}), errdefs.Conflict)
	got, err := s.TokenByHash(ctx, "h1")
	if err != nil || got.ID != tok.ID || got.Name != "admin" || got.RevokedAt != nil {
		t.Fatalf("by hash = %+v %v", got, err)
	}
	_, err = s.TokenByHash(ctx, "nope")
	wantKind(t, err, errdefs.NotFound)
	if err := s.RevokeToken(ctx, tok.ID, epoch.Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	if err := s.RevokeToken(ctx, tok.ID, epoch.Add(time.Hour)); err != nil { // idempotent; keeps the first time
		t.Fatal(err)
	}
	got, _ = s.TokenByHash(ctx, "h1")
	if got.RevokedAt == nil || !got.RevokedAt.Equal(epoch.Add(time.Minute)) {
		t.Fatalf("revoked_at = %v", got.RevokedAt)
	}
	wantKind(t, s.RevokeToken(ctx, ids.New(ids.Token), epoch), errdefs.NotFound)
	if byID, err := s.TokenByID(ctx, tok.ID); err != nil || byID.Hash != "h1" || byID.RevokedAt == nil {
		t.Fatalf("by id = %+v %v", byID, err)
	}
	_, err = s.TokenByID(ctx, ids.New(ids.Token))
	wantKind(t, err, errdefs.NotFound)
	list, err := s.ListTokens(ctx, "")
	if err != nil || len(list) != 1 || list[0].Project != store.DefaultProject || list[0].Role != store.RoleOwner {
		t.Fatalf("list = %+v %v", list, err)
	}
}
