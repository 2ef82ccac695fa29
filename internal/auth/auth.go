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
	store    store.Tokens
	projects Projects
	now      func() time.Time
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

// Projects is what tokens need to know of projects: that one exists.
type Projects interface {
	GetProject(ctx context.Context, name string) (*store.Project, error)
}

// New returns a token manager over s, whose tokens belong to projects p.
func New(s store.Tokens, p Projects) *Tokens {
	return &Tokens{store: s, projects: p, now: func() time.Time { return time.Now().UTC() }, cacheTTL: time.Second, cache: map[string]cached{}}
}

// E2BKeyPrefix marks tokens made in E2B's API key format ("e2b_" and 40 hex
// digits), for E2B SDKs and tools that check a key's shape.
const E2BKeyPrefix = "e2b_"

// Spec is what a new token is: its name, project and role, and optionally
// when it expires and how fast it may call.
type Spec struct {
	Name    string
	Project string // "": the default project
	Role    store.Role
	// TTL, when positive, makes the token expire that long after it is made.
	TTL        time.Duration
	RatePerSec float64
	Burst      int
	// E2BFormat shapes the value like an E2B API key ("e2b_" and 40 hex
	// digits, 160 random bits), for E2B SDKs and tools that check a key's
	// shape; it works everywhere a token does.
	E2BFormat bool
}

// MaxTTL bounds a token's lifetime when one is given.
const MaxTTL = 10 * 366 * 24 * time.Hour

// Create makes an owner token of the default project (the first token of a
// server, and the CLI's default), stores its hash and returns its value,
// which is never retrievable again.
func (t *Tokens) Create(ctx context.Context, name string) (store.Token, string, error) {
	return t.CreateSpec(ctx, Spec{Name: name, Role: store.RoleOwner})
}

// CreateE2BKey is Create with a value shaped like an E2B API key.
func (t *Tokens) CreateE2BKey(ctx context.Context, name string) (store.Token, string, error) {
	return t.CreateSpec(ctx, Spec{Name: name, Role: store.RoleOwner, E2BFormat: true})
}

// CreateSpec makes a token as spec says. The project must exist.
func (t *Tokens) CreateSpec(ctx context.Context, spec Spec) (store.Token, string, error) {
	var value string
	if spec.E2BFormat {
		var b [20]byte
		if _, err := rand.Read(b[:]); err != nil {
			return store.Token{}, "", fmt.Errorf("generate token: %w", err)
		}
		value = E2BKeyPrefix + hex.EncodeToString(b[:])
	} else {
		var b [32]byte
		if _, err := rand.Read(b[:]); err != nil {
			return store.Token{}, "", fmt.Errorf("generate token: %w", err)
		}
		value = TokenPrefix + tokenEncoding.EncodeToString(b[:])
	}
	return t.create(ctx, spec, value)
}

func (t *Tokens) create(ctx context.Context, spec Spec, value string) (store.Token, string, error) {
	name := strings.TrimSpace(spec.Name)
	if name == "" || len(name) > 64 {
		return store.Token{}, "", errdefs.New(errdefs.InvalidArgument, "token name must be 1 to 64 characters")
	}
	if spec.Project == "" {
		spec.Project = store.DefaultProject
	}
	if err := store.ValidProject(spec.Project); err != nil {
		return store.Token{}, "", err
	}
	if spec.Role.Rank() == 0 {
		return store.Token{}, "", errdefs.New(errdefs.InvalidArgument, "role must be owner, admin, member or read-only, not %q", spec.Role)
	}
	if spec.TTL < 0 || spec.TTL > MaxTTL {
		return store.Token{}, "", errdefs.New(errdefs.InvalidArgument, "a token's lifetime must be positive and at most %d days", int(MaxTTL.Hours()/24))
	}
	if spec.RatePerSec < 0 || spec.RatePerSec > 1e6 || spec.Burst < 0 || spec.Burst > 1e6 || (spec.Burst > 0 && spec.RatePerSec == 0) {
		return store.Token{}, "", errdefs.New(errdefs.InvalidArgument, "rate must be 0 (no limit) to 1000000 requests/s and burst 0 to 1000000, with a rate")
	}
	if _, err := t.projects.GetProject(ctx, spec.Project); err != nil {
		return store.Token{}, "", err
	}
	now := t.now()
	tok := store.Token{ID: ids.New(ids.Token), Name: name, Hash: Hash(value), Project: spec.Project, Role: spec.Role, CreatedAt: now,
		RatePerSec: spec.RatePerSec, Burst: spec.Burst}
	if spec.RatePerSec > 0 && tok.Burst == 0 {
		tok.Burst = max(1, int(2*spec.RatePerSec))
	}
	if spec.TTL > 0 {
		e := now.Add(spec.TTL)
		tok.ExpiresAt = &e
	}
	if err := t.store.CreateToken(ctx, &tok); err != nil {
		return store.Token{}, "", fmt.Errorf("store token: %w", err)
	}
	return tok, value, nil
}

