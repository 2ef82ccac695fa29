package network

import (
	"bytes"
	"errors"
	"net/textproto"
	"strings"
)

// Parsers of the first bytes of a sandbox's connection: the server name of
// a TLS ClientHello and the Host of an HTTP/1 request. Both read untrusted
// bytes and are fuzzed (FuzzServerName, FuzzHTTPHost).

var (
	errNeedMore = errors.New("need more bytes")
	errNotTLS   = errors.New("not a TLS ClientHello")
	errNotHTTP  = errors.New("not an HTTP/1 request")
)

// maxHello bounds what is read before the decision: one TLS record.
const maxHello = 5 + 16384

// serverName returns the SNI host name of a ClientHello in b ("" when it
// has none), errNeedMore when b holds less than the first record.
func serverName(b []byte) (string, error) {
	if len(b) < 5 {
		return "", errNeedMore
	}
	if b[0] != 0x16 || b[1] != 3 {
		return "", errNotTLS
	}
	n := int(b[3])<<8 | int(b[4])
	if n > 16384 {
		return "", errNotTLS
	}
	if len(b) < 5+n {
		return "", errNeedMore
	}
	p := b[5 : 5+n]
	// Handshake header: type client_hello, 24-bit length (the hello may
	// continue in a further record; the SNI is almost always in the first,
	// and a name past it is treated as none).
	if len(p) < 4 || p[0] != 1 {
		return "", errNotTLS
	}
	p = p[4:]
	skip := func(n int) bool {
		if len(p) < n {
			return false
		}
		p = p[n:]
		return true
	}
	vec := func(lenBytes int) ([]byte, bool) {
		if len(p) < lenBytes {
			return nil, false
		}
		n := 0
		for i := 0; i < lenBytes; i++ {
			n = n<<8 | int(p[i])
		}
		p = p[lenBytes:]
		if len(p) < n {
			return nil, false
		}
		v := p[:n]
		p = p[n:]
		return v, true
	}
	if !skip(2 + 32) { // version, random
		return "", nil
	}
	if _, ok := vec(1); !ok { // session id
		return "", nil
	}
	if _, ok := vec(2); !ok { // cipher suites
		return "", nil
	}
	if _, ok := vec(1); !ok { // compression methods
		return "", nil
	}
	exts, ok := vec(2)
	if !ok {
		return "", nil
	}
	p = exts
	for len(p) >= 4 {
		typ := int(p[0])<<8 | int(p[1])
		p = p[2:]
		data, ok := vec(2)
		if !ok {
			return "", nil
		}
		if typ != 0 { // server_name
			continue
		}
		p = data
		list, ok := vec(2)
		if !ok {
			return "", nil
		}
		p = list
		for len(p) >= 3 {
			nameType := p[0]
			p = p[1:]
			name, ok := vec(2)
			if !ok {
				return "", nil
			}
			if nameType == 0 {
				if h, ok := hostName(string(name)); ok {
					return h, nil
				}
				return "", errNotTLS
			}
		}
		return "", nil
	}
	return "", nil
}

// maxHeader bounds an HTTP request head read before the decision.
const maxHeader = 16 << 10

// httpHost returns the Host of the HTTP/1 request head in b (without a
// port), errNeedMore until the head is complete.
func httpHost(b []byte) (string, error) {
	end := bytes.Index(b, []byte("\r\n\r\n"))
	if end < 0 {
		if len(b) >= maxHeader {
			return "", errNotHTTP
		}
		// Reject early what cannot be a request line.
		if i := bytes.IndexByte(b, ' '); i == 0 || (i < 0 && len(b) > 32) {
			return "", errNotHTTP
		}
		return "", errNeedMore
	}
	lines := strings.Split(string(b[:end]), "\r\n")
	if f := strings.Fields(lines[0]); len(f) != 3 || !strings.HasPrefix(f[2], "HTTP/1.") {
		return "", errNotHTTP
	}
	host := ""
	for _, l := range lines[1:] {
		k, v, ok := strings.Cut(l, ":")
		if !ok {
			return "", errNotHTTP
		}
		if textproto.CanonicalMIMEHeaderKey(strings.TrimSpace(k)) == "Host" {
			if host != "" {
				return "", errNotHTTP // two Host headers: ambiguous
			}
			host = strings.TrimSpace(v)
		}
	}
	if h, _, ok := strings.Cut(host, ":"); ok && !strings.HasPrefix(host, "[") {
		host = h
	}
	h, ok := hostName(strings.TrimSuffix(host, "."))
	if !ok {
		return "", errNotHTTP
	}
	return h, nil
}

// hostName lower-cases s when it can be a DNS name or an address literal
// (ASCII letters, digits and "-._:[]" only); anything else is refused
// rather than matched against a policy's names.
func hostName(s string) (string, bool) {
	b := []byte(s)
	for i, c := range b {
		switch {
		case 'A' <= c && c <= 'Z':
			b[i] = c + 'a' - 'A'
		case 'a' <= c && c <= 'z', '0' <= c && c <= '9', strings.IndexByte("-._:[]", c) >= 0:
		default:
			return "", false
		}
	}
	return string(b), true
}
