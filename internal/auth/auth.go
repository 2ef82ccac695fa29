// Package auth issues and checks API tokens. A token's value is shown once
// when it is made; only its SHA-256 hash is stored, and a presented token is
// checked by hashing it and comparing hashes in constant time.
package auth

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base32"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/spacesandbox/space/internal/errdefs"
	"github.com/spacesandbox/space/internal/ids"
	"github.com/spacesandbox/space/internal/store"
)

// TokenPrefix marks SPACE API tokens (so secret scanners can find leaks).
const TokenPrefix = "space_"

var tokenEncoding = base32.NewEncoding("abcdefghijklmnopqrstuvwxyz234567").WithPadding(base32.NoPadding)

// Hash returns the stored form of a token value.
func Hash(value string) string {
	sum := sha256.Sum256([]byte(value))
	return hex.EncodeToString(sum[:])
}

// Tokens manages API tokens in a store.
type Tokens struct {
	store store.Tokens
	now   func() time.Time
	// cacheTTL bounds how long a positive check is trusted without reading
	// the store again (so a revoke takes effect within it).
	cacheTTL time.Duration

	mu     sync.Mutex // guards cache, active
	cache  map[string]cached
	active cachedIDs
}

type cachedIDs struct {
	ids   []string
	until time.Time
}

type cached struct {
	tok   store.Token
	until time.Time
}

// New returns a token manager over s.
func New(s store.Tokens) *Tokens {
	return &Tokens{store: s, now: func() time.Time { return time.Now().UTC() }, cacheTTL: time.Second, cache: map[string]cached{}}
}

// E2BKeyPrefix marks tokens made in E2B's API key format ("e2b_" and 40 hex
// digits), for E2B SDKs and tools that check a key's shape.
const E2BKeyPrefix = "e2b_"

// Create makes a token, stores its hash and returns its value, which is
// never retrievable again.
func (t *Tokens) Create(ctx context.Context, name string) (store.Token, string, error) {
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		return store.Token{}, "", fmt.Errorf("generate token: %w", err)
	}
	return t.create(ctx, name, TokenPrefix+tokenEncoding.EncodeToString(b[:]))
}

// CreateE2BKey makes a token shaped like an E2B API key (160 random bits); it
// works everywhere a token does.
func (t *Tokens) CreateE2BKey(ctx context.Context, name string) (store.Token, string, error) {
	var b [20]byte
	if _, err := rand.Read(b[:]); err != nil {
		return store.Token{}, "", fmt.Errorf("generate token: %w", err)
	}
	return t.create(ctx, name, E2BKeyPrefix+hex.EncodeToString(b[:]))
}

func (t *Tokens) create(ctx context.Context, name, value string) (store.Token, string, error) {
	name = strings.TrimSpace(name)
	if name == "" || len(name) > 64 {
		return store.Token{}, "", errdefs.New(errdefs.InvalidArgument, "token name must be 1 to 64 characters")
	}
	tok := store.Token{ID: ids.New(ids.Token), Name: name, Hash: Hash(value), CreatedAt: t.now()}
	if err := t.store.CreateToken(ctx, &tok); err != nil {
		return store.Token{}, "", fmt.Errorf("store token: %w", err)
	}
	return tok, value, nil
}

// Verify checks a presented token value and returns its record.
// Every failure is errdefs.Unauthenticated with the same message.
func (t *Tokens) Verify(ctx context.Context, value string) (store.Token, error) {
	denied := errdefs.New(errdefs.Unauthenticated, "missing or invalid API token")
	if !(strings.HasPrefix(value, TokenPrefix) || strings.HasPrefix(value, E2BKeyPrefix)) || len(value) > 256 {
		return store.Token{}, denied
	}
	h := Hash(value)
	now := t.now()
	t.mu.Lock()
	c, ok := t.cache[h]
	t.mu.Unlock()
	if ok && now.Before(c.until) && subtle.ConstantTimeCompare([]byte(c.tok.Hash), []byte(h)) == 1 {
		return c.tok, nil
	}
	tok, err := t.store.TokenByHash(ctx, h)
	if errors.Is(err, errdefs.NotFound) {
		return store.Token{}, denied
	}
	if err != nil {
		return store.Token{}, fmt.Errorf("look up token: %w", err)
	}
	// The lookup is by hash; compare again in constant time so the check
	// never depends on how the store compares strings.
	if subtle.ConstantTimeCompare([]byte(tok.Hash), []byte(h)) != 1 || tok.RevokedAt != nil {
		return store.Token{}, denied
	}
	t.mu.Lock()
	if len(t.cache) > 10000 {
		clear(t.cache)
	}
	t.cache[h] = cached{tok: *tok, until: now.Add(t.cacheTTL)}
	t.mu.Unlock()
	return *tok, nil
}

