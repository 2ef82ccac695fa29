//go:build linux

package network

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	goruntime "runtime"
	"strings"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/spacesandbox/space/internal/runtime"
)

// resolveUplink fills in the uplink and its gateway from the host's
// default route where the configuration names none.
func (m *Manager) resolveUplink() error {
	if m.cfg.Uplink != "" && m.cfg.Gateway.IsValid() {
		_, err := netlink.LinkByName(m.cfg.Uplink)
		return err
	}
	routes, err := netlink.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Table: unix.RT_TABLE_MAIN}, netlink.RT_FILTER_TABLE)
	if err != nil {
		return fmt.Errorf("list routes: %w", err)
	}
	for _, r := range routes {
		if r.Dst != nil && r.Dst.IP != nil && !r.Dst.IP.IsUnspecified() {
			continue // not a default route
		}
		l, err := netlink.LinkByIndex(r.LinkIndex)
		if err != nil {
			continue
		}
		if m.cfg.Uplink != "" && l.Attrs().Name != m.cfg.Uplink {
			continue
		}
		m.cfg.Uplink = l.Attrs().Name
		if gw, ok := netip.AddrFromSlice(r.Gw); ok && !m.cfg.Gateway.IsValid() {
			m.cfg.Gateway = gw.Unmap()
		}
		return nil
	}
	if m.cfg.Uplink != "" {
		if _, err := netlink.LinkByName(m.cfg.Uplink); err != nil {
			return fmt.Errorf("uplink %s: %w", m.cfg.Uplink, err)
		}
		return nil // a point-to-point uplink: routes out of the link itself
	}
	return errors.New("the host has no default route and --egress-uplink names no link")
}

// hostResolver is the first nameserver of /etc/resolv.conf.
func hostResolver() string {
	f, err := os.Open("/etc/resolv.conf")
	if err == nil {
		defer f.Close()
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			fs := strings.Fields(sc.Text())
			if len(fs) >= 2 && fs[0] == "nameserver" {
				if a, err := netip.ParseAddr(fs[1]); err == nil {
					return netip.AddrPortFrom(a, 53).String()
				}
			}
		}
	}
	return "127.0.0.1:53"
}

// hostAddrs are the host's own addresses (the floor keeps sandboxes away
// from them even where they are public).
func hostAddrs() []netip.Prefix {
	var out []netip.Prefix
	addrs, _ := net.InterfaceAddrs()
	for _, a := range addrs {
		if ipn, ok := a.(*net.IPNet); ok {
			if ip, ok := netip.AddrFromSlice(ipn.IP); ok {
				ip = ip.Unmap()
				out = append(out, netip.PrefixFrom(ip, ip.BitLen()))
			}
		}
	}
	return out
}

func ipnet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

// setupHost makes the gateway link, turns on forwarding and routes the
// sandbox range's traffic out of the uplink only.
func (m *Manager) setupHost() error {
	if err := os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1"), 0o644); err != nil {
		return fmt.Errorf("enable forwarding: %w", err)
	}
	// The gateway address lives on lo (a dummy link would do, but not
	// every kernel has the module): local, reachable only through the
	// input rules.
	lo, err := netlink.LinkByName("lo")
	if err != nil {
		return err
	}
	if err := netlink.AddrReplace(lo, &netlink.Addr{IPNet: ipnet(netip.PrefixFrom(m.gw, 32))}); err != nil {
		return fmt.Errorf("gateway address: %w", err)
	}
	// Policy routing: traffic from the sandbox range (and the proxy, which
	// dials from the gateway address) uses this instance's table, whose
	// only route is out of the uplink.
	// Traffic to the range (answers of the resolver and proxy, ingress)
	// keeps the main table and its routes to each sandbox link.
	prio := 1000 + m.table%1000
	toRange := netlink.NewRule()
	toRange.Dst, toRange.Table, toRange.Priority = ipnet(m.cfg.Range), unix.RT_TABLE_MAIN, prio
	fromRange := netlink.NewRule()
	fromRange.Src, fromRange.Table, fromRange.Priority = ipnet(m.cfg.Range), m.table, prio+1
	rules, _ := netlink.RuleList(netlink.FAMILY_V4)
	for _, want := range []*netlink.Rule{toRange, fromRange} {
		found := false
		for _, r := range rules {
			found = found || (r.Table == want.Table && r.Priority == want.Priority)
		}
		if !found {
			if err := netlink.RuleAdd(want); err != nil && !errors.Is(err, unix.EEXIST) {
				return fmt.Errorf("add routing rule: %w", err)
			}
		}
	}
	if m.cfg.Uplink == "" {
		return nil
	}
	up, err := netlink.LinkByName(m.cfg.Uplink)
	if err != nil {
		return fmt.Errorf("uplink %s: %w", m.cfg.Uplink, err)
	}
	def := &netlink.Route{LinkIndex: up.Attrs().Index, Table: m.table, Dst: ipnet(netip.MustParsePrefix("0.0.0.0/0"))}
	if m.cfg.Gateway.IsValid() {
		def.Gw = m.cfg.Gateway.AsSlice()
	} else {
		def.Scope = netlink.SCOPE_LINK
	}
	if err := netlink.RouteReplace(def); err != nil {
		return fmt.Errorf("route out of %s: %w", m.cfg.Uplink, err)
	}
	return nil
}

