package netpolicy

import "net/netip"

// FloorPrefixes are never reachable from a sandbox, whatever its policy:
// this host and its loopback, link-local and cloud metadata, private and
// shared address space, multicast, broadcast and reserved ranges, and their
// IPv6 counterparts. The sandboxes' own range and the host's addresses are
// added by the network that enforces the floor.
var FloorPrefixes = mustPrefixes(
	"0.0.0.0/8",         // "this" network
	"10.0.0.0/8",        // RFC 1918
	"100.64.0.0/10",     // CGNAT (RFC 6598)
	"127.0.0.0/8",       // loopback
	"169.254.0.0/16",    // link-local, cloud metadata (169.254.169.254)
	"172.16.0.0/12",     // RFC 1918
	"192.0.0.0/24",      // IETF protocol assignments
	"192.168.0.0/16",    // RFC 1918
	"224.0.0.0/4",       // multicast
	"240.0.0.0/4",       // reserved, and broadcast 255.255.255.255
	"::/128", "::1/128", // unspecified, loopback
	"fc00::/7",  // ULA (fd00:ec2::254, the IPv6 metadata address, is in it)
	"fe80::/10", // link-local
	"ff00::/8",  // multicast
)

func mustPrefixes(ss ...string) []netip.Prefix {
	out := make([]netip.Prefix, len(ss))
	for i, s := range ss {
		out[i] = netip.MustParsePrefix(s)
	}
	return out
}

// Floor is the set of destinations no sandbox reaches.
type Floor struct {
	deny []netip.Prefix
	open []netip.Prefix
}

// NewFloor is FloorPrefixes plus extra (the sandboxes' range, the host's
// addresses), less open (private ranges an operator opened by flag).
func NewFloor(extra, open []netip.Prefix) *Floor {
	f := &Floor{open: open}
	f.deny = append(append(f.deny, FloorPrefixes...), extra...)
	return f
}

// Blocks reports whether addr is on the floor.
func (f *Floor) Blocks(addr netip.Addr) bool {
	addr = addr.Unmap()
	if !addr.IsValid() {
		return true
	}
	for _, p := range f.open {
		if p.Contains(addr) {
			return false
		}
	}
	for _, p := range f.deny {
		if p.Contains(addr) {
			return true
		}
	}
	return false
}

// Deny and Open are the floor's ranges (for nftables sets).
func (f *Floor) Deny() []netip.Prefix { return f.deny }
func (f *Floor) Open() []netip.Prefix { return f.open }
