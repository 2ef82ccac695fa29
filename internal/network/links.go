//go:build linux

package network

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/netip"
	"os"
	"path/filepath"
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
	if isNetns(m.nsPath(id)) {
		if h, err := netns.GetFromName(m.nsName(id)); err == nil {
			return h, nil
		}
	}
	// A file without its namespace is what a kill between the two steps of
	// making one leaves: it goes first.
	if err := removeNetns(m.nsPath(id)); err != nil {
		return 0, fmt.Errorf("remove a half-made network namespace: %w", err)
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
// their addresses. Both kinds get a named network namespace joined to the
// host by a veth pair (the host's end s<tag>x<n>, the sandbox's eth0):
//
//   - NetNamespace (gvisor): eth0 has the sandbox's address and default
//     route; runsc's netstack takes it over;
//   - NetTap (vm): eth0 and a tap device (tap0) are ports of a bridge
//     (br0) and carry no address — the guest has it, one hop from the
//     host's end — and QEMU runs inside the namespace, so a QEMU escape
//     finds no host network either.
//
// starting says the runtime is about to start the sandbox in it (create,
// restore): the sandbox's side is configured then, and left alone
// otherwise — gVisor takes eth0's address and routes off the namespace's
// kernel once it runs (its own netstack answers), and putting them back
// would make that kernel answer in its place.
func (m *Manager) makeLinks(s *sbxNet, starting bool) error {
	name := m.linkName(s.idx)
	if s.kind != runtime.NetNamespace && s.kind != runtime.NetTap {
		return fmt.Errorf("unknown network kind %q", s.kind)
	}
	ns, err := m.ensureNetns(s.id)
	if err != nil {
		return err
	}
	defer ns.Close()
	host, err := netlink.LinkByName(name)
	exists := err == nil
	if exists && !hasEth0(ns) {
		// A host end whose other end is not in this namespace: left by a
		// server of the same range that was killed and whose state is
		// gone (the index was given anew), or the namespace was made
		// anew. It goes, and the pair is made again.
		if err := netlink.LinkDel(host); err != nil {
			return fmt.Errorf("remove stale %s: %w", name, err)
		}
		exists = false
	}
	if !exists || starting {
		if err := m.makeSandboxSide(s, ns, name, exists); err != nil {
			return err
		}
	}
	l, err := netlink.LinkByName(name)
	if err != nil {
		return err
	}
	if err := netlink.AddrReplace(l, &netlink.Addr{IPNet: ipnet(netip.PrefixFrom(m.hostAddr(s.idx), 30))}); err != nil {
		return fmt.Errorf("address %s: %w", name, err)
	}
	// No IPv6 on the host's end: sandboxes get IPv4 only.
	os.WriteFile("/proc/sys/net/ipv6/conf/"+name+"/disable_ipv6", []byte("1"), 0o644)
	return netlink.LinkSetUp(l)
}

// hasEth0 reports whether namespace ns has its eth0.
func hasEth0(ns netns.NsHandle) bool {
	nh, err := netlink.NewHandleAt(ns)
	if err != nil {
		return false
	}
	defer nh.Close()
	_, err = nh.LinkByName("eth0")
	return err == nil
}

// makeSandboxSide makes the veth pair (unless exists) and configures the
// namespace's side. The pair is made under a temporary name and renamed
// once the sandbox's side is done, so a link with the final name is always
// a finished one; a half-made pair (a crash) goes first.
func (m *Manager) makeSandboxSide(s *sbxNet, ns netns.NsHandle, name string, exists bool) error {
	tmp := name + "t"
	if !exists {
		if l, err := netlink.LinkByName(tmp); err == nil {
			netlink.LinkDel(l)
		}
		nh, err := netlink.NewHandleAt(ns)
		if err != nil {
			return fmt.Errorf("netlink in the sandbox namespace: %w", err)
		}
		if l, err := nh.LinkByName("eth0"); err == nil {
			nh.LinkDel(l)
		}
		nh.Close()
		veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: tmp}, PeerName: "eth0", PeerNamespace: netlink.NsFd(int(ns))}
		if err := netlink.LinkAdd(veth); err != nil {
			return fmt.Errorf("add veth %s: %w", name, err)
		}
	}
	// Inside the namespace (a thread of its own: a tap is made in the
	// namespace of the thread that asks).
	err := inThread(func() error {
		if err := netns.Set(ns); err != nil {
			return err
		}
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			return err
		}
		if err := netlink.LinkSetUp(lo); err != nil {
			return err
		}
		eth, err := netlink.LinkByName("eth0")
		if err != nil {
			return fmt.Errorf("the sandbox's eth0: %w", err)
		}
		if s.kind == runtime.NetTap {
			return m.bridgeTap(eth)
		}
		if err := netlink.AddrReplace(eth, &netlink.Addr{IPNet: ipnet(netip.PrefixFrom(m.guestAddr(s.idx), 30))}); err != nil {
			return fmt.Errorf("address eth0: %w", err)
		}
		if err := netlink.LinkSetUp(eth); err != nil {
			return err
		}
		def := &netlink.Route{LinkIndex: eth.Attrs().Index, Gw: m.hostAddr(s.idx).AsSlice(), Dst: ipnet(netip.MustParsePrefix("0.0.0.0/0"))}
		if err := netlink.RouteReplace(def); err != nil {
			return fmt.Errorf("default route in the sandbox: %w", err)
		}
		return nil
	})
	if err != nil {
		return err
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
	return nil
}

