//go:build linux

// Package nettest builds the network a test's sandboxes talk to, entirely
// inside network namespaces the test makes: an "upstream" namespace joined
// to the host by a veth (the server's --egress-uplink), holding addresses
// from documentation and benchmark ranges with HTTP, HTTPS and DNS servers,
// and private-range "hosts" the floor must keep sandboxes from. No packet
// of a test that uses it can reach the machine's real network.
package nettest

import (
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"strings"
	"syscall"
	"testing"

	"github.com/miekg/dns"
	"github.com/vishvananda/netns"
)

// Upstream is a test's "internet".
type Upstream struct {
	// Index is the slot (0…63) it holds on this host: its addresses, and
	// anything else a test keeps apart per upstream, derive from it.
	Index int
	// NS is the upstream namespace's name (ip netns).
	NS string
	// Uplink is the host's end of the veth: pass it as --egress-uplink.
	Uplink string
	// Gateway is the upstream's end: pass it as --egress-gateway.
	Gateway netip.Addr
	// DNS is the upstream resolver (ADDR:PORT): pass it as --egress-dns.
	DNS string
	// Public are "public" addresses (TEST-NET-3) served by HTTP on 80 and
	// a TCP echo on 7, HTTPS on 443 (a certificate for every test name).
	Public []netip.Addr
	// Private is a 10.x host and Metadata 169.254.169.254, both with HTTP
	// on 80: the floor must keep sandboxes from them.
	Private, Metadata netip.Addr
	// Names maps each test domain to the address it resolves to.
	Names map[string]netip.Addr
}

// HTTPBody is what every upstream HTTP server answers, followed by the
// address it was reached at.
const HTTPBody = "hello from upstream "

func run(t testing.TB, args ...string) {
	t.Helper()
	if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
		t.Fatalf("%s: %v: %s", strings.Join(args, " "), err, out)
	}
}

// Root skips a test that is not running as root (making namespaces
// needs it).
func Root(t testing.TB) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: makes network namespaces")
	}
}

// NewUpstream makes the upstream namespace in slot index (0…63), or the
// next one free on this host: slots keep the addresses of tests running at
// once apart, in this process and in any other (see claim).
func NewUpstream(t testing.TB, index int) *Upstream {
	Root(t)
	index = claim(t, index)
	b := make([]byte, 3)
	rand.Read(b)
	suffix := hex.EncodeToString(b)
	u := &Upstream{
		Index:   index,
		NS:      "spup-" + suffix,
		Uplink:  "spup" + suffix,
		Gateway: netip.AddrFrom4([4]byte{198, 18, byte(index), 2}),
		Public: []netip.Addr{
			netip.AddrFrom4([4]byte{203, 0, 113, byte(10 + 2*index)}),
			netip.AddrFrom4([4]byte{203, 0, 113, byte(11 + 2*index)}),
		},
		Private:  netip.AddrFrom4([4]byte{10, 250, byte(index), 10}),
		Metadata: netip.MustParseAddr("169.254.169.254"),
	}
	u.DNS = netip.AddrPortFrom(u.Gateway, 53).String()
	u.Names = map[string]netip.Addr{
		"allowed.example.test": u.Public[0],
		"denied.example.test":  u.Public[0],
		"www.example.test":     u.Public[0],
		"api.github.test":      u.Public[1],
		"other.example.test":   u.Public[1],
	}
	hostAddr := netip.AddrFrom4([4]byte{198, 18, byte(index), 1})
	removeStale(hostAddr)
	run(t, "ip", "netns", "add", u.NS)
	t.Cleanup(func() {
		exec.Command("ip", "link", "del", u.Uplink).Run()
		exec.Command("ip", "netns", "del", u.NS).Run()
	})
	run(t, "ip", "link", "add", u.Uplink, "type", "veth", "peer", "name", "eth0", "netns", u.NS)
	run(t, "ip", "addr", "add", hostAddr.String()+"/30", "dev", u.Uplink)
	run(t, "ip", "link", "set", u.Uplink, "up")
	ns := func(args ...string) { run(t, append([]string{"ip", "netns", "exec", u.NS}, args...)...) }
	ns("ip", "link", "set", "lo", "up")
	ns("ip", "addr", "add", u.Gateway.String()+"/30", "dev", "eth0")
	ns("ip", "link", "set", "eth0", "up")
	for _, a := range append(append([]netip.Addr{}, u.Public...), u.Private, u.Metadata) {
		ns("ip", "addr", "add", a.String()+"/32", "dev", "lo")
	}
	// Answers go back to the host's end; nothing routes further.
	ns("ip", "route", "add", "default", "via", hostAddr.String())

	names := make([]string, 0, len(u.Names))
	for n := range u.Names {
		names = append(names, n)
	}
	cert := selfSigned(t, names)
	for _, a := range append(append([]netip.Addr{}, u.Public...), u.Private, u.Metadata) {
		addr := a
		srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/bytes" {
				serveBytes(w, r)
				return
			}
			fmt.Fprintf(w, "%s%s host=%s\n", HTTPBody, addr, r.Host)
		})}
		l := u.Listen(t, "tcp", netip.AddrPortFrom(a, 80).String())
		go srv.Serve(l)
		t.Cleanup(func() { srv.Close() })
		tl := u.Listen(t, "tcp", netip.AddrPortFrom(a, 443).String())
		tsrv := &http.Server{Handler: srv.Handler, TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}}}
		go tsrv.ServeTLS(tl, "", "")
		t.Cleanup(func() { tsrv.Close() })
		el := u.Listen(t, "tcp", netip.AddrPortFrom(a, 7).String())
		go echo(el)
		t.Cleanup(func() { el.Close() })
	}
	u.serveDNS(t)
	return u
}

