package e2e

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// closedWithin reports whether the server closes c within d.
func closedWithin(c net.Conn, d time.Duration) bool {
	c.SetReadDeadline(time.Now().Add(d))
	_, err := io.Copy(io.Discard, c)
	return err == nil || !strings.Contains(err.Error(), "timeout")
}

// Slow and numerous clients cannot hold a listener (#14 item 5): on every
// listener, headers that trickle and a body that stops are cut off at their
// deadlines; connections beyond --max-connections are closed at once; and
// authenticated event streams do not count against the cap.
func TestSlowClientsAreCutOff(t *testing.T) {
	s := startServer(t, serverOpts{args: []string{"--runtime", "fake", "--header-timeout", "1s", "--body-idle-timeout", "1s", "--max-connections", "20"}})
	for name, addr := range map[string]string{"api": s.apiAddr, "data plane": s.dpAddr, "e2b": s.ecwAddr} {
		// Headers one byte at a time, forever.
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		stop := make(chan struct{})
		go func() {
			for _, b := range []byte("GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: " + strings.Repeat("a", 100)) {
				select {
				case <-stop:
					return
				case <-time.After(200 * time.Millisecond):
				}
				if _, err := c.Write([]byte{b}); err != nil {
					return
				}
			}
		}()
		if !closedWithin(c, 5*time.Second) {
			t.Errorf("%s: a client trickling its headers was not cut off", name)
		}
		close(stop)
		c.Close()
	}
	// A body that stops arriving.
	c, _ := net.Dial("tcp", s.apiAddr)
	fmt.Fprintf(c, "POST /v1/sandboxes HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"metadata\":", s.token)
	if !closedWithin(c, 5*time.Second) {
		t.Error("a request whose body stopped was not cut off")
	}
	c.Close()

	// Twenty authenticated streams do not count against the cap of 20.
	sbx := s.createRunning()
	var streams []*stream
	for i := 0; i < 22; i++ {
		sess := s.command(sbx, map[string]any{"command": []string{"sleep", "30"}})
		st, resp := s.attach(sess.Attach.URL, sess.Attach.Token, "")
		if st == nil {
			t.Fatalf("stream %d: %d", i, resp.StatusCode)
		}
		streams = append(streams, st)
	}
	if r := s.do("GET", "/v1/sandboxes/"+sbx, s.token, nil); r.status != 200 {
		t.Fatalf("with 22 streams open: %d", r.status)
	}
	for _, st := range streams {
		st.close()
	}

	// Twenty idle connections fill the cap: the next is closed at once,
	// and once the idle ones time out, requests are served again.
	var idle []net.Conn
	for i := 0; i < 20; i++ {
		c, err := net.Dial("tcp", s.apiAddr)
		if err != nil {
			t.Fatal(err)
		}
		idle = append(idle, c)
	}
	time.Sleep(100 * time.Millisecond) // let the server accept them
	extra, _ := net.Dial("tcp", s.apiAddr)
	fmt.Fprintf(extra, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
	if line, err := bufio.NewReader(extra).ReadString('\n'); err == nil {
		t.Fatalf("connection 21 was served (%q) with the cap of 20 full", line)
	}
	extra.Close()
	for _, c := range idle {
		if !closedWithin(c, 5*time.Second) {
			t.Error("an idle connection was not closed at the header timeout")
		}
		c.Close()
	}
	resp, err := http.Get("http://" + s.apiAddr + "/healthz")
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("after the idle connections went: %v %v", resp, err)
	}
	resp.Body.Close()
}

// An attached reader that stops reading for longer than the agent's reader
// timeout (5 s) loses nothing (#14 item 8): the server keeps its place while
// it waits on the client, so the process waits instead of output being
// dropped — no resync_required, every byte in order.
func TestStalledReaderLosesNothing(t *testing.T) {
	s := startServer(t, serverOpts{})
	sbx := s.createRunning()
	sess := s.command(sbx, map[string]any{"command": []string{"seq", "1", "3000000"}}) // ~21 MB
	st, resp := s.attach(sess.Attach.URL, sess.Attach.Token, "")
	if st == nil {
		t.Fatalf("attach: %d", resp.StatusCode)
	}
	tr := &transcript{}
	stalled := false
	collect(t, st, tr, func(tr *transcript) bool {
		if !stalled && len(tr.stdout) >= 2<<20 {
			stalled = true
			t.Log("the reader stops reading for 8 s, its stream open")
			time.Sleep(8 * time.Second)
		}
		return false
	})
	var want strings.Builder
	for i := 1; i <= 3000000; i++ {
		fmt.Fprintf(&want, "%d\n", i)
	}
	for _, ev := range tr.events {
		if ev == "resync_required" {
			t.Fatal("the stalled reader got resync_required: output was dropped")
		}
	}
	if !tr.complete || string(tr.stdout) != want.String() {
		t.Fatalf("got %d bytes (complete %v), want %d in order", len(tr.stdout), tr.complete, want.Len())
	}
}
