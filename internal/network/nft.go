//go:build linux

package network

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"reflect"
	"sort"
	"strconv"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/spacesandbox/space/internal/netpolicy"
)

// The rules live in one table per instance. New writes it whole in one
// nftables transaction (everything known: recovery is the same code path as
// a start); after that each change touches only its sandbox — its chains and
// its elements of the dispatch maps — in one transaction of its own, so a
// change costs the same with ten sandboxes or a thousand, and no packet ever
// sees a half-written policy. Conntrack state outlives rule changes:
// established connections carry on.
//
// forward (filter):  replies to sandboxes' connections pass; a packet from a
//                    sandbox jumps to its chain e<n> (vmap @egress by link);
//                    anything else from or to a sandbox link is dropped (no
//                    sandbox ↔ sandbox, no unsolicited inbound).
// e<n>:              IPv4 only, its own source address only, out of the
//                    uplink only, the floor; then e<n>p: allow CIDRs, deny
//                    CIDRs, default; every verdict counted (tagged
//                    "allow"/"deny" for metrics).
// input (filter):    i<n> (vmap @input): its own source address only; then
//                    from a sandbox link only DNS and the proxy, after DNAT.
// prerouting (nat):  every DNS query → the resolver; n<n> (vmap @dnat): with
//                    domain rules, ports 80 and 443 → the proxy.
// postrouting (nat): masquerade the range out of the uplink.

func (m *Manager) tableName() string { return "space_" + m.tag }

func (m *Manager) nftTable() *nftables.Table {
	return &nftables.Table{Name: m.tableName(), Family: nftables.TableFamilyINet}
}

// The dispatch maps: a sandbox link's name → a jump to its chain.
func (m *Manager) vmap(t *nftables.Table, name string) *nftables.Set {
	return &nftables.Set{Table: t, Name: name, IsMap: true, KeyType: nftables.TypeIFName, DataType: nftables.TypeVerdict}
}

var dispatchMaps = []struct{ set, prefix string }{{"egress", "e"}, {"input", "i"}, {"dnat", "n"}}

// writeRules replaces the instance's table with the rules for every
// sandbox now known (at New).
func (m *Manager) writeRules() error {
	m.rulesMu.Lock()
	defer m.rulesMu.Unlock()
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
	t := m.nftTable()
	// Counters of the sandboxes' verdicts are carried over the rewrite.
	m.foldCounters(-1)
	// add-delete-add: delete fails on a missing table, add never does.
	c.AddTable(t)
	c.DelTable(t)
	c.AddTable(t)
	accept := nftables.ChainPolicyAccept
	fwd := c.AddChain(&nftables.Chain{Name: "forward", Table: t, Type: nftables.ChainTypeFilter, Hooknum: nftables.ChainHookForward, Priority: nftables.ChainPriorityFilter, Policy: &accept})
	in := c.AddChain(&nftables.Chain{Name: "input", Table: t, Type: nftables.ChainTypeFilter, Hooknum: nftables.ChainHookInput, Priority: nftables.ChainPriorityFilter, Policy: &accept})
	pre := c.AddChain(&nftables.Chain{Name: "prerouting", Table: t, Type: nftables.ChainTypeNAT, Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityNATDest, Policy: &accept})
	post := c.AddChain(&nftables.Chain{Name: "postrouting", Table: t, Type: nftables.ChainTypeNAT, Hooknum: nftables.ChainHookPostrouting, Priority: nftables.ChainPriorityNATSource, Policy: &accept})
	maps := map[string]*nftables.Set{}
	for _, d := range dispatchMaps {
		maps[d.set] = m.vmap(t, d.set)
		if err := c.AddSet(maps[d.set], nil); err != nil {
			return err
		}
	}
	// The sandboxes' chains first: the maps' elements name them.
	for _, s := range sbxs {
		if err := m.sandboxRules(c, t, s, true); err != nil {
			return err
		}
	}

	rule := func(ch *nftables.Chain, exprs ...[]expr.Any) {
		var all []expr.Any
		for _, e := range exprs {
			all = append(all, e...)
		}
		c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: all})
	}
	fromSbx := ifPrefix(expr.MetaKeyIIFNAME, m.linkPrefix())
	toSbx := ifPrefix(expr.MetaKeyOIFNAME, m.linkPrefix())
	dispatch := func(set *nftables.Set) []expr.Any {
		return []expr.Any{&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1},
			&expr.Lookup{SourceRegister: 1, SetName: set.Name, SetID: set.ID, DestRegister: 0, IsDestRegSet: true}}
	}

	// forward
	rule(fwd, fromSbx, ctStateEstablished(), verdict(expr.VerdictAccept))
	rule(fwd, toSbx, ctStateEstablished(), verdict(expr.VerdictAccept))
	rule(fwd, fromSbx, dispatch(maps["egress"]))
	rule(fwd, fromSbx, counter(), verdict(expr.VerdictDrop))
	rule(fwd, toSbx, counter(), verdict(expr.VerdictDrop))

	// input: the resolver and proxy, reached through DNAT only, from the
	// sandbox's own address only (they tell sandboxes apart by it).
	rule(in, fromSbx, dispatch(maps["input"]))
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
	rule(pre, fromSbx, dispatch(maps["dnat"]))
	// postrouting
	if m.cfg.Uplink != "" {
		rule(post, ifName(expr.MetaKeyOIFNAME, m.cfg.Uplink), ipv4(), saddrIn(m.cfg.Range), []expr.Any{&expr.Masq{}})
	}
	if err := c.Flush(); err != nil {
		return err
	}
	for _, s := range sbxs {
		s.wrote()
	}
	return nil
}

