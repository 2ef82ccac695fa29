package auth_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/spacesandbox/space/internal/auth"
	"github.com/spacesandbox/space/internal/errdefs"
	"github.com/spacesandbox/space/internal/store"
	"github.com/spacesandbox/space/internal/store/sqlite"
)

func newTokens(t *testing.T) (*auth.Tokens, string) {
	dir := t.TempDir()
	st, err := sqlite.Open(context.Background(), filepath.Join(dir, "db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return auth.New(st, st), dir
}

func TestCreateVerifyRevoke(t *testing.T) {
	tk, _ := newTokens(t)
	ctx := context.Background()
	tok, value, err := tk.Create(ctx, "ci")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(value, auth.TokenPrefix) || tok.Hash == value || strings.Contains(tok.Hash, value) {
		t.Fatalf("token %q stored as %q", value, tok.Hash)
	}
	got, err := tk.Verify(ctx, value)
	if err != nil || got.ID != tok.ID {
		t.Fatalf("verify = %+v %v", got, err)
	}
	for _, bad := range []string{"", value + "x", value[:len(value)-1], "Bearer " + value, strings.ToUpper(value)} {
		if _, err := tk.Verify(ctx, bad); !errors.Is(err, errdefs.Unauthenticated) {
			t.Errorf("verify(%q) = %v", bad, err)
		}
	}
	if err := tk.Revoke(ctx, tok.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := tk.Verify(ctx, value); !errors.Is(err, errdefs.Unauthenticated) {
		t.Fatalf("revoked token verified: %v", err)
	}
	if err := tk.Revoke(ctx, "tok_nope"); !errors.Is(err, errdefs.InvalidArgument) {
		t.Fatalf("revoke malformed = %v", err)
	}
	if _, _, err := tk.Create(ctx, " "); !errors.Is(err, errdefs.InvalidArgument) {
		t.Fatalf("empty name = %v", err)
	}
}

// A token in E2B's key format verifies and revokes like any other.
func TestE2BKeys(t *testing.T) {
	tk, _ := newTokens(t)
	ctx := context.Background()
	tok, value, err := tk.CreateE2BKey(ctx, "sdk")
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`^e2b_[0-9a-f]{40}$`).MatchString(value) {
		t.Fatalf("E2B key %q", value)
	}
	if got, err := tk.Verify(ctx, value); err != nil || got.ID != tok.ID {
		t.Fatalf("verify = %+v %v", got, err)
	}
	if _, err := tk.Verify(ctx, "e2b_"+strings.Repeat("0", 40)); !errors.Is(err, errdefs.Unauthenticated) {
		t.Fatalf("unknown E2B key: %v", err)
	}
	tk.Revoke(ctx, tok.ID)
	if _, err := tk.Verify(ctx, value); !errors.Is(err, errdefs.Unauthenticated) {
		t.Fatalf("revoked E2B key verified: %v", err)
	}
}

func TestBootstrapWritesTokenOnce(t *testing.T) {
	tk, dir := newTokens(t)
	ctx := context.Background()
	path, err := tk.Bootstrap(ctx, dir)
	if err != nil || path != filepath.Join(dir, auth.TokenFile) {
		t.Fatalf("bootstrap = %q %v", path, err)
	}
	fi, err := os.Stat(path)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("token file mode = %v %v", fi.Mode(), err)
	}
	b, _ := os.ReadFile(path)
	if _, err := tk.Verify(ctx, strings.TrimSpace(string(b))); err != nil {
		t.Fatalf("bootstrapped token does not verify: %v", err)
	}
	again, err := tk.Bootstrap(ctx, dir)
	if err != nil || again != "" {
		t.Fatalf("second bootstrap = %q %v", again, err)
	}
	b2, _ := os.ReadFile(path)
	if string(b2) != string(b) {
		t.Fatal("second bootstrap rewrote the token file")
	}
}

func TestBearerToken(t *testing.T) {
	for in, want := range map[string]string{"Bearer abc": "abc", "bearer  abc ": "abc", "Basic abc": "", "Bearer": "", "Bearer ": "", "": ""} {
		got, ok := auth.BearerToken(in)
		if got != want || ok != (want != "") {
			t.Errorf("BearerToken(%q) = %q %v", in, got, ok)
		}
	}
}

// A token belongs to an existing project with a role; one with a lifetime
// stops working when it ends, and so do the credentials it issued.
func TestTokenSpecAndExpiry(t *testing.T) {
	tk, _ := newTokens(t)
	ctx := context.Background()
	for _, bad := range []auth.Spec{
		{Name: "x", Role: "root"},
		{Name: "x", Role: store.RoleMember, Project: "Nope!"},
		{Name: "x", Role: store.RoleMember, Project: "missing"},
		{Name: "x", Role: store.RoleMember, TTL: -time.Second},
		{Name: "x", Role: store.RoleMember, Burst: 5},
	} {
		if _, _, err := tk.CreateSpec(ctx, bad); err == nil {
			t.Errorf("CreateSpec(%+v) made a token", bad)
		}
	}
	tok, value, err := tk.CreateSpec(ctx, auth.Spec{Name: "short", Role: store.RoleReadOnly, TTL: 150 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if got, err := tk.Verify(ctx, value); err != nil || got.Role != store.RoleReadOnly || got.Project != store.DefaultProject || got.ExpiresAt == nil {
		t.Fatalf("verify = %+v %v", got, err)
	}
	if _, err := tk.Active(ctx, tok.ID); err != nil {
		t.Fatalf("active before expiry: %v", err)
	}
	time.Sleep(200 * time.Millisecond)
	if _, err := tk.Verify(ctx, value); !errors.Is(err, errdefs.Unauthenticated) {
		t.Fatalf("expired token verified (cached or not): %v", err)
	}
	if _, err := tk.Active(ctx, tok.ID); !errors.Is(err, errdefs.Unauthenticated) {
		t.Fatalf("expired token active: %v", err)
	}
}

func TestLimiter(t *testing.T) {
	l := auth.NewLimiter()
	tok := store.Token{ID: "tok_a", RatePerSec: 2, Burst: 3}
	for i := range 3 {
		if _, err := l.Allow(tok); err != nil {
			t.Fatalf("request %d of the burst refused: %v", i, err)
		}
	}
	wait, err := l.Allow(tok)
	if !errors.Is(err, errdefs.ResourceExhausted) || wait != time.Second {
		t.Fatalf("past the burst = %v %v, want a 1 s retry", wait, err)
	}
	if _, err := l.Allow(store.Token{ID: "tok_b", RatePerSec: 2, Burst: 3}); err != nil {
		t.Fatalf("another token shares the bucket: %v", err)
	}
	if _, err := l.Allow(store.Token{ID: "tok_c"}); err != nil {
		t.Fatalf("an unlimited token refused: %v", err)
	}
	time.Sleep(600 * time.Millisecond)
	if _, err := l.Allow(tok); err != nil {
		t.Fatalf("refill did not give a request back: %v", err)
	}
}
