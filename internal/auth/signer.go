package auth

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/spacesandbox/space/internal/errdefs"
	"github.com/spacesandbox/space/internal/ids"
)

// AttachPrefix marks attachment tokens; they never look like API tokens.
const AttachPrefix = "spat_"

// Claims are what an attachment token grants: access to one session.
type Claims struct {
	Session string `json:"sid"`
	Sandbox string `json:"sbx"`
	Expires int64  `json:"exp"` // unix seconds
	// Token is the id of the API token that created the session: the
	// attachment token stops working when that one is revoked.
	Token string `json:"tok,omitempty"`
	// Project is the project of the session's sandbox (and of Token).
	Project string `json:"prj,omitempty"`
}

// Signer issues and checks attachment tokens: the claims, signed with
// HMAC-SHA256 under a key kept in the data directory. Nothing is stored per
// token, so issuing one costs no write.
type Signer struct {
	key []byte
	now func() time.Time
}

// LoadSigner reads the key at path, creating it (mode 0600) if absent.
func LoadSigner(path string) (*Signer, error) {
	key, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		key = make([]byte, 32)
		rand.Read(key)
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			return nil, fmt.Errorf("create attach key: %w", err)
		}
		if _, err := f.Write(key); err != nil {
			f.Close()
			return nil, fmt.Errorf("write attach key: %w", err)
		}
		if err := f.Close(); err != nil {
			return nil, err
		}
	} else if err != nil {
		return nil, fmt.Errorf("read attach key: %w", err)
	}
	if len(key) < 32 {
		return nil, fmt.Errorf("attach key %s is shorter than 32 bytes", path)
	}
	return NewSigner(key), nil
}

// NewSigner returns a signer with key.
func NewSigner(key []byte) *Signer {
	return &Signer{key: key, now: time.Now}
}

func (s *Signer) mac(payload string) []byte {
	m := hmac.New(sha256.New, s.key)
	m.Write([]byte(payload))
	return m.Sum(nil)
}

// Issue returns a token for c.
func (s *Signer) Issue(c Claims) string {
	b, _ := json.Marshal(c)
	payload := base64.RawURLEncoding.EncodeToString(b)
	return AttachPrefix + payload + "." + base64.RawURLEncoding.EncodeToString(s.mac(payload))
}

// Verify checks a token's signature and expiry and that it was issued for
// session. A malformed, forged or expired token is Unauthenticated; a valid
// token for another session is PermissionDenied.
func (s *Signer) Verify(token, session string) (Claims, error) {
	denied := errdefs.New(errdefs.Unauthenticated, "missing or invalid attachment token")
	body, ok := strings.CutPrefix(token, AttachPrefix)
	if !ok || len(token) > 1024 {
		return Claims{}, denied
	}
	payload, sig, ok := strings.Cut(body, ".")
	if !ok {
		return Claims{}, denied
	}
	got, err := base64.RawURLEncoding.DecodeString(sig)
	if err != nil || !hmac.Equal(got, s.mac(payload)) {
		return Claims{}, denied
	}
	raw, err := base64.RawURLEncoding.DecodeString(payload)
	if err != nil {
		return Claims{}, denied
	}
	var c Claims
	if json.Unmarshal(raw, &c) != nil || !ids.Valid(ids.Process, c.Session) || !ids.Valid(ids.Sandbox, c.Sandbox) {
		return Claims{}, denied
	}
	if s.now().Unix() >= c.Expires {
		return Claims{}, errdefs.New(errdefs.Unauthenticated, "attachment token expired")
	}
	if c.Session != session {
		return Claims{}, errdefs.New(errdefs.PermissionDenied, "attachment token is for another session")
	}
	return c, nil
}

// SandboxAccessPrefix starts a sandbox access token.
const SandboxAccessPrefix = "spsa_"

// SandboxAccessToken is the token that grants a sandbox's whole in-sandbox
// API (the E2B layer's envdAccessToken) to the holder of API token tokenID:
// the token's id and an HMAC of both ids under the signer's key, so it needs
// no storage, lives as long as the sandbox and ends with the API token.
func (s *Signer) SandboxAccessToken(sandboxID, tokenID string) string {
	return SandboxAccessPrefix + tokenID + "." + base64.RawURLEncoding.EncodeToString(s.mac("sandbox-access\x00"+sandboxID+"\x00"+tokenID))
}

// IngressToken reaches a sandbox's ports through the data plane: an HMAC of
// the sandbox id under its own label, so it grants nothing else.
func (s *Signer) IngressToken(sandboxID string) string {
	return IngressPrefix + base64.RawURLEncoding.EncodeToString(s.mac("sandbox-ingress\x00"+sandboxID))
}

// IngressPrefix starts every ingress token.
const IngressPrefix = "spi_"

// VerifyIngress checks an ingress token in constant time.
func (s *Signer) VerifyIngress(token, sandboxID string) error {
	want := s.IngressToken(sandboxID)
	if len(token) > 256 || !hmac.Equal([]byte(token), []byte(want)) {
		return errdefs.New(errdefs.Unauthenticated, "missing or invalid ingress token (X-Space-Ingress-Token)")
	}
	return nil
}

// VerifySandboxAccess checks a sandbox access token in constant time and
// returns the id of the API token it was issued to (the caller checks that
// one is still active).
func (s *Signer) VerifySandboxAccess(token, sandboxID string) (string, error) {
	denied := errdefs.New(errdefs.Unauthenticated, "missing or invalid sandbox access token")
	rest, ok := strings.CutPrefix(token, SandboxAccessPrefix)
	if !ok || len(token) > 256 {
		return "", denied
	}
	tokenID, _, ok := strings.Cut(rest, ".")
	if !ok || !ids.Valid(ids.Token, tokenID) {
		return "", denied
	}
	if !hmac.Equal([]byte(token), []byte(s.SandboxAccessToken(sandboxID, tokenID))) {
		return "", denied
	}
	return tokenID, nil
}
