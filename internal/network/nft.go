//go:build linux

package network

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"sort"
	"strconv"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/spacesandbox/space/internal/netpolicy"
)

// The rules live in one table per instance, rewritten whole in one
// nftables transaction on every change (add, delete, policy change): the
// kernel swaps the old rules for the new atomically, so no packet ever sees
// a half-written policy, and recovery is the same code path as a change.
// Conntrack state survives the swap: established connections carry on.
//
// forward (filter):  replies to sandboxes' connections pass; a packet from a
//                    sandbox jumps to its chain e<n>; anything else from or to
//                    a sandbox link is dropped (no sandbox ↔ sandbox, no
//                    unsolicited inbound).
// e<n>:              IPv4 only, its own source address only, out of the
//                    uplink only, the floor, allow CIDRs, deny CIDRs, default;
//                    every verdict counted (tagged "allow"/"deny" for metrics).
// input (filter):    from a sandbox link only DNS and the proxy, after DNAT.
// prerouting (nat):  every DNS query → the resolver; with domain rules,
//                    ports 80 and 443 → the proxy.
// postrouting (nat): masquerade the range out of the uplink.

func (m *Manager) tableName() string { return "space_" + m.tag }

// writeRules replaces the instance's table with the rules for every
// sandbox now known.
func (m *Manager) writeRules() error {
	m.mu.Lock()
	sbxs := make([]*sbxNet, 0, len(m.sbx))
	for _, s := range m.sbx {
		sbxs = append(sbxs, s)
	}
	m.mu.Unlock()
	sort.Slice(sbxs, func(i, j int) bool { return sbxs[i].idx < sbxs[j].idx })

	c, err := newNFT()
	if err != nil {
		return err
	}
	t := &nftables.Table{Name: m.tableName(), Family: nftables.TableFamilyINet}
	// add-delete-add: delete fails on a missing table, add never does.
	c.AddTable(t)
	c.DelTable(t)
	c.AddTable(t)
	accept := nftables.ChainPolicyAccept
	fwd := c.AddChain(&nftables.Chain{Name: "forward", Table: t, Type: nftables.ChainTypeFilter, Hooknum: nftables.ChainHookForward, Priority: nftables.ChainPriorityFilter, Policy: &accept})
	in := c.AddChain(&nftables.Chain{Name: "input", Table: t, Type: nftables.ChainTypeFilter, Hooknum: nftables.ChainHookInput, Priority: nftables.ChainPriorityFilter, Policy: &accept})
	pre := c.AddChain(&nftables.Chain{Name: "prerouting", Table: t, Type: nftables.ChainTypeNAT, Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityNATDest, Policy: &accept})
	post := c.AddChain(&nftables.Chain{Name: "postrouting", Table: t, Type: nftables.ChainTypeNAT, Hooknum: nftables.ChainHookPostrouting, Priority: nftables.ChainPriorityNATSource, Policy: &accept})
	// Counters of the sandboxes' verdicts are carried over the rewrite.
	m.foldCounters(c, t)

	rule := func(ch *nftables.Chain, exprs ...[]expr.Any) {
		var all []expr.Any
		for _, e := range exprs {
			all = append(all, e...)
		}
		c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: all})
	}
	fromSbx := ifPrefix(expr.MetaKeyIIFNAME, m.linkPrefix())
	toSbx := ifPrefix(expr.MetaKeyOIFNAME, m.linkPrefix())

	// forward
	rule(fwd, fromSbx, ctStateEstablished(), verdict(expr.VerdictAccept))
	rule(fwd, toSbx, ctStateEstablished(), verdict(expr.VerdictAccept))
	for _, s := range sbxs {
		ch := c.AddChain(&nftables.Chain{Name: fmt.Sprintf("e%d", s.idx), Table: t})
		rule(fwd, ifName(expr.MetaKeyIIFNAME, m.linkName(s.idx)), jump(ch.Name))
		m.egressRules(c, t, ch, s)
	}
	rule(fwd, fromSbx, counter(), verdict(expr.VerdictDrop))
	rule(fwd, toSbx, counter(), verdict(expr.VerdictDrop))

	// input: the resolver and proxy, reached through DNAT only, from the
	// sandbox's own address only (they tell sandboxes apart by it).
	for _, s := range sbxs {
		rule(in, ifName(expr.MetaKeyIIFNAME, m.linkName(s.idx)), saddrNot(m.guestAddr(s.idx)), counter(), verdict(expr.VerdictDrop))
	}
	rule(in, fromSbx, ctStateEstablished(), verdict(expr.VerdictAccept))
	for _, svc := range []struct {
		proto byte
		port  uint16
	}{{unix.IPPROTO_UDP, dnsPort}, {unix.IPPROTO_TCP, dnsPort}, {unix.IPPROTO_TCP, httpPort}, {unix.IPPROTO_TCP, httpsPort}} {
		rule(in, fromSbx, ctStatusDNAT(), ipv4(), daddrIn(netip.PrefixFrom(m.gw, 32)), l4(svc.proto), dport(svc.port), verdict(expr.VerdictAccept))
	}
	rule(in, fromSbx, counter(), verdict(expr.VerdictDrop))

	// prerouting: DNS to the resolver whatever server the sandbox asks.
	for _, proto := range []byte{unix.IPPROTO_UDP, unix.IPPROTO_TCP} {
		rule(pre, fromSbx, ipv4(), l4(proto), dport(53), dnat(m.gw, dnsPort))
	}
	for _, s := range sbxs {
		if s.policy != nil && s.policy.HasDomains() && (s.policy.Public || len(s.policy.Allow) > 0) {
			name := ifName(expr.MetaKeyIIFNAME, m.linkName(s.idx))
			rule(pre, name, ipv4(), l4(unix.IPPROTO_TCP), dport(80), dnat(m.gw, httpPort))
			rule(pre, name, ipv4(), l4(unix.IPPROTO_TCP), dport(443), dnat(m.gw, httpsPort))
		}
	}
	// postrouting
	if m.cfg.Uplink != "" {
		rule(post, ifName(expr.MetaKeyOIFNAME, m.cfg.Uplink), ipv4(), saddrIn(m.cfg.Range), []expr.Any{&expr.Masq{}})
	}
	return c.Flush()
}