func (m *Manager) teardownHost() {
	m.deleteRules()
	rules, _ := netlink.RuleList(netlink.FAMILY_V4)
	prio := 1000 + m.table%1000
	for _, r := range rules {
		if r.Table == m.table || (r.Table == unix.RT_TABLE_MAIN && r.Priority == prio) {
			netlink.RuleDel(&r)
		}
	}
	routes, _ := netlink.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Table: m.table}, netlink.RT_FILTER_TABLE)
	for _, r := range routes {
		netlink.RouteDel(&r)
	}
	if lo, err := netlink.LinkByName("lo"); err == nil {
		netlink.AddrDel(lo, &netlink.Addr{IPNet: ipnet(netip.PrefixFrom(m.gw, 32))})
	}
}

// inThread runs fn on a locked OS thread that is thrown away afterwards, so
// a namespace switch in fn never leaks to other goroutines.
func inThread(fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		goruntime.LockOSThread() // never unlocked: the thread exits with us
		errc <- fn()
	}()
	return <-errc
}

// ensureNetns makes the sandbox's named network namespace unless it exists.
func (m *Manager) ensureNetns(id string) (netns.NsHandle, error) {
	if h, err := netns.GetFromName(m.nsName(id)); err == nil {
		return h, nil
	}
	err := inThread(func() error {
		h, err := netns.NewNamed(m.nsName(id))
		if err == nil {
			h.Close()
		}
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("make network namespace: %w", err)
	}
	return netns.GetFromName(m.nsName(id))
}

// makeLinks makes whatever of the sandbox's links is missing and sets
// their addresses. starting says the runtime is about to start the sandbox
// in it (create, restore): the sandbox's side is configured then, and left
// alone otherwise — gVisor takes eth0's address and routes off the
// namespace's kernel once it runs (its own netstack answers), and putting
// them back would make that kernel answer in its place.
func (m *Manager) makeLinks(s *sbxNet, starting bool) error {
	name := m.linkName(s.idx)
	hostPfx := netip.PrefixFrom(m.hostAddr(s.idx), 30)
	switch s.kind {
	case runtime.NetNamespace:
		ns, err := m.ensureNetns(s.id)
		if err != nil {
			return err
		}
		defer ns.Close()
		nh, err := netlink.NewHandleAt(ns)
		if err != nil {
			return fmt.Errorf("netlink in the sandbox namespace: %w", err)
		}
		defer nh.Close()
		_, err = netlink.LinkByName(name)
		exists := err == nil
		if exists && !starting {
			break
		}
		// The pair is made under a temporary name and renamed once the
		// sandbox's side is configured, so a link with the final name is
		// always a finished one. A half-made pair (a crash) goes first.
		tmp := name + "t"
		if !exists {
			if l, err := netlink.LinkByName(tmp); err == nil {
				netlink.LinkDel(l)
			}
			if l, err := nh.LinkByName("eth0"); err == nil {
				nh.LinkDel(l)
			}
			veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: tmp}, PeerName: "eth0", PeerNamespace: netlink.NsFd(int(ns))}
			if err := netlink.LinkAdd(veth); err != nil {
				return fmt.Errorf("add veth %s: %w", name, err)
			}
		}
		lo, err := nh.LinkByName("lo")
		if err != nil {
			return err
		}
		if err := nh.LinkSetUp(lo); err != nil {
			return err
		}
		eth, err := nh.LinkByName("eth0")
		if err != nil {
			return fmt.Errorf("the sandbox's eth0: %w", err)
		}
		if err := nh.AddrReplace(eth, &netlink.Addr{IPNet: ipnet(netip.PrefixFrom(m.guestAddr(s.idx), 30))}); err != nil {
			return fmt.Errorf("address eth0: %w", err)
		}
		if err := nh.LinkSetUp(eth); err != nil {
			return err
		}
		def := &netlink.Route{LinkIndex: eth.Attrs().Index, Gw: m.hostAddr(s.idx).AsSlice(), Dst: ipnet(netip.MustParsePrefix("0.0.0.0/0"))}
		if err := nh.RouteReplace(def); err != nil {
			return fmt.Errorf("default route in the sandbox: %w", err)
		}
		if !exists {
			hl, err := netlink.LinkByName(tmp)
			if err != nil {
				return err
			}
			if err := netlink.LinkSetName(hl, name); err != nil {
				return fmt.Errorf("name veth %s: %w", name, err)
			}
		}
	case runtime.NetTap:
		if _, err := netlink.LinkByName(name); err != nil {
			tap := &netlink.Tuntap{LinkAttrs: netlink.LinkAttrs{Name: name}, Mode: netlink.TUNTAP_MODE_TAP,
				Flags: netlink.TUNTAP_NO_PI | netlink.TUNTAP_VNET_HDR}
			if err := netlink.LinkAdd(tap); err != nil && !errors.Is(err, unix.EEXIST) {
				return fmt.Errorf("add tap %s: %w", name, err)
			}
			for _, f := range tap.Fds {
				f.Close() // persistent: QEMU opens it by name
			}
		}
	default:
		return fmt.Errorf("unknown network kind %q", s.kind)
	}
	l, err := netlink.LinkByName(name)
	if err != nil {
		return err
	}
	if err := netlink.AddrReplace(l, &netlink.Addr{IPNet: ipnet(hostPfx)}); err != nil {
		return fmt.Errorf("address %s: %w", name, err)
	}
	// No IPv6 on the host's end: sandboxes get IPv4 only.
	os.WriteFile("/proc/sys/net/ipv6/conf/"+name+"/disable_ipv6", []byte("1"), 0o644)
	return netlink.LinkSetUp(l)
}

// removeLinks deletes the sandbox's host link (a veth's peer goes with it)
// and its namespace.
func (m *Manager) removeLinks(s *sbxNet) error {
	var errs []error
	if l, err := netlink.LinkByName(m.linkName(s.idx)); err == nil {
		if err := netlink.LinkDel(l); err != nil {
			errs = append(errs, fmt.Errorf("delete %s: %w", m.linkName(s.idx), err))
		}
	}
	if _, err := os.Stat(m.nsPath(s.id)); err == nil {
		if err := netns.DeleteNamed(m.nsName(s.id)); err != nil {
			errs = append(errs, fmt.Errorf("delete network namespace: %w", err))
		}
	}
	return errors.Join(errs...)
}

// removeAllLinks deletes every sandbox link and namespace of this
// instance, known or not.
func (m *Manager) removeAllLinks() {
	links, _ := netlink.LinkList()
	for _, l := range links {
		if strings.HasPrefix(l.Attrs().Name, m.linkPrefix()) {
			netlink.LinkDel(l)
		}
	}
	ents, _ := os.ReadDir("/run/netns")
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), "space-"+m.tag+"-") {
			netns.DeleteNamed(e.Name())
		}
	}
}