// usable says whether a recorded token works at now.
func usable(tok *store.Token, now time.Time) bool {
	return tok.RevokedAt == nil && (tok.ExpiresAt == nil || now.Before(*tok.ExpiresAt))
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
	if ok && now.Before(c.until) && subtle.ConstantTimeCompare([]byte(c.tok.Hash), []byte(h)) == 1 && usable(&c.tok, now) {
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
	if subtle.ConstantTimeCompare([]byte(tok.Hash), []byte(h)) != 1 || !usable(tok, now) {
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

// List returns the tokens of project ("": of every project; hashes only).
func (t *Tokens) List(ctx context.Context, project string) ([]store.Token, error) {
	return t.store.ListTokens(ctx, project)
}

// Get returns a token's record (NotFound when there is none).
func (t *Tokens) Get(ctx context.Context, id string) (store.Token, error) {
	if !ids.Valid(ids.Token, id) {
		return store.Token{}, errdefs.New(errdefs.InvalidArgument, "malformed token id %q", id)
	}
	tok, err := t.store.TokenByID(ctx, id)
	if err != nil {
		return store.Token{}, err
	}
	return *tok, nil
}

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

// Active checks that the API token with id exists, is not revoked and has
// not expired, and returns it: credentials it issued (attachment and sandbox
// access tokens) carry its id, act in its project, and stop working within
// the cache TTL of its revocation.
func (t *Tokens) Active(ctx context.Context, id string) (store.Token, error) {
	revoked := errdefs.New(errdefs.Unauthenticated, "the API token that issued this credential was revoked or expired")
	if !ids.Valid(ids.Token, id) {
		return store.Token{}, revoked
	}
	key, now := "id\x00"+id, t.now()
	t.mu.Lock()
	c, ok := t.cache[key]
	t.mu.Unlock()
	if ok && now.Before(c.until) && usable(&c.tok, now) {
		return c.tok, nil
	}
	tok, err := t.store.TokenByID(ctx, id)
	if errors.Is(err, errdefs.NotFound) {
		return store.Token{}, revoked
	}
	if err != nil {
		return store.Token{}, fmt.Errorf("look up token: %w", err)
	}
	if !usable(tok, now) {
		return store.Token{}, revoked
	}
	t.mu.Lock()
	if len(t.cache) > 10000 {
		clear(t.cache)
	}
	t.cache[key] = cached{tok: *tok, until: now.Add(t.cacheTTL)}
	t.mu.Unlock()
	return *tok, nil
}

type tokenKey struct{}

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
	all, err := t.store.ListTokens(ctx, "")
	if err != nil {
		return nil, fmt.Errorf("list tokens: %w", err)
	}
	ids := make([]string, 0, len(all))
	for _, tok := range all {
		if usable(&tok, now) {
			ids = append(ids, tok.ID)
		}
	}
	t.mu.Lock()
	t.active = cachedIDs{ids: ids, until: now.Add(t.cacheTTL)}
	t.mu.Unlock()
	return ids, nil
}

// WithToken records the API token a request authenticated with.
func WithToken(ctx context.Context, tok store.Token) context.Context {
	tok.Hash = "" // nothing downstream needs it
	return context.WithValue(ctx, tokenKey{}, tok)
}

// TokenOf is the API token the request authenticated with (false for none).
func TokenOf(ctx context.Context) (store.Token, bool) {
	tok, ok := ctx.Value(tokenKey{}).(store.Token)
	return tok, ok
}

// TokenID is the id of the API token the request authenticated with ("" for
// none).
func TokenID(ctx context.Context) string {
	tok, _ := TokenOf(ctx)
	return tok.ID
}

// Project is the project the request acts in: its token's, or the default
// project for a request without one (the server's own work).
func Project(ctx context.Context) string {
	tok, _ := TokenOf(ctx)
	return store.ProjectOr(tok.Project)
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
