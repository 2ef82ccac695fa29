package sandboxio_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spacesandbox/space/internal/errdefs"
	"github.com/spacesandbox/space/internal/sandboxio"
	"github.com/spacesandbox/space/internal/sandboxio/sandboxiotest"
)

// Every error the service returns carries the kind the HTTP layers answer
// with; nothing reaches them as a bare protocol error.
func TestErrorsCarryTheirKind(t *testing.T) {
	a := sandboxiotest.Start(t)
	ctx := context.Background()
	cases := []struct {
		name string
		err  error
		kind *errdefs.Kind
	}{
		{"stat missing", func() error { _, err := a.Stat(ctx, "/nope"); return err }(), errdefs.NotFound},
		{"open missing", func() error { _, err := a.Open(ctx, "/nope"); return err }(), errdefs.NotFound},
		{"list a file", func() error { _, err := a.List(ctx, "/etc/passwd", 1); return err }(), errdefs.FailedPrecondition},
		{"remove non-empty dir", a.Remove(ctx, "/etc", false), errdefs.FailedPrecondition},
		{"mkdir for an unknown user", func() error { _, err := a.MakeDir(ctx, sandboxio.Mkdir{Path: "/d", User: "nobody-here"}); return err }(), errdefs.InvalidArgument},
		{"move missing", func() error { _, err := a.Move(ctx, "/nope", "/x"); return err }(), errdefs.NotFound},
		{"read small too big", func() error { _, err := a.ReadSmall(ctx, "/etc/passwd", 4); return err }(), errdefs.ResourceExhausted},
		{"unknown process", func() error { _, err := a.GetProcess(ctx, "proc_x"); return err }(), errdefs.NotFound},
		{"signal unknown process", a.Signal(ctx, "proc_x", "SIGTERM"), errdefs.NotFound},
	}
	for _, c := range cases {
		if !errors.Is(c.err, c.kind) {
			t.Errorf("%s: %v, want %s", c.name, c.err, c.kind.Code)
		}
	}
	a.Stop()
	if _, err := a.Stat(ctx, "/etc"); !errors.Is(err, errdefs.Unavailable) || !sandboxio.Lost(err) || sandboxio.Refused(err) {
		t.Fatalf("stat with the agent gone: %v", err)
	}
}

type brokenReader struct{ after int }

func (b *brokenReader) Read(p []byte) (int, error) {
	if b.after <= 0 {
		return 0, io.ErrUnexpectedEOF
	}
	n := min(len(p), b.after)
	b.after -= n
	return n, nil
}

// A write whose data breaks off is the caller's InvalidArgument with the
// source's error in the chain, and replaces nothing; a whole one lands.
func TestWriteFile(t *testing.T) {
	a := sandboxiotest.Start(t)
	ctx := context.Background()
	_, err := a.WriteFile(ctx, sandboxio.Write{Path: "/etc/passwd"}, &brokenReader{after: 3 << 20})
	if !errors.Is(err, errdefs.InvalidArgument) || !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("broken source: %v", err)
	}
	if b, _ := os.ReadFile(filepath.Join(a.Root, "etc", "passwd")); !strings.HasPrefix(string(b), "root:") {
		t.Fatalf("a broken write replaced the file: %q", b)
	}
	data := bytes.Repeat([]byte("0123456789abcdef"), 200000) // > 3 chunks
	e, err := a.WriteFile(ctx, sandboxio.Write{Path: "/out/big", Mode: 0o600}, bytes.NewReader(data))
	if err != nil || e.Size != int64(len(data)) || e.Mode != "0600" || e.Type != "file" {
		t.Fatalf("write: %+v %v", e, err)
	}
	f, err := a.Open(ctx, "/out/big")
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(f)
	if err != nil || !bytes.Equal(got, data) || f.Size != int64(len(data)) {
		t.Fatalf("read back %d bytes (size %d), err %v", len(got), f.Size, err)
	}
}