// TapName is the tap device a vm sandbox's QEMU opens in its namespace.
const TapName = "tap0"

// bridgeTap makes br0 and the persistent tap0 (unless they exist) and puts
// eth0 and tap0 on the bridge. It runs inside the sandbox's namespace.
func (m *Manager) bridgeTap(eth netlink.Link) error {
	br, err := netlink.LinkByName("br0")
	if err != nil {
		if err := netlink.LinkAdd(&netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: "br0"}}); err != nil && !errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("add bridge: %w", err)
		}
		if br, err = netlink.LinkByName("br0"); err != nil {
			return err
		}
	}
	tap, err := netlink.LinkByName(TapName)
	if err != nil {
		t := &netlink.Tuntap{LinkAttrs: netlink.LinkAttrs{Name: TapName}, Mode: netlink.TUNTAP_MODE_TAP,
			Flags: netlink.TUNTAP_NO_PI | netlink.TUNTAP_VNET_HDR}
		if err := netlink.LinkAdd(t); err != nil && !errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("add tap: %w", err)
		}
		for _, f := range t.Fds {
			f.Close() // persistent: QEMU opens it by name
		}
		if tap, err = netlink.LinkByName(TapName); err != nil {
			return err
		}
	}
	for _, l := range []netlink.Link{eth, tap} {
		if err := netlink.LinkSetMaster(l, br); err != nil {
			return fmt.Errorf("bridge %s: %w", l.Attrs().Name, err)
		}
	}
	for _, l := range []netlink.Link{br, eth, tap} {
		os.WriteFile("/proc/sys/net/ipv6/conf/"+l.Attrs().Name+"/disable_ipv6", []byte("1"), 0o644)
		if err := netlink.LinkSetUp(l); err != nil {
			return fmt.Errorf("%s up: %w", l.Attrs().Name, err)
		}
	}
	return nil
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
	if err := removeNetns(m.nsPath(s.id)); err != nil {
		errs = append(errs, fmt.Errorf("delete network namespace: %w", err))
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
	ents, _ := os.ReadDir(netnsDir)
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), "space-"+m.tag+"-") {
			removeNetns(filepath.Join(netnsDir, e.Name()))
		}
	}
}

// isNetns says whether path is a network namespace's bind mount (not the
// empty file a kill while making one leaves behind).
func isNetns(path string) bool {
	var st unix.Statfs_t
	return unix.Statfs(path, &st) == nil && st.Type == unix.NSFS_MAGIC
}

// netnsDir is where named network namespaces are pinned, as iproute2's
// `ip netns` names them.
const netnsDir = "/run/netns"

// shareNetnsDir makes netnsDir a shared mount point of its own, as `ip
// netns add` does the first time it runs on a host. A namespace pinned in
// the plain directory is hidden when ip later binds the directory onto
// itself: a removal then unmounts only the copy the bind took, the file
// stays busy, and the pin underneath, out of every path's reach, holds the
// namespace and its links until the host reboots. Where the plain directory
// holds namespaces already (pinned by an earlier release, or by another
// program), binding it now would hide them just the same: it is left as it
// is, and the reason returned. Servers starting at once on a host take
// turns (a lock on the directory), so that neither binds over the other's
// pins.
func shareNetnsDir() error {
	if err := os.MkdirAll(netnsDir, 0o755); err != nil {
		return err
	}
	d, err := os.Open(netnsDir)
	if err != nil {
		return err
	}
	defer d.Close()
	if err := unix.Flock(int(d.Fd()), unix.LOCK_EX); err != nil {
		return fmt.Errorf("lock %s: %w", netnsDir, err)
	}
	err = unix.Mount("", netnsDir, "none", unix.MS_SHARED|unix.MS_REC, "")
	if !errors.Is(err, unix.EINVAL) {
		return err // shared already (nil), or a real failure
	}
	ents, _ := os.ReadDir(netnsDir)
	for _, e := range ents {
		if isNetns(filepath.Join(netnsDir, e.Name())) {
			return fmt.Errorf("%s is not a mount point and already pins %s: left as it is (a later `ip netns add` on this host hides such pins)", netnsDir, e.Name())
		}
	}
	if err := unix.Mount(netnsDir, netnsDir, "none", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("bind %s onto itself: %w", netnsDir, err)
	}
	return unix.Mount("", netnsDir, "none", unix.MS_SHARED|unix.MS_REC, "")
}

// removeNetns removes a named network namespace: its bind mount, then its
// file — also a file whose mount was never made (netns.DeleteNamed stops at
// the failed unmount and leaves it).
func removeNetns(path string) error {
	if err := unix.Unmount(path, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return err
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}