func echo(l net.Listener) {
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			buf := make([]byte, 32<<10)
			for {
				n, err := c.Read(buf)
				if n > 0 {
					c.Write(buf[:n])
				}
				if err != nil {
					return
				}
			}
		}()
	}
}

// serveBytes answers /bytes?n=N with N zero bytes (throughput tests).
func serveBytes(w http.ResponseWriter, r *http.Request) {
	var n int64
	fmt.Sscan(r.URL.Query().Get("n"), &n)
	w.Header().Set("Content-Length", fmt.Sprint(n))
	buf := make([]byte, 256<<10)
	for n > 0 {
		k := min(n, int64(len(buf)))
		if _, err := w.Write(buf[:k]); err != nil {
			return
		}
		n -= k
	}
}

// InNS runs fn with the calling goroutine's thread in namespace name; the
// thread is discarded afterwards. Sockets made in fn stay in that
// namespace.
func InNS(name string, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		goruntime.LockOSThread() // never unlocked: the thread exits with us
		h, err := netns.GetFromName(name)
		if err != nil {
			errc <- err
			return
		}
		defer h.Close()
		if err := netns.Set(h); err != nil {
			errc <- err
			return
		}
		errc <- fn()
	}()
	return <-errc
}

// Listen opens a listener inside the upstream namespace.
func (u *Upstream) Listen(t testing.TB, network, addr string) net.Listener {
	t.Helper()
	var l net.Listener
	if err := InNS(u.NS, func() (err error) { l, err = net.Listen(network, addr); return }); err != nil {
		t.Fatalf("listen %s in %s: %v", addr, u.NS, err)
	}
	return l
}

// Get fetches url from inside namespace ns (to show a listener answers
// where the floor is not in the way).
func Get(ns, url string) (string, error) {
	out, err := exec.Command("ip", "netns", "exec", ns, "curl", "-sS", "-m", "5", url).CombinedOutput()
	return string(out), err
}

func (u *Upstream) serveDNS(t testing.TB) {
	h := dns.HandlerFunc(func(w dns.ResponseWriter, req *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(req)
		for _, q := range req.Question {
			name := strings.TrimSuffix(strings.ToLower(q.Name), ".")
			a, ok := u.Names[name]
			if !ok {
				m.SetRcode(req, dns.RcodeNameError)
				break
			}
			if q.Qtype == dns.TypeA {
				m.Answer = append(m.Answer, &dns.A{Hdr: dns.RR_Header{Name: q.Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 60}, A: a.AsSlice()})
			}
		}
		w.WriteMsg(m)
	})
	var pc net.PacketConn
	if err := InNS(u.NS, func() (err error) { pc, err = net.ListenPacket("udp", u.DNS); return }); err != nil {
		t.Fatalf("dns listen: %v", err)
	}
	srv := &dns.Server{PacketConn: pc, Handler: h}
	go srv.ActivateAndServe()
	tl := u.Listen(t, "tcp", u.DNS)
	tsrv := &dns.Server{Listener: tl, Handler: h}
	go tsrv.ActivateAndServe()
	t.Cleanup(func() { srv.Shutdown(); tsrv.Shutdown() })
}