// egressRules fills a sandbox's chain from its policy. Only a connection's
// first packet gets here (the rest are established), so the counters of
// the verdict rules count connections.
func (m *Manager) egressRules(c *nftables.Conn, t *nftables.Table, ch *nftables.Chain, s *sbxNet) {
	add := func(tag string, exprs ...[]expr.Any) {
		var all []expr.Any
		for _, e := range exprs {
			all = append(all, e...)
		}
		c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: all, UserData: []byte(tag)})
	}
	drop, accept := verdict(expr.VerdictDrop), verdict(expr.VerdictAccept)
	add("deny", notIPv4(), counter(), drop)
	add("deny", saddrNot(m.guestAddr(s.idx)), counter(), drop)
	if m.cfg.Uplink == "" {
		add("deny", counter(), drop)
		return
	}
	add("deny", ifNameNot(expr.MetaKeyOIFNAME, m.cfg.Uplink), counter(), drop)
	// The policy goes in a chain of its own, e<n>p (the floor's opened
	// ranges skip to it); it must exist before a rule names it.
	pch := c.AddChain(&nftables.Chain{Name: ch.Name + "p", Table: t})
	// The floor: opened ranges skip it, the rest drop.
	for _, p := range m.floor.Open() {
		if p.Addr().Is4() {
			add("", daddrIn(p), []expr.Any{&expr.Verdict{Kind: expr.VerdictGoto, Chain: ch.Name + "p"}})
		}
	}
	for _, p := range m.floor.Deny() {
		if p.Addr().Is4() {
			add("deny", daddrIn(p), counter(), drop)
		}
	}
	add("", []expr.Any{&expr.Verdict{Kind: expr.VerdictGoto, Chain: ch.Name + "p"}})
	padd := func(tag string, exprs ...[]expr.Any) {
		var all []expr.Any
		for _, e := range exprs {
			all = append(all, e...)
		}
		c.AddRule(&nftables.Rule{Table: t, Chain: pch, Exprs: all, UserData: []byte(tag)})
	}
	p := s.policy
	if p == nil {
		p, _ = netpolicy.Parse(netpolicy.Default)
	}
	for _, r := range p.Allow {
		if r.Domain == "" && r.Prefix.Addr().Is4() {
			padd("allow", daddrIn(r.Prefix), counter(), accept)
		}
	}
	for _, r := range p.Deny {
		if r.Domain == "" && r.Prefix.Addr().Is4() {
			padd("deny", daddrIn(r.Prefix), counter(), drop)
		}
	}
	if p.Public {
		padd("allow", counter(), accept)
	} else {
		padd("deny", counter(), drop)
	}
}

// foldCounters adds the connection counters of the rules about to be
// replaced to each sandbox's totals (the rewrite starts them at zero).
func (m *Manager) foldCounters(c *nftables.Conn, t *nftables.Table) {
	counts := m.readCounters()
	m.mu.Lock()
	defer m.mu.Unlock()
	for idx, n := range counts {
		if s := m.byIdx[idx]; s != nil {
			s.stats.nftAllowed.Add(n[0])
			s.stats.nftDenied.Add(n[1])
		}
	}
}

// readCounters returns each sandbox's allowed and denied connections as
// the rules now count them (by sandbox index).
func (m *Manager) readCounters() map[int][2]int64 {
	out := map[int][2]int64{}
	c, err := newNFT()
	if err != nil {
		return out
	}
	t := &nftables.Table{Name: m.tableName(), Family: nftables.TableFamilyINet}
	chains, err := c.ListChainsOfTableFamily(nftables.TableFamilyINet)
	if err != nil {
		return out
	}
	for _, ch := range chains {
		if ch.Table.Name != t.Name || !strings.HasPrefix(ch.Name, "e") {
			continue
		}
		idx, err := strconv.Atoi(strings.TrimSuffix(ch.Name[1:], "p"))
		if err != nil {
			continue
		}
		rules, err := c.GetRules(t, ch)
		if err != nil {
			continue
		}
		n := out[idx]
		for _, r := range rules {
			for _, e := range r.Exprs {
				if ctr, ok := e.(*expr.Counter); ok {
					switch string(r.UserData) {
					case "allow":
						n[0] += int64(ctr.Packets)
					case "deny":
						n[1] += int64(ctr.Packets)
					}
				}
			}
		}
		out[idx] = n
	}
	return out
}

