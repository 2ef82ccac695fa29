package api

import (
	"context"
	"encoding/binary"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/spacesandbox/space/client"
	"github.com/spacesandbox/space/internal/commands"
	"github.com/spacesandbox/space/internal/sandbox"
)

func TestWantsFrames(t *testing.T) {
	for accept, want := range map[string]bool{
		"": false, "text/event-stream": false, "*/*": false, "application/octet-stream": true,
		"application/octet-stream, text/event-stream;q=0.9": true, "text/event-stream, application/octet-stream": false,
		"application/json, application/octet-stream": true, "garbage;;;": false,
	} {
		if got := wantsFrames(accept); got != want {
			t.Errorf("wantsFrames(%q) = %v", accept, got)
		}
	}
}

// The binary stream carries what the SSE stream carries, byte for byte, to
// the Go client (which asks for it), through the real data plane and a real
// in-process agent; resuming with Last-Event-ID works on it too.
func TestBinaryEventStream(t *testing.T) {
	h := newHarness(t)
	run := h.eng.Add(sandbox.Running)
	srv := httptest.NewServer(h.data)
	defer srv.Close()
	cmd := []string{"sh", "-c", "printf out1; sleep 0.2; printf err >&2; sleep 0.2; head -c 300000 /dev/zero; exit 3"}
	start := func() *client.Session {
		s, err := h.cmds.Create(context.Background(), run.ID, commands.CreateRequest{Command: cmd})
		if err != nil {
			t.Fatal(err)
		}
		cs := &client.Session{SessionID: s.SessionID}
		cs.Attach.URL, cs.Attach.Token = srv.URL+"/v1/sessions/"+s.SessionID+"/events", s.Attach.Token
		return cs
	}
	c, err := client.New(srv.URL, "unused")
	if err != nil {
		t.Fatal(err)
	}
	var stdout, stderr []byte
	var ids []string
	term, err := c.Attach(context.Background(), start(), "", 0, func(ev client.Event) error {
		if ev.Name == "output" {
			ids = append(ids, ev.ID)
			if ev.Stream == "stdout" {
				stdout = append(stdout, ev.Data...)
			} else {
				stderr = append(stderr, ev.Data...)
			}
		}
		return nil
	})
	if err != nil || term.Name != "process_exited" || term.ExitCode == nil || *term.ExitCode != 3 {
		t.Fatalf("term %+v err %v", term, err)
	}
	if string(stdout[:4]) != "out1" || len(stdout) != 4+300000 || string(stderr) != "err" || len(ids) < 3 || ids[0] != "1" {
		t.Fatalf("stdout %d bytes %q…, stderr %q, ids %v", len(stdout), stdout[:min(8, len(stdout))], stderr, ids)
	}

	// The raw frames: the content type, and a resume after the first chunk.
	sess := start()
	if _, err := c.Attach(context.Background(), sess, "", 0, func(client.Event) error { return nil }); err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequest("GET", sess.Attach.URL, nil)
	req.Header.Set("Authorization", "Bearer "+sess.Attach.Token)
	req.Header.Set("Accept", FramedType)
	req.Header.Set("Last-Event-ID", "1")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != FramedType {
		t.Fatalf("%d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	var hdr [FrameHeader]byte
	if _, err := io.ReadFull(resp.Body, hdr[:]); err != nil {
		t.Fatal(err)
	}
	n := binary.BigEndian.Uint32(hdr[9:13])
	payload := make([]byte, n)
	io.ReadFull(resp.Body, payload)
	if hdr[0] != FrameStderr || binary.BigEndian.Uint64(hdr[1:9]) != 2 || string(payload) != "err" {
		t.Fatalf("first frame after id 1: kind %d id %d %q", hdr[0], binary.BigEndian.Uint64(hdr[1:9]), payload)
	}
}
