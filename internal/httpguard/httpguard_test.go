package httpguard

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

func serveGuarded(t *testing.T, max int, h http.Handler) (string, *Limited) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := Listener(ln, max)
	srv := &http.Server{Handler: BodyIdle(h, 300*time.Millisecond), ConnContext: ConnContext, ReadHeaderTimeout: 300 * time.Millisecond}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	return ln.Addr().String(), l
}

// A body that stops arriving ends its request at the idle deadline; one that
// keeps arriving, however slowly, does not.
func TestBodyIdle(t *testing.T) {
	addr, _ := serveGuarded(t, 0, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, "body: "+err.Error(), 400)
			return
		}
		fmt.Fprintf(w, "read %d", len(b))
	}))
	c, _ := net.Dial("tcp", addr)
	defer c.Close()
	fmt.Fprintf(c, "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nabc")
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	b, _ := io.ReadAll(c)
	if len(b) == 0 {
		t.Fatal("a stalled body was not cut off")
	}
	// Slow but steady: 10 bytes, one every 100 ms.
	c2, _ := net.Dial("tcp", addr)
	defer c2.Close()
	fmt.Fprintf(c2, "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\nConnection: close\r\n\r\n")
	for i := 0; i < 10; i++ {
		time.Sleep(100 * time.Millisecond)
		c2.Write([]byte("x"))
	}
	c2.SetReadDeadline(time.Now().Add(5 * time.Second))
	b, _ = io.ReadAll(c2)
	if !strings.Contains(string(b), "read 10") {
		t.Fatalf("a slow, steady body = %q", b)
	}
}

// Beyond the cap a connection is closed at once; an exempted one gives its
// place back.
func TestCapAndExempt(t *testing.T) {
	hold := make(chan struct{})
	addr, l := serveGuarded(t, 2, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/stream" {
			Exempt(r.Context())
		}
		w.WriteHeader(200)
		w.(http.Flusher).Flush()
		<-hold
	}))
	defer close(hold)
	get := func(path string) (net.Conn, string) {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: x\r\n\r\n", path)
		c.SetReadDeadline(time.Now().Add(2 * time.Second))
		line, _ := bufio.NewReader(c).ReadString('\n')
		return c, line
	}
	for i := 0; i < 3; i++ { // streams: exempt, so never refused
		c, line := get("/stream")
		defer c.Close()
		if !strings.HasPrefix(line, "HTTP/1.1 200") {
			t.Fatalf("stream %d: %q", i, line)
		}
	}
	for i := 0; i < 2; i++ {
		c, line := get("/held")
		defer c.Close()
		if !strings.HasPrefix(line, "HTTP/1.1 200") {
			t.Fatalf("held %d: %q", i, line)
		}
	}
	c, line := get("/third")
	defer c.Close()
	if line != "" {
		t.Fatalf("a connection beyond the cap was served: %q", line)
	}
	if l.Refused() != 1 || l.Open() != 2 {
		t.Fatalf("refused %d open %d, want 1 and 2", l.Refused(), l.Open())
	}
}
