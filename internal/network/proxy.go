//go:build linux

package network

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/spacesandbox/space/internal/metrics"
)

// The egress proxy. With domain rules, a sandbox's TCP connections to ports
// 80 and 443 are redirected here (nftables DNAT). The proxy reads the first
// request's Host header or the TLS ClientHello's SNI, decides with
// Policy.Conn (the floor first), and on allow dials the original
// destination from the gateway address (so the connection leaves by the
// uplink, masqueraded like the sandbox's own) and splices the two.

// Stats counts a sandbox's egress decisions: proxied connections and DNS
// answers here, the rest by nftables (see readCounters).
type Stats struct {
	ConnsAllowed, ConnsDenied atomic.Int64
	DNSAllowed, DNSDenied     atomic.Int64
	// nftAllowed and nftDenied are connections counted by rules since
	// replaced (see foldCounters).
	nftAllowed, nftDenied atomic.Int64
}

func (m *Manager) stats(id string) *Stats {
	m.mu.Lock()
	defer m.mu.Unlock()
	if s := m.sbx[id]; s != nil {
		return &s.stats
	}
	return &Stats{}
}

func (m *Manager) countDNS(id string, allowed bool) {
	st := m.stats(id)
	if allowed {
		st.DNSAllowed.Add(1)
	} else {
		st.DNSDenied.Add(1)
	}
}

// NetStats reports every sandbox's traffic and decisions (for metrics):
// bytes from its host link's counters, connections from the rules' and
// the proxy's, DNS answers from the resolver's.
func (m *Manager) NetStats() []metrics.NetStat {
	counts := m.readCounters(-1)
	m.mu.Lock()
	sbxs := make([]*sbxNet, 0, len(m.sbx))
	for _, s := range m.sbx {
		sbxs = append(sbxs, s)
	}
	m.mu.Unlock()
	out := make([]metrics.NetStat, 0, len(sbxs))
	for _, s := range sbxs {
		st := metrics.NetStat{SandboxID: s.id,
			ConnsAllowed: s.stats.ConnsAllowed.Load() + s.stats.nftAllowed.Load() + counts[s.idx][0],
			ConnsDenied:  s.stats.ConnsDenied.Load() + s.stats.nftDenied.Load() + counts[s.idx][1],
			DNSAllowed:   s.stats.DNSAllowed.Load(), DNSDenied: s.stats.DNSDenied.Load()}
		if l, err := netlink.LinkByName(m.linkName(s.idx)); err == nil && l.Attrs().Statistics != nil {
			st.BytesOut, st.BytesIn = int64(l.Attrs().Statistics.RxBytes), int64(l.Attrs().Statistics.TxBytes)
		}
		out = append(out, st)
	}
	return out
}

func (m *Manager) serveProxy(port uint16, tls bool) error {
	l, err := net.Listen("tcp", netip.AddrPortFrom(m.gw, port).String())
	if err != nil {
		return err
	}
	m.closers = append(m.closers, func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				if errors.Is(err, net.ErrClosed) {
					return
				}
				time.Sleep(10 * time.Millisecond)
				continue
			}
			go m.proxy(c.(*net.TCPConn), tls)
		}
	}()
	return nil
}

// originalDst is where the sandbox meant to connect before DNAT.
func originalDst(c *net.TCPConn) (netip.AddrPort, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return netip.AddrPort{}, err
	}
	var sa unix.RawSockaddrInet4
	var serr error
	err = rc.Control(func(fd uintptr) {
		size := uint32(unsafe.Sizeof(sa))
		_, _, e := unix.Syscall6(unix.SYS_GETSOCKOPT, fd, unix.SOL_IP, 80 /* SO_ORIGINAL_DST */, uintptr(unsafe.Pointer(&sa)), uintptr(unsafe.Pointer(&size)), 0)
		if e != 0 {
			serr = e
		}
	})
	if err == nil {
		err = serr
	}
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("original destination: %w", err)
	}
	port := uint16(sa.Port>>8) | uint16(sa.Port<<8)
	return netip.AddrPortFrom(netip.AddrFrom4(sa.Addr), port), nil
}

func (m *Manager) proxy(c *net.TCPConn, tls bool) {
	defer c.Close()
	src, _ := netip.ParseAddrPort(c.RemoteAddr().String())
	s := m.byAddr(src.Addr())
	if s == nil {
		return
	}
	dst, err := originalDst(c)
	if err != nil {
		m.log.Debug("proxy: no original destination", "sandbox_id", s.id, "err", err)
		return
	}
	// Read the request's first bytes (bounded in size and time).
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	buf := make([]byte, 0, 4096)
	var host string
	limit := maxHeader
	if tls {
		limit = maxHello
	}
	for {
		if len(buf) == cap(buf) {
			buf = append(buf, make([]byte, 4096)...)[:len(buf)]
		}
		n, rerr := c.Read(buf[len(buf):min(cap(buf), limit)])
		buf = buf[:len(buf)+n]
		if tls {
			host, err = serverName(buf)
		} else {
			host, err = httpHost(buf)
		}
		if err != errNeedMore {
			break
		}
		if rerr != nil || len(buf) >= limit {
			return
		}
	}
	c.SetReadDeadline(time.Time{})
	if err != nil {
		host = "" // not TLS or HTTP: only the address's rules count
	}
	st := m.stats(s.id)
	m.mu.Lock()
	pol := s.policy
	m.mu.Unlock()
	allow, reason := false, "floor"
	if !m.floor.Blocks(dst.Addr()) && pol != nil {
		v := pol.Conn(dst.Addr(), host, s.learned.has)
		allow, reason = v.Allow, v.Reason
	}
	if !allow {
		st.ConnsDenied.Add(1)
		m.log.Debug("proxy: denied", "sandbox_id", s.id, "dst", dst, "host", host, "rule", reason)
		if !tls {
			fmt.Fprintf(c, "HTTP/1.1 403 Forbidden\r\nContent-Type: text/plain\r\nConnection: close\r\n\r\nblocked by the sandbox's network policy (%s)\n", reason)
		}
		return
	}
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: m.gw.AsSlice()}, Timeout: 10 * time.Second}
	up, err := d.Dial("tcp", dst.String())
	if err != nil {
		m.log.Debug("proxy: dial failed", "sandbox_id", s.id, "dst", dst, "err", err)
		return
	}
	defer up.Close()
	st.ConnsAllowed.Add(1)
	if _, err := up.Write(buf); err != nil {
		return
	}
	done := make(chan struct{})
	go func() {
		io.Copy(c, up)
		c.CloseWrite()
		close(done)
	}()
	io.Copy(up, c)
	up.(*net.TCPConn).CloseWrite()
	<-done
}

// serve starts the resolver and both proxies.
func (m *Manager) serve() error {
	if err := m.serveDNS(); err != nil {
		return fmt.Errorf("resolver: %w", err)
	}
	if err := m.serveProxy(httpPort, false); err != nil {
		return fmt.Errorf("http proxy: %w", err)
	}
	if err := m.serveProxy(httpsPort, true); err != nil {
		return fmt.Errorf("tls proxy: %w", err)
	}
	return nil
}
