package ecw

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"net/http"
	"strconv"
	"time"

	"github.com/spacesandbox/space/internal/errdefs"
	"github.com/spacesandbox/space/internal/sandbox"
	"github.com/spacesandbox/space/internal/store"
)

// Signed file URLs. E2B's SDKs give out /files URLs that work without an
// access token (downloadUrl, uploadUrl): the URL carries a signature of the
// path, the operation (read for GET, write for POST) and the user, made
// with the sandbox's envd access token, and optionally its expiry:
//
//	signature = "v1_" + base64(sha256(path:operation:user:token[:expiration]))
//
// without base64's padding, as envd checks it. A SPACE envd access token
// belongs to the API token it was issued to (revoking that ends it), so a
// signature is checked against the access token of each active API token.
// A URL on a plain E2B_SANDBOX_URL names no sandbox: it is looked for among
// the running sandboxes with the same check.

// maxSignedScan bounds the signatures computed to find the sandbox of a URL
// that names none (sandboxes × API tokens).
const maxSignedScan = 20000

// signedFile is what a signed /files request claims.
type signedFile struct {
	path, op, user, sig, exp string
}

// signedRequest reads the signature of a /files request; ok is false when
// it carries none.
func signedRequest(r *http.Request) (signedFile, bool, error) {
	q := r.URL.Query()
	sig, exp := q.Get("signature"), q.Get("signature_expiration")
	if sig == "" {
		if exp != "" {
			return signedFile{}, false, errdefs.New(errdefs.InvalidArgument, "signature_expiration without a signature")
		}
		return signedFile{}, false, nil
	}
	if len(sig) > 128 {
		return signedFile{}, false, errdefs.New(errdefs.Unauthenticated, "invalid signature")
	}
	if exp != "" {
		if _, err := strconv.ParseInt(exp, 10, 64); err != nil {
			return signedFile{}, false, errdefs.New(errdefs.InvalidArgument, "signature_expiration must be a Unix time in seconds")
		}
	}
	op := "read"
	if r.Method == http.MethodPost {
		op = "write"
	}
	return signedFile{path: q.Get("path"), op: op, user: q.Get("username"), sig: sig, exp: exp}, true, nil
}

func fileSignature(f signedFile, accessToken string) string {
	raw := f.path + ":" + f.op + ":" + f.user + ":" + accessToken
	if f.exp != "" {
		raw += ":" + f.exp
	}
	sum := sha256.Sum256([]byte(raw))
	return "v1_" + base64.RawStdEncoding.EncodeToString(sum[:])
}

var errBadSignature = errdefs.New(errdefs.Unauthenticated, "invalid signature")

// signs returns which of tokens (API token ids) issued the access token to
// sandboxID that signed f.
func (s *Server) signs(f signedFile, sandboxID string, tokens []string) (string, bool) {
	for _, tid := range tokens {
		want := fileSignature(f, s.cfg.Commands.Signer().SandboxAccessToken(sandboxID, tid))
		if subtle.ConstantTimeCompare([]byte(want), []byte(f.sig)) == 1 {
			return tid, true
		}
	}
	return "", false
}

// signedBy returns the id of the API token whose access token to sandbox
// signed f, or why the signature is refused.
func (s *Server) signedBy(ctx context.Context, f signedFile, sandboxID string) (string, error) {
	for _, fresh := range []bool{false, true} {
		tokens, err := s.cfg.Tokens.ActiveIDs(ctx, fresh)
		if err != nil {
			return "", err
		}
		if tid, ok := s.signs(f, sandboxID, tokens); ok {
			if f.exp != "" {
				exp, _ := strconv.ParseInt(f.exp, 10, 64)
				if exp < time.Now().Unix() {
					return "", errdefs.New(errdefs.Unauthenticated, "signature is already expired")
				}
			}
			return tid, nil
		}
	}
	return "", errBadSignature
}

// signedSandbox finds the running sandbox whose access token signed f.
func (s *Server) signedSandbox(ctx context.Context, f signedFile) (string, error) {
	tokens, err := s.cfg.Tokens.ActiveIDs(ctx, true)
	if err != nil {
		return "", err
	}
	checked := 0
	q := store.SandboxQuery{State: sandbox.Running, Limit: store.MaxLimit}
	for {
		page, err := s.cfg.Engine.List(ctx, q)
		if err != nil {
			return "", err
		}
		for _, sb := range page.Items {
			if checked += len(tokens); checked > maxSignedScan {
				return "", errdefs.New(errdefs.InvalidArgument, "too many sandboxes to find the one this URL was signed for: address it by its host name (%s-<sandbox id>.<domain>) or send E2b-Sandbox-Id", EnvdPort)
			}
			if _, ok := s.signs(f, sb.ID, tokens); ok {
				return sb.ID, nil
			}
		}
		if page.Next == "" {
			return "", errBadSignature
		}
		q.Cursor = page.Next
	}
}
