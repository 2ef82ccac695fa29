//go:build linux

package network

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/miekg/dns"
	"github.com/vishvananda/netlink"

	"github.com/spacesandbox/space/internal/network/nettest"
	"github.com/spacesandbox/space/internal/runtime"
	"github.com/spacesandbox/space/internal/sandbox"
)

// These tests drive the host side with plain network namespaces standing in
// for sandboxes (the runtimes' own tests and the e2e suites run real
// gVisor and QEMU sandboxes on it). Every packet stays in namespaces the
// test makes.

func newManager(t *testing.T, up *nettest.Upstream) *Manager {
	t.Helper()
	m, err := New(context.Background(), Config{
		Range: up.SandboxRange(), Uplink: up.Uplink, Gateway: up.Gateway, DNS: up.DNS, StateDir: t.TempDir(),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Destroy)
	return m
}

// curl runs curl inside a sandbox's namespace and returns its output, or
// the error text.
func curl(m *Manager, id string, args ...string) string {
	all := []string{"netns", "exec", m.nsName(id), "curl", "-sS", "-m", "2", "-k"}
	for _, a := range args {
		all = append(all, strings.Fields(a)...)
	}
	out, err := exec.Command("ip", all...).CombinedOutput()
	if err != nil {
		return "ERR " + strings.TrimSpace(string(out))
	}
	return string(out)
}

// lookup resolves name from inside a sandbox's namespace through the
// sandbox's resolver (any server address will do: every query is
// redirected to it). The socket is made in the namespace; the exchange
// runs anywhere.
func lookup(m *Manager, id, name string) ([]string, error) {
	var c net.Conn
	if err := nettest.InNS(m.nsName(id), func() (err error) { c, err = net.Dial("udp", "192.0.2.53:53"); return }); err != nil {
		return nil, err
	}
	defer c.Close()
	q := new(dns.Msg)
	q.SetQuestion(dns.Fqdn(name), dns.TypeA)
	c.SetDeadline(time.Now().Add(3 * time.Second))
	dc := &dns.Conn{Conn: c}
	if err := dc.WriteMsg(q); err != nil {
		return nil, err
	}
	r, err := dc.ReadMsg()
	if err != nil {
		return nil, err
	}
	if r.Rcode != dns.RcodeSuccess {
		return nil, fmt.Errorf("%s: %s", name, dns.RcodeToString[r.Rcode])
	}
	var out []string
	for _, rr := range r.Answer {
		if a, ok := rr.(*dns.A); ok {
			out = append(out, a.A.String())
		}
	}
	return out, nil
}

func reached(out string) bool { return strings.HasPrefix(out, nettest.HTTPBody) }

func TestEgressPolicyInNamespaces(t *testing.T) {
	nettest.Root(t)
	up := nettest.NewUpstream(t, 60)
	m := newManager(t, up)
	ctx := context.Background()
	pub, pub2 := up.Public[0].String(), up.Public[1].String()

	a, err := m.Attach(ctx, "sbx_a", runtime.NetNamespace, sandbox.Network{Egress: "public"}, true)
	if err != nil {
		t.Fatal(err)
	}
	b, err := m.Attach(ctx, "sbx_b", runtime.NetNamespace, sandbox.Network{Egress: "none"}, true)
	if err != nil {
		t.Fatal(err)
	}
	if out := curl(m, "sbx_a", "http://"+pub+"/"); !reached(out) {
		t.Fatalf("public egress: %s", out)
	}
	if out := curl(m, "sbx_b", "http://"+pub+"/"); reached(out) {
		t.Fatalf("egress none reached upstream: %s", out)
	}

	t.Run("Floor", func(t *testing.T) {
		for _, target := range []string{
			"http://" + up.Private.String() + "/", "http://" + up.Metadata.String() + "/",
			"http://" + a.Gateway.String() + "/", "http://" + b.Address.Addr().String() + ":7/",
			"http://" + m.gw.String() + ":10080/",
		} {
			if out := curl(m, "sbx_a", target); reached(out) || !strings.HasPrefix(out, "ERR") {
				t.Errorf("%s reached from a sandbox: %s", target, out)
			}
		}
		// The same listeners answer from their own namespace.
		for _, target := range []string{"http://" + up.Private.String() + "/", "http://" + up.Metadata.String() + "/"} {
			if out, err := nettest.Get(up.NS, target); err != nil || !reached(out) {
				t.Errorf("%s not reachable from upstream itself: %v %s", target, err, out)
			}
		}
	})

	t.Run("CIDRRules", func(t *testing.T) {
		if err := m.Apply(ctx, "sbx_a", sandbox.Network{Egress: "public", Deny: []string{pub + "/32"}}); err != nil {
			t.Fatal(err)
		}
		if out := curl(m, "sbx_a", "http://"+pub+"/"); reached(out) {
			t.Errorf("denied CIDR reached: %s", out)
		}
		if out := curl(m, "sbx_a", "http://"+pub2+"/"); !reached(out) {
			t.Errorf("other address blocked: %s", out)
		}
		m.Apply(ctx, "sbx_a", sandbox.Network{Egress: "none", Allow: []string{pub2}})
		if out := curl(m, "sbx_a", "http://"+pub2+"/"); !reached(out) {
			t.Errorf("allowed address blocked: %s", out)
		}
		if out := curl(m, "sbx_a", "http://"+pub+"/"); reached(out) {
			t.Errorf("egress none reached a not-allowed address: %s", out)
		}
	})

	t.Run("Domains", func(t *testing.T) {
		m.Apply(ctx, "sbx_a", sandbox.Network{Egress: "none", Allow: []string{"allowed.example.test", "*.github.test"}})
		if addrs, err := lookup(m, "sbx_a", "allowed.example.test"); err != nil || len(addrs) != 1 || addrs[0] != pub {
			t.Fatalf("allowed name: %v %v", addrs, err)
		}
		if _, err := lookup(m, "sbx_a", "other.example.test"); err == nil {
			t.Errorf("a name egress none does not allow resolved")
		}
		resolve := func(name, addr string) string { return "--resolve " + name + ":443:" + addr }
		resolve80 := func(name, addr string) string { return "--resolve " + name + ":80:" + addr }
		if out := curl(m, "sbx_a", resolve("allowed.example.test", pub), "https://allowed.example.test/"); !reached(out) {
			t.Errorf("https to an allowed domain: %s", out)
		}
		if out := curl(m, "sbx_a", resolve80("allowed.example.test", pub), "http://allowed.example.test/"); !reached(out) {
			t.Errorf("http to an allowed domain: %s", out)
		}
		// The allowed name at an address it did not resolve to (literal-IP bypass).
		if out := curl(m, "sbx_a", resolve("allowed.example.test", pub2), "https://allowed.example.test/"); reached(out) {
			t.Errorf("allowed SNI at another address reached: %s", out)
		}
		if out := curl(m, "sbx_a", "https://"+pub+"/"); reached(out) {
			t.Errorf("literal IP without an allowed rule reached: %s", out)
		}
		if out := curl(m, "sbx_a", resolve("other.example.test", pub2), "https://other.example.test/"); reached(out) {
			t.Errorf("not-allowed domain reached: %s", out)
		}
		lookup(m, "sbx_a", "api.github.test")
		if out := curl(m, "sbx_a", resolve("api.github.test", pub2), "https://api.github.test/"); !reached(out) {
			t.Errorf("wildcard domain: %s", out)
		}

		m.Apply(ctx, "sbx_a", sandbox.Network{Egress: "public", Deny: []string{"denied.example.test"}})
		if _, err := lookup(m, "sbx_a", "denied.example.test"); err == nil {
			t.Errorf("denied name resolved")
		}
		if out := curl(m, "sbx_a", resolve("denied.example.test", pub), "https://denied.example.test/"); reached(out) {
			t.Errorf("denied SNI reached: %s", out)
		}
		if out := curl(m, "sbx_a", resolve80("denied.example.test", pub), "http://denied.example.test/"); reached(out) || !strings.Contains(out, "blocked") {
			t.Errorf("denied Host reached: %s", out)
		}
		if out := curl(m, "sbx_a", resolve("www.example.test", pub), "https://www.example.test/"); !reached(out) {
			t.Errorf("public egress to another name at the same address: %s", out)
		}
	})

	t.Run("TapKind", func(t *testing.T) {
		n, err := m.Attach(ctx, "sbx_c", runtime.NetTap, sandbox.Network{Egress: "public"}, true)
		if err != nil {
			t.Fatal(err)
		}
		if n.Tap != TapName || n.Netns != m.nsPath("sbx_c") {
			t.Fatalf("attachment %+v", n)
		}
		for _, l := range []string{"eth0", TapName} {
			out, err := exec.Command("ip", "-n", m.nsName("sbx_c"), "-o", "link", "show", l).CombinedOutput()
			if err != nil || !strings.Contains(string(out), "master br0") {
				t.Errorf("%s is not on the bridge: %v %s", l, err, out)
			}
		}
		out, _ := exec.Command("ip", "-n", m.nsName("sbx_c"), "-o", "-4", "addr", "show").CombinedOutput()
		if strings.Contains(string(out), "eth0") || strings.Contains(string(out), "br0") {
			t.Errorf("the namespace's side carries an address (the guest has it): %s", out)
		}
		if err := m.Detach(ctx, "sbx_c"); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("Metrics", func(t *testing.T) {
		for _, st := range m.NetStats() {
			if st.SandboxID != "sbx_a" {
				continue
			}
			if st.BytesOut == 0 || st.BytesIn == 0 || st.ConnsAllowed == 0 || st.ConnsDenied == 0 || st.DNSAllowed == 0 || st.DNSDenied == 0 {
				t.Errorf("counters of a sandbox that was allowed and denied: %+v", st)
			}
			return
		}
		t.Errorf("no counters for sbx_a")
	})

	t.Run("Detach", func(t *testing.T) {
		if err := m.Detach(ctx, "sbx_b"); err != nil {
			t.Fatal(err)
		}
		if err := exec.Command("ip", "netns", "exec", m.nsName("sbx_b"), "true").Run(); err == nil {
			t.Errorf("namespace left behind")
		}
		if err := exec.Command("ip", "link", "show", m.linkName(1)).Run(); err != nil {
			t.Errorf("the other sandbox's link went too: %v", err)
		}
		out, _ := exec.Command("ip", "link", "show").CombinedOutput()
		if strings.Contains(string(out), fmt.Sprintf("%sx%d", "s"+m.tag, 2)) {
			t.Errorf("link left behind: %s", out)
		}
	})
}

// A host end of a sandbox's veth left by another server of the same range
// (killed, its state directory gone: the index is given anew) is not taken
// for this sandbox's: attaching replaces it (it used to fail with "the
// sandbox's eth0: Link not found").
func TestStaleHostLinkIsReplaced(t *testing.T) {
	nettest.Root(t)
	up := nettest.NewUpstream(t, 62)
	m := newManager(t, up)
	ctx := context.Background()
	for idx := range 3 { // whichever index the attach is given
		stale := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: m.linkName(idx)}, PeerName: fmt.Sprintf("stale%dp", idx)}
		if err := netlink.LinkAdd(stale); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if l, err := netlink.LinkByName(stale.PeerName); err == nil {
				netlink.LinkDel(l)
			}
		})
	}
	if _, err := m.Attach(ctx, "sbx_s", runtime.NetNamespace, sandbox.Network{Egress: "public"}, true); err != nil {
		t.Fatalf("attach over a stale host link: %v", err)
	}
	if out := curl(m, "sbx_s", "http://"+up.Public[0].String()+"/"); !reached(out) {
		t.Fatalf("the sandbox does not reach upstream: %s", out)
	}
	if err := m.Detach(ctx, "sbx_s"); err != nil {
		t.Fatal(err)
	}
}

