package ecw

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/spacesandbox/space/internal/auth"
	"github.com/spacesandbox/space/internal/commands"
	"github.com/spacesandbox/space/internal/sandbox"
	"github.com/spacesandbox/space/internal/sandboxio/sandboxiotest"
)

// fuzzProcedures are the RPCs fuzzed: every one that cannot start a host
// process or a long-lived watch (the agent runs as a host process here).
var fuzzProcedures = []string{
	"/filesystem.Filesystem/Stat", "/filesystem.Filesystem/ListDir", "/filesystem.Filesystem/MakeDir",
	"/filesystem.Filesystem/Move", "/filesystem.Filesystem/Remove", "/filesystem.Filesystem/GetWatcherEvents",
	"/filesystem.Filesystem/RemoveWatcher", "/process.Process/List", "/process.Process/Connect",
	"/process.Process/SendInput", "/process.Process/SendSignal", "/process.Process/CloseStdin",
	"/process.Process/Update", "/process.Process/StreamInput",
}

var fuzzContentTypes = []string{"application/json", "application/connect+json", "application/proto", "application/connect+proto", "application/grpc", "text/plain"}

// FuzzConnectEnvelope sends arbitrary bytes as the body of envd's Connect
// RPCs (unary JSON, enveloped streams, other codecs): whatever arrives, the
// answer is a well-formed Connect response or error, never a panic or a hang.
func FuzzConnectEnvelope(f *testing.F) {
	ag := sandboxiotest.Start(f).Agent
	s := New(Config{Commands: commands.New(commands.Config{Signer: auth.NewSigner(bytes.Repeat([]byte{7}, 32))})})
	sc := &sandboxCtx{sb: &sandbox.Sandbox{ID: "sbx_aaaaaaaaaaaaaaaaaaaaaaaaaa", State: sandbox.Running}, agent: ag, user: "root"}
	mux := http.NewServeMux()
	s.mountRPC(mux, func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			h.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), sandboxCtxKey{}, sc)))
		})
	})
	frame := func(flags byte, msg string) []byte {
		n := len(msg)
		return append([]byte{flags, byte(n >> 24), byte(n >> 16), byte(n >> 8), byte(n)}, msg...)
	}
	f.Add(byte(0), byte(0), []byte(`{"path":"/"}`))
	f.Add(byte(1), byte(0), []byte(`{"path":"/etc","depth":2}`))
	f.Add(byte(8), byte(1), frame(0, `{"process":{"pid":1}}`))
	f.Add(byte(13), byte(1), append(frame(0, `{"start":{"process":{"tag":"x"}}}`), frame(0, `{"data":{"input":{"stdin":"aGk="}}}`)...))
	f.Add(byte(13), byte(1), frame(2, `{}`))
	f.Add(byte(8), byte(1), []byte{0, 0xff, 0xff, 0xff, 0xff})
	f.Add(byte(2), byte(0), []byte(`{"path":"/new/dir"}`))
	f.Add(byte(3), byte(0), []byte(`{"source":"/etc/passwd","destination":"/etc/p2"}`))
	f.Add(byte(10), byte(2), []byte{0x0a, 0x02, 0x08, 0x01})
	f.Fuzz(func(t *testing.T, proc, ct byte, body []byte) {
		path := fuzzProcedures[int(proc)%len(fuzzProcedures)]
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		req := httptest.NewRequestWithContext(ctx, "POST", path, bytes.NewReader(body))
		req.Header.Set("Content-Type", fuzzContentTypes[int(ct)%len(fuzzContentTypes)])
		rec := httptest.NewRecorder()
		mux.ServeHTTP(rec, req)
		out := rec.Body.Bytes()
		switch {
		case rec.Code == http.StatusOK && rec.Header().Get("Content-Type") == "application/connect+json":
			// A stream: envelopes, the last one the end of the stream.
			last := byte(0)
			for len(out) > 0 {
				if len(out) < 5 {
					t.Fatalf("truncated envelope in %q", rec.Body.Bytes())
				}
				n := int(out[1])<<24 | int(out[2])<<16 | int(out[3])<<8 | int(out[4])
				if len(out) < 5+n {
					t.Fatalf("short envelope in %q", rec.Body.Bytes())
				}
				last, out = out[0], out[5+n:]
			}
			if last&2 == 0 {
				t.Fatalf("stream without an end frame: %q", rec.Body.Bytes())
			}
		case rec.Code >= 400 && rec.Header().Get("Content-Type") == "application/json":
			var e struct{ Code string }
			if json.Unmarshal(out, &e) != nil || e.Code == "" {
				t.Fatalf("error %d without a Connect error body: %q", rec.Code, out)
			}
		case rec.Code >= 500:
			t.Fatalf("server error %d: %q", rec.Code, out)
		}
	})
}

// FuzzBasicUser parses arbitrary Authorization headers: never a panic, and
// a user name only from a well-formed Basic credential.
func FuzzBasicUser(f *testing.F) {
	f.Add("Basic dXNlcjo=")
	f.Add("Basic cm9vdDpwYXNz")
	f.Add("Bearer abc")
	f.Add("Basic !!!")
	f.Fuzz(func(t *testing.T, h string) {
		u := basicUser(h)
		if u != "" && len(h) < len("Basic ") {
			t.Fatalf("user %q from %q", u, h)
		}
	})
}