// deleteRules removes the instance's table.
func (m *Manager) deleteRules() error {
	c, err := nftables.New()
	if err != nil {
		return err
	}
	t := &nftables.Table{Name: m.tableName(), Family: nftables.TableFamilyINet}
	c.AddTable(t)
	c.DelTable(t)
	return c.Flush()
}

// newNFT opens an nftables connection whose socket buffers hold the
// answers to a whole rewrite (the kernel answers every message of a batch;
// the default buffer overflows with ENOBUFS at a few sandboxes).
func newNFT() (*nftables.Conn, error) {
	return nftables.New(nftables.WithSockOptions(func(nc *netlink.Conn) error {
		rc, err := nc.SyscallConn()
		if err != nil {
			return err
		}
		var serr error
		err = rc.Control(func(fd uintptr) {
			serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 64<<20)
			if serr == nil {
				serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, 16<<20)
			}
		})
		if err != nil {
			return err
		}
		return serr
	}))
}

// Expression helpers. Register 1 holds what is compared.

func ifPrefix(key expr.MetaKey, prefix string) []expr.Any {
	return []expr.Any{&expr.Meta{Key: key, Register: 1}, &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte(prefix)}}
}

func ifBytes(name string) []byte {
	b := make([]byte, unix.IFNAMSIZ)
	copy(b, name)
	return b
}

func ifName(key expr.MetaKey, name string) []expr.Any {
	return []expr.Any{&expr.Meta{Key: key, Register: 1}, &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: ifBytes(name)}}
}

func ifNameNot(key expr.MetaKey, name string) []expr.Any {
	return []expr.Any{&expr.Meta{Key: key, Register: 1}, &expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: ifBytes(name)}}
}

func ipv4() []expr.Any {
	return []expr.Any{&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1}, &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.NFPROTO_IPV4}}}
}

func notIPv4() []expr.Any {
	return []expr.Any{&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1}, &expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: []byte{unix.NFPROTO_IPV4}}}
}

func addrIn(offset uint32, p netip.Prefix) []expr.Any {
	a := p.Masked().Addr().As4()
	mask := binary.BigEndian.AppendUint32(nil, ^uint32(0)<<(32-p.Bits()))
	if p.Bits() == 0 {
		mask = []byte{0, 0, 0, 0}
	}
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: offset, Len: 4},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: mask, Xor: []byte{0, 0, 0, 0}},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: a[:]},
	}
}

func daddrIn(p netip.Prefix) []expr.Any { return addrIn(16, p) }
func saddrIn(p netip.Prefix) []expr.Any { return addrIn(12, p) }

func saddrNot(a netip.Addr) []expr.Any {
	b := a.As4()
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 12, Len: 4},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: b[:]},
	}
}

func l4(proto byte) []expr.Any {
	return []expr.Any{&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1}, &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{proto}}}
}

func dport(port uint16) []expr.Any {
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binary.BigEndian.AppendUint16(nil, port)},
	}
}

func ctStateEstablished() []expr.Any {
	return []expr.Any{
		&expr.Ct{Register: 1, Key: expr.CtKeySTATE},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
			Mask: binary.NativeEndian.AppendUint32(nil, expr.CtStateBitESTABLISHED|expr.CtStateBitRELATED), Xor: []byte{0, 0, 0, 0}},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: []byte{0, 0, 0, 0}},
	}
}

// ipsDstNAT is IPS_DST_NAT of the conntrack status bits.
const ipsDstNAT = 1 << 5

func ctStatusDNAT() []expr.Any {
	return []expr.Any{
		&expr.Ct{Register: 1, Key: expr.CtKeySTATUS},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: binary.NativeEndian.AppendUint32(nil, ipsDstNAT), Xor: []byte{0, 0, 0, 0}},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: []byte{0, 0, 0, 0}},
	}
}

func dnat(to netip.Addr, port uint16) []expr.Any {
	a := to.As4()
	return []expr.Any{
		&expr.Immediate{Register: 1, Data: a[:]},
		&expr.Immediate{Register: 2, Data: binary.BigEndian.AppendUint16(nil, port)},
		&expr.NAT{Type: expr.NATTypeDestNAT, Family: unix.NFPROTO_IPV4, RegAddrMin: 1, RegProtoMin: 2, Specified: true},
	}
}

func counter() []expr.Any { return []expr.Any{&expr.Counter{}} }

func verdict(k expr.VerdictKind) []expr.Any { return []expr.Any{&expr.Verdict{Kind: k}} }

func jump(chain string) []expr.Any {
	return []expr.Any{&expr.Verdict{Kind: expr.VerdictJump, Chain: chain}}
}