// A kill between creating a namespace's file and bind-mounting it leaves an
// empty file (found by the e2e fault suite): attaching replaces it, and
// detaching or tearing down removes such a file too.
func TestHalfMadeNamespaceIsReplaced(t *testing.T) {
	nettest.Root(t)
	up := nettest.NewUpstream(t, 61)
	m := newManager(t, up)
	ctx := context.Background()
	if err := os.WriteFile(m.nsPath("sbx_h"), nil, 0o444); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Attach(ctx, "sbx_h", runtime.NetNamespace, sandbox.Network{Egress: "public"}, true); err != nil {
		t.Fatalf("attach over a half-made namespace: %v", err)
	}
	if !isNetns(m.nsPath("sbx_h")) {
		t.Fatal("no namespace after attach")
	}
	if err := m.Detach(ctx, "sbx_h"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(m.nsPath("sbx_h")); !os.IsNotExist(err) {
		t.Fatalf("namespace file left after detach: %v", err)
	}
	// A leftover file of the range goes with the teardown.
	os.WriteFile(m.nsPath("sbx_left"), nil, 0o444)
	m.removeAllLinks()
	if _, err := os.Stat(m.nsPath("sbx_left")); !os.IsNotExist(err) {
		t.Fatalf("half-made namespace left after teardown: %v", err)
	}
}

// A wake attaches again a sandbox whose network its suspend kept: chains
// that hold its policy already are not written again (a transaction of
// 5–15 ms), and a policy that changed is.
func TestAttachAgainRewritesOnlyAChangedPolicy(t *testing.T) {
	nettest.Root(t)
	up := nettest.NewUpstream(t, 59)
	m := newManager(t, up)
	ctx := context.Background()
	target := "http://" + up.Public[0].String() + "/"
	attach := func(egress string) {
		t.Helper()
		if _, err := m.Attach(ctx, "sbx_w", runtime.NetNamespace, sandbox.Network{Egress: egress}, true); err != nil {
			t.Fatal(err)
		}
	}
	// The handles of the sandbox's rules: new ones for every rule written.
	handles := func() []uint64 {
		t.Helper()
		c, err := newNFT()
		if err != nil {
			t.Fatal(err)
		}
		var hs []uint64
		for _, name := range m.chainNames(m.sbx["sbx_w"].idx) {
			rules, err := c.GetRules(m.nftTable(), &nftables.Chain{Name: name, Table: m.nftTable()})
			if err != nil {
				t.Fatal(err)
			}
			for _, r := range rules {
				hs = append(hs, r.Handle)
			}
		}
		return hs
	}
	attach("public")
	first := handles()
	if len(first) == 0 {
		t.Fatal("no rules for the sandbox")
	}
	attach("public")
	if again := handles(); !slices.Equal(again, first) {
		t.Errorf("the same policy was written again: rules %v, then %v", first, again)
	}
	if out := curl(m, "sbx_w", target); !reached(out) {
		t.Fatalf("public egress after attaching again: %s", out)
	}
	attach("none")
	if changed := handles(); slices.Equal(changed, first) {
		t.Errorf("a changed policy was not written: rules %v", changed)
	}
	if out := curl(m, "sbx_w", target); reached(out) {
		t.Fatalf("egress none reached upstream after attaching again: %s", out)
	}
	if err := m.Detach(ctx, "sbx_w"); err != nil {
		t.Fatal(err)
	}
}

// A restart (a new Manager over the same state) writes each sandbox's own
// policy with the table it writes whole: a running sandbox's new
// connections follow that policy throughout, not egress none until
// recovery attaches the sandbox again (and that attach writes nothing).
func TestRestartKeepsEachSandboxsPolicy(t *testing.T) {
	nettest.Root(t)
	up := nettest.NewUpstream(t, 58)
	ctx := context.Background()
	cfg := Config{Range: up.SandboxRange(), Uplink: up.Uplink, Gateway: up.Gateway, DNS: up.DNS, StateDir: t.TempDir()}
	target := "http://" + up.Public[0].String() + "/"
	before, err := New(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	var after *Manager
	t.Cleanup(func() {
		if after == nil {
			before.Destroy()
		}
	})
	for id, egress := range map[string]string{"sbx_p": "public", "sbx_n": "none"} {
		if _, err := before.Attach(ctx, id, runtime.NetNamespace, sandbox.Network{Egress: egress}, true); err != nil {
			t.Fatal(err)
		}
	}
	before.Close()
	if after, err = New(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(after.Destroy)
	if out := curl(after, "sbx_p", target); !reached(out) {
		t.Fatalf("public egress right after a restart, before recovery: %s", out)
	}
	if out := curl(after, "sbx_n", target); reached(out) {
		t.Fatalf("egress none reached upstream after a restart: %s", out)
	}
	chains := func() int64 {
		c, err := newNFT()
		if err != nil {
			t.Fatal(err)
		}
		rules, err := c.GetRules(after.nftTable(), &nftables.Chain{Name: after.chainNames(after.sbx["sbx_p"].idx)[1], Table: after.nftTable()})
		if err != nil || len(rules) == 0 {
			t.Fatalf("the sandbox's policy chain: %v", err)
		}
		return int64(rules[0].Handle)
	}
	first := chains()
	if _, err := after.Attach(ctx, "sbx_p", runtime.NetNamespace, sandbox.Network{Egress: "public"}, false); err != nil {
		t.Fatal(err)
	}
	if again := chains(); again != first {
		t.Errorf("recovery's attach wrote the policy the restart had written already")
	}
	if out := curl(after, "sbx_p", target); !reached(out) {
		t.Fatalf("public egress after recovery: %s", out)
	}
}