// updateRules writes one sandbox's chains (and, the first time, its map
// elements) in one transaction. Chains that hold its policy already (a
// wake attaches again what its suspend kept) are left as they are: a
// transaction costs a wake 5–15 ms.
func (m *Manager) updateRules(s *sbxNet) error {
	m.rulesMu.Lock()
	defer m.rulesMu.Unlock()
	if s.inTable && s.written != nil && reflect.DeepEqual(s.written, s.policy) {
		return nil
	}
	m.foldCounters(s.idx)
	c, err := newNFT()
	if err != nil {
		return err
	}
	if err := m.sandboxRules(c, m.nftTable(), s, !s.inTable); err != nil {
		return err
	}
	if err := c.Flush(); err != nil {
		return err
	}
	s.wrote()
	// Its allocation's file records the policy, which a restart writes
	// again at once (load).
	return m.saveAlloc(s)
}

// removeRules deletes one sandbox's map elements and chains.
func (m *Manager) removeRules(s *sbxNet) error {
	m.rulesMu.Lock()
	defer m.rulesMu.Unlock()
	c, err := newNFT()
	if err != nil {
		return err
	}
	t := m.nftTable()
	key := []nftables.SetElement{{Key: ifBytes(m.linkName(s.idx))}}
	for _, d := range dispatchMaps {
		if err := c.SetDeleteElements(m.vmap(t, d.set), key); err != nil {
			return err
		}
	}
	for _, name := range m.chainNames(s.idx) {
		c.DelChain(&nftables.Chain{Name: name, Table: t})
	}
	if err := c.Flush(); err != nil {
		// Gone already (a retry, or a table rewritten without it).
		if chains, lerr := c.ListChainsOfTableFamily(nftables.TableFamilyINet); lerr == nil {
			for _, ch := range chains {
				if ch.Table.Name == t.Name && ch.Name == fmt.Sprintf("e%d", s.idx) {
					return err
				}
			}
			return nil
		}
		return err
	}
	return nil
}

func (m *Manager) chainNames(idx int) []string {
	return []string{fmt.Sprintf("e%d", idx), fmt.Sprintf("e%dp", idx), fmt.Sprintf("i%d", idx), fmt.Sprintf("n%d", idx)}
}

// sandboxRules adds to c a sandbox's chains with their rules (emptying
// chains that exist) and, with elements, its entries in the dispatch maps.
func (m *Manager) sandboxRules(c *nftables.Conn, t *nftables.Table, s *sbxNet, elements bool) error {
	names := m.chainNames(s.idx)
	chains := make([]*nftables.Chain, len(names))
	for i, name := range names {
		chains[i] = c.AddChain(&nftables.Chain{Name: name, Table: t})
		c.FlushChain(chains[i])
	}
	egress, policy, input, nat := chains[0], chains[1], chains[2], chains[3]
	m.egressRules(c, t, egress, policy, s)
	c.AddRule(&nftables.Rule{Table: t, Chain: input, Exprs: append(saddrNot(m.guestAddr(s.idx)), &expr.Counter{}, &expr.Verdict{Kind: expr.VerdictDrop})})
	if s.policy != nil && s.policy.HasDomains() && (s.policy.Public || len(s.policy.Allow) > 0) {
		for _, p := range []struct{ from, to uint16 }{{80, httpPort}, {443, httpsPort}} {
			var exprs []expr.Any
			for _, e := range [][]expr.Any{ipv4(), l4(unix.IPPROTO_TCP), dport(p.from), dnat(m.gw, p.to)} {
				exprs = append(exprs, e...)
			}
			c.AddRule(&nftables.Rule{Table: t, Chain: nat, Exprs: exprs})
		}
	}
	if !elements {
		return nil
	}
	for i, d := range dispatchMaps {
		ch := []*nftables.Chain{egress, input, nat}[i]
		el := []nftables.SetElement{{Key: ifBytes(m.linkName(s.idx)), VerdictData: &expr.Verdict{Kind: expr.VerdictJump, Chain: ch.Name}}}
		if err := c.SetAddElements(m.vmap(t, d.set), el); err != nil {
			return err
		}
	}
	return nil
}

