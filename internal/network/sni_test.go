package network

import (
	"bytes"
	"crypto/tls"
	"net"
	"strings"
	"testing"
	"time"
)

// clientHello captures the ClientHello crypto/tls sends for name.
func clientHello(t testing.TB, name string) []byte {
	t.Helper()
	c1, c2 := net.Pipe()
	go func() {
		tc := tls.Client(c1, &tls.Config{ServerName: name, InsecureSkipVerify: true})
		tc.SetDeadline(time.Now().Add(2 * time.Second))
		tc.Handshake()
		c1.Close()
	}()
	c2.SetDeadline(time.Now().Add(2 * time.Second))
	var buf bytes.Buffer
	b := make([]byte, 4096)
	for {
		n, err := c2.Read(b)
		buf.Write(b[:n])
		if _, e := serverName(buf.Bytes()); e != errNeedMore || err != nil {
			break
		}
	}
	c2.Close()
	return buf.Bytes()
}

func TestServerName(t *testing.T) {
	for _, name := range []string{"pypi.org", "api.github.com", ""} {
		hello := clientHello(t, name)
		got, err := serverName(hello)
		if err != nil || got != name {
			t.Errorf("serverName(hello for %q) = %q, %v", name, got, err)
		}
		// Every prefix asks for more bytes, never a wrong name.
		for i := 0; i < len(hello); i += 7 {
			if got, err := serverName(hello[:i]); err == nil && got != name {
				t.Fatalf("prefix %d: %q", i, got)
			}
		}
	}
	if _, err := serverName([]byte("GET / HTTP/1.1\r\n")); err != errNotTLS {
		t.Errorf("HTTP as TLS: %v", err)
	}
}

func TestHTTPHost(t *testing.T) {
	cases := []struct {
		in, host string
		err      error
	}{
		{"GET / HTTP/1.1\r\nHost: Example.COM:8080\r\nAccept: */*\r\n\r\n", "example.com", nil},
		{"GET / HTTP/1.1\r\nhost: pypi.org.\r\n\r\n", "pypi.org", nil},
		{"GET / HTTP/1.0\r\n\r\n", "", nil},
		{"GET / HTTP/1.1\r\nHost: a.com\r\nHost: b.com\r\n\r\n", "", errNotHTTP},
		{"GET / HTTP/1.1\r\nHost: a.com\r\n", "", errNeedMore},
		{"\x16\x03\x01\x02\x00\x01", "", errNeedMore},
		{strings.Repeat("x", 40), "", errNotHTTP},
		{"GET / SSH-2.0\r\n\r\n", "", errNotHTTP},
		// Found by FuzzHTTPHost: lower-casing non-ASCII grew the name.
		{"GET / HTTP/1.1\r\nHost: \xc8\xba.com\r\n\r\n", "", errNotHTTP},
		{"GET / HTTP/1.1\r\nHost: a\x00b\r\n\r\n", "", errNotHTTP},
		{"GET / HTTP/1.1\r\nHost: [::1]:80\r\n\r\n", "[::1]:80", nil},
	}
	for _, c := range cases {
		host, err := httpHost([]byte(c.in))
		if host != c.host || err != c.err {
			t.Errorf("httpHost(%q) = %q, %v; want %q, %v", c.in, host, err, c.host, c.err)
		}
	}
}

// The parsers read what a sandbox sends: no input may panic or hang, and
// a name, when found, is a plausible one.
func FuzzServerName(f *testing.F) {
	f.Add(clientHello(f, "pypi.org"))
	f.Add([]byte{0x16, 3, 1, 0, 4, 1, 0, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		name, err := serverName(b)
		if err == nil && len(name) > len(b) {
			t.Fatalf("name longer than its input")
		}
	})
}

func FuzzHTTPHost(f *testing.F) {
	f.Add([]byte("GET / HTTP/1.1\r\nHost: example.com\r\n\r\n"))
	f.Add([]byte("CONNECT x:443 HTTP/1.1\r\n\r\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		host, err := httpHost(b)
		if err == nil && len(host) > len(b) {
			t.Fatalf("host longer than its input")
		}
	})
}
