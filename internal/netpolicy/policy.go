// Package netpolicy is the meaning of a sandbox's network policy as pure
// logic: parsing and validating the rules a client gives, and deciding
// whether a destination (an address, and the name the sandbox asked for)
// may be reached. The network package enforces these decisions in
// nftables, the sandbox's resolver and its HTTP/TLS proxy.
//
// Order of precedence, first match wins:
//
//  1. the floor (Floor): loopback, link-local and cloud metadata, RFC 1918,
//     CGNAT, multicast and broadcast, IPv6 ULA and link-local, the host's and
//     other sandboxes' addresses — never reachable, whatever the policy says;
//     only a server flag can open a private range;
//  2. an Allow rule (a CIDR holding the address, or a domain the name
//     matches — and the address was what SPACE's resolver answered for that
//     name, so a literal IP cannot borrow an allowed name);
//  3. a Deny rule (CIDR or domain);
//  4. Egress: "public" allows, "none" denies.
package netpolicy

import (
	"fmt"
	"net/netip"
	"strings"

	"github.com/spacesandbox/space/internal/sandbox"
)

// The egress defaults.
const (
	EgressPublic = "public"
	EgressNone   = "none"
)

// MaxRules bounds each of Allow and Deny.
const MaxRules = 64

// Rule is one allow or deny entry: a prefix or a domain pattern.
type Rule struct {
	Prefix netip.Prefix // valid for a CIDR rule
	// Domain is a lower-case name ("pypi.org", matching only that name) or
	// a wildcard ("*.github.com", matching every name below github.com).
	Domain string
}

func (r Rule) String() string {
	if r.Domain != "" {
		return r.Domain
	}
	return r.Prefix.String()
}

// Matches reports whether a name matches a domain rule.
func (r Rule) Matches(name string) bool {
	if r.Domain == "" || name == "" {
		return false
	}
	name = strings.TrimSuffix(strings.ToLower(name), ".")
	if suffix, ok := strings.CutPrefix(r.Domain, "*"); ok {
		return strings.HasSuffix(name, suffix) && len(name) > len(suffix)
	}
	return name == r.Domain
}

// Policy is a parsed, valid network policy.
type Policy struct {
	Public        bool // egress public
	Allow, Deny   []Rule
	PublicIngress bool
}

// Default is the policy of a sandbox whose record has none.
var Default = sandbox.Network{Egress: EgressNone}

// Normalize fills in defaults (egress from def) and validates n in place;
// each problem is an error naming the field.
func Normalize(n *sandbox.Network, defaultEgress string) error {
	if n.Egress == "" {
		n.Egress = defaultEgress
	}
	if n.Allow == nil {
		n.Allow = []string{}
	}
	if n.Deny == nil {
		n.Deny = []string{}
	}
	_, err := Parse(*n)
	return err
}

// FieldError is a validation failure of one field of a policy.
type FieldError struct {
	Field   string
	Message string
}

func (e *FieldError) Error() string { return e.Field + ": " + e.Message }

// Parse checks n and returns its policy.
func Parse(n sandbox.Network) (*Policy, error) {
	p := &Policy{PublicIngress: n.PublicIngress}
	switch n.Egress {
	case EgressPublic:
		p.Public = true
	case EgressNone:
	default:
		return nil, &FieldError{"network.egress", `must be "public" or "none"`}
	}
	var err error
	if p.Allow, err = parseRules("network.allow", n.Allow); err != nil {
		return nil, err
	}
	if p.Deny, err = parseRules("network.deny", n.Deny); err != nil {
		return nil, err
	}
	return p, nil
}

func parseRules(field string, in []string) ([]Rule, error) {
	if len(in) > MaxRules {
		return nil, &FieldError{field, fmt.Sprintf("at most %d entries", MaxRules)}
	}
	out := make([]Rule, 0, len(in))
	for _, s := range in {
		r, err := ParseRule(s)
		if err != nil {
			return nil, &FieldError{field, err.Error()}
		}
		out = append(out, r)
	}
	return out, nil
}

