//go:build linux

package gvisor

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	goruntime "runtime"

	"github.com/vishvananda/netlink"
	nsh "github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/spacesandbox/space/internal/runtime"
)

// bareNet is a bare sandbox's network namespace, laid out as SPACE's
// network lays out a gVisor sandbox's: lo, and eth0 — one end of a veth
// pair — with an address and a default route through the pair's other
// end, so runsc runs it with --network sandbox as it runs SPACE's. The
// other end lives in a second namespace of its own, held by peer: nothing
// the bare sandbox could send reaches the host's network.
type bareNet struct {
	path string // the namespace, bind-mounted: the bundle names it
	peer nsh.NsHandle
	addr netip.Prefix
	gw   netip.Addr
}

// newBareNet makes the namespace at path (a file it creates) with eth0 at
// addr and its peer at gw.
func newBareNet(path string, addr netip.Prefix, gw netip.Addr) (*bareNet, error) {
	n := &bareNet{path: path, peer: -1, addr: addr, gw: gw}
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		return nil, fmt.Errorf("bare network: %w", err)
	}
	errc := make(chan error, 1)
	go func() {
		// The thread moves between namespaces and is never given back:
		// it exits with this goroutine.
		goruntime.LockOSThread()
		errc <- n.make()
	}()
	if err := <-errc; err != nil {
		n.close()
		return nil, fmt.Errorf("bare network: %w", err)
	}
	return n, nil
}

// make runs on a thread of its own: it enters a new namespace for the
// peer, then a new one for the sandbox, pins that one at n.path, adds the
// pair and brings the peer's end up.
func (n *bareNet) make() error {
	peer, err := nsh.New()
	if err != nil {
		return err
	}
	n.peer = peer
	sbx, err := nsh.New()
	if err != nil {
		return err
	}
	defer sbx.Close()
	if err := unix.Mount("/proc/thread-self/ns/net", n.path, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("pin the namespace: %w", err)
	}
	if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "eth0"}, PeerName: "peer0", PeerNamespace: netlink.NsFd(int(peer))}); err != nil {
		return fmt.Errorf("add veth: %w", err)
	}
	if err := nsh.Set(peer); err != nil {
		return err
	}
	l, err := netlink.LinkByName("peer0")
	if err != nil {
		return err
	}
	if err := netlink.AddrReplace(l, &netlink.Addr{IPNet: prefixNet(netip.PrefixFrom(n.gw, n.addr.Bits()))}); err != nil {
		return fmt.Errorf("address the peer: %w", err)
	}
	return netlink.LinkSetUp(l)
}

// configure (re)sets lo and eth0 up, eth0's address and the default route
// before a sandbox starts or is restored in the namespace: runsc takes the
// address off the namespace's kernel when its netstack takes eth0 over,
// and reads the address and routes anew at every start, as it does in a
// SPACE sandbox's namespace, which SPACE's network configures before each.
func (n *bareNet) configure() error {
	ns, err := nsh.GetFromPath(n.path)
	if err != nil {
		return fmt.Errorf("bare network: %w", err)
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return fmt.Errorf("bare network: %w", err)
	}
	defer h.Close()
	up := func(name string) (netlink.Link, error) {
		l, err := h.LinkByName(name)
		if err == nil {
			err = h.LinkSetUp(l)
		}
		return l, err
	}
	if _, err := up("lo"); err != nil {
		return fmt.Errorf("bare network: lo: %w", err)
	}
	eth, err := up("eth0")
	if err == nil {
		err = h.AddrReplace(eth, &netlink.Addr{IPNet: prefixNet(n.addr)})
	}
	if err == nil {
		err = h.RouteReplace(&netlink.Route{LinkIndex: eth.Attrs().Index, Gw: n.gw.AsSlice(), Dst: prefixNet(netip.MustParsePrefix("0.0.0.0/0"))})
	}
	if err != nil {
		return fmt.Errorf("bare network: eth0: %w", err)
	}
	return nil
}

// close lets go of both namespaces (the pair goes with them) and removes
// the pin's file.
func (n *bareNet) close() error {
	if n.peer >= 0 {
		n.peer.Close()
		n.peer = -1
	}
	err := unix.Unmount(n.path, unix.MNT_DETACH)
	if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOENT) {
		err = nil
	}
	if rerr := os.Remove(n.path); rerr != nil && !os.IsNotExist(rerr) {
		err = errors.Join(err, rerr)
	}
	return err
}

func prefixNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

// spec is the namespace as a sandbox's network attachment.
func (n *bareNet) spec() *runtime.Net {
	return &runtime.Net{Kind: runtime.NetNamespace, Netns: n.path, Address: n.addr, Gateway: n.gw}
}
