//go:build linux

// Package network gives sandboxes their network: an address per sandbox in
// a private range, a network namespace joined to the host by a veth (gvisor
// runs its netstack on it; vm bridges it to a tap QEMU opens inside the
// namespace), NAT out of one uplink, and the sandbox's policy enforced in three
// places — nftables (addresses: the floor, CIDR rules, the default), SPACE's
// own resolver (names) and a proxy for HTTP and TLS that reads the Host
// header or SNI (domain rules on ports 80 and 443). Nothing here shells out:
// links and routes are made over netlink, rules with nftables' netlink API.
//
// The host side, per server instance (its sandbox range names it):
//
//	<range>.1/32   the gateway address, on lo: the resolver and the proxy
//	               listen there
//	s<tag>x<n>     the host's end of each sandbox's veth, <host>/30; the other
//	               end is eth0 in the sandbox's namespace (space-<tag>-<id>),
//	               bridged to a tap there for vm sandboxes
//	table inet space_<tag>   forward/input filters, DNAT to resolver and proxy, masquerade
//	ip rule from <range> lookup <table>: sandboxes route out the uplink only
//
// Sandbox n owns the /30 at range+4n: .1 is the host's end, .2 the sandbox.
package network

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"github.com/spacesandbox/space/internal/netpolicy"
	"github.com/spacesandbox/space/internal/runtime"
	"github.com/spacesandbox/space/internal/sandbox"
)

// Config configures the sandbox network.
type Config struct {
	// Range is the sandboxes' address range (default 10.209.0.0/16).
	Range netip.Prefix
	// Uplink is the link sandbox traffic leaves by ("" : the host's
	// default route's); Gateway the next hop on it (default: the default
	// route's gateway through Uplink, if any).
	Uplink  string
	Gateway netip.Addr
	// DNS is the upstream resolver (ADDR:PORT; default: the first
	// nameserver of /etc/resolv.conf).
	DNS string
	// OpenPrivate are private ranges the floor lets sandboxes reach.
	OpenPrivate []netip.Prefix
	// StateDir keeps each sandbox's address allocation.
	StateDir string
	Logger   *slog.Logger
}

// DefaultRange is the sandboxes' address range unless configured.
var DefaultRange = netip.MustParsePrefix("10.209.0.0/16")

// Ports the resolver and proxy listen on at the gateway address.
const (
	dnsPort   = 10053
	httpPort  = 10080
	httpsPort = 10443
)

// Manager owns every sandbox's network on this host.
type Manager struct {
	cfg     Config
	log     *slog.Logger
	tag     string // names this instance's links and table
	table   int    // its routing table
	gw      netip.Addr
	floor   *netpolicy.Floor
	uplinks string // why egress may not work, for readyz-like reporting

	mu  sync.Mutex
	sbx map[string]*sbxNet // by sandbox id
	// rulesMu serialises nftables transactions.
	rulesMu sync.Mutex
	byIdx   map[int]*sbxNet

	closers []func()
}

// sbxNet is one sandbox's network.
type sbxNet struct {
	id     string
	idx    int
	kind   runtime.NetKind
	policy *netpolicy.Policy
	given  sandbox.Network // policy as given
	// learned maps an address the resolver answered this sandbox to the
	// names it answered it for (for the proxy's domain rules).
	learned *learned
	stats   Stats
	// inTable says its elements are in the dispatch maps.
	inTable bool
	// written is the policy its chains hold (nil: not written yet), and
	// writtenAs that policy as given (kept in its allocation's file).
	written   *netpolicy.Policy
	writtenAs *sandbox.Network
}

// wrote records that its chains and map elements now hold its policy (a
// copy of it as given: Apply replaces the sandbox's own).
func (s *sbxNet) wrote() {
	given := s.given
	s.inTable, s.written, s.writtenAs = true, s.policy, &given
}

