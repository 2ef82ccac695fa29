package fakeruntime

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"strings"

	"github.com/spacesandbox/space/internal/errdefs"
	"github.com/spacesandbox/space/internal/sandbox"
)

// Templates is a FAKE template store for tests: every reference resolves to
// a digest of its own name, except names starting with "missing", which do
// not exist.
type Templates struct{}

// Resolve implements lifecycle.Templates.
func (Templates) Resolve(ctx context.Context, ref string) (sandbox.TemplateRef, error) {
	if strings.HasPrefix(ref, "missing") {
		return sandbox.TemplateRef{}, errdefs.New(errdefs.NotFound, "template %s not found", ref)
	}
	if strings.HasPrefix(ref, "sha256:") {
		return sandbox.TemplateRef{Ref: ref, Digest: ref}, nil
	}
	sum := sha256.Sum256([]byte(ref))
	return sandbox.TemplateRef{Ref: ref, Digest: "sha256:" + hex.EncodeToString(sum[:])}, nil
}
