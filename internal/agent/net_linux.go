package agent

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/spacesandbox/space/internal/agent/proto"
)

// writeHosts names localhost and the sandbox's hostname in /etc/hosts, so
// no lookup of either ever leaves the sandbox.
func writeHosts(hostname string) error {
	b := fmt.Sprintf("127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n127.0.1.1\t%s\n", hostname)
	return writeFileAtomic("/etc/hosts", []byte(b), 0o644)
}

func writeFileAtomic(path string, b []byte, mode os.FileMode) error {
	// /etc/resolv.conf may be a symlink a template left (resolvconf,
	// systemd): replace the link itself.
	tmp := path + ".space-tmp"
	if err := os.WriteFile(tmp, b, mode); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// configureNetwork brings lo up and, unless the runtime did (c.Given),
// gives the first other link its address and default route; then points
// the resolver at SPACE's.
func configureNetwork(c proto.NetConfig) error {
	addr, err := netip.ParsePrefix(c.Address)
	if err != nil {
		return fmt.Errorf("address %q: %w", c.Address, err)
	}
	gw, err := netip.ParseAddr(c.Gateway)
	if err != nil {
		return fmt.Errorf("gateway %q: %w", c.Gateway, err)
	}
	dns, err := netip.ParseAddr(c.DNS)
	if err != nil {
		return fmt.Errorf("dns %q: %w", c.DNS, err)
	}
	if !c.Given {
		if err := configureLinks(addr, gw); err != nil {
			return err
		}
	}
	return writeFileAtomic("/etc/resolv.conf", []byte("nameserver "+dns.String()+"\noptions edns0\n"), 0o644)
}

// configureLinks brings lo up and gives the first other link addr and a
// default route via gw, taking off any other address it has. One netlink
// socket serves every look and change (under gVisor each new socket is
// several trapped calls), and a link found as it should be is left alone.
func configureLinks(addr netip.Prefix, gw netip.Addr) error {
	h, err := netlink.NewHandle(unix.NETLINK_ROUTE)
	if err != nil {
		return fmt.Errorf("netlink: %w", err)
	}
	defer h.Close()
	links, err := h.LinkList()
	if err != nil {
		return fmt.Errorf("list links: %w", err)
	}
	var eth netlink.Link
	for _, l := range links {
		if l.Attrs().Flags&net.FlagLoopback != 0 {
			if l.Attrs().Flags&net.FlagUp == 0 {
				if err := h.LinkSetUp(l); err != nil {
					return fmt.Errorf("lo up: %w", err)
				}
			}
			continue
		}
		if eth == nil {
			eth = l
		}
	}
	if eth == nil {
		return errors.New("no network interface")
	}
	have, _ := h.AddrList(eth, unix.AF_INET)
	configured := false
	for _, a := range have {
		if a.IP.Equal(addr.Addr().AsSlice()) {
			configured = true
			continue
		}
		// A copy of another sandbox (a fork, a snapshot) wakes with its
		// source's address: it is not this sandbox's.
		if err := h.AddrDel(eth, &a); err != nil {
			return fmt.Errorf("remove stale address %s: %w", a.IPNet, err)
		}
	}
	if configured {
		return nil
	}
	ipn := &net.IPNet{IP: addr.Addr().AsSlice(), Mask: net.CIDRMask(addr.Bits(), 32)}
	if err := h.AddrReplace(eth, &netlink.Addr{IPNet: ipn}); err != nil {
		return fmt.Errorf("address %s: %w", eth.Attrs().Name, err)
	}
	if err := h.LinkSetUp(eth); err != nil {
		return fmt.Errorf("%s up: %w", eth.Attrs().Name, err)
	}
	def := &netlink.Route{LinkIndex: eth.Attrs().Index, Gw: gw.AsSlice(), Dst: &net.IPNet{IP: net.IPv4zero, Mask: net.CIDRMask(0, 32)}}
	if err := h.RouteReplace(def); err != nil {
		return fmt.Errorf("default route: %w", err)
	}
	return nil
}