// ParseRule parses one entry: a CIDR, an address (a /32 or /128), or a
// domain name with an optional leading "*.".
func ParseRule(s string) (Rule, error) {
	if len(s) > 253 || s == "" {
		return Rule{}, fmt.Errorf("%q is not a CIDR, an address or a domain name", clip(s))
	}
	if pfx, err := netip.ParsePrefix(s); err == nil {
		if pfx.Addr().Zone() != "" {
			return Rule{}, fmt.Errorf("%q: zones are not allowed", clip(s))
		}
		return Rule{Prefix: pfx.Masked()}, nil
	}
	if a, err := netip.ParseAddr(s); err == nil {
		if a.Zone() != "" {
			return Rule{}, fmt.Errorf("%q: zones are not allowed", clip(s))
		}
		return Rule{Prefix: netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen())}, nil
	}
	name := strings.TrimSuffix(strings.ToLower(s), ".")
	wild := false
	if rest, ok := strings.CutPrefix(name, "*."); ok {
		name, wild = rest, true
	}
	if !validName(name) {
		return Rule{}, fmt.Errorf("%q is not a CIDR, an address or a domain name (a wildcard is only allowed as a leading \"*.\")", clip(s))
	}
	if wild {
		return Rule{Domain: "*." + name}, nil
	}
	return Rule{Domain: name}, nil
}

// validName accepts a DNS name of at least two labels of letters, digits,
// hyphens and underscores, none longer than 63 bytes or starting or ending
// with a hyphen; the last label is not all digits (that would be an
// address).
func validName(name string) bool {
	labels := strings.Split(name, ".")
	if len(name) == 0 || len(name) > 253 || len(labels) < 2 {
		return false
	}
	for _, l := range labels {
		if len(l) == 0 || len(l) > 63 || l[0] == '-' || l[len(l)-1] == '-' {
			return false
		}
		for i := 0; i < len(l); i++ {
			c := l[i]
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return false
			}
		}
	}
	last := labels[len(labels)-1]
	return strings.Trim(last, "0123456789") != ""
}

func clip(s string) string {
	if len(s) > 64 {
		return s[:64] + "…"
	}
	return s
}

// HasDomains reports whether any rule names a domain (the sandbox's HTTP
// and TLS connections then go through the proxy, which reads the name).
func (p *Policy) HasDomains() bool {
	for _, rs := range [][]Rule{p.Allow, p.Deny} {
		for _, r := range rs {
			if r.Domain != "" {
				return true
			}
		}
	}
	return false
}

// Verdict is a decision and the rule that made it.
type Verdict struct {
	Allow bool
	// Reason names the deciding rule: "allow 203.0.113.0/24",
	// "deny *.example.com", "egress public", "egress none", "floor".
	Reason string
}

// IP decides a connection to addr by the CIDR rules and the default (the
// floor is checked separately). This is what nftables enforces.
func (p *Policy) IP(addr netip.Addr) Verdict {
	addr = addr.Unmap()
	for _, r := range p.Allow {
		if r.Domain == "" && r.Prefix.Contains(addr) {
			return Verdict{true, "allow " + r.String()}
		}
	}
	for _, r := range p.Deny {
		if r.Domain == "" && r.Prefix.Contains(addr) {
			return Verdict{false, "deny " + r.String()}
		}
	}
	return p.byDefault()
}

func (p *Policy) byDefault() Verdict {
	if p.Public {
		return Verdict{true, "egress " + EgressPublic}
	}
	return Verdict{false, "egress " + EgressNone}
}

// Name decides whether the sandbox's resolver answers a query for name.
func (p *Policy) Name(name string) Verdict {
	for _, r := range p.Allow {
		if r.Matches(name) {
			return Verdict{true, "allow " + r.Domain}
		}
	}
	for _, r := range p.Deny {
		if r.Matches(name) {
			return Verdict{false, "deny " + r.Domain}
		}
	}
	return p.byDefault()
}

// Conn decides an HTTP or TLS connection to addr whose request names host
// (the Host header or TLS SNI; "" when there is none). resolved reports
// whether SPACE's resolver answered addr to this sandbox for host: an
// allowed domain only allows the addresses it resolved to.
func (p *Policy) Conn(addr netip.Addr, host string, resolved func(addr netip.Addr, host string) bool) Verdict {
	addr = addr.Unmap()
	if host != "" {
		if _, err := netip.ParseAddr(host); err == nil {
			host = "" // a literal address names no domain
		}
	}
	if host != "" {
		for _, r := range p.Allow {
			if r.Matches(host) {
				if resolved != nil && resolved(addr, host) {
					return Verdict{true, "allow " + r.Domain}
				}
				// The name is allowed but this address is not one it
				// resolved to: only the address's own rules count.
				break
			}
		}
	}
	for _, r := range p.Allow {
		if r.Domain == "" && r.Prefix.Contains(addr) {
			return Verdict{true, "allow " + r.String()}
		}
	}
	if host != "" {
		for _, r := range p.Deny {
			if r.Matches(host) {
				return Verdict{false, "deny " + r.Domain}
			}
		}
	}
	return p.IP(addr)
}
