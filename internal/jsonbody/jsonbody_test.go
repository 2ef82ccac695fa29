package jsonbody

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/spacesandbox/space/internal/errdefs"
)

type req struct {
	Name string `json:"name"`
	N    int    `json:"n"`
}

func TestDecode(t *testing.T) {
	cases := []struct {
		body string
		kind *errdefs.Kind
		want string // substring of the message
	}{
		{body: `{"name":"a","n":1}`},
		{body: ``},
		{body: "  \n"},
		{body: `null`}, // JSON's "no value": the same as no body
		{body: `[]`, kind: errdefs.InvalidArgument, want: "expected"},
		{body: `{"name":"a"} `},
		{body: `{"nope":1}`, kind: errdefs.InvalidArgument, want: `unknown field "nope"`},
		{body: `{"n":"x"}`, kind: errdefs.InvalidArgument, want: "field n must be int"},
		{body: `{"name":`, kind: errdefs.InvalidArgument, want: "unexpected end of input"},
		{body: `{"name":"a"}}`, kind: errdefs.InvalidArgument, want: "unexpected data after the value"},
		{body: `{} {}`, kind: errdefs.InvalidArgument, want: "unexpected data after the value"},
		{body: `{x}`, kind: errdefs.InvalidArgument, want: "syntax error at byte 2"},
	}
	for _, c := range cases {
		var v req
		err := Decode(strings.NewReader(c.body), &v)
		if c.kind == nil {
			if err != nil {
				t.Errorf("%q: %v", c.body, err)
			}
			continue
		}
		if errdefs.KindOf(err) != c.kind || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: got %v (kind %v), want %v containing %q", c.body, err, errdefs.KindOf(err), c.kind, c.want)
		}
	}
}

// A body over the reader's limit is too_large, whether the limit falls inside
// the value or in what follows it.
func TestDecodeTooLarge(t *testing.T) {
	for _, body := range []string{`{"name":"` + strings.Repeat("a", 100) + `"}`, `{"name":"a"}` + strings.Repeat(" ", 100) + "x"} {
		r := http.MaxBytesReader(httptest.NewRecorder(), io.NopCloser(strings.NewReader(body)), 20)
		var v req
		err := Decode(r, &v)
		if errdefs.KindOf(err) != errdefs.TooLarge || !strings.Contains(err.Error(), "exceeds 20 bytes") {
			t.Errorf("%.20q…: got %v, want too_large", body, err)
		}
	}
}