// New sets up the host side and starts the resolver and proxy. It needs
// root (CAP_NET_ADMIN).
func New(ctx context.Context, cfg Config) (*Manager, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if !cfg.Range.IsValid() {
		cfg.Range = DefaultRange
	}
	cfg.Range = cfg.Range.Masked()
	if !cfg.Range.Addr().Is4() || cfg.Range.Bits() > 24 || cfg.Range.Bits() < 8 {
		return nil, fmt.Errorf("network: sandbox range %s must be IPv4, /8 to /24", cfg.Range)
	}
	if cfg.StateDir == "" {
		return nil, errors.New("network: no state directory")
	}
	if err := os.MkdirAll(cfg.StateDir, 0o700); err != nil {
		return nil, fmt.Errorf("network: %w", err)
	}
	h := fnv.New32a()
	h.Write([]byte(cfg.Range.String()))
	sum := h.Sum32()
	m := &Manager{
		cfg: cfg, log: cfg.Logger,
		tag:   fmt.Sprintf("%04x", sum&0xffff),
		table: 10000 + int(sum%50000),
		gw:    cfg.Range.Addr().Next(),
		sbx:   map[string]*sbxNet{}, byIdx: map[int]*sbxNet{},
	}
	if err := m.resolveUplink(); err != nil {
		m.log.Warn("network: sandboxes have no egress", "err", err)
		m.uplinks = err.Error()
	}
	if cfg.DNS == "" {
		m.cfg.DNS = hostResolver()
	}
	if err := shareNetnsDir(); err != nil {
		m.log.Warn("network: named network namespaces stay in a plain directory", "err", err)
	}
	m.floor = netpolicy.NewFloor(append([]netip.Prefix{cfg.Range}, hostAddrs()...), cfg.OpenPrivate)
	if err := m.load(); err != nil {
		return nil, err
	}
	if err := m.setupHost(); err != nil {
		return nil, fmt.Errorf("network: host setup: %w", err)
	}
	if err := m.writeRules(); err != nil {
		return nil, fmt.Errorf("network: rules: %w", err)
	}
	if err := m.serve(); err != nil {
		m.Close()
		return nil, fmt.Errorf("network: %w", err)
	}
	m.log.Info("network ready", "range", cfg.Range, "uplink", m.cfg.Uplink, "gateway", m.cfg.Gateway, "dns", m.cfg.DNS, "tag", m.tag)
	return m, nil
}

// Close stops the resolver and proxy. Links, namespaces and rules stay:
// running sandboxes keep their network across a server restart, and the
// next New re-adopts them.
func (m *Manager) Close() {
	for _, c := range m.closers {
		c()
	}
	m.closers = nil
}

// Destroy removes the host side (rules, gateway link, routing) and every
// sandbox network this instance made. For tests and uninstall.
func (m *Manager) Destroy() {
	m.Close()
	m.mu.Lock()
	ids := make([]string, 0, len(m.sbx))
	for id := range m.sbx {
		ids = append(ids, id)
	}
	m.mu.Unlock()
	for _, id := range ids {
		m.Detach(context.Background(), id)
	}
	m.teardownHost()
}

// Range is the sandboxes' address range.
func (m *Manager) Range() netip.Prefix { return m.cfg.Range }

// Egress says where sandbox traffic goes out, or why it cannot.
func (m *Manager) Egress() string {
	if m.uplinks != "" {
		return "no egress: " + m.uplinks
	}
	return fmt.Sprintf("uplink %s via %s, resolver %s", m.cfg.Uplink, m.cfg.Gateway, m.cfg.DNS)
}

func (m *Manager) prefixOf(idx int) netip.Prefix {
	a := m.cfg.Range.Addr().As4()
	base := uint32(a[0])<<24 | uint32(a[1])<<16 | uint32(a[2])<<8 | uint32(a[3])
	base += uint32(idx) * 4
	return netip.PrefixFrom(netip.AddrFrom4([4]byte{byte(base >> 24), byte(base >> 16), byte(base >> 8), byte(base)}), 30)
}

func (m *Manager) hostAddr(idx int) netip.Addr  { return m.prefixOf(idx).Addr().Next() }
func (m *Manager) guestAddr(idx int) netip.Addr { return m.prefixOf(idx).Addr().Next().Next() }
func (m *Manager) linkName(idx int) string      { return "s" + m.tag + "x" + strconv.Itoa(idx) }
func (m *Manager) linkPrefix() string           { return "s" + m.tag + "x" }
func (m *Manager) nsName(id string) string      { return "space-" + m.tag + "-" + id }
func (m *Manager) nsPath(id string) string      { return filepath.Join(netnsDir, m.nsName(id)) }
func (m *Manager) capacity() int                { return 1 << (32 - m.cfg.Range.Bits()) / 4 }