func selfSigned(t testing.TB, names []string) tls.Certificate {
	t.Helper()
	cert, err := makeCert(names)
	if err != nil {
		t.Fatal(err)
	}
	return cert
}

// SandboxRange is the range for the sandboxes of the test that holds this
// upstream: like its addresses, unique to its slot on this host.
func (u *Upstream) SandboxRange() netip.Prefix {
	return netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(100 + u.Index), 0, 0}), 16)
}

// Client makes a plain namespace joined straight to the upstream by a veth
// of its own (no SPACE in between): the baseline a sandbox's network is
// measured against. It returns the namespace's name.
func (u *Upstream) Client(t testing.TB, index int) string {
	b := make([]byte, 3)
	rand.Read(b)
	ns, link := "spcl-"+hex.EncodeToString(b), "spcl"+hex.EncodeToString(b)
	mine := netip.AddrFrom4([4]byte{198, 19, byte(index), 1})
	theirs := netip.AddrFrom4([4]byte{198, 19, byte(index), 2})
	run(t, "ip", "netns", "add", ns)
	t.Cleanup(func() { exec.Command("ip", "netns", "del", ns).Run() })
	run(t, "ip", "link", "add", link, "netns", ns, "type", "veth", "peer", "name", link+"u", "netns", u.NS)
	run(t, "ip", "-n", ns, "link", "set", "lo", "up")
	run(t, "ip", "-n", ns, "addr", "add", mine.String()+"/30", "dev", link)
	run(t, "ip", "-n", ns, "link", "set", link, "up")
	run(t, "ip", "-n", u.NS, "addr", "add", theirs.String()+"/30", "dev", link+"u")
	run(t, "ip", "-n", u.NS, "link", "set", link+"u", "up")
	for _, a := range u.Public {
		run(t, "ip", "-n", ns, "route", "add", a.String()+"/32", "via", theirs.String())
	}
	return ns
}

// slotDir holds a lock file per upstream slot, host-wide.
const slotDir = "/run/space-nettest"

// claim takes upstream slot index, or the next free one, for this test
// until its cleanup: an flock on the slot's file, which the kernel lets go
// when the process ends however it ends. Two test processes on one host
// (an orphaned test binary and a new run) therefore never share a slot,
// and a slot's leftovers found by its new owner are a dead run's.
func claim(t testing.TB, index int) int {
	t.Helper()
	n, f, err := lockSlot(index)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() }) // registered first: runs after the namespace is gone
	return n
}

// lockSlot locks the first free slot from index on (wrapping at 64) and
// returns it with its locked file: the slot is held until that closes.
func lockSlot(index int) (int, *os.File, error) {
	if err := os.MkdirAll(slotDir, 0o755); err != nil {
		return 0, nil, fmt.Errorf("upstream slots: %w", err)
	}
	for i := range 64 {
		n := (index + i) % 64
		f, err := os.OpenFile(filepath.Join(slotDir, fmt.Sprintf("upstream-%d.lock", n)), os.O_RDWR|os.O_CREATE, 0o600)
		if err != nil {
			return 0, nil, fmt.Errorf("upstream slot %d: %w", n, err)
		}
		if syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB) == nil {
			return n, f, nil
		}
		f.Close()
	}
	return 0, nil, errors.New("all 64 upstream slots on this host are taken by running tests")
}

// removeStale deletes an upstream a killed test run left holding the same
// host address (two links with one address would split the routes). Only
// the slot's owner calls it, so nothing it deletes is a live test's.
func removeStale(hostAddr netip.Addr) {
	out, _ := exec.Command("ip", "-o", "-4", "addr", "show").Output()
	for _, l := range strings.Split(string(out), "\n") {
		f := strings.Fields(l)
		if len(f) < 4 || !strings.HasPrefix(f[1], "spup") || !strings.HasPrefix(f[3], hostAddr.String()+"/") {
			continue
		}
		exec.Command("ip", "link", "del", f[1]).Run()
		exec.Command("ip", "netns", "del", "spup-"+strings.TrimPrefix(f[1], "spup")).Run()
	}
}
