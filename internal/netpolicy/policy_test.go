package netpolicy

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/spacesandbox/space/internal/sandbox"
)

func TestParseRule(t *testing.T) {
	good := map[string]string{
		"203.0.113.0/24": "203.0.113.0/24", "203.0.113.7": "203.0.113.7/32", "203.0.113.9/24": "203.0.113.0/24",
		"2001:db8::/32": "2001:db8::/32", "PyPI.org": "pypi.org", "*.GitHub.com": "*.github.com", "files.pythonhosted.org.": "files.pythonhosted.org",
	}
	for in, want := range good {
		r, err := ParseRule(in)
		if err != nil || r.String() != want {
			t.Errorf("ParseRule(%q) = %v, %v; want %s", in, r, err, want)
		}
	}
	for _, bad := range []string{"", "localhost", "*", "*.com.", "a.*.com", "exa mple.com", "-a.com", "a-.com", "fe80::1%eth0", "1.2.3.4/33", "x.123", strings.Repeat("a", 64) + ".com", "http://a.com"} {
		if r, err := ParseRule(bad); err == nil {
			t.Errorf("ParseRule(%q) = %v, want an error", bad, r)
		}
	}
}

func TestMatches(t *testing.T) {
	exact, _ := ParseRule("github.com")
	wild, _ := ParseRule("*.github.com")
	for name, want := range map[string][2]bool{
		"github.com": {true, false}, "api.github.com": {false, true}, "a.b.github.com": {false, true},
		"GITHUB.COM.": {true, false}, "evilgithub.com": {false, false}, "github.com.evil.org": {false, false},
	} {
		if exact.Matches(name) != want[0] || wild.Matches(name) != want[1] {
			t.Errorf("%s: exact %v wild %v, want %v", name, exact.Matches(name), wild.Matches(name), want)
		}
	}
}

func policy(t *testing.T, n sandbox.Network) *Policy {
	t.Helper()
	if err := Normalize(&n, EgressPublic); err != nil {
		t.Fatal(err)
	}
	p, err := Parse(n)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestPrecedence(t *testing.T) {
	a := netip.MustParseAddr
	p := policy(t, sandbox.Network{Egress: "none", Allow: []string{"203.0.113.0/24", "pypi.org"}, Deny: []string{"203.0.113.7", "*.pypi.org"}})
	if !p.IP(a("203.0.113.7")).Allow {
		t.Error("allow must win over deny")
	}
	if p.IP(a("198.51.100.1")).Allow {
		t.Error("egress none must deny what no rule names")
	}
	if !p.Name("pypi.org").Allow || p.Name("files.pypi.org").Allow || p.Name("example.com").Allow {
		t.Error("names")
	}
	resolved := func(addr netip.Addr, host string) bool { return addr == a("198.51.100.10") && host == "pypi.org" }
	if !p.Conn(a("198.51.100.10"), "pypi.org", resolved).Allow {
		t.Error("an allowed name at an address it resolved to")
	}
	if p.Conn(a("198.51.100.11"), "pypi.org", resolved).Allow {
		t.Error("an allowed name at an address it did not resolve to (literal-IP bypass)")
	}
	if p.Conn(a("198.51.100.10"), "198.51.100.10", resolved).Allow {
		t.Error("a literal address as the name")
	}
	if !p.Conn(a("203.0.113.9"), "anything.example", resolved).Allow {
		t.Error("an allowed CIDR whatever the name")
	}
	q := policy(t, sandbox.Network{Deny: []string{"evil.example"}})
	if !q.Public || q.Conn(a("198.51.100.1"), "evil.example", nil).Allow || !q.Conn(a("198.51.100.1"), "good.example", nil).Allow {
		t.Error("public egress with a denied domain")
	}
	if err := Normalize(&sandbox.Network{Egress: "sometimes"}, EgressPublic); err == nil {
		t.Error("bad egress accepted")
	}
	if err := Normalize(&sandbox.Network{Allow: make([]string, MaxRules+1)}, EgressPublic); err == nil {
		t.Error("too many rules accepted")
	}
}

func TestFloor(t *testing.T) {
	f := NewFloor([]netip.Prefix{netip.MustParsePrefix("10.209.0.0/16")}, []netip.Prefix{netip.MustParsePrefix("10.1.2.0/24")})
	for _, s := range []string{"127.0.0.1", "10.0.0.1", "172.16.5.5", "192.168.1.1", "169.254.169.254", "100.64.0.1", "224.0.0.1", "255.255.255.255", "0.0.0.0", "::1", "fd00:ec2::254", "fe80::1", "::ffff:127.0.0.1"} {
		if !f.Blocks(netip.MustParseAddr(s)) {
			t.Errorf("%s is not on the floor", s)
		}
	}
	for _, s := range []string{"203.0.113.1", "8.8.8.8", "10.1.2.3", "2001:db8::1"} {
		if f.Blocks(netip.MustParseAddr(s)) {
			t.Errorf("%s is on the floor", s)
		}
	}
}

// A rule clients send parses to a canonical form that parses to itself.
func FuzzParseRule(f *testing.F) {
	for _, s := range []string{"203.0.113.0/24", "*.github.com", "pypi.org", "::1", "a..b", "*.*.x"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		r, err := ParseRule(s)
		if err != nil {
			return
		}
		again, err := ParseRule(r.String())
		if err != nil || again != r {
			t.Fatalf("%q → %q → %v, %v", s, r.String(), again, err)
		}
	})
}