// byAddr finds the sandbox that owns a source address.
func (m *Manager) byAddr(a netip.Addr) *sbxNet {
	a = a.Unmap()
	if !m.cfg.Range.Contains(a) {
		return nil
	}
	b := a.As4()
	r := m.cfg.Range.Addr().As4()
	off := (uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])) -
		(uint32(r[0])<<24 | uint32(r[1])<<16 | uint32(r[2])<<8 | uint32(r[3]))
	idx := int(off / 4)
	if a != m.guestAddr(idx) {
		return nil
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.byIdx[idx]
}

func (m *Manager) attachment(s *sbxNet) *runtime.Net {
	n := &runtime.Net{Kind: s.kind, Address: netip.PrefixFrom(m.guestAddr(s.idx), 30), Gateway: m.hostAddr(s.idx), DNS: m.gw}
	n.Netns = m.nsPath(s.id)
	if s.kind == runtime.NetTap {
		n.Tap = TapName
	}
	return n
}

// Lookup returns a sandbox's attachment (nil when it has no network).
func (m *Manager) Lookup(id string) *runtime.Net {
	m.mu.Lock()
	defer m.mu.Unlock()
	if s := m.sbx[id]; s != nil {
		return m.attachment(s)
	}
	return nil
}

// Attach makes (or finds, or repairs) a sandbox's network of the given
// kind with policy pol, and returns how to plug it in. starting says the
// runtime is about to start the sandbox in it (create, restore) rather than
// re-adopt a sandbox that runs. Idempotent: after a crash or a host reboot
// it makes whatever is missing.
func (m *Manager) Attach(ctx context.Context, id string, kind runtime.NetKind, pol sandbox.Network, starting bool) (*runtime.Net, error) {
	p, err := netpolicy.Parse(pol)
	if err != nil {
		return nil, err
	}
	m.mu.Lock()
	s := m.sbx[id]
	if s == nil {
		idx := -1
		for i := 1; i < m.capacity(); i++ {
			if m.byIdx[i] == nil {
				idx = i
				break
			}
		}
		if idx < 0 {
			m.mu.Unlock()
			return nil, fmt.Errorf("network: all %d sandbox addresses of %s are in use", m.capacity()-1, m.cfg.Range)
		}
		s = &sbxNet{id: id, idx: idx, kind: kind, learned: newLearned()}
		if err := m.saveAlloc(s); err != nil {
			m.mu.Unlock()
			return nil, err
		}
		m.sbx[id], m.byIdx[idx] = s, s
	}
	s.policy, s.given = p, pol
	s.kind = kind
	m.mu.Unlock()
	if err := m.makeLinks(s, starting); err != nil {
		return nil, fmt.Errorf("network of %s: %w", id, err)
	}
	if err := m.updateRules(s); err != nil {
		return nil, fmt.Errorf("network rules of %s: %w", id, err)
	}
	return m.attachment(s), nil
}

// Apply changes a sandbox's policy; new connections follow it at once.
func (m *Manager) Apply(ctx context.Context, id string, pol sandbox.Network) error {
	p, err := netpolicy.Parse(pol)
	if err != nil {
		return err
	}
	m.mu.Lock()
	s := m.sbx[id]
	if s != nil {
		s.policy, s.given = p, pol
	}
	m.mu.Unlock()
	if s == nil {
		return nil // no network yet: Attach applies it
	}
	return m.updateRules(s)
}

// Detach removes a sandbox's network: links, namespace, rules, resolver
// state and allocation. Absent is success.
func (m *Manager) Detach(ctx context.Context, id string) error {
	m.mu.Lock()
	s := m.sbx[id]
	m.mu.Unlock()
	if s == nil {
		return nil
	}
	var errs []error
	if err := m.removeLinks(s); err != nil {
		errs = append(errs, err)
	}
	if err := m.removeRules(s); err != nil {
		errs = append(errs, err)
	}
	m.mu.Lock()
	delete(m.sbx, id)
	delete(m.byIdx, s.idx)
	m.mu.Unlock()
	if err := os.Remove(filepath.Join(m.cfg.StateDir, id)); err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// Known lists the sandboxes that have a network here.
func (m *Manager) Known() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]string, 0, len(m.sbx))
	for id := range m.sbx {
		out = append(out, id)
	}
	return out
}

