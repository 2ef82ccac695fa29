package edge

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/spacesandbox/space/internal/errdefs"
	"github.com/spacesandbox/space/internal/metrics"
)

// testEdge renders errors as {"code","message"} and logs into buf.
func testEdge(buf *bytes.Buffer) *Edge {
	return &Edge{Listener: "test", Metrics: metrics.New(), Log: slog.New(slog.NewTextHandler(buf, nil)),
		Render: func(err error) (int, []byte) {
			k, msg, _ := errdefs.Public(err)
			b, _ := Marshal(map[string]string{"code": k.Code, "message": msg})
			return k.Status, b
		}}
}

func serve(e *Edge, r *http.Request, d Dispatch) *httptest.ResponseRecorder {
	w := httptest.NewRecorder()
	e.Serve(w, r, d)
	return w
}

func body(t *testing.T, w *httptest.ResponseRecorder) map[string]string {
	t.Helper()
	var m map[string]string
	if err := json.Unmarshal(w.Body.Bytes(), &m); err != nil {
		t.Fatalf("body %q: %v", w.Body.String(), err)
	}
	return m
}

func TestReturnedErrorIsRenderedWithItsKind(t *testing.T) {
	var logs bytes.Buffer
	e := testEdge(&logs)
	w := serve(e, httptest.NewRequest("GET", "/x", nil), func(w http.ResponseWriter, r *http.Request, route *string) error {
		*route = "/x"
		return errdefs.New(errdefs.NotFound, "sandbox sbx_1 not found")
	})
	if w.Code != 404 || body(t, w)["code"] != "not_found" || body(t, w)["message"] != "sandbox sbx_1 not found" {
		t.Fatalf("got %d %s", w.Code, w.Body)
	}
	if w.Header().Get("Cache-Control") != "no-store" || w.Header().Get("Content-Type") != "application/json" {
		t.Fatalf("headers %v", w.Header())
	}
	if logs.Len() != 0 {
		t.Fatalf("a client's error was logged: %s", logs.String())
	}
}

func TestErrorWithoutKindIsInternalAndLoggedNotShown(t *testing.T) {
	var logs bytes.Buffer
	e := testEdge(&logs)
	w := serve(e, httptest.NewRequest("GET", "/x", nil), func(http.ResponseWriter, *http.Request, *string) error {
		return errors.New("secret detail /var/lib/space")
	})
	if w.Code != 500 || strings.Contains(w.Body.String(), "secret") {
		t.Fatalf("got %d %s", w.Code, w.Body)
	}
	if !strings.Contains(logs.String(), "secret detail") || !strings.Contains(logs.String(), "level=ERROR") {
		t.Fatalf("internal error not logged: %s", logs.String())
	}
}

func TestPanicBecomes500AndIsCountedUnderItsRoute(t *testing.T) {
	var logs bytes.Buffer
	e := testEdge(&logs)
	w := serve(e, httptest.NewRequest("POST", "/boom", nil), func(w http.ResponseWriter, r *http.Request, route *string) error {
		*route = "/boom"
		panic("bug")
	})
	if w.Code != 500 || body(t, w)["code"] != "internal" {
		t.Fatalf("got %d %s", w.Code, w.Body)
	}
	if !strings.Contains(logs.String(), "panic serving request") {
		t.Fatalf("panic not logged: %s", logs.String())
	}
	rec := httptest.NewRecorder()
	e.Metrics.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	if !strings.Contains(rec.Body.String(), `space_http_request_duration_seconds_count{code="500",listener="test",method="POST",route="/boom"} 1`) {
		t.Fatalf("request not recorded under its route:\n%s", rec.Body.String())
	}
}

func TestAbortHandlerStillAborts(t *testing.T) {
	e := testEdge(new(bytes.Buffer))
	defer func() {
		if v := recover(); v != http.ErrAbortHandler {
			t.Fatalf("recovered %v, want http.ErrAbortHandler to pass through", v)
		}
	}()
	serve(e, httptest.NewRequest("GET", "/", nil), func(http.ResponseWriter, *http.Request, *string) error {
		panic(http.ErrAbortHandler)
	})
}

