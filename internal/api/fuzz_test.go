package api

import (
	"errors"
	"strings"
	"testing"

	"github.com/spacesandbox/space/internal/errdefs"
	"github.com/spacesandbox/space/internal/lifecycle"
	"github.com/spacesandbox/space/internal/store"
)

// Decoding and validating a create body never panics, and whatever it
// rejects is an invalid_argument; whatever it accepts is within limits.
func FuzzDecodeCreateRequest(f *testing.F) {
	for _, s := range []string{``, `{}`, `{"template":"seed:latest"}`, `{"resources":{"vcpus":2}}`, `{"env":{"A":"b"}}`,
		`{"auto_lifecycle":{"idle_timeout":"10m","idle_action":"pause"}}`, `[]`, `{"x":1}`, `{"env":{"":""}}`, `{"resources":{"vcpus":1e309}}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		var req lifecycle.CreateRequest
		err := decodeJSON("application/json", body, &req)
		if err == nil {
			err = req.Normalize(lifecycle.DefaultLimits)
		}
		if err != nil {
			if !errors.Is(err, errdefs.InvalidArgument) {
				t.Fatalf("rejection of %q is %v, not invalid_argument", body, err)
			}
			return
		}
		r := req.Resources
		if r.VCPUs < 1 || r.VCPUs > lifecycle.DefaultLimits.MaxVCPUs || r.MemoryMiB < 128 || r.DiskMiB < 256 || req.Template == "" {
			t.Fatalf("accepted out-of-range request %+v", req)
		}
	})
}

// Routing arbitrary paths never panics and never yields an empty parameter
// or one with a separator in it.
func FuzzRouter(f *testing.F) {
	rt := newRouter((&Server{}).Routes())
	for _, s := range []string{"/v1/sandboxes", "/v1/sandboxes/sbx_a:pause", "/v1/sandboxes/:pause", "//", "/v1/sandboxes/a:b:pause", "/v1/operations/%00"} {
		f.Add("POST", s)
	}
	f.Fuzz(func(t *testing.T, method, path string) {
		r, p, _ := rt.match(method, path)
		if r == nil {
			return
		}
		for k, v := range p {
			if v == "" || strings.ContainsAny(v, ":/") {
				t.Fatalf("%s %q: param %s = %q", method, path, k, v)
			}
		}
	})
}

// Cursors from clients never panic the decoder; what decodes re-encodes.
func FuzzCursor(f *testing.F) {
	f.Add(store.EncodeCursor(42))
	f.Add("!!")
	f.Add("")
	f.Fuzz(func(t *testing.T, c string) {
		seq, err := store.DecodeCursor(c)
		if err != nil {
			if !errors.Is(err, errdefs.InvalidArgument) {
				t.Fatalf("cursor %q: %v", c, err)
			}
			return
		}
		if seq < 0 {
			t.Fatalf("negative seq from %q", c)
		}
	})
}

// Last-Event-ID from clients: never panics; a resume point is only ever an
// id we could have issued, and it round-trips.
func FuzzParseLastEventID(f *testing.F) {
	for _, s := range []string{"", "0", "1", "42", "8589934590", "8589934591", "99999999999999999999", "-1", " 1", "01", "1e3", "abc"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		l := parseLastEventID(s)
		if l.resync {
			return
		}
		if l.after >= MaxEventID {
			t.Fatalf("%q resumes after %d, beyond the positional range", s, l.after)
		}
		if s != "" && eventID(l.after) != s {
			t.Fatalf("%q parsed as %d which renders %q", s, l.after, eventID(l.after))
		}
	})
}

// A token's lifetime, a project's name and its quotas as clients send them:
// never a panic; a refusal is an invalid_argument; what is accepted is
// positive and bounded, and a name that passes is one the store can key.
func FuzzProjectInputs(f *testing.F) {
	for _, s := range []string{"30d", "12h", "0d", "-1d", "1e9d", "9999999999999d", "", "team-a", "A", "a-", `{"sandboxes":-1}`, `{"vcpus":1e20}`, `{"x":1}`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		if d, err := ParseTTL(v); err != nil {
			if !errors.Is(err, errdefs.InvalidArgument) {
				t.Fatalf("ParseTTL(%q) = %v, not invalid_argument", v, err)
			}
		} else if v != "" && d <= 0 {
			t.Fatalf("ParseTTL(%q) accepted %v", v, d)
		}
		if store.ValidProject(v) == nil && (len(v) == 0 || len(v) > 40 || strings.ContainsAny(v, " /:_\x00") || strings.HasSuffix(v, "-")) {
			t.Fatalf("project name %q accepted", v)
		}
		var q store.Quotas
		if err := decodeJSON("application/json", []byte(v), &q); err == nil && q.Validate() == nil {
			for _, n := range []int{q.Sandboxes, q.RunningSandboxes, q.VCPUs, q.MemoryMiB, q.DiskMiB, q.SnapshotMiB, q.Templates, q.WarmPool} {
				if n < 0 || n > 1<<30 {
					t.Fatalf("quotas %q accepted", v)
				}
			}
		}
	})
}