// List returns every token (hashes only).
func (t *Tokens) List(ctx context.Context) ([]store.Token, error) { return t.store.ListTokens(ctx) }

// Revoke revokes a token by id; it stops working within the cache TTL.
func (t *Tokens) Revoke(ctx context.Context, id string) error {
	if !ids.Valid(ids.Token, id) {
		return errdefs.New(errdefs.InvalidArgument, "malformed token id %q", id)
	}
	if err := t.store.RevokeToken(ctx, id, t.now()); err != nil {
		return err
	}
	t.mu.Lock()
	clear(t.cache)
	t.active = cachedIDs{}
	t.mu.Unlock()
	return nil
}

// Active checks that the API token with id exists and is not revoked:
// credentials it issued (attachment and sandbox access tokens) carry its id
// and stop working within the cache TTL of its revocation.
func (t *Tokens) Active(ctx context.Context, id string) error {
	revoked := errdefs.New(errdefs.Unauthenticated, "the API token that issued this credential was revoked")
	if !ids.Valid(ids.Token, id) {
		return revoked
	}
	key, now := "id\x00"+id, t.now()
	t.mu.Lock()
	c, ok := t.cache[key]
	t.mu.Unlock()
	if ok && now.Before(c.until) {
		return nil
	}
	tok, err := t.store.TokenByID(ctx, id)
	if errors.Is(err, errdefs.NotFound) {
		return revoked
	}
	if err != nil {
		return fmt.Errorf("look up token: %w", err)
	}
	if tok.RevokedAt != nil {
		return revoked
	}
	t.mu.Lock()
	if len(t.cache) > 10000 {
		clear(t.cache)
	}
	t.cache[key] = cached{tok: *tok, until: now.Add(t.cacheTTL)}
	t.mu.Unlock()
	return nil
}

type tokenIDKey struct{}

// ActiveIDs lists the ids of the tokens not revoked, read from the store
// at most once per cacheTTL (so a revoke takes effect within it) unless
// fresh asks to read it now (a token made by another process since).
func (t *Tokens) ActiveIDs(ctx context.Context, fresh bool) ([]string, error) {
	now := t.now()
	t.mu.Lock()
	a := t.active
	t.mu.Unlock()
	if !fresh && now.Before(a.until) {
		return a.ids, nil
	}
	all, err := t.store.ListTokens(ctx)
	if err != nil {
		return nil, fmt.Errorf("list tokens: %w", err)
	}
	ids := make([]string, 0, len(all))
	for _, tok := range all {
		if tok.RevokedAt == nil {
			ids = append(ids, tok.ID)
		}
	}
	t.mu.Lock()
	t.active = cachedIDs{ids: ids, until: now.Add(t.cacheTTL)}
	t.mu.Unlock()
	return ids, nil
}

// WithTokenID records the id of the API token a request authenticated with.
func WithTokenID(ctx context.Context, id string) context.Context {
	return context.WithValue(ctx, tokenIDKey{}, id)
}

// TokenID is the id of the API token the request authenticated with ("" for
// none).
func TokenID(ctx context.Context) string {
	id, _ := ctx.Value(tokenIDKey{}).(string)
	return id
}

// BearerToken extracts the token of an "Authorization: Bearer" header.
func BearerToken(header string) (string, bool) {
	scheme, value, ok := strings.Cut(header, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	value = strings.TrimSpace(value)
	return value, value != ""
}