// Dial connects to a port of a sandbox from the host (ingress).
func (m *Manager) Dial(ctx context.Context, id string, port int) (net.Conn, error) {
	m.mu.Lock()
	s := m.sbx[id]
	m.mu.Unlock()
	if s == nil {
		return nil, errors.New("sandbox has no network")
	}
	var d net.Dialer
	return d.DialContext(ctx, "tcp", netip.AddrPortFrom(m.guestAddr(s.idx), uint16(port)).String())
}

// saveAlloc records a sandbox's address index and kind (atomically).
func (m *Manager) saveAlloc(s *sbxNet) error {
	p := filepath.Join(m.cfg.StateDir, s.id)
	tmp := p + ".tmp"
	rec := fmt.Sprintf("%d %s\n", s.idx, s.kind)
	if s.writtenAs != nil {
		b, err := json.Marshal(s.writtenAs)
		if err != nil {
			return fmt.Errorf("network: record policy: %w", err)
		}
		rec += string(b) + "\n"
	}
	if err := os.WriteFile(tmp, []byte(rec), 0o600); err != nil {
		return fmt.Errorf("network: record allocation: %w", err)
	}
	return os.Rename(tmp, p)
}

// load reads the allocations of a previous run: index, kind and the policy
// the sandbox's chains held, which the rules New writes give it again, so a
// running sandbox's new connections follow its own policy across a restart
// (the engine's Attach at recovery then finds it in force). One recorded
// without a policy (by a release before that, or before its rules were
// first written) is held to egress none until that Attach.
func (m *Manager) load() error {
	ents, err := os.ReadDir(m.cfg.StateDir)
	if err != nil {
		return err
	}
	none, _ := netpolicy.Parse(netpolicy.Default)
	for _, e := range ents {
		if strings.HasSuffix(e.Name(), ".tmp") {
			os.Remove(filepath.Join(m.cfg.StateDir, e.Name()))
			continue
		}
		b, err := os.ReadFile(filepath.Join(m.cfg.StateDir, e.Name()))
		if err != nil {
			continue
		}
		first, rest, _ := strings.Cut(string(b), "\n")
		f := strings.Fields(first)
		if len(f) < 1 {
			continue
		}
		idx, err := strconv.Atoi(f[0])
		if err != nil || idx < 1 || idx >= m.capacity() || m.byIdx[idx] != nil {
			m.log.Warn("network: dropping a malformed allocation", "file", e.Name())
			os.Remove(filepath.Join(m.cfg.StateDir, e.Name()))
			continue
		}
		kind := runtime.NetNamespace
		if len(f) > 1 {
			kind = runtime.NetKind(f[1])
		}
		s := &sbxNet{id: e.Name(), idx: idx, kind: kind, policy: none, given: netpolicy.Default, learned: newLearned()}
		if line := strings.TrimSpace(rest); line != "" {
			var given sandbox.Network
			if err := json.Unmarshal([]byte(line), &given); err == nil {
				if p, err := netpolicy.Parse(given); err == nil {
					s.policy, s.given = p, given
				}
			}
		}
		m.sbx[s.id], m.byIdx[idx] = s, s
	}
	return nil
}

// Teardown removes what New set up on the host for a range — its rules,
// routing and gateway address — and every sandbox link and namespace of
// that range left behind. For tests and uninstalling; sandboxes of that
// range lose their network.
func Teardown(rng netip.Prefix) {
	h := fnv.New32a()
	h.Write([]byte(rng.Masked().String()))
	sum := h.Sum32()
	m := &Manager{cfg: Config{Range: rng.Masked()}, tag: fmt.Sprintf("%04x", sum&0xffff), table: 10000 + int(sum%50000), gw: rng.Masked().Addr().Next()}
	m.teardownHost()
	m.removeAllLinks()
}
