package auth

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spacesandbox/space/internal/errdefs"
	"github.com/spacesandbox/space/internal/ids"
)

func TestAttachTokens(t *testing.T) {
	s, err := LoadSigner(filepath.Join(t.TempDir(), "attach.key"))
	if err != nil {
		t.Fatal(err)
	}
	sid, sbx := ids.New(ids.Process), ids.New(ids.Sandbox)
	tok := s.Issue(Claims{Session: sid, Sandbox: sbx, Expires: time.Now().Add(time.Minute).Unix()})
	c, err := s.Verify(tok, sid)
	if err != nil || c.Sandbox != sbx {
		t.Fatalf("verify = %+v %v", c, err)
	}
	if _, err := s.Verify(tok, ids.New(ids.Process)); !errors.Is(err, errdefs.PermissionDenied) {
		t.Fatalf("other session = %v", err)
	}
	other := NewSigner([]byte(strings.Repeat("k", 32)))
	for name, bad := range map[string]string{
		"empty":        "",
		"api token":    "space_abcdef",
		"forged":       other.Issue(Claims{Session: sid, Sandbox: sbx, Expires: time.Now().Add(time.Minute).Unix()}),
		"tampered":     tok[:len(tok)-2] + "AA",
		"no signature": strings.Split(tok, ".")[0],
		"expired":      s.Issue(Claims{Session: sid, Sandbox: sbx, Expires: time.Now().Add(-time.Second).Unix()}),
	} {
		if _, err := s.Verify(bad, sid); !errors.Is(err, errdefs.Unauthenticated) {
			t.Errorf("%s: %v", name, err)
		}
	}
}

func TestSignerKeyPersists(t *testing.T) {
	path := filepath.Join(t.TempDir(), "attach.key")
	a, _ := LoadSigner(path)
	b, err := LoadSigner(path)
	if err != nil {
		t.Fatal(err)
	}
	sid := ids.New(ids.Process)
	if _, err := b.Verify(a.Issue(Claims{Session: sid, Sandbox: ids.New(ids.Sandbox), Expires: time.Now().Add(time.Hour).Unix()}), sid); err != nil {
		t.Fatalf("token from before a restart rejected: %v", err)
	}
}

func FuzzVerify(f *testing.F) {
	s := NewSigner([]byte(strings.Repeat("k", 32)))
	sid := ids.New(ids.Process)
	f.Add(s.Issue(Claims{Session: sid, Sandbox: ids.New(ids.Sandbox), Expires: 1 << 40}))
	f.Add("spat_.")
	f.Add("spat_e30.AAAA")
	f.Fuzz(func(t *testing.T, tok string) {
		c, err := s.Verify(tok, sid)
		if err == nil && c.Session != sid {
			t.Fatalf("accepted a token for %s", c.Session)
		}
	})
}
