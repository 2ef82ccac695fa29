package client

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
)

// Output events of growing and shrinking sizes, each with bytes of its own,
// arrive intact on both encodings while the client reuses its buffers: each
// event's Data is exactly what the server sent for it, and nothing else.
func TestAttachDeliversEachEventIntactWhileReusingBuffers(t *testing.T) {
	sizes := []int{5, 70000, 3, 1 << 20, 0, 4096, 200000, 1}
	payload := func(i int) []byte {
		b := make([]byte, sizes[i])
		for j := range b {
			b[j] = byte(i*31 + j*7)
		}
		return b
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Accept") == "text/event-stream" {
			w.Header().Set("Content-Type", "text/event-stream")
			for i := range sizes {
				fmt.Fprintf(w, "id: %d\nevent: output\ndata: {\"stream\":\"stdout\",\"data\":\"%s\"}\n\n", i+1, base64.StdEncoding.EncodeToString(payload(i)))
			}
			fmt.Fprintf(w, "id: %d\nevent: process_exited\ndata: {\"exit_code\":0}\n\n", len(sizes)+1)
			return
		}
		w.Header().Set("Content-Type", "application/octet-stream")
		frame := func(kind byte, id int, p []byte) {
			var hdr [frameHeader]byte
			hdr[0] = kind
			binary.BigEndian.PutUint64(hdr[1:9], uint64(id))
			binary.BigEndian.PutUint32(hdr[9:13], uint32(len(p)))
			w.Write(hdr[:])
			w.Write(p)
		}
		for i := range sizes {
			frame(1, i+1, payload(i))
		}
		frame(4, len(sizes)+1, []byte(`{"exit_code":0}`))
	}))
	defer srv.Close()
	for _, sse := range []bool{false, true} {
		c, s := attachTo(t, srv.URL, sse)
		i := 0
		term, err := c.Attach(context.Background(), s, "", 0, func(ev Event) error {
			if ev.Name != "output" {
				return nil
			}
			if want := payload(i); !bytes.Equal(ev.Data, want) {
				t.Errorf("sse=%v: event %d: %d bytes, want its own %d", sse, i+1, len(ev.Data), len(want))
			}
			i++
			return nil
		})
		if err != nil || term.Name != "process_exited" || i != len(sizes) {
			t.Fatalf("sse=%v: %d output events, term %+v, err %v", sse, i, term, err)
		}
	}
}

// An event's data may span several lines, which SSE joins with line feeds:
// an output event split between JSON tokens arrives whole (the client's
// path for events that are not one line), and a number split across two
// lines is not read as their digits run together.
func TestAttachJoinsDataLinesWithLineFeeds(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "id: 1\nevent: output\ndata: {\"stream\":\"stdout\",\ndata: \"data\":\"aGVsbG8K\"}\n\n")
		fmt.Fprint(w, "id: 2\nevent: process_exited\ndata: {\"exit_code\":1\ndata: 2}\n\n")
	}))
	defer srv.Close()
	c, s := attachTo(t, srv.URL, true)
	var out []byte
	term, err := c.Attach(context.Background(), s, "", 0, func(ev Event) error {
		if ev.Name == "output" {
			out = append(out, ev.Data...)
		}
		return nil
	})
	if string(out) != "hello\n" {
		t.Fatalf("output %q, want hello", out)
	}
	if err == nil {
		t.Fatalf("exit code split across lines read as %v, want an error", term.ExitCode)
	}
}

// attachTo is a client and a session whose attach URL is url, asking for
// Server-Sent Events when sse.
func attachTo(t *testing.T, url string, sse bool) (*Client, *Session) {
	t.Helper()
	c, err := New(url, "t")
	if err != nil {
		t.Fatal(err)
	}
	c.SSE = sse
	s := &Session{}
	s.Attach.URL, s.Attach.Token = url, "a"
	return c, s
}