func TestErrorAfterResponseBeganIsNotWritten(t *testing.T) {
	var logs bytes.Buffer
	e := testEdge(&logs)
	w := serve(e, httptest.NewRequest("GET", "/", nil), func(w http.ResponseWriter, r *http.Request, _ *string) error {
		w.WriteHeader(200)
		io.WriteString(w, "data: partial\n")
		return errdefs.New(errdefs.Unavailable, "agent went away")
	})
	if w.Code != 200 || w.Body.String() != "data: partial\n" {
		t.Fatalf("got %d %q", w.Code, w.Body)
	}
	if !strings.Contains(logs.String(), "after its response began") {
		t.Fatalf("late error not logged: %s", logs.String())
	}
}

func TestNoRoute(t *testing.T) {
	e := testEdge(new(bytes.Buffer))
	w := serve(e, httptest.NewRequest("DELETE", "/v1/x", nil), func(w http.ResponseWriter, r *http.Request, _ *string) error {
		return NoRoute(w, r, []string{"GET", "POST"})
	})
	if w.Code != 405 || w.Header().Get("Allow") != "GET, POST" || body(t, w)["code"] != "method_not_allowed" {
		t.Fatalf("got %d %v %s", w.Code, w.Header(), w.Body)
	}
	w = serve(e, httptest.NewRequest("GET", "/nope", nil), func(w http.ResponseWriter, r *http.Request, _ *string) error {
		return NoRoute(w, r, nil)
	})
	if w.Code != 404 || w.Header().Get("Allow") != "" {
		t.Fatalf("got %d %v", w.Code, w.Header())
	}
}

func TestUnauthenticatedCarriesAChallenge(t *testing.T) {
	e := testEdge(new(bytes.Buffer))
	w := serve(e, httptest.NewRequest("GET", "/", nil), func(http.ResponseWriter, *http.Request, *string) error {
		return errdefs.New(errdefs.Unauthenticated, "missing token")
	})
	if w.Code != 401 || w.Header().Get("WWW-Authenticate") != `Bearer realm="space-test"` {
		t.Fatalf("got %d %v", w.Code, w.Header())
	}
}

func TestReadBody(t *testing.T) {
	w := httptest.NewRecorder()
	if _, err := ReadBody(w, httptest.NewRequest("POST", "/", strings.NewReader(strings.Repeat("x", 11))), 10); !errors.Is(err, errdefs.TooLarge) {
		t.Fatalf("11 bytes over a limit of 10: %v", err)
	}
	b, err := ReadBody(w, httptest.NewRequest("POST", "/", strings.NewReader("0123456789")), 10)
	if err != nil || string(b) != "0123456789" {
		t.Fatalf("%q %v", b, err)
	}
	r := httptest.NewRequest("POST", "/", io.MultiReader(strings.NewReader("ab"), errReader{}))
	if _, err := ReadBody(w, r, 10); !errors.Is(err, errdefs.InvalidArgument) {
		t.Fatalf("broken body: %v", err)
	}
}

type errReader struct{}

func (errReader) Read([]byte) (int, error) { return 0, io.ErrUnexpectedEOF }

func TestJSONThatCannotMarshalWritesNothing(t *testing.T) {
	w := httptest.NewRecorder()
	if err := JSON(w, 200, map[string]any{"f": func() {}}); err == nil || !errors.Is(err, errdefs.Internal) {
		t.Fatalf("err %v", err)
	}
	if w.Body.Len() != 0 || w.Code != 200 || w.Header().Get("Content-Type") != "" {
		t.Fatalf("wrote %d %q", w.Code, w.Body)
	}
	if err := JSON(w, 201, map[string]int{"a": 1}); err != nil || w.Code != 201 || w.Body.String() != "{\"a\":1}\n" {
		t.Fatalf("%v %d %q", err, w.Code, w.Body)
	}
}