// egressRules fills a sandbox's chains from its policy. Only a
// connection's first packet gets here (the rest are established), so the
// counters of the verdict rules count connections.
func (m *Manager) egressRules(c *nftables.Conn, t *nftables.Table, ch, pch *nftables.Chain, s *sbxNet) {
	add := func(chain *nftables.Chain, tag string, exprs ...[]expr.Any) {
		var all []expr.Any
		for _, e := range exprs {
			all = append(all, e...)
		}
		c.AddRule(&nftables.Rule{Table: t, Chain: chain, Exprs: all, UserData: []byte(tag)})
	}
	drop, accept := verdict(expr.VerdictDrop), verdict(expr.VerdictAccept)
	add(ch, "deny", notIPv4(), counter(), drop)
	add(ch, "deny", saddrNot(m.guestAddr(s.idx)), counter(), drop)
	if m.cfg.Uplink == "" {
		add(ch, "deny", counter(), drop)
		return
	}
	add(ch, "deny", ifNameNot(expr.MetaKeyOIFNAME, m.cfg.Uplink), counter(), drop)
	// The floor: opened ranges skip it, the rest drop.
	toPolicy := []expr.Any{&expr.Verdict{Kind: expr.VerdictGoto, Chain: pch.Name}}
	for _, p := range m.floor.Open() {
		if p.Addr().Is4() {
			add(ch, "", daddrIn(p), toPolicy)
		}
	}
	for _, p := range m.floor.Deny() {
		if p.Addr().Is4() {
			add(ch, "deny", daddrIn(p), counter(), drop)
		}
	}
	add(ch, "", toPolicy)
	p := s.policy
	if p == nil {
		p, _ = netpolicy.Parse(netpolicy.Default)
	}
	for _, r := range p.Allow {
		if r.Domain == "" && r.Prefix.Addr().Is4() {
			add(pch, "allow", daddrIn(r.Prefix), counter(), accept)
		}
	}
	for _, r := range p.Deny {
		if r.Domain == "" && r.Prefix.Addr().Is4() {
			add(pch, "deny", daddrIn(r.Prefix), counter(), drop)
		}
	}
	if p.Public {
		add(pch, "allow", counter(), accept)
	} else {
		add(pch, "deny", counter(), drop)
	}
}

// foldCounters adds the connection counters of rules about to be replaced
// (sandbox idx's, or every sandbox's for -1) to the sandboxes' totals.
func (m *Manager) foldCounters(idx int) {
	counts := m.readCounters(idx)
	m.mu.Lock()
	defer m.mu.Unlock()
	for i, n := range counts {
		if s := m.byIdx[i]; s != nil {
			s.stats.nftAllowed.Add(n[0])
			s.stats.nftDenied.Add(n[1])
		}
	}
}

// readCounters returns the allowed and denied connections of sandbox idx
// (-1: every sandbox) as the rules now count them, by sandbox index.
func (m *Manager) readCounters(only int) map[int][2]int64 {
	out := map[int][2]int64{}
	c, err := newNFT()
	if err != nil {
		return out
	}
	t := m.nftTable()
	var chains []*nftables.Chain
	if only >= 0 {
		for _, name := range m.chainNames(only)[:2] {
			chains = append(chains, &nftables.Chain{Name: name, Table: t})
		}
	} else {
		all, err := c.ListChainsOfTableFamily(nftables.TableFamilyINet)
		if err != nil {
			return out
		}
		for _, ch := range all {
			if ch.Table.Name == t.Name && strings.HasPrefix(ch.Name, "e") {
				chains = append(chains, ch)
			}
		}
	}
	for _, ch := range chains {
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
	t := m.nftTable()
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
