//go:build linux

package network

import (
	"context"
	"net"
	"net/netip"
	"strings"
	"sync"
	"time"

	"github.com/miekg/dns"
)

// The sandbox's resolver. Every DNS query a sandbox sends, to whatever
// server, is redirected here (nftables DNAT). It answers a name only when
// the sandbox's policy allows it (Policy.Name), forwarding allowed queries
// to the upstream resolver; a refused name gets NXDOMAIN. AAAA queries get
// an empty answer (sandboxes have IPv4 only, and an empty answer makes
// clients use IPv4 at once). The addresses it answers are remembered per
// sandbox for the proxy: an allowed domain allows only its own addresses.

type resolver struct {
	m      *Manager
	client *dns.Client
	tcp    *dns.Client
}

func (r *resolver) ServeDNS(w dns.ResponseWriter, req *dns.Msg) {
	src, _ := netip.ParseAddrPort(w.RemoteAddr().String())
	s := r.m.byAddr(src.Addr())
	reply := func(rcode int) {
		msg := new(dns.Msg)
		msg.SetRcode(req, rcode)
		w.WriteMsg(msg)
	}
	if s == nil || len(req.Question) != 1 || req.Opcode != dns.OpcodeQuery {
		reply(dns.RcodeRefused)
		return
	}
	q := req.Question[0]
	name := strings.TrimSuffix(strings.ToLower(q.Name), ".")
	r.m.mu.Lock()
	pol := s.policy
	r.m.mu.Unlock()
	if pol == nil {
		reply(dns.RcodeRefused)
		return
	}
	if v := pol.Name(name); !v.Allow {
		r.m.log.Debug("dns: refused", "sandbox_id", s.id, "name", name, "rule", v.Reason)
		r.m.countDNS(s.id, false)
		reply(dns.RcodeNameError)
		return
	}
	if q.Qtype == dns.TypeAAAA {
		msg := new(dns.Msg)
		msg.SetReply(req)
		w.WriteMsg(msg)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	up := req.Copy()
	resp, _, err := r.client.ExchangeContext(ctx, up, r.m.cfg.DNS)
	if err == nil && resp.Truncated {
		resp, _, err = r.tcp.ExchangeContext(ctx, up, r.m.cfg.DNS)
	}
	if err != nil {
		r.m.log.Debug("dns: upstream failed", "sandbox_id", s.id, "name", name, "err", err)
		reply(dns.RcodeServerFailure)
		return
	}
	r.m.countDNS(s.id, true)
	now := time.Now()
	for _, rr := range resp.Answer {
		if a, ok := rr.(*dns.A); ok {
			if ip, ok := netip.AddrFromSlice(a.A); ok {
				ttl := time.Duration(a.Hdr.Ttl) * time.Second
				s.learned.add(ip.Unmap(), name, now.Add(min(max(ttl, 5*time.Minute), time.Hour)))
			}
		}
	}
	resp.Id = req.Id
	w.WriteMsg(resp)
}

// learned remembers which names the resolver answered an address for.
type learned struct {
	mu sync.Mutex
	m  map[netip.Addr]map[string]time.Time
}

func newLearned() *learned { return &learned{m: map[netip.Addr]map[string]time.Time{}} }

func (l *learned) add(a netip.Addr, name string, until time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	names := l.m[a]
	if names == nil {
		if len(l.m) > 4096 {
			l.pruneLocked(time.Now())
		}
		names = map[string]time.Time{}
		l.m[a] = names
	}
	names[name] = until
}

// has reports whether a was answered for name (and has not expired).
func (l *learned) has(a netip.Addr, name string) bool {
	name = strings.TrimSuffix(strings.ToLower(name), ".")
	l.mu.Lock()
	defer l.mu.Unlock()
	t, ok := l.m[a.Unmap()][name]
	return ok && time.Now().Before(t)
}

func (l *learned) pruneLocked(now time.Time) {
	for a, names := range l.m {
		for n, t := range names {
			if now.After(t) {
				delete(names, n)
			}
		}
		if len(names) == 0 {
			delete(l.m, a)
		}
	}
}

// serveDNS starts the resolver on the gateway address, UDP and TCP.
func (m *Manager) serveDNS() error {
	r := &resolver{m: m, client: &dns.Client{Net: "udp", Timeout: 5 * time.Second}, tcp: &dns.Client{Net: "tcp", Timeout: 5 * time.Second}}
	addr := netip.AddrPortFrom(m.gw, dnsPort).String()
	pc, err := net.ListenPacket("udp", addr)
	if err != nil {
		return err
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		pc.Close()
		return err
	}
	for _, srv := range []*dns.Server{{PacketConn: pc, Handler: r}, {Listener: l, Handler: r}} {
		go srv.ActivateAndServe()
		m.closers = append(m.closers, func() { srv.Shutdown() })
	}
	return nil
}
